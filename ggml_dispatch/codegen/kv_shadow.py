"""The KV shadow under a budget: whether attention rules may read an f16 shadow of a quantized KV cache
(``fa_mma/kv=shadow``, ``fa_tile/kv=shadow``).

A shadow's bytes are the cache's (2 bytes per element of every quantized K/V cache tensor the rules'
nodes read), known only at run time from the context size, so the decision is per point like any other
candidate's and the table's budget is a run-time cap: ``codegen --vram-budget MiB`` admits shadow rules
beside the weight cache's (:mod:`codegen.vram`) and writes the shadow's share of that budget into the
table (``kv_shadow``) and the header (``GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES``). Without a budget,
shadow rows are left out, which is exactly the table without the shadow. A node whose shadow cannot be
had (over the budget, under capture before it exists, allocation failed) runs the same kernel and
configuration with the per-call conversion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import pandas as pd

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl

MIB: Final = 1 << 20
SHADOW_PARAM: Final = ("kv", "shadow")
REUSE_PARAM: Final = ("kv", "reuse")


def is_shadow(config: registry.Config) -> bool:
    """Does the configuration read the KV cache's f16 shadow (making it, or where one was made)?"""
    return config.has(*SHADOW_PARAM) or config.has(*REUSE_PARAM)


def _makes_shadow(config: registry.Config) -> bool:
    return config.has(*SHADOW_PARAM)


def _attention_kind(rule: Mapping[str, Any]) -> tuple[Any, ...]:
    """An attention rule's key without its KV bucket (layout, K/V types, head dims, GQA ratio)."""
    fields = [f for f in registry.key_class("FLASH_ATTN_EXT").fields() if f != "kv"]
    return tuple(rule.get(f) for f in ("layout", *fields))


def reuse_below_makers(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shadow rules that may make the shadow, and those that only read one already made (``kv=reuse``).

    Once made, a shadow is kept equal to its cache: every step after it pays a mirror kernel per cache
    write (per layer, K and V), whether or not a rule reads the shadow at that KV length. A context fills
    from short to long, so a shadow made at a short KV length is upkeep for every depth up to the next
    rule that reads it. Per attention kind, the rules in the deepest unbroken run of power-of-two KV
    buckets that have shadow rules make it (``kv=shadow``); shallower ones (``kv=reuse``) read it where it
    exists, make it where the cache is long enough for one of those rules to apply in it (the hook:
    ``fattn_kv_reuse_resolve``), and leave stock's kernel where neither holds. (In the H100 A/Bs of
    evidence/h100-2026-12-06-s26 and -s27, rules at KV bucket 256, which llama-bench's warm-up pass
    reaches, made the shadow in every test, and at depth 4096, where no rule read it, tg32, pp3 and pp4 on
    a q8_0 cache ran 3-7% below stock.)"""
    buckets: dict[tuple[Any, ...], set[int]] = {}
    for r in rules:
        if r.get("op") == registry.Op.FLASH_ATTN_EXT.value and _makes_shadow(tbl.rule_typed_config(r)):
            buckets.setdefault(_attention_kind(r), set()).add(int(r["kv"]))
    floor: dict[tuple[Any, ...], int] = {}
    for kind, kvs in buckets.items():
        lo = max(kvs)
        while lo // 2 in kvs:
            lo //= 2
        floor[kind] = lo
    out = []
    for r in rules:
        is_attention = r.get("op") == registry.Op.FLASH_ATTN_EXT.value
        kind = _attention_kind(r)
        if (
            is_attention
            and kind in floor
            and int(r["kv"]) < floor[kind]
            and _makes_shadow(tbl.rule_typed_config(r))
        ):
            r = {**r, "config": str(tbl.rule_typed_config(r).with_param(*REUSE_PARAM))}
        out.append(r)
    return out


def shadow_rows(df: pd.DataFrame) -> pd.Series:
    """A mask of the tuning rows that measured a shadow configuration."""
    if not len(df):
        return pd.Series([], dtype=bool)
    return decide.configs(df).map(is_shadow).astype(bool)


def faster_points(rows: pd.DataFrame) -> int:
    rows = rows[rows["status"] == schema.TrialStatus.OK.value]
    if not len(rows):
        return 0
    point = [*registry.key_class("FLASH_ATTN_EXT").fields(), "M"]
    ratios = rows[point].assign(config=decide.configs(rows), ratio=rows["anchor_us"] / rows["us"])
    medians = ratios.groupby([*point, "config"], dropna=False)["ratio"].median()
    return int((medians.groupby(level=list(range(len(point))), dropna=False).max() > 1.0).sum())


def section(budget_mib: int) -> dict[str, Any]:
    """The table's ``kv_shadow`` field."""
    return {"budget_mib": budget_mib, "budget_bytes": budget_mib * MIB}


def attach(table: dict[str, Any], budget_mib: int | None) -> dict[str, Any]:
    """The table with its ``kv_shadow`` section where a rule reads a shadow, the shallow shadow rules
    reading only a shadow made deeper (``reuse_below_makers``); validated again."""
    if not budget_mib or not any(is_shadow(tbl.rule_typed_config(r)) for r in table["rules"]):
        return table
    rules = reuse_below_makers(list(table["rules"]))
    return tbl.validate(tbl.canonicalize({**table, "rules": rules, "kv_shadow": section(budget_mib)}))


def budget_bytes(table: Mapping[str, Any]) -> int:
    """The header's GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES: 0 without a kv_shadow section."""
    s = table.get("kv_shadow")
    return int(s["budget_bytes"]) if isinstance(s, Mapping) else 0
