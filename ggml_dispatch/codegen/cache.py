"""The weight cache under a budget: which weights get a persistent f16 copy (``cublas/weight=cached``).

The copy costs memory (N x K x 2 bytes per weight tensor) and saves, at every call the census counts,
the measured difference between what the table without the cache runs there and the best cached
configuration. ``codegen.vram`` ranks weight shapes by measured time saved per MiB (census calls x
(uncached - cached) per call, summed over the shape's M) and takes them greedily while the bytes of
all their tensors fit the budget. ``codegen.vram`` ranks these candidates together with the KV shadow's
under one VRAM budget and decides twice: without any cached candidate (the table a budget of 0 gives,
exactly) and with the cached candidates of the chosen shapes; the chosen shapes' exact rules come from
the second decision (where it leaves an M range uncovered, the first decision's rules stay, :func:`merge`),
every other rule from the first, so no other shape, size class or per-type default can pick a cached
configuration. The table records the plan under ``cache`` and the header carries its cap
(``GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pandas as pd

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl

MIB: Final = 1 << 20
F16_BYTES: Final = 2
CACHE_PARAM: Final = ("weight", "cached")


def is_cached(config: registry.Config) -> bool:
    """Does the configuration read the cached copy of its weight?"""
    return config.has(*CACHE_PARAM)


@dataclass(frozen=True)
class CachedShape:
    key: schema.ShapeKey
    tensors: int  # distinct weight tensors of this shape in the census
    bytes: int  # their f16 copies
    saved_us: float  # census calls x measured (uncached - cached) per call, summed over M
    points: int  # census M with both measurements

    @property
    def saved_per_mib(self) -> float:
        return self.saved_us / (self.bytes / MIB) if self.bytes else 0.0


@dataclass(frozen=True)
class CachePlan:
    budget_mib: int
    chosen: tuple[CachedShape, ...]
    skipped: tuple[tuple[CachedShape, str], ...]  # candidates not taken, with why
    # the table without the cache's exact rules for the chosen shapes: what a node runs when its rule asks
    # for a copy that cannot be had (budget lowered at run time, allocation failed, under capture)
    fallback: tuple[decide.Rule, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.chosen)

    def section(self) -> dict[str, Any]:
        """The table's ``cache`` field."""
        return {
            "budget_mib": self.budget_mib,
            "budget_bytes": self.budget_mib * MIB,
            "bytes": self.bytes,
            "rule": "greedy by measured time saved per MiB (census calls x (uncached - cached) per call)",
            "tensors": [
                {
                    **s.key.as_dict(),
                    "tensors": s.tensors,
                    "bytes": s.bytes,
                    "saved_us": s.saved_us,
                    "saved_us_per_mib": s.saved_per_mib,
                    "points": s.points,
                }
                for s in self.chosen
            ],
            "fallback": self._fallback_rules(),
        }

    def _fallback_rules(self) -> list[dict[str, Any]]:
        if not self.fallback:
            return []
        rules: list[dict[str, Any]] = []
        for r in self.fallback:
            rules.append(
                {
                    **r.key.as_dict(),
                    "M_lo": r.M_lo,
                    "M_hi": r.M_hi,
                    **r.route.fields(),
                    "kind": r.kind,
                }
            )
        return sorted(rules, key=tbl.rule_sort_key)


def split_cached(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """The tuning rows and a mask of those that measured a cached configuration."""
    if not len(df):
        return df, pd.Series([], dtype=bool)
    mask = decide.configs(df).map(is_cached).astype(bool)
    return df, mask


def _weight_rows(census: pd.DataFrame) -> pd.DataFrame:
    c = census
    keep = (
        (c["op"] == schema.Op.MUL_MAT.value)
        & (c["layout"] == schema.Layout.WEIGHT.value)
        & c["fused"].isna()
        & (c["B"] == 1)
    )
    return c[keep]


def candidate_shapes(
    census: pd.DataFrame,
    base_table: Mapping[str, Any],
    evals: Mapping[schema.ShapeKey, Mapping[int, Mapping[registry.Config, decide.RouteEval]]],
    stock_us: Mapping[schema.ShapeKey, Mapping[int, float]],
) -> list[CachedShape]:
    """Every census weight shape whose cached configuration saves measured time somewhere."""
    gpu = tbl.table_gpu(base_table)
    rows = _weight_rows(census)
    tensors: dict[schema.ShapeKey, set[str]] = defaultdict(set)
    calls: dict[schema.ShapeKey, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    records: list[dict[str, Any]] = rows.to_dict("records")  # type: ignore[assignment]
    for r in records:
        key = schema.ShapeKey.of(r)
        tensors[key].add(str(r["tensor"]))
        calls[key][int(r["M"])] += int(r["calls"])
    out = []
    for key in sorted(tensors):
        saved, points = 0.0, 0
        for M, n in sorted(calls[key].items()):
            point = evals.get(key, {}).get(M, {})
            cached = [
                e.median_us
                for c, e in point.items()
                if is_cached(c) and e.median_us is not None and e.n_ok > 0
            ]
            if not cached:
                continue
            chosen = tbl.lookup_config(base_table, gpu, key, M) if base_table["rules"] else None
            ev = point.get(chosen) if chosen is not None else None
            uncached = ev.median_us if ev is not None else stock_us.get(key, {}).get(M)
            if uncached is None or not math.isfinite(uncached):
                continue
            points += 1
            saved += n * max(0.0, uncached - min(cached))
        if points and saved > 0:
            nbytes = len(tensors[key]) * key.N * key.K * F16_BYTES
            out.append(CachedShape(key, len(tensors[key]), nbytes, saved, points))
    return out


def _subtract(lo: int, hi: int, covered: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi] minus the union of the covered closed intervals."""
    parts = [(lo, hi)]
    for a, b in covered:
        nxt = []
        for x, y in parts:
            if b < x or a > y:
                nxt.append((x, y))
                continue
            if x < a:
                nxt.append((x, a - 1))
            if b < y:
                nxt.append((b + 1, y))
        parts = nxt
    return parts


def merge(base: decide.Decisions, full: decide.Decisions, chosen: set[schema.ShapeKey]) -> decide.Decisions:
    """Rules of ``full`` for the chosen shapes' exact keys (plus ``base``'s where those leave an M range
    uncovered), every other rule and refusal from ``base``."""
    rules = [r for r in base.rules if r.key not in chosen]
    for key in sorted(chosen, key=lambda k: k.codes()):
        mine = [r for r in full.rules if r.key == key]
        spans = [(r.M_lo, r.M_hi) for r in mine]
        rules += mine
        for r in base.rules:
            if r.key == key:
                for a, b in _subtract(r.M_lo, r.M_hi, spans):
                    inside = tuple(m for m in r.measured_M if a <= m <= b)
                    rules.append(dataclasses.replace(r, M_lo=a, M_hi=b, measured_M=inside or r.measured_M))
    refusals = [f for f in base.refusals if f.key not in chosen] + [
        f for f in full.refusals if f.key in chosen
    ]
    return dataclasses.replace(
        base,
        rules=sorted(rules, key=lambda r: (r.key.codes(), r.NK or (0, 0), r.M_lo)),
        refusals=sorted(refusals, key=lambda r: (r.key.codes(), r.M, decide._order(r.route), r.reason)),
        evals=full.evals,
        n_rows=full.n_rows,
        n_ok=full.n_ok,
    )


def attach(table: dict[str, Any], plan: CachePlan | None) -> dict[str, Any]:
    """The table with its ``cache`` section (validated again)."""
    if plan is None:
        return table
    return tbl.validate(tbl.canonicalize({**table, "cache": plan.section()}))


def budget_bytes(table: Mapping[str, Any]) -> int:
    """The header's GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES: 0 without a cache section."""
    cache = table.get("cache")
    return int(cache["budget_bytes"]) if isinstance(cache, Mapping) else 0


def cached_rule_keys(table: Mapping[str, Any]) -> set[schema.ShapeKey]:
    """Keys of the rules that pick a cached configuration."""
    return {schema.ShapeKey.of(r) for r in table["rules"] if is_cached(tbl.rule_typed_config(r))}
