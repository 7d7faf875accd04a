"""Compare two dispatch tables, and predict what a change of table does to estimated matmul time. Pure.

Rules are compared per shape key (the op's key: MUL_MAT's op, layout, types, N, K, B; MUL_MAT_ID's adds E,
U and routing in place of B) and size class: identical rules are dropped, and the rest
are grouped by overlapping M ranges -- a group with rules on both sides is *changed* (other route or
other interval), one with rules only in B is *added*, only in A *removed*. Two tables *differ* when a
rule differs or the runtime identity (GPU name, cc, SM count, upstream commit, layout version) does;
provenance (hash, tool version, source) is reported but does not by itself make tables differ.

Prediction over a census: :mod:`codegen.predict`, the model the report uses too (baseline: measured
stock time where the tuning has the point, census est_us elsewhere; a changed route divides it by the
measured, interpolated or type-default stock/route ratio).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ggml_dispatch import registry
from ggml_dispatch.artifacts import table as table_artifact
from ggml_dispatch.artifacts.table import LoadedTable
from ggml_dispatch.codegen import predict as predict_mod
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.codegen.predict import AffectedRow as AffectedRow
from ggml_dispatch.codegen.predict import Evals, StockUs
from ggml_dispatch.codegen.predict import Prediction as Prediction
from ggml_dispatch.codegen.predict import format_prediction as format_prediction
from ggml_dispatch.codegen.predict import route_factor as route_factor
from ggml_dispatch.errors import InputError


def load_text(text: str, origin: str) -> LoadedTable:
    """table.json text or a rendered header -> LoadedTable (content decides which)."""
    return table_artifact.loads_any(text, origin)


def load_file(path: Path) -> LoadedTable:
    """A table.json or header file, through the one table reader."""
    return table_artifact.load_any(path)


def empty() -> LoadedTable:
    t = tbl.empty_table()
    return LoadedTable(t, tbl.table_hash(t), "empty", "empty")


# --------------------------------------------------------------------------------------------
# Rule diff


@dataclass
class RuleChange:
    key: dict[str, Any]
    before: list[dict[str, Any]]
    after: list[dict[str, Any]]


@dataclass
class TableDiff:
    a: str
    b: str
    identity: dict[str, list[Any]] = field(default_factory=dict)  # field -> [a, b]
    provenance: dict[str, list[Any]] = field(default_factory=dict)
    added: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    changed: list[RuleChange] = field(default_factory=list)
    unchanged: int = 0

    @property
    def differs(self) -> bool:
        return bool(self.identity or self.added or self.removed or self.changed)


def _overlap(x: Mapping[str, Any], y: Mapping[str, Any]) -> bool:
    return bool(x["M_lo"] <= y["M_hi"] and y["M_lo"] <= x["M_hi"])


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def diff_tables(a: LoadedTable, b: LoadedTable) -> TableDiff:
    d = TableDiff(a=a.origin, b=b.origin)
    ta, tb = a.table, b.table
    for name, va, vb in (
        ("gpu.name", ta["gpu"]["name"], tb["gpu"]["name"]),
        ("gpu.cc", ta["gpu"]["cc"], tb["gpu"]["cc"]),
        ("gpu.sm_count", ta["gpu"]["sm_count"], tb["gpu"]["sm_count"]),
        ("upstream_commit", ta["upstream_commit"], tb["upstream_commit"]),
        ("layout_version", ta["layout_version"], tb["layout_version"]),
    ):
        if va != vb:
            d.identity[name] = [va, vb]
    for name, va, vb in (
        ("hash", a.hash, b.hash),
        ("source", ta["provenance"].get("source"), tb["provenance"].get("source")),
        ("tool_version", ta["provenance"].get("tool_version"), tb["provenance"].get("tool_version")),
        ("tuning_sha256", ta["provenance"].get("tuning_sha256"), tb["provenance"].get("tuning_sha256")),
    ):
        if va != vb and va is not None and vb is not None:  # a header carries less provenance than JSON
            d.provenance[name] = [va, vb]

    shapes: dict[tuple[int, ...], dict[str, Any]] = {}

    def by_key(rules: Sequence[Mapping[str, Any]]) -> dict[tuple[int, ...], list[dict[str, Any]]]:
        # grouped by the op's shape key (its integer codes) and size class; a rule's kind rides along for
        # display, decisions compare on the runtime fields only (a kind renamed is not a changed decision)
        out: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        for full, r in zip(rules, tbl.core_rules(rules), strict=True):
            kind = tbl.rule_kind(full)
            row = {**r, "kind": kind} if kind is not None else r
            group = (*tbl.key_codes(r), *tbl.class_codes(r))
            shape = registry.shape_key(r).as_dict()
            if tbl.is_class(r):
                shape.update({f: r[f] for f in tbl.CLASS_FIELDS})
            shapes.setdefault(group, shape)
            out.setdefault(group, []).append(row)
        return out

    def core(r: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k != "kind"}

    ka, kb = by_key(ta["rules"]), by_key(tb["rules"])
    for key in sorted(set(ka) | set(kb)):
        ra, rb = ka.get(key, []), kb.get(key, [])
        core_b = [core(r) for r in rb]
        same = [r for r in ra if core(r) in core_b]
        d.unchanged += len(same)
        core_same = [core(r) for r in same]
        ra = [r for r in ra if core(r) not in core_b]
        rb = [r for r in rb if core(r) not in core_same]
        # connected components of the "M ranges overlap" relation between the two sides
        items = [("a", r) for r in ra] + [("b", r) for r in rb]
        parent = list(range(len(items)))
        for i, (si, ri) in enumerate(items):
            for j in range(i + 1, len(items)):
                sj, rj = items[j]
                if si != sj and _overlap(ri, rj):
                    parent[_root(parent, i)] = _root(parent, j)
        comps: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for i, it in enumerate(items):
            comps.setdefault(_root(parent, i), []).append(it)
        for comp in sorted(comps.values(), key=lambda c: min(r["M_lo"] for _, r in c)):
            before = sorted((r for s, r in comp if s == "a"), key=lambda r: r["M_lo"])
            after = sorted((r for s, r in comp if s == "b"), key=lambda r: r["M_lo"])
            if before and after:
                d.changed.append(RuleChange(dict(shapes[key]), before, after))
            elif before:
                d.removed.extend(before)
            else:
                d.added.extend(after)
    return d


# --------------------------------------------------------------------------------------------
# Prediction over a census (the model is codegen.predict, shared with the report)


def predict(
    census: pd.DataFrame,
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    evals: Evals,
    stock_us: StockUs | None = None,
) -> Prediction:
    """Predicted change in matmul time over ``census`` when table ``a`` is replaced by ``b``; without
    ``stock_us`` (the tuning's median stock time per point) every baseline is the census est_us."""
    rows = [{str(k): v for k, v in r.items()} for r in census.to_dict("records")]
    return predict_mod.predict(rows, a, b, evals, stock_us)


# --------------------------------------------------------------------------------------------
# Output


def rule_line(r: Mapping[str, Any]) -> str:
    kind = tbl.rule_kind(r)
    return f"{tbl.rule_label(r)} -> {tbl.rule_config(r)}" + (f" [{kind}]" if kind else "")


def _span(r: Mapping[str, Any]) -> str:
    kind = tbl.rule_kind(r)
    return f"M={r['M_lo']}..{r['M_hi']} {tbl.rule_config(r)}" + (f" [{kind}]" if kind else "")


def format_diff(d: TableDiff) -> list[str]:
    out = [f"diff {d.a} -> {d.b}"]
    for name, (va, vb) in d.identity.items():
        out.append(f"  identity {name}: {va!r} -> {vb!r}")
    for name, (va, vb) in d.provenance.items():
        out.append(f"  provenance {name}: {va!r} -> {vb!r}")
    for r in d.removed:
        out.append(f"- {rule_line(r)}")
    for r in d.added:
        out.append(f"+ {rule_line(r)}")
    for c in d.changed:
        before = ", ".join(_span(r) for r in c.before)
        after = ", ".join(_span(r) for r in c.after)
        label = tbl.rule_label({**c.key, "M_lo": 0, "M_hi": 0}).rsplit(" M=", 1)[0]
        out.append(f"~ {label}: {before} -> {after}")
    out.append(
        f"{len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed, {d.unchanged} unchanged; "
        + ("tables differ" if d.differs else "same decisions")
    )
    return out


def to_json(d: TableDiff, p: Prediction | None) -> str:
    obj: dict[str, Any] = {
        "a": d.a,
        "b": d.b,
        "differs": d.differs,
        "identity": d.identity,
        "provenance": d.provenance,
        "added": d.added,
        "removed": d.removed,
        "changed": [asdict(c) for c in d.changed],
        "unchanged": d.unchanged,
    }
    if p is not None:
        obj["prediction"] = {
            "census_rows": p.census_rows,
            "considered_rows": p.considered_rows,
            "fused_rows": p.fused_rows,
            "total_a_us": p.total_a_us,
            "total_b_us": p.total_b_us,
            "delta_us": p.delta_us,
            "delta_pct": p.delta_pct,
            "unpredicted": p.unpredicted,
            "rows": [{k: v for k, v in asdict(r).items() if k != "shape"} for r in p.rows],
            "notes": p.notes,
        }
    return json.dumps(obj, sort_keys=True, indent=2, default=str) + "\n"


def check_census(df: pd.DataFrame, path: str) -> None:
    need = ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "calls", "est_us", "fused")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(path, f"not a census: missing columns {', '.join(missing)}")
