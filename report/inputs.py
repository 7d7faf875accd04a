"""What a report reads: tuning, census and table files, validated, with what the provenance section says
about each. The only impure part of the report besides writing it: bad input becomes one
:class:`~ggml_dispatch.errors.InputError` naming the file (and row or field). The A/B records are read
by :mod:`report.ab`, the kernel timelines by :mod:`report.timeline`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from codegen import decide
from codegen import table as table_mod
from ggml_dispatch import fileio, schema
from ggml_dispatch.errors import InputError
from report import timeline

if TYPE_CHECKING:  # report.ab reads its files through InputFile, defined here
    from report.ab import AbRecord

ShapeKey = decide.ShapeKey

STATUS_KINDS: Final = ("ok", "ineligible", "wrong", "drifted", "failed")


@dataclass(frozen=True)
class InputFile:
    """What the provenance section says about one input file."""

    role: str
    name: str
    sha256: str
    details: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TableView:
    """A validated table.json (``codegen.table``), looked up as the runtime would on its own GPU."""

    data: Mapping[str, Any]

    @property
    def rules(self) -> list[dict[str, Any]]:
        return list(self.data["rules"])

    def route_at(self, key: ShapeKey, M: int) -> str | None:
        return table_mod.lookup(
            self.data,
            table_mod.table_gpu(self.data),
            key.op,
            key.layout,
            key.src0_type,
            key.src1_type,
            M,
            key.N,
            key.K,
            key.B,
        )

    def rules_for(self, key: ShapeKey) -> list[dict[str, Any]]:
        """The shape key's own rules, then the per-type defaults (N = K = 0) that can apply to it."""
        own = [r for r in self.rules if tuple(r[f] for f in table_mod.KEY_FIELDS) == _key_tuple(key)]
        default = _key_tuple(ShapeKey(key.op, key.layout, key.src0_type, key.src1_type, 0, 0, key.B))
        defaults = [r for r in self.rules if tuple(r[f] for f in table_mod.KEY_FIELDS) == default]
        return sorted(own, key=lambda r: int(r["M_lo"])) + sorted(defaults, key=lambda r: int(r["M_lo"]))


def _key_tuple(key: ShapeKey) -> tuple[Any, ...]:
    return (key.op, key.layout, key.src0_type, key.src1_type, key.N, key.K, key.B)


def is_default_rule(rule: Mapping[str, Any]) -> bool:
    return bool(rule["N"] == 0 and rule["K"] == 0)


@dataclass
class Inputs:
    tuning: pd.DataFrame
    files: list[InputFile]
    params: decide.Params = field(default_factory=decide.Params)
    census: list[dict[str, Any]] | None = None
    table: TableView | None = None
    ab: list[AbRecord] | None = None
    profile: timeline.Profile | None = None
    notes: str | None = None


def _type_ok(kind: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True  # a column of nulls only; the row checks decide whether nulls are allowed there
    if kind == "string":
        return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t))
    if kind == "int64":
        return bool(pa.types.is_integer(t))
    if kind == "float64":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "bool":
        return bool(pa.types.is_boolean(t))
    return True


def _read_parquet(
    path: Path, schema_name: str, columns: Mapping[str, str], what: str
) -> tuple[pa.Table, dict[str, str]]:
    if not path.is_file():
        raise InputError(path, f"no such {what} file")
    if path.stat().st_size == 0:
        raise InputError(path, f"empty file (expected a {what} Parquet file)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(path, f"not a readable Parquet file: {e}") from None
    meta: dict[str, str] = {}
    for k, v in (table.schema.metadata or {}).items():
        key = k.decode("utf-8", "replace")
        if key.startswith(schema.META_PREFIX):
            meta[key] = v.decode("utf-8", "replace")
    got = meta.get(schema.META_SCHEMA)
    if got is None:
        raise InputError(
            path,
            f"no '{schema.META_SCHEMA}' key-value metadata: not a {what} file written by ggml-dispatch",
            field=schema.META_SCHEMA,
        )
    if got != schema_name:
        raise InputError(
            path, f"schema is {got!r}, expected {schema_name!r} (a {what} file)", field=schema.META_SCHEMA
        )
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)}", field=missing[0])
    for col, kind in columns.items():
        t = table.schema.field(col).type
        if not _type_ok(kind, t):
            raise InputError(path, f"column has type {t}, expected {kind}", field=col)
    if table.num_rows == 0:
        raise InputError(path, f"no rows: an empty {what} file")
    return table.select(list(columns)), meta


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in df.to_dict("records")]


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _describe(meta: Mapping[str, str], keys: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(label, meta[key]) for label, key in keys if meta.get(key)]


def _distinct(rows: Iterable[Mapping[str, Any]], *cols: str) -> str:
    values = sorted({" / ".join(str(r[c]) for c in cols) for r in rows if all(present(r[c]) for c in cols)})
    return ", ".join(values) if values else "(none)"


def present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def status_kind(status: str) -> str | None:
    """``ok``/``ineligible``/``wrong``/``drifted``/``failed`` for a tuning status; None if invalid."""
    if status in ("ok", "ineligible", "wrong", "drifted"):
        return status
    if status.startswith(schema.FAILED_PREFIX):
        return "failed"
    return None


def load_tuning(path: Path, params: decide.Params) -> tuple[pd.DataFrame, InputFile]:
    """Read and validate tuning.parquet (the decision code's row checks, plus schema and status)."""
    table, meta = _read_parquet(path, schema.TUNING_SCHEMA, schema.TUNING_COLUMNS, "tuning")
    df = table.to_pandas()
    for i, status in enumerate(df["status"]):
        if not isinstance(status, str) or status_kind(status) is None:
            raise InputError(
                path,
                f"unknown status {status!r} (ok, ineligible, wrong, drifted or failed:<msg>)",
                field=f"row {i}: status",
            )
    decide.check_rows(df, path, params)
    rows = records(df)
    details = [
        ("GPU", _distinct(rows, "gpu_name")),
        ("cc / SMs", _distinct(rows, "gpu_cc", "gpu_sm_count")),
        ("GPU uuid", _distinct(rows, "gpu_uuid")),
        ("driver / CUDA / cuBLAS", _distinct(rows, "driver", "cuda_version", "cublas_version")),
        ("upstream commit", _distinct(rows, "upstream_commit")),
        ("patch hash", _distinct(rows, "patch_hash")),
        ("harness version", _distinct(rows, "harness_version")),
        ("source", _distinct(rows, "source")),
        ("rows", str(len(rows))),
    ]
    details += _describe(
        meta,
        (
            ("schema", schema.META_SCHEMA),
            ("tool version", schema.META_TOOL_VERSION),
            ("metadata upstream commit", schema.META_UPSTREAM_COMMIT),
            ("metadata patch hash", schema.META_PATCH_HASH),
        ),
    )
    return df, InputFile("tuning", path.name, fileio.sha256_file(path), tuple(details))


def load_census(path: Path) -> tuple[list[dict[str, Any]], InputFile]:
    table, meta = _read_parquet(path, schema.CENSUS_SCHEMA, schema.CENSUS_COLUMNS, "census")
    rows: list[dict[str, Any]] = table.to_pylist()
    ops = {o.value for o in schema.Op}
    layouts = {x.value for x in schema.Layout}
    for i, row in enumerate(rows):
        where = f"row {i}"
        for col in ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "calls", "est_us"):
            if row[col] is None:
                raise InputError(path, "null in a required column", field=f"{where}: {col}")
        if row["op"] not in ops:
            raise InputError(path, f"unknown op {row['op']!r}", field=f"{where}: op")
        if row["layout"] not in layouts:
            raise InputError(path, f"unknown layout {row['layout']!r}", field=f"{where}: layout")
        for col in ("M", "N", "K", "B"):
            if row[col] < 1:
                raise InputError(
                    path, f"must be a positive integer, got {row[col]!r}", field=f"{where}: {col}"
                )
        if not (finite(row["est_us"]) and row["est_us"] >= 0):
            raise InputError(
                path, f"est_us must be a time >= 0, got {row['est_us']!r}", field=f"{where}: est_us"
            )
    details = [
        ("GPU", _distinct(rows, "gpu_name")),
        ("cc / SMs", _distinct(rows, "gpu_cc", "gpu_sm_count")),
        ("source", _distinct(rows, "source")),
        ("estimate", _distinct(rows, "est_kind")),
        ("rows", str(len(rows))),
    ]
    details += _describe(
        meta,
        (
            ("schema", schema.META_SCHEMA),
            ("tool version", schema.META_TOOL_VERSION),
            ("upstream commit", schema.META_UPSTREAM_COMMIT),
            ("patch hash", schema.META_PATCH_HASH),
            ("GGUF hashes", schema.META_GGUF_HASHES),
        ),
    )
    return rows, InputFile("census", path.name, fileio.sha256_file(path), tuple(details))


def load_table(path: Path) -> tuple[TableView, InputFile]:
    """Read table.json through ``codegen.table`` (the same validation codegen and install use)."""
    if path.is_file() and not path.read_bytes().strip():
        raise InputError(path, "empty file (expected table.json)")
    data = table_mod.load(path)
    gpu = data["gpu"]
    prov = data.get("provenance", {})
    details = [
        ("GPU", f"{gpu['name']} (cc {gpu['cc']}, {gpu['sm_count']} SMs)"),
        ("upstream commit", str(data["upstream_commit"]) or "(none)"),
        ("rules", str(len(data["rules"]))),
        ("refused candidates", str(len(data.get("refused", [])))),
        ("table hash", table_mod.table_hash(data)),
        ("source", str(prov.get("source", "(none)"))),
    ]
    if isinstance(prov.get("decision"), dict):
        details.append(("decision", json.dumps(prov["decision"], sort_keys=True)))
    return TableView(data), InputFile("table", path.name, fileio.sha256_file(path), tuple(details))


def params_from_table(table: TableView | None, reference_margin: float | None = None) -> decide.Params:
    """Decision parameters the table was made with (so verdicts match it), else the defaults."""
    base = decide.Params(reference_margin=reference_margin)
    if table is None:
        return base
    dec = table.data.get("provenance", {}).get("decision")
    if not isinstance(dec, dict):
        return base
    known = table_mod.DECISION_PARAMS
    kwargs: dict[str, Any] = {known[k]: v for k, v in dec.items() if k in known and v is not None}
    if reference_margin is not None:
        kwargs["reference_margin"] = reference_margin
    return decide.Params(**kwargs)


def profile_file(path: Path, profile: timeline.Profile) -> InputFile:
    """What the provenance section says about a profile (a folder has no single hash)."""
    digest = fileio.sha256_file(path) if path.is_file() else "-"
    return InputFile("profile", path.name, digest, (("timelines", str(len(profile.rows))),))
