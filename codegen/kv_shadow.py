"""The KV shadow under a budget: whether attention rules may read an f16 shadow of a quantized KV cache
(``fa_mma/kv=shadow``, ``fa_tile/kv=shadow``).

A shadow's bytes are the cache's (2 bytes per element of every quantized K/V cache tensor the rules'
nodes read), known only at run time from the context size, so the decision is per point like any other
candidate's and the budget is a run-time cap: ``codegen --kv-shadow-budget MiB`` keeps the shadow rows
and writes the budget into the table (``kv_shadow``) and the header
(``GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES``). Unset or 0, shadow rows are left out, which is exactly the
table without the shadow. A node whose shadow cannot be had (over the budget, under capture before it
exists, allocation failed) runs the same kernel and configuration with the per-call conversion.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pandas as pd

from codegen import decide
from codegen import table as tbl
from ggml_dispatch import registry, schema
from ggml_dispatch.errors import InputError

MIB: Final = 1 << 20
SHADOW_PARAM: Final = ("kv", "shadow")
MAX_BUDGET_MIB: Final = 1 << 30


def is_shadow(config: str) -> bool:
    """Does the configuration read the KV cache's f16 shadow?"""
    return SHADOW_PARAM in registry.Config.parse(config).params


def shadow_rows(df: pd.DataFrame) -> pd.Series:
    """A mask of the tuning rows that measured a shadow configuration."""
    if not len(df):
        return pd.Series([], dtype=bool)
    return df.apply(lambda r: is_shadow(decide.config_of(r)), axis=1).astype(bool)


def keep_rows(
    df: pd.DataFrame, budget_mib: int | None, path: str | Path = "<tuning>"
) -> tuple[pd.DataFrame, int]:
    """The rows the decision sees (shadow rows only under a positive budget), and at how many points a
    shadow configuration left out was measured faster than stock (median per-trial anchor_us/us above 1)."""
    if budget_mib is not None and not 0 <= budget_mib <= MAX_BUDGET_MIB:
        raise InputError(
            path, f"KV shadow budget must be in [0, {MAX_BUDGET_MIB}] MiB", field="--kv-shadow-budget"
        )
    if budget_mib:
        return df, 0
    mask = shadow_rows(df)
    if not mask.any():
        return df, 0
    return df[~mask], _faster_points(df[mask])


def _faster_points(rows: pd.DataFrame) -> int:
    rows = rows[rows["status"] == schema.TrialStatus.OK.value]
    if not len(rows):
        return 0
    point = [*registry.key_class("FLASH_ATTN_EXT").fields(), "M"]
    ratios = rows[point].assign(
        config=rows.apply(decide.config_of, axis=1), ratio=rows["anchor_us"] / rows["us"]
    )
    medians = ratios.groupby([*point, "config"], dropna=False)["ratio"].median()
    return int((medians.groupby(level=list(range(len(point))), dropna=False).max() > 1.0).sum())


def section(budget_mib: int) -> dict[str, Any]:
    """The table's ``kv_shadow`` field."""
    return {"budget_mib": budget_mib, "budget_bytes": budget_mib * MIB}


def attach(table: dict[str, Any], budget_mib: int | None) -> dict[str, Any]:
    """The table with its ``kv_shadow`` section where a rule reads a shadow (validated again)."""
    if not budget_mib or not any(is_shadow(tbl.rule_config(r)) for r in table["rules"]):
        return table
    return tbl.validate(tbl.canonicalize({**table, "kv_shadow": section(budget_mib)}))


def budget_bytes(table: Mapping[str, Any]) -> int:
    """The header's GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES: 0 without a kv_shadow section."""
    s = table.get("kv_shadow")
    return int(s["budget_bytes"]) if isinstance(s, Mapping) else 0
