"""One VRAM budget for every rule that trades memory for time: the weight cache and the KV shadow.

Two kinds of rule buy time with memory that lives as long as the process: ``cublas/weight=cached``
(a persistent f16 copy of a weight, :mod:`codegen.cache`) and ``kv=shadow`` (an f16 shadow of a quantized
KV cache, :mod:`codegen.kv_shadow`). ``codegen --vram-budget MiB`` decides them together:

1. the table without either (no cached or shadow row) is the *base*;
2. every candidate is priced: a weight shape (its census tensors' f16 copies; saved: census calls x
   (the base's time - the best cached time) per call, summed over its census M) and an attention key
   whose decision with the shadow picks a shadow configuration (one layer's K and V shadow at the KV
   length it was measured at, ``N x heads/gqa x (D_K + D_V) x 2`` bytes; saved: the base's time - the
   shadow rule's, one call per measured M: no census counts attention calls by KV depth);
3. all candidates, of both kinds, are ranked by measured time saved per MiB and admitted in that order
   while their bytes fit what is left of the budget; the first that does not fit ends the admission (so
   a larger budget admits everything a smaller one does);
4. the admitted keys' rules come from the decision with their memory rows, every other rule from the
   base (:func:`codegen.cache.merge`).

The table records the budget and each admitted rule's cost under ``vram``; the run-time caps the hook
applies come from it: the weight cache gets the bytes of its admitted copies and the KV shadow what is
left of the budget (a shadow's real size is the cache's, known only at run time), or either the whole
budget where the other kind admitted nothing. Budget 0 (or no budget) is the table without memory rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pandas as pd

from ggml_dispatch import registry
from ggml_dispatch.codegen import cache, decide, kv_shadow
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError

MIB: Final = 1 << 20
MAX_BUDGET_MIB: Final = 1 << 30  # 1 EiB: far above any GPU, small enough for int64 bytes
WEIGHT_CACHE: Final = "weight_cache"
KV_SHADOW: Final = "kv_shadow"
KINDS: Final = (WEIGHT_CACHE, KV_SHADOW)
RULE_TEXT: Final = (
    "memory-for-time rules (weight cache, KV shadow) ranked together by measured time saved per MiB and "
    "admitted greedily within the budget; weight cache: census calls x (base - cached) per call over the "
    "copies of the shape's census tensors; KV shadow: (base - shadow) per call, one call per measured M, "
    "over one layer's K and V shadow at the measured KV length"
)


@dataclass(frozen=True)
class Candidate:
    """One memory-for-time choice: a weight shape to cache, or an attention key to read a KV shadow."""

    kind: str  # WEIGHT_CACHE or KV_SHADOW
    key: Any  # the op's shape key (schema.ShapeKey interface)
    bytes: int
    saved_us: float
    points: int  # measured M that the saving was summed over
    tensors: int = 0  # weight cache: census tensors of the shape

    @property
    def saved_per_mib(self) -> float:
        return self.saved_us / (self.bytes / MIB) if self.bytes else 0.0

    def label(self) -> str:
        return f"{self.kind} {self.key.label()}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            **self.key.as_dict(),
            "bytes": self.bytes,
            "saved_us": self.saved_us,
            "saved_us_per_mib": self.saved_per_mib,
            "points": self.points,
            **({"tensors": self.tensors} if self.kind == WEIGHT_CACHE else {}),
        }


@dataclass(frozen=True)
class VramPlan:
    budget_mib: int
    admitted: tuple[Candidate, ...]
    skipped: tuple[tuple[Candidate, str], ...]
    cache_fallback: tuple[decide.Rule, ...] = ()
    # weight=cached rows were given without a census to weigh their savings: left out, not priced
    cache_unweighed: bool = False

    def of(self, kind: str) -> tuple[Candidate, ...]:
        return tuple(c for c in self.admitted if c.kind == kind)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.admitted)

    def kind_bytes(self, kind: str) -> int:
        return sum(c.bytes for c in self.of(kind))

    def caps_mib(self) -> tuple[int, int]:
        """The run-time caps (weight cache, KV shadow) in MiB; their sum never exceeds the budget."""
        has_cache, has_shadow = bool(self.of(WEIGHT_CACHE)), bool(self.of(KV_SHADOW))
        if not has_shadow:
            return (self.budget_mib if has_cache else 0), 0
        if not has_cache:
            return 0, self.budget_mib
        cache_mib = -(-self.kind_bytes(WEIGHT_CACHE) // MIB)
        return cache_mib, self.budget_mib - cache_mib

    def section(self) -> dict[str, Any]:
        """The table's ``vram`` field."""
        cache_mib, shadow_mib = self.caps_mib()
        admitted = sorted(self.admitted, key=_rank)
        return {
            "budget_mib": self.budget_mib,
            "budget_bytes": self.budget_mib * MIB,
            "planned_bytes": self.bytes,
            "rule": RULE_TEXT,
            "caps_mib": {WEIGHT_CACHE: cache_mib, KV_SHADOW: shadow_mib},
            "admitted": [c.as_dict() for c in admitted],
            "skipped": [{**c.as_dict(), "why": why} for c, why in self.skipped],
        }

    def cache_plan(self) -> cache.CachePlan | None:
        """The ``cache`` section's plan (its budget: the weight cache's cap), None without a cached shape."""
        chosen = self.of(WEIGHT_CACHE)
        if not chosen:
            return None
        shapes = tuple(
            sorted(
                (cache.CachedShape(c.key, c.tensors, c.bytes, c.saved_us, c.points) for c in chosen),
                key=lambda s: s.key,
            )
        )
        return cache.CachePlan(self.caps_mib()[0], shapes, (), self.cache_fallback)


def _rank(c: Candidate) -> tuple[Any, ...]:
    return (-c.saved_per_mib, -c.saved_us, KINDS.index(c.kind), c.key.codes())


def check_budget(budget_mib: Any, path: str | Path = "<tuning>") -> int | None:
    """The budget as an int in [0, MAX_BUDGET_MIB] MiB (None: not asked); anything else one clear error."""
    if budget_mib is None:
        return None
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int):
        raise InputError(
            path, f"VRAM budget must be an integer number of MiB, got {budget_mib!r}", field="--vram-budget"
        )
    if not 0 <= budget_mib <= MAX_BUDGET_MIB:
        raise InputError(
            path, f"VRAM budget must be in [0, {MAX_BUDGET_MIB}] MiB, got {budget_mib}", field="--vram-budget"
        )
    return budget_mib


def choose(candidates: Sequence[Candidate], budget_mib: int) -> VramPlan:
    """Greedy by saved time per MiB over both kinds (ties: the larger saving, the weight cache first, the
    key), never over budget: the longest prefix of that ranking that fits. It stops at the first rule that
    does not fit rather than reaching past it for a smaller one, so what a budget admits is also admitted
    by every larger budget (a rule never leaves the table because the budget grew)."""
    left = budget_mib * MIB
    admitted: list[Candidate] = []
    skipped: list[tuple[Candidate, str]] = []
    blocked: Candidate | None = None
    for c in sorted(candidates, key=_rank):
        if blocked is None and c.bytes <= left:
            admitted.append(c)
            left -= c.bytes
        elif blocked is None:
            blocked = c
            skipped.append((c, f"{c.bytes} bytes do not fit the {left} bytes left of the budget"))
        else:
            skipped.append((c, f"ranked below {blocked.label()}, which does not fit"))
    return VramPlan(budget_mib, tuple(admitted), tuple(skipped))


def _key_rows(df: pd.DataFrame, key: Any) -> pd.DataFrame:
    d = key.as_dict()
    mask = pd.Series(True, index=df.index)
    for f, val in d.items():
        if f in df.columns:
            mask &= df[f] == val
    return df[mask]


def shadow_bytes(rows: pd.DataFrame) -> int:
    """One layer's f16 K and V shadow at the longest KV length measured: N x KV heads x (D_K + D_V) x 2."""
    r = rows.iloc[0]
    heads = int(rows["B"].max())
    gqa = max(1, int(r["gqa"]))
    kv_heads = max(1, heads // gqa)
    return int(rows["N"].max()) * kv_heads * (int(r["D_K"]) + int(r["D_V"])) * cache.F16_BYTES


def shadow_candidates(
    df: pd.DataFrame,
    with_shadow: decide.Decisions,
    base_table: Mapping[str, Any],
    evals: Mapping[Any, Mapping[int, Mapping[registry.Config, decide.RouteEval]]],
    stock_us: Mapping[Any, Mapping[int, float]],
) -> list[Candidate]:
    """Every attention key whose decision with the shadow picks a shadow configuration somewhere."""
    gpu = tbl.table_gpu(base_table) if base_table["rules"] else None
    saved: dict[Any, float] = {}
    points: dict[Any, int] = {}
    for rule in with_shadow.rules:
        if rule.key.op != registry.Op.FLASH_ATTN_EXT.value or not kv_shadow.is_shadow(rule.route):
            continue
        for M in rule.measured_M:
            point = evals.get(rule.key, {}).get(M, {})
            ev = point.get(rule.route)
            if ev is None or ev.median_us is None:
                continue
            chosen = tbl.lookup_config(base_table, gpu, rule.key, M) if gpu is not None else None
            base_ev = point.get(chosen) if chosen is not None else None
            base_us = base_ev.median_us if base_ev is not None else stock_us.get(rule.key, {}).get(M)
            if base_us is None or not math.isfinite(base_us):
                continue
            saved[rule.key] = saved.get(rule.key, 0.0) + max(0.0, base_us - ev.median_us)
            points[rule.key] = points.get(rule.key, 0) + 1
    out = []
    for key in sorted(saved, key=lambda k: k.codes()):
        if saved[key] > 0:
            out.append(Candidate(KV_SHADOW, key, shadow_bytes(_key_rows(df, key)), saved[key], points[key]))
    return out


def _keys_mask(df: pd.DataFrame, among: pd.Series, keys: set[Any]) -> pd.Series:
    """Which rows of ``among`` (a mask of ``df``) measured one of ``keys``."""
    if not keys or not among.any():
        return pd.Series(False, index=df.index)
    rows = df[among]
    records: list[dict[str, Any]] = rows.to_dict("records")  # type: ignore[assignment]
    inside = pd.Series([registry.shape_key(r) in keys for r in records], index=rows.index, dtype=bool)
    return inside.reindex(df.index, fill_value=False).astype(bool)


def decide_with_budget(
    df: pd.DataFrame,
    census: pd.DataFrame | None,
    budget_mib: int | None,
    params: decide.Params,
    path: str | Path = "<tuning>",
) -> tuple[decide.Decisions, VramPlan | None, int]:
    """The decisions under one VRAM budget, the plan (None: no budget asked), and at how many attention
    points a shadow configuration left out (no positive budget) was measured faster than stock."""
    budget_mib = check_budget(budget_mib, path)
    df = decide.with_configs(df, path)  # each row's configuration parsed once, for every step below
    cached = cache.split_cached(df)[1] if len(df) else pd.Series([], dtype=bool)
    shadow = kv_shadow.shadow_rows(df)
    memory = cached | shadow if len(df) else cached
    base = decide.decide(df[~memory] if len(df) else df, params, path)
    if not budget_mib:
        left_out = kv_shadow.faster_points(df[shadow]) if shadow.any() else 0
        plan = None if budget_mib is None else VramPlan(0, (), ())
        return base, plan, left_out
    base_table = tbl.build_table(base, tuning_sha256="0" * 64)
    evals, stock = decide.evaluate(df, dataclasses.replace(params, resamples=0), path)
    candidates: list[Candidate] = []
    if cached.any() and census is not None:
        for s in cache.candidate_shapes(census, base_table, evals, stock):
            candidates.append(Candidate(WEIGHT_CACHE, s.key, s.bytes, s.saved_us, s.points, s.tensors))
    if shadow.any():
        # a shadow configuration serves attention only: its decision needs no other op's rows
        attention = df["op"] == registry.Op.FLASH_ATTN_EXT.value
        with_shadow = decide.decide(df[attention & ~cached], params, path)
        candidates += shadow_candidates(df, with_shadow, base_table, evals, stock)
    plan = dataclasses.replace(
        choose(candidates, budget_mib), cache_unweighed=bool(cached.any()) and census is None
    )
    if not plan.admitted:
        return base, plan, 0
    cache_keys = {c.key for c in plan.of(WEIGHT_CACHE)}
    shadow_keys = {c.key for c in plan.of(KV_SHADOW)}
    keys = cache_keys | shadow_keys
    # the admitted keys' rows, memory rows included: an exact rule (measured or interpolated) depends on
    # its own key's rows only, so this decision gives those keys the rules a decision of every row would
    of_keys = _keys_mask(df, pd.Series(True, index=df.index), keys)
    keep = of_keys & (~memory | _keys_mask(df, cached, cache_keys) | _keys_mask(df, shadow, shadow_keys))
    full = decide.decide(df[keep], params, path)
    fallback = tuple(r for r in base.rules if r.key in cache_keys)
    merged = cache.merge(base, full, keys)
    evals = {**base.evals, **full.evals}
    merged = dataclasses.replace(merged, evals=evals, n_rows=len(df), n_ok=decide.count_ok(df))
    return merged, dataclasses.replace(plan, cache_fallback=fallback), 0


def attach(table: dict[str, Any], plan: VramPlan | None) -> dict[str, Any]:
    """The table with its ``vram`` section, and the ``cache`` and ``kv_shadow`` sections whose caps the
    hook reads (the shallow shadow rules reading only a shadow made deeper: ``kv_shadow.attach``)."""
    if plan is None:
        return table
    table = tbl.validate(tbl.canonicalize({**table, "vram": plan.section()}))
    table = cache.attach(table, plan.cache_plan())
    return kv_shadow.attach(table, plan.caps_mib()[1])


def budget_bytes(table: Mapping[str, Any]) -> int:
    """The header's GGML_DISPATCH_TABLE_VRAM_BUDGET_BYTES: 0 without a vram section."""
    s = table.get("vram")
    return int(s["budget_bytes"]) if isinstance(s, Mapping) else 0
