"""Census rows -> Arrow table with exactly ``schema.CENSUS_COLUMNS``, plus provenance metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from census.aggregate import Row
from ggml_dispatch import fileio, schema
from ggml_dispatch.errors import InputError

_ARROW = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
_INT64_MAX = (1 << 63) - 1

CENSUS_ARROW_SCHEMA = pa.schema([pa.field(c, _ARROW[t]) for c, t in schema.CENSUS_COLUMNS.items()])


def _sort_key(r: Row) -> tuple[Any, ...]:
    return (
        r["gpu_name"],
        r["gpu_cc"],
        r["gpu_sm_count"],
        -r["est_us"],
        r["op"],
        r["layout"],
        r["src0_type"],
        r["M"],
        r["N"],
        r["K"],
        r["B"],
        r["tensor"],
        r["route"] or "",
        r["fused"] or "",
        r["reason"] or "",
    )


# _sort_key's order, for Arrow; the columns that sort a null as ""
_OR_EMPTY: Final = ("route", "fused", "reason")
_SORT_KEYS: Final = [
    ("gpu_name", "ascending"),
    ("gpu_cc", "ascending"),
    ("gpu_sm_count", "ascending"),
    ("est_us", "descending"),
    *((c, "ascending") for c in ("op", "layout", "src0_type", "M", "N", "K", "B", "tensor", *_OR_EMPTY)),
]


def to_table(rows: Sequence[Row]) -> pa.Table:
    """Deterministic order: by GPU, then estimated time (largest first), then the key."""
    for r in rows:
        if r["calls"] > _INT64_MAX:
            raise InputError(None, f"tensor {r['tensor']!r}: {r['calls']} calls do not fit in int64")

    # sorted by Arrow and built one column at a time: no per-row sort key, and no column of Python
    # values or unsorted copy longer than it takes to convert it (a census can have millions of rows)
    def column(c: str) -> pa.Array:
        return pa.array([r[c] for r in rows], type=CENSUS_ARROW_SCHEMA.field(c).type)

    keys = pa.table({c: pc.fill_null(column(c), "") if c in _OR_EMPTY else column(c) for c, _ in _SORT_KEYS})
    order = pc.sort_indices(keys, sort_keys=_SORT_KEYS)
    del keys
    return pa.Table.from_arrays(
        [column(c).take(order) for c in CENSUS_ARROW_SCHEMA.names], schema=CENSUS_ARROW_SCHEMA
    )


def metadata(
    *,
    inputs: Mapping[str, str],
    ggufs: Mapping[str, str],
    headers: Sequence[Mapping[str, Any]] = (),
    gpu_specs: Sequence[Mapping[str, Any]] = (),
    warnings: Sequence[str] = (),
    unseen: Mapping[str, Sequence[str]] | None = None,
    declared: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Provenance: schema, tool version, input and GGUF sha256s, trace headers (upstream commit, patch
    hash, devices), the GPU specs behind est_us, warnings."""
    commits = sorted({str(h["upstream_commit"]) for h in headers if h.get("upstream_commit")})
    patches = sorted({str(h["patch_hash"]) for h in headers if h.get("patch_hash")})
    extra: dict[str, Any] = {
        schema.META_INPUT_HASHES: dict(inputs),
        schema.META_GGUF_HASHES: dict(ggufs),
        schema.META_TRACE_HEADERS: list(headers),
        schema.META_UPSTREAM_COMMIT: ",".join(commits),
        schema.META_PATCH_HASH: ",".join(patches),
        schema.META_GPU_SPECS: list(gpu_specs),
        schema.META_WARNINGS: list(warnings),
        schema.META_GGUF_UNSEEN: dict(unseen or {}),
    }
    if declared is not None:
        extra[schema.META_DECLARED] = dict(declared)
    return fileio.base_metadata(schema.CENSUS_SCHEMA, **extra)


def write(rows: Sequence[Row], path: str | Path, meta: Mapping[str, str]) -> pa.Table:
    table = to_table(rows)
    fileio.write_parquet(table, path, meta)
    return table


def read(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """A census file and its decoded metadata; an :class:`InputError` if it is not one."""
    p = Path(path)
    try:
        table = pq.read_table(p)
    except FileNotFoundError:
        raise InputError(p, "no such file") from None
    except (OSError, pa.ArrowException) as e:
        raise InputError(p, f"not a readable Parquet file ({e})") from None
    raw = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if raw.get(schema.META_SCHEMA) != schema.CENSUS_SCHEMA:
        raise InputError(
            p,
            f"not a census file (schema {raw.get(schema.META_SCHEMA)!r}, expected {schema.CENSUS_SCHEMA!r})",
        )
    missing = [c for c in schema.CENSUS_COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(p, f"census file lacks columns {missing}")
    meta: dict[str, Any] = {}
    for k, v in raw.items():
        if not k.startswith(schema.META_PREFIX):
            continue
        try:
            meta[k] = json.loads(v) if v[:1] in ("{", "[") else v
        except ValueError:
            meta[k] = v
    return table.select(list(schema.CENSUS_COLUMNS)), meta
