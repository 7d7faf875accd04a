"""FLASH_ATTN_EXT census rows: one row per (GPU, FlashAttnKey, Q columns, KV length, flags, stock kernel).

The rows are keyed as the table keys attention (:class:`ggml_dispatch.registry.FlashAttnKey`: K/V types,
head dims, GQA ratio, KV-length bucket; ``M`` = Q columns) and keep the exact KV length and the other
trace fields beside the key. ``est_us`` = calls x a roofline estimate per call (measured stock time
where the trace carries one):

* bytes = K and V as stored (n_kv x kv_heads x head dim, ggml type size, per sequence) + Q (f32) + the
  f32 output, plus for a kernel that converts a quantized (or f32) K/V to f16 (TILE, MMA_F16) writing
  and reading the f16 copies;
* FLOPs = 2 x q_cols x q_heads x n_kv x (D_K + D_V) per sequence (KQ and KQV).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.artifacts.validators import ARROW_TYPES
from ggml_dispatch.census import estimate
from ggml_dispatch.census.trace import RouteKey, Tally
from ggml_dispatch.errors import InputError

ATTENTION_SCHEMA: Final = "ggml-dispatch-attention-census/1"

COLUMNS: Final[dict[str, pa.DataType]] = {
    "gpu_name": pa.string(),
    "gpu_cc": pa.int64(),
    "gpu_sm_count": pa.int64(),
    # the key's columns (registry.FlashAttnKey: op, layout, k_type, v_type, D_K, D_V, gqa, kv = the
    # KV-length bucket, registry.kv_bucket)
    **{name: ARROW_TYPES[kind] for name, kind in registry.FlashAttnKey.column_types().items()},
    "M": pa.int64(),  # Q columns
    "n_kv": pa.int64(),
    "q_heads": pa.int64(),
    "kv_heads": pa.int64(),
    "seqs": pa.int64(),
    "mask": pa.bool_(),
    "sinks": pa.bool_(),
    "softcap": pa.bool_(),
    "alibi": pa.bool_(),
    "stock_route": pa.string(),
    "route": pa.string(),
    "reason": pa.string(),
    "calls": pa.int64(),
    "est_us": pa.float64(),
    "est_kind": pa.string(),
}
ATTENTION_ARROW_SCHEMA: Final = pa.schema(list(COLUMNS.items()))

# Kernels that read K/V as f16 copies made on every call (fattn.cu: need_f16_K/V for TILE and MMA_F16).
CONVERTING_ROUTES: Final = frozenset({registry.Route.FA_TILE.value, registry.Route.FA_MMA.value})


@dataclass(frozen=True)
class AttnShape:
    """What the estimate needs of one FLASH_ATTN_EXT call."""

    k_type: str
    v_type: str
    d_k: int
    d_v: int
    q_heads: int
    kv_heads: int
    q_cols: int
    n_kv: int
    seqs: int = 1


def work_of(shape: AttnShape, route: str) -> estimate.Work:
    """Bytes and FLOPs of one call run by ``route`` (see the module text)."""
    tk, tv = schema.ggml_type(shape.k_type), schema.ggml_type(shape.v_type)
    kv_rows = shape.n_kv * shape.kv_heads * shape.seqs
    k_bytes = kv_rows * tk.row_bytes(shape.d_k)
    v_bytes = kv_rows * tv.row_bytes(shape.d_v)
    q_bytes = 4 * shape.d_k * shape.q_cols * shape.q_heads * shape.seqs
    out_bytes = 4 * shape.d_v * shape.q_cols * shape.q_heads * shape.seqs
    conv = 0
    if route in CONVERTING_ROUTES:
        # the f16 copy is written once and read by the kernel (f16 K/V are read in place)
        conv += 0 if shape.k_type == "f16" else 2 * 2 * kv_rows * shape.d_k
        conv += 0 if shape.v_type == "f16" else 2 * 2 * kv_rows * shape.d_v
    flops = 2.0 * shape.q_cols * shape.q_heads * shape.n_kv * (shape.d_k + shape.d_v) * shape.seqs
    return estimate.Work(bytes=float(k_bytes + v_bytes + q_bytes + out_bytes + conv), flops=flops)


def attention_rows(tallies: Mapping[RouteKey, Tally]) -> list[dict[str, Any]]:
    """One row per distinct attention key of the trace tallies (matmul keys are left out); rows whose
    fields agree add their calls and estimates. Sorted by est_us, largest first."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    specs: dict[schema.GpuId, estimate.GpuSpec] = {}
    for key, tally in tallies.items():
        a = key.attn
        if key.op != schema.Op.FLASH_ATTN_EXT or a is None:
            continue
        spec = specs.get(key.gpu) or specs.setdefault(key.gpu, estimate.spec_for(key.gpu))
        shape = AttnShape(a.k_type, a.v_type, a.d_k, a.d_v, a.q_heads, a.kv_heads, a.q_cols, a.n_kv, a.seqs)
        if tally.timed_calls > 0 and key.route == key.stock_route:
            est, kind = tally.calls * tally.time_us / tally.timed_calls, "measured"
        else:
            est, kind = tally.calls * estimate.per_call_us(spec, work_of(shape, key.stock_route)), "roofline"
        row: dict[str, Any] = {
            "gpu_name": key.gpu.name,
            "gpu_cc": key.gpu.cc,
            "gpu_sm_count": key.gpu.sm_count,
            "op": key.op,
            "layout": key.layout,
            "k_type": a.k_type,
            "v_type": a.v_type,
            "D_K": a.d_k,
            "D_V": a.d_v,
            "gqa": a.q_heads // a.kv_heads,
            "kv": registry.kv_bucket(a.n_kv),
            "M": a.q_cols,
            "n_kv": a.n_kv,
            "q_heads": a.q_heads,
            "kv_heads": a.kv_heads,
            "seqs": a.seqs,
            "mask": a.mask,
            "sinks": a.sinks,
            "softcap": a.softcap != 0.0,
            "alibi": a.max_bias != 0.0,
            "stock_route": key.stock_route,
            "route": key.route,
            "reason": key.reason,
            "calls": tally.calls,
            "est_us": est,
            "est_kind": kind,
        }
        ident = tuple(v for c, v in row.items() if c not in ("calls", "est_us", "est_kind"))
        have = merged.get(ident)
        if have is None:
            merged[ident] = row
        else:
            have["calls"] += row["calls"]
            have["est_us"] += row["est_us"]
            if have["est_kind"] != row["est_kind"]:
                have["est_kind"] = "mixed"
    return sorted(merged.values(), key=lambda r: (-r["est_us"], r["M"], r["n_kv"]))


# llama.cpp pads the KV length a FlashAttention node sees to this many cells (FATTN_KQ_STRIDE)
KV_PAD: Final = 256

# the fields that make one attention point apart from its KV length (and what was counted of it)
_POINT_FIELDS: Final = (
    "gpu_name", "op", "layout", "k_type", "v_type", "D_K", "D_V", "gqa", "M", "seqs", "mask", "sinks",
    "softcap", "alibi",
)  # fmt: skip


def keep_points(
    rows: Sequence[dict[str, Any]], max_m: int, fill_kv: Sequence[int] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The decode and verify points (at most ``max_m`` Q columns) and, for each KV length L of
    ``fill_kv``, the last point of a depth-L KV fill: per attention point above ``max_m`` Q columns (the
    fill runs at the ubatch, one point per KV length on the way), the one with the largest KV length at
    most L rounded up to :data:`KV_PAD`. Returns (decode and verify rows, fill rows), each in the rows'
    order."""
    small = [r for r in rows if r["M"] <= max_m]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["M"] > max_m:
            groups.setdefault(tuple(r[f] for f in _POINT_FIELDS), []).append(r)
    chosen: set[int] = set()
    for length in fill_kv:
        top = -(-int(length) // KV_PAD) * KV_PAD
        for group in groups.values():
            below = [r["n_kv"] for r in group if r["n_kv"] <= top]
            if below:
                chosen.update(id(r) for r in group if r["n_kv"] == max(below))
    return small, [r for r in rows if id(r) in chosen]


def key_of(row: Mapping[str, Any]) -> registry.FlashAttnKey:
    """The table's shape key of an attention census row."""
    key = registry.shape_key(row)
    assert isinstance(key, registry.FlashAttnKey)
    return key


def write(rows: list[dict[str, Any]], path: Path, inputs: Mapping[str, str], source: Path) -> pa.Table:
    """The attention census Parquet file (atomic; refuses an empty row list)."""
    if not rows:
        raise InputError(source, "no FLASH_ATTN_EXT route records in the input: nothing to census")
    table = pa.Table.from_pylist(rows, schema=ATTENTION_ARROW_SCHEMA)
    meta = {b"ggml_dispatch_schema": ATTENTION_SCHEMA.encode(), b"inputs": repr(dict(inputs)).encode()}
    table = table.replace_schema_metadata(meta)
    with fileio.atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return table
