"""FLASH_ATTN_EXT cases for the harness, selected from an attention census (`census attention`).

A case is one census point: an attention shape key (:class:`registry.FlashAttnKey`: K/V types, head
dims, GQA ratio, KV-length bucket), Q columns M, and the exact KV length and head counts the trace
recorded (the harness builds the KV-cache views with llama.cpp's strides at that length). Its harness
object also carries the matmul-shaped fields every tuning row has (src0_type = K type, src1_type = V
type, N = KV length, K = D_K, B = Q heads) beside the attention key's own columns, so the rows go
through the same journal, tuning file and decision as the matmul cases.

Points whose flags the harness does not build (attention sinks, logit softcap, ALiBi, no mask, more
than one sequence) are left out and counted by reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from ggml_dispatch import registry
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner.select import DEFAULT_NMSE_MAX, DEFAULT_TRIALS, CompiledMmvq, Selection, Wanted

FA_ROUTES: Final[tuple[str, ...]] = tuple(r.value for r in registry.OPS[registry.Op.FLASH_ATTN_EXT].routes)
_KEY_INTS: Final = registry.FlashAttnKey.INT_FIELDS


@dataclass(frozen=True)
class AttnCase:
    shape: registry.FlashAttnKey
    M: int  # Q columns
    n_kv: int
    q_heads: int
    kv_heads: int
    est_us: float
    census: bool = True
    routes: tuple[str, ...] = FA_ROUTES
    trials: int = DEFAULT_TRIALS
    nmse_max: float = DEFAULT_NMSE_MAX

    @property
    def id(self) -> str:
        return f"{self.shape.id()}:M{self.M}:n_kv{self.n_kv}:H{self.q_heads}"

    def spec(self) -> dict[str, Any]:
        """The harness case object (ggml_dispatch/tuner/harness/flash_attn_ext.cpp reads the attention
        fields)."""
        s = self.shape
        return {
            "case": self.id,
            "op": s.op,
            "layout": s.layout,
            "k_type": s.k_type,
            "v_type": s.v_type,
            "D_K": s.D_K,
            "D_V": s.D_V,
            "gqa": s.gqa,
            "kv": s.kv,
            "q_heads": self.q_heads,
            "kv_heads": self.kv_heads,
            "M": self.M,
            "n_kv": self.n_kv,
            "src0_type": s.k_type,
            "src1_type": s.v_type,
            "N": self.n_kv,
            "K": s.D_K,
            "B": self.q_heads,
            "routes": list(self.routes),
            "trials": self.trials,
            "nmse_max": self.nmse_max,
        }


def _fa_config(text: str) -> bool:
    try:
        return registry.config_route(text) in FA_ROUTES
    except registry.ConfigError:
        return False


def is_attention_census(path: Path) -> bool:
    """Is this file an attention census (`census attention`) rather than a matmul census?"""
    from ggml_dispatch.census import attention

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet, missing: the matmul census reader gives the error
        return False
    return meta.get(b"ggml_dispatch_schema") == attention.ATTENTION_SCHEMA.encode()


def parse_routes(text: str) -> tuple[str, ...]:
    """--routes for attention cases: FlashAttention kernels, or configurations of them (a targeted sweep,
    with --configs routes): ``fa_vec,fa_mma/ncols1=1,ncols2=8,kv=shadow``. A comma followed by a
    ``name=value`` without a route continues the configuration before it."""
    parts: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if parts and "=" in token and "/" not in token and "/" in parts[-1]:
            parts[-1] += "," + token
        else:
            parts.append(token)
    bad = [r for r in parts if not _fa_config(r)]
    if bad or not parts:
        raise ValueError(
            f"attention routes must be among {', '.join(FA_ROUTES)} or configurations of them; got {text!r}"
        )
    return tuple(dict.fromkeys(registry.canonical_config(r) for r in parts))


def read_attention_table(path: Path) -> pa.Table:
    """An attention census' rows (every column `census attention` writes); else one InputError saying why."""
    from ggml_dispatch.census import attention

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a file that is not Parquet
        raise InputError(path, f"not a Parquet file: {e}") from None
    meta = table.schema.metadata or {}
    if meta.get(b"ggml_dispatch_schema") != attention.ATTENTION_SCHEMA.encode():
        raise InputError(path, f"not an attention census ({attention.ATTENTION_SCHEMA}; `census attention`)")
    missing = [c for c in attention.COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(path, f"columns missing: {', '.join(missing)}")
    return table


def read_attention_census(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = read_attention_table(path).to_pylist()
    return rows


def select_attention(
    rows: Sequence[Mapping[str, Any]],
    *,
    coverage: float = 1.0,
    routes: Sequence[str] = FA_ROUTES,
    trials: int = DEFAULT_TRIALS,
    nmse_max: float = DEFAULT_NMSE_MAX,
) -> Selection:
    """The census points to time, largest est_us first, until ``coverage`` of the tunable est_us.
    ``routes``: the candidates, FlashAttention routes or configurations of them (``fa_mma/ncols2=4``)."""
    bad = [r for r in routes if not _fa_config(r)]
    if bad:
        raise ValueError(f"not FlashAttention routes: {', '.join(bad)} (routes: {', '.join(FA_ROUTES)})")
    total = sum(float(r["est_us"]) for r in rows)
    skipped: dict[str, float] = {}
    skipped_rows: dict[str, int] = {}
    points: dict[tuple[Any, ...], AttnCase] = {}
    for r in rows:
        why = (
            "with attention sinks"
            if r["sinks"]
            else "with logit softcap"
            if r["softcap"]
            else "with ALiBi"
            if r["alibi"]
            else "without a mask"
            if not r["mask"]
            else "over several sequences"
            if int(r["seqs"]) != 1
            else None
        )
        if why is not None:
            skipped[why] = skipped.get(why, 0.0) + float(r["est_us"])
            skipped_rows[why] = skipped_rows.get(why, 0) + 1
            continue
        key = registry.FlashAttnKey(
            str(r["op"]),
            str(r["layout"]),
            str(r["k_type"]),
            str(r["v_type"]),
            *(int(r[f]) for f in _KEY_INTS),
        )
        ident = (key, int(r["M"]), int(r["n_kv"]), int(r["q_heads"]), int(r["kv_heads"]))
        have = points.get(ident)
        est = float(r["est_us"]) + (have.est_us if have else 0.0)
        points[ident] = AttnCase(
            key, *ident[1:], est_us=est, routes=tuple(routes), trials=trials, nmse_max=nmse_max
        )
    tunable = sum(c.est_us for c in points.values())
    cases: list[AttnCase] = []
    covered = 0.0
    for c in sorted(points.values(), key=lambda c: (-c.est_us, c.id)):
        if cases and tunable > 0 and covered / tunable >= coverage:
            break
        cases.append(c)
        covered += c.est_us
    left = tunable - covered
    if left > 0:
        skipped["beyond the coverage"] = left
        skipped_rows["beyond the coverage"] = len(points) - len(cases)
    return Selection(
        cases=cases,  # type: ignore[arg-type]  # AttnCase has Case's interface (id, spec, shape, M, census)
        total_est_us=total,
        tunable_est_us=tunable,
        covered_est_us=covered,
        skipped=skipped,
        skipped_rows=skipped_rows,
    )


# how tuner.candidates recognises and reads the census of this module's op
is_census = is_attention_census
read_census = read_attention_table


def candidates(
    census: pa.Table,
    wanted: Wanted,
    prior: Selection | None,
    *,
    path: str | Path = "<census>",
    mmvq: CompiledMmvq | None = None,
) -> Selection:
    """FLASH_ATTN_EXT's candidate generator (registry.OPS names this module; tuner.candidates calls it): the
    cases of an attention census, :func:`select_attention`. The only op of its census: no ``prior``."""
    if prior is not None:
        raise ValueError(
            "FLASH_ATTN_EXT's cases are the only ones of an attention census: no prior selection"
        )
    return select_attention(
        census.to_pylist(),
        coverage=wanted.coverage,
        routes=wanted.routes,
        trials=wanted.trials,
        nmse_max=wanted.nmse_max,
    )
