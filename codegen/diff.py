"""Compare two dispatch tables, and predict what a change of table does to estimated matmul time. Pure.

Rules are compared per shape key (op, layout, types, N, K, B): identical rules are dropped, and the rest
are grouped by overlapping M ranges -- a group with rules on both sides is *changed* (other route or
other interval), one with rules only in B is *added*, only in A *removed*. Two tables *differ* when a
rule differs or the runtime identity (GPU name, cc, SM count, upstream commit, layout version) does;
provenance (hash, tool version, source) is reported but does not by itself make tables differ.

Prediction over a census: each census row (fused groups excepted: the table never overrides them) is
looked up in both tables with the row's GPU. The census ``est_us`` (calls x estimated stock time) is
the baseline; where the routes differ, each side's time is ``est_us / ratio``, the ratio being the
tuning file's stock/route ratio (the statistic decisions use)

* at that exact point (basis ``measured``);
* else the smaller ratio of the two measured neighbours in M (``interpolated``);
* else, for a shape never measured, the smallest such ratio over the measured shapes of the same type
  (``type default``).

Rows where none applies are counted as unpredicted and left at their census estimate. So the total is
the census's estimated matmul time and the change is the measured relative change applied to it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from codegen import render
from codegen import table as tbl
from codegen.decide import RouteEval, ShapeKey
from ggml_dispatch import schema
from ggml_dispatch.errors import InputError

Evals = Mapping[ShapeKey, Mapping[int, Mapping[str, RouteEval]]]


@dataclass
class LoadedTable:
    table: dict[str, Any]
    hash: str  # sha256 of the canonical table.json (embedded in a header)
    origin: str
    kind: str  # "json", "header" or "empty"


def load_text(text: str, origin: str) -> LoadedTable:
    """table.json text or a rendered header -> LoadedTable (content decides which)."""
    if text.lstrip().startswith("{"):
        t = tbl.loads(text, origin)
        return LoadedTable(t, tbl.table_hash(t), origin, "json")
    t, h = render.parse_header(text, origin)
    return LoadedTable(t, h, origin, "header")


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

    def by_key(rules: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
        # grouped by shape key and size class; a rule's kind rides along for display, decisions compare
        # on the runtime fields only (a kind renamed is not a changed decision)
        out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for full, r in zip(rules, tbl.core_rules(rules), strict=True):
            kind = tbl.rule_kind(full)
            row = {**r, "kind": kind} if kind is not None else r
            out.setdefault((*(r[f] for f in tbl.KEY_FIELDS), *tbl.class_codes(r)), []).append(row)
        return out

    def core(r: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k != "kind"}

    ka, kb = by_key(ta["rules"]), by_key(tb["rules"])
    for key in sorted(
        set(ka) | set(kb),
        key=lambda k: (tbl.key_codes(dict(zip(tbl.KEY_FIELDS, k, strict=False))), *k[len(tbl.KEY_FIELDS) :]),
    ):
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
                shape = dict(zip(tbl.KEY_FIELDS, key, strict=False))
                if len(key) > len(tbl.KEY_FIELDS) and key[len(tbl.KEY_FIELDS)]:
                    shape["NK_lo"], shape["NK_hi"] = key[len(tbl.KEY_FIELDS) :]
                d.changed.append(RuleChange(shape, before, after))
            elif before:
                d.removed.extend(before)
            else:
                d.added.extend(after)
    return d


# --------------------------------------------------------------------------------------------
# Prediction over a census


@dataclass
class AffectedRow:
    tensor: str | None
    role: str | None
    op: str
    layout: str
    src0_type: str
    src1_type: str
    M: int
    N: int
    K: int
    B: int
    calls: int
    route_a: str | None
    route_b: str | None
    us_a: float | None  # total over the row's calls
    us_b: float | None
    delta_us: float | None
    basis: str


@dataclass
class Prediction:
    census_rows: int
    considered_rows: int  # rows of a GPU at least one table applies to
    fused_rows: int
    total_a_us: float
    total_b_us: float
    rows: list[AffectedRow]
    unpredicted: int
    notes: list[str]

    @property
    def delta_us(self) -> float:
        return self.total_b_us - self.total_a_us

    @property
    def delta_pct(self) -> float:
        return 100.0 * self.delta_us / self.total_a_us if self.total_a_us > 0 else 0.0


def _neighbour_ratio(by_m: Mapping[int, Mapping[str, RouteEval]], route: str, M: int) -> float | None:
    lo = [m for m, p in by_m.items() if m < M and route in p and p[route].ratio is not None]
    hi = [m for m, p in by_m.items() if m > M and route in p and p[route].ratio is not None]
    if not lo or not hi:
        return None
    r_lo, r_hi = by_m[max(lo)][route].ratio, by_m[min(hi)][route].ratio
    assert r_lo is not None and r_hi is not None
    return min(r_lo, r_hi)


def route_factor(route: str | None, key: ShapeKey, M: int, evals: Evals) -> tuple[float, str] | None:
    """Time of ``route`` (None = stock) relative to stock at a census point and its basis, or None."""
    if route is None:
        return 1.0, "stock"
    ev = evals.get(key, {}).get(M, {}).get(route)
    if ev is not None and ev.ratio is not None:
        return 1.0 / ev.ratio, "reference sample" if ev.reference else "measured"
    if key in evals:
        r = _neighbour_ratio(evals[key], route, M)
        return (1.0 / r, "interpolated") if r is not None else None
    ratios = []
    for s, by_m in evals.items():
        if s.group() != key.group():
            continue
        at_m = by_m.get(M, {}).get(route)
        for r in (_neighbour_ratio(by_m, route, M), at_m.ratio if at_m is not None else None):
            if r is not None:
                ratios.append(r)
    return (1.0 / min(ratios), "type default, worst measured shape") if ratios else None


def _gpu_of(row: Mapping[str, Any], fallback: schema.GpuId) -> tuple[schema.GpuId, bool]:
    name = row.get("gpu_name")
    if name is None or (isinstance(name, float) and math.isnan(name)) or name == "":
        return fallback, True
    return schema.GpuId(str(name), int(row["gpu_cc"]), int(row["gpu_sm_count"])), False


def predict(census: pd.DataFrame, a: Mapping[str, Any], b: Mapping[str, Any], evals: Evals) -> Prediction:
    """Predicted change in estimated matmul time over ``census`` when table ``a`` is replaced by ``b``."""
    fallback = tbl.table_gpu(b) if b["rules"] else tbl.table_gpu(a)
    rows: list[AffectedRow] = []
    total_a = total_b = 0.0
    unpredicted = fused = considered = 0
    assumed_gpu = 0
    for raw in census.to_dict("records"):
        rec = {str(k): v for k, v in raw.items()}
        est = float(rec["est_us"]) if rec.get("est_us") is not None else math.nan
        calls = int(rec["calls"])
        if not math.isfinite(est):
            est = 0.0
        gpu, assumed = _gpu_of(rec, fallback)
        assumed_gpu += assumed
        if tbl.gpu_matches(a, gpu) or tbl.gpu_matches(b, gpu):
            considered += 1
        f = rec.get("fused")
        if f is not None and not (isinstance(f, float) and math.isnan(f)) and f != "":
            fused += 1
            total_a += est
            total_b += est
            continue
        q = (str(rec["op"]), str(rec["layout"]), str(rec["src0_type"]), str(rec["src1_type"]))
        M, N, K, B = (int(rec[c]) for c in ("M", "N", "K", "B"))
        ra = tbl.lookup(a, gpu, *q, M, N, K, B)
        rb = tbl.lookup(b, gpu, *q, M, N, K, B)
        if ra == rb:
            total_a += est
            total_b += est
            continue
        key = ShapeKey(*q, N, K, B)
        fa = route_factor(ra, key, M, evals)
        fb = route_factor(rb, key, M, evals)
        common: dict[str, Any] = dict(
            tensor=rec.get("tensor"),
            role=rec.get("role"),
            op=q[0],
            layout=q[1],
            src0_type=q[2],
            src1_type=q[3],
            M=M,
            N=N,
            K=K,
            B=B,
            calls=calls,
            route_a=ra,
            route_b=rb,
        )
        if fa is None or fb is None:
            unpredicted += 1
            total_a += est
            total_b += est
            rows.append(
                AffectedRow(**common, us_a=None, us_b=None, delta_us=None, basis="no timing for this point")
            )
            continue
        ua, ub = est * fa[0], est * fb[0]
        total_a += ua
        total_b += ub
        basis = fb[1] if rb is not None else fa[1]
        rows.append(AffectedRow(**common, us_a=ua, us_b=ub, delta_us=ub - ua, basis=basis))
    notes = []
    kinds = census["est_kind"].value_counts().to_dict() if "est_kind" in census.columns else {}
    if kinds:
        listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        notes.append(
            f"baseline is the census est_us ({listed} rows); a changed row gets it / the stock/route ratio"
        )
    if assumed_gpu:
        notes.append(f"{assumed_gpu} census rows name no GPU: assumed to run on the table's GPU")
    if fused:
        notes.append(f"{fused} fused census rows are never overridden by a table")
    rows.sort(key=lambda r: (r.delta_us if r.delta_us is not None else 0.0, r.tensor or ""))
    return Prediction(
        census_rows=len(census),
        considered_rows=considered,
        fused_rows=fused,
        total_a_us=total_a,
        total_b_us=total_b,
        rows=rows,
        unpredicted=unpredicted,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# Output


def rule_line(r: Mapping[str, Any]) -> str:
    kind = tbl.rule_kind(r)
    return f"{tbl.rule_label(r)} -> {r['route']}" + (f" [{kind}]" if kind else "")


def _span(r: Mapping[str, Any]) -> str:
    kind = tbl.rule_kind(r)
    return f"M={r['M_lo']}..{r['M_hi']} {r['route']}" + (f" [{kind}]" if kind else "")


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


def format_prediction(p: Prediction, top: int = 20) -> list[str]:
    out = [
        f"census: {p.census_rows} rows, {len(p.rows)} affected, {p.unpredicted} without timing; "
        f"estimated matmul time {p.total_a_us:,.1f} us -> {p.total_b_us:,.1f} us "
        f"({p.delta_us:+,.1f} us, {p.delta_pct:+.2f}%)"
    ]
    for r in p.rows[:top]:
        what = f"{r.tensor or '?'} {r.src0_type} N={r.N} K={r.K} M={r.M} x{r.calls}"
        routes = f"{r.route_a or 'stock'} -> {r.route_b or 'stock'}"
        if r.delta_us is None:
            out.append(f"  {what}: {routes}: unpredicted ({r.basis})")
        else:
            out.append(
                f"  {what}: {routes}: {r.us_a:,.1f} -> {r.us_b:,.1f} us ({r.delta_us:+,.1f}; {r.basis})"
            )
    if len(p.rows) > top:
        out.append(f"  ... {len(p.rows) - top} more affected rows (--json lists all)")
    out.extend(f"  note: {n}" for n in p.notes)
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
            "rows": [asdict(r) for r in p.rows],
            "notes": p.notes,
        }
    return json.dumps(obj, sort_keys=True, indent=2, default=str) + "\n"


def check_census(df: pd.DataFrame, path: str) -> None:
    need = ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "calls", "est_us", "fused")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(path, f"not a census: missing columns {', '.join(missing)}")
