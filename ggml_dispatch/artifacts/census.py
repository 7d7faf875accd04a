"""The census Parquet file (``schema.CENSUS_SCHEMA``): its writer and the one reader every command uses.

One row per distinct key with exactly ``schema.CENSUS_COLUMNS``; the key-value metadata carries the
provenance (input and GGUF sha256s, trace headers with upstream commit and patch hash, the GPU specs
behind est_us, warnings).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ggml_dispatch import fileio, schema
from ggml_dispatch.artifacts import columns as col
from ggml_dispatch.artifacts import validators as v
from ggml_dispatch.errors import InputError

CENSUS_ARROW_SCHEMA: Final = v.arrow_schema(schema.CENSUS_COLUMNS)
COLUMNS: Final = {**schema.CENSUS_COLUMNS, **schema.CENSUS_OPTIONAL_COLUMNS}
FULL_ARROW_SCHEMA: Final = v.arrow_schema(COLUMNS)
INT64_MAX: Final = (1 << 63) - 1
WHAT: Final = "census"

_OPS: Final = frozenset(o.value for o in schema.Op)
_LAYOUTS: Final = frozenset(x.value for x in schema.Layout)
_REQUIRED: Final = ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "E", "U", "calls", "est_us")

Row = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Writing


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


def to_table(rows: Sequence[Mapping[str, Any]], source: str | Path) -> pa.Table:
    """Deterministic order: by GPU, then estimated time (largest first), then the key. ``source`` is
    the input the rows come from (named when a row does not fit)."""
    for r in rows:
        if r["calls"] > INT64_MAX:
            raise InputError(source, f"tensor {r['tensor']!r}: {r['calls']} calls do not fit in int64")

    # sorted by Arrow and built one column at a time: no per-row sort key, and no column of Python
    # values or unsorted copy longer than it takes to convert it (a census can have millions of rows)
    def column(c: str) -> pa.Array:
        return pa.array([r.get(c) for r in rows], type=FULL_ARROW_SCHEMA.field(c).type)

    # the optional columns only where a row has a value (a census without MUL_MAT_ID statistics keeps
    # exactly the required columns)
    optional = [c for c in schema.CENSUS_OPTIONAL_COLUMNS if any(r.get(c) is not None for r in rows)]
    out_schema = v.arrow_schema({**schema.CENSUS_COLUMNS, **{c: COLUMNS[c] for c in optional}})

    keys = pa.table({c: pc.fill_null(column(c), "") if c in _OR_EMPTY else column(c) for c, _ in _SORT_KEYS})
    order = pc.sort_indices(keys, sort_keys=_SORT_KEYS)
    del keys
    return pa.Table.from_arrays([column(c).take(order) for c in out_schema.names], schema=out_schema)


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


def write(
    rows: Sequence[Mapping[str, Any]], path: str | Path, meta: Mapping[str, str], source: str | Path
) -> pa.Table:
    table = to_table(rows, source)
    fileio.write_parquet(table, path, meta)
    return table


# --------------------------------------------------------------------------------------------
# Reading


def validate_table(table: pa.Table, path: str | Path) -> None:
    """Row checks: required values present, known op / layout / ggml types, positive dimensions,
    call counts >= 0 and est_us a finite time >= 0."""
    col.not_null(table, _REQUIRED, path)
    col.one_of(table, "op", _OPS, path, "op")
    col.one_of(table, "layout", _LAYOUTS, path, "layout")
    col.one_of(table, "src0_type", schema.GGML_TYPES, path, "ggml type")
    col.one_of(table, "src1_type", schema.GGML_TYPES, path, "ggml type")
    col.positive_ints(table, ("M", "N", "K", "B", "E", "U"), path)
    col.non_negative_ints(table, ("calls",), path)
    col.finite_at_least(
        table, "est_us", path, minimum=0.0, strict=False, message="est_us must be a time >= 0, got {value!r}"
    )


@dataclass(frozen=True)
class Census:
    """A validated census file."""

    path: Path
    table: pa.Table  # schema.CENSUS_COLUMNS then CENSUS_OPTIONAL_COLUMNS (null where absent), canonical types
    raw_meta: dict[str, str]  # the ggml_dispatch.* key-value metadata as stored

    @functools.cached_property
    def meta(self) -> dict[str, Any]:
        """The metadata with JSON values decoded."""
        return v.decode_meta(self.raw_meta)

    def rows(self) -> list[Row]:
        rows: list[Row] = self.table.to_pylist()
        return rows

    def frame(self) -> pd.DataFrame:
        df: pd.DataFrame = self.table.to_pandas()
        return df

    @functools.cached_property
    def sha256(self) -> str:
        return fileio.sha256_file(self.path)

    def details(self) -> list[tuple[str, str]]:
        """What a provenance section says about the file: (label, value) pairs."""
        rows = self.table.select(["gpu_name", "gpu_cc", "gpu_sm_count", "source", "est_kind"]).to_pylist()
        out = [
            ("GPU", distinct(rows, "gpu_name")),
            ("cc / SMs", distinct(rows, "gpu_cc", "gpu_sm_count")),
            ("source", distinct(rows, "source")),
            ("estimate", distinct(rows, "est_kind")),
            ("rows", str(self.table.num_rows)),
        ]
        return out + describe(
            self.raw_meta,
            (
                ("schema", schema.META_SCHEMA),
                ("tool version", schema.META_TOOL_VERSION),
                ("upstream commit", schema.META_UPSTREAM_COMMIT),
                ("patch hash", schema.META_PATCH_HASH),
                ("GGUF hashes", schema.META_GGUF_HASHES),
            ),
        )


def _column_names(path: Path) -> set[str]:
    """The column names a Parquet file holds (empty where it cannot be read: read_parquet says why)."""
    try:
        return set(pq.ParquetFile(path).schema_arrow.names)
    except (pa.ArrowException, OSError):
        return set()


def read(path: str | Path) -> Census:
    """The census file at ``path``, or one :class:`InputError` naming the file and the field."""
    p = Path(path)
    _names = _column_names(p)
    present = {c: k for c, k in COLUMNS.items() if c in _names or c in schema.CENSUS_COLUMNS}
    table, raw = v.read_parquet(p, schema.CENSUS_SCHEMA, present, WHAT)
    for name, kind in schema.CENSUS_OPTIONAL_COLUMNS.items():
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, v.ARROW_TYPES[kind]))
    table = table.select(list(COLUMNS))
    validate_table(table, p)
    return Census(p, table, raw)


# --------------------------------------------------------------------------------------------
# Shared by the provenance descriptions


def distinct(rows: Sequence[Mapping[str, Any]], *cols: str) -> str:
    values = sorted({" / ".join(str(r[c]) for c in cols) for r in rows if all(v.present(r[c]) for c in cols)})
    return ", ".join(values) if values else "(none)"


def describe(meta: Mapping[str, str], keys: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(label, meta[key]) for label, key in keys if meta.get(key)]
