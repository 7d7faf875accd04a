"""The tuning Parquet file (``schema.TUNING_SCHEMA``): its writer and the one reader every command uses.

One row per (shape, configuration, trial) with exactly ``schema.TUNING_COLUMNS`` and the optional
``schema.TUNING_OPTIONAL_COLUMNS`` (read as null where an older file lacks them). A row's ``status`` is one of
``schema.TrialStatus`` or ``failed:<msg>``; an ``ok`` row carries a finite positive ``us`` and, where
stock was measured, a finite positive ``anchor_us``; no row holds NaN or infinity (null: not measured),
and no trial comes twice. The provenance columns (GPU identity, driver,
CUDA and cuBLAS versions, upstream commit, patch hash, harness version) are per row; a file (or a set
of files) from several GPUs or upstream commits is refused unless the caller allows mixing.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.artifacts import columns as col
from ggml_dispatch.artifacts import validators as v
from ggml_dispatch.artifacts.census import describe, distinct
from ggml_dispatch.errors import InputError

COLUMNS: Final = {**schema.TUNING_COLUMNS, **schema.TUNING_OPTIONAL_COLUMNS}
TUNING_ARROW_SCHEMA: Final = v.arrow_schema(COLUMNS)
WHAT: Final = "tuning"
META_TUNER: Final = schema.META_PREFIX + "tuner"  # sweep settings (JSON)
META_TUNER_CASES: Final = schema.META_PREFIX + "tuner_cases"  # per-case details (JSON)
TABLE_ROUTES: Final = frozenset(r.value for r in schema.Route)
SOURCES: Final = frozenset({schema.Source.MEASURED.value, schema.Source.REFERENCE.value})
# What identifies one trial row: the shape, M, route, configuration and trial, measured on one GPU at
# one commit. The shape is the matmul columns and every op's own columns (schema.TUNING_OP_COLUMNS: an
# op's key and what else shapes its case, e.g. MUL_MAT_ID's routing kind, bucket and experts per token:
# one shape and M measured under several routings are several trials).
ROW_KEY: Final = (
    *("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "route", "config", "trial"),
    *schema.TUNING_OP_COLUMNS,
)
# The physical GPU (uuid) is part of a trial's identity: two sweeps on two GPUs each number their trials
# from 0, and their rows at one point are distinct trials, never one counted twice.
ROW_IDENTITY: Final = ("gpu_name", "gpu_cc", "gpu_sm_count", "gpu_uuid", "upstream_commit")

_OPS: Final = frozenset(o.value for o in schema.Op)
_LAYOUTS: Final = frozenset(x.value for x in schema.Layout)
_REQUIRED: Final = ("op", "layout", "src0_type", "src1_type", "route", "M", "N", "K", "B")


def to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in COLUMNS}
    return pa.Table.from_pydict(cols, schema=TUNING_ARROW_SCHEMA)


def with_optional_columns(table: pa.Table) -> pa.Table:
    """The table with every optional column: one an older file lacks is all null (rows of plain routes)."""
    for name, kind in schema.TUNING_OPTIONAL_COLUMNS.items():
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, v.ARROW_TYPES[kind]))
    return table.select(list(COLUMNS))


def pq_column_names(path: Path) -> set[str]:
    """The column names a Parquet file holds (empty where it cannot be read: the reader says why)."""
    try:
        return set(pq.ParquetFile(path).schema_arrow.names)
    except (pa.ArrowException, OSError):
        return set()


def write(table: pa.Table, path: str | Path, meta: Mapping[str, str]) -> None:
    fileio.write_parquet(table, path, meta)


# --------------------------------------------------------------------------------------------
# Row checks


def status_ok_mask(table: pa.Table) -> pa.ChunkedArray:
    return pc.fill_null(pc.equal(table.column("status"), schema.TrialStatus.OK.value), False)


def _check_status(table: pa.Table, path: str | Path) -> None:
    s = table.column("status")
    known = pc.is_in(s, value_set=pa.array(sorted(schema.TRIAL_STATUSES), pa.string()))
    failed = pc.and_(
        pc.starts_with(s, schema.FAILED_PREFIX), pc.greater(pc.utf8_length(s), len(schema.FAILED_PREFIX))
    )
    good = pc.fill_null(pc.or_(known, failed), False)
    bad = pc.index(good, False).as_py()
    if bad is not None and bad >= 0:
        value = s[bad].as_py()
        raise InputError(path, f"unknown status {value!r} ({v.STATUS_HELP})", field=f"row {bad}: status")


def _check_text(table: pa.Table, name: str, path: str | Path, message: str) -> None:
    c = table.column(name)
    bad = pc.or_kleene(pc.is_null(c), pc.equal(c, ""))
    i = pc.index(pc.fill_null(bad, True), True).as_py()
    if i is not None and i >= 0:
        raise InputError(path, message, field=f"row {i}: {name}")


def _check_expert_rows(table: pa.Table, path: str | Path) -> None:
    """MUL_MAT_ID rows carry E >= 1 and U >= 1; a measured routing bucket is one of the registry's."""
    moe = pc.fill_null(pc.equal(table.column("op"), schema.Op.MUL_MAT_ID.value), False)
    if not pc.any(moe).as_py():
        return
    sub = table.filter(moe)
    rows = pc.indices_nonzero(moe)
    for name in ("E", "U"):
        c = sub.column(name)
        bad = pc.fill_null(pc.or_kleene(pc.is_null(c), pc.less(c, 1)), True)
        i = pc.index(bad, True).as_py()
        if i is not None and i >= 0:
            raise InputError(
                path,
                f"MUL_MAT_ID rows need a positive integer {name}, got {c[i].as_py()!r}",
                field=f"row {rows[i].as_py()}: {name}",
            )
    buckets = pa.array(sorted(registry.ROUTING_BUCKETS), pa.int64())
    c = sub.column("routing")
    bad = pc.and_(pc.is_valid(c), pc.invert(pc.is_in(c, value_set=buckets)))  # null: not measured
    i = pc.index(bad, True).as_py()
    if i is not None and i >= 0:
        raise InputError(
            path,
            f"routing bucket {c[i].as_py()!r} is not one of {sorted(registry.ROUTING_BUCKETS)}",
            field=f"row {rows[i].as_py()}: routing",
        )


def _check_upstream(table: pa.Table, path: str | Path) -> None:
    """Every row's upstream commit is an upstream id (``schema.check_upstream_id``), as a table's is."""
    c = table.column("upstream_commit")
    for value in pc.unique(c).to_pylist():
        try:
            schema.check_upstream_id(value)
        except ValueError as e:
            i = pc.index(c, value).as_py()
            raise InputError(path, str(e), field=f"row {i}: upstream_commit") from None


def _check_duplicates(table: pa.Table, path: str | Path) -> None:
    """One row per trial (:func:`row_keys`): a trial counted twice would narrow its confidence interval."""
    names = [*ROW_IDENTITY, *ROW_KEY]
    counts = table.select(names).group_by(names, use_threads=False).aggregate([([], "count_all")])
    if counts.num_rows == table.num_rows:
        return
    first: dict[tuple[Any, ...], int] = {}
    for i, key in enumerate(row_keys(table)):
        if key in first:
            raise InputError(
                path,
                f"repeats row {first[key]} (same GPU and uuid, upstream commit, shape, configuration and "
                "trial)",
                field=f"row {i}: trial",
            )
        first[key] = i


def validate_table(table: pa.Table, path: str | Path) -> None:
    """Row checks, each naming the first bad row: known op / layout / ggml types / table route /
    source / status, positive dimensions, GPU cc and SM count >= 0 (0: the CPU backend), a GPU name,
    an upstream id (``schema.check_upstream_id``) and a harness version, a finite positive time (and
    stock anchor, where there is one) in every ok row, no NaN or infinite value in any row, and no
    trial twice."""
    col.not_null(table, _REQUIRED, path)
    col.one_of(table, "op", _OPS, path, "op")
    col.one_of(table, "layout", _LAYOUTS, path, "layout")
    col.one_of(table, "src0_type", schema.GGML_TYPES, path, "ggml type")
    col.one_of(table, "src1_type", schema.GGML_TYPES, path, "ggml type")
    col.one_of(table, "route", TABLE_ROUTES, path, "route")
    col.positive_ints(table, ("M", "N", "K", "B"), path)
    # 0 = no GPU: trials of ggml's CPU backend (the harness runs there too); a table needs a GPU
    col.non_negative_ints(table, ("gpu_cc", "gpu_sm_count"), path)
    col.non_negative_ints(table, ("trial",), path)
    _check_text(table, "gpu_name", path, "empty GPU name")
    nul = pc.fill_null(pc.match_substring(table.column("gpu_name"), "\0"), False)
    i = pc.index(nul, True).as_py()
    if i is not None and i >= 0:
        raise InputError(path, "GPU name contains a NUL byte", field=f"row {i}: gpu_name")
    _check_text(table, "upstream_commit", path, "empty upstream commit")
    _check_upstream(table, path)
    _check_text(table, "harness_version", path, "empty harness version (what measured the row?)")
    src = table.column("source")
    bad_src = pc.fill_null(pc.invert(pc.is_in(src, value_set=pa.array(sorted(SOURCES), pa.string()))), True)
    i = pc.index(bad_src, True).as_py()
    if i is not None and i >= 0:
        raise InputError(
            path, f"source must be measured or reference, got {src[i].as_py()!r}", field=f"row {i}: source"
        )
    _check_status(table, path)
    _check_expert_rows(table, path)
    ok = status_ok_mask(table)
    col.finite_at_least(
        table, "us", path, minimum=0.0, strict=True, where=ok, message="ok trial with time {value!r}"
    )
    col.finite_at_least(
        table,
        "anchor_us",
        path,
        minimum=0.0,
        strict=True,
        where=ok,
        nullable=True,
        message="ok trial with stock anchor {value!r}",
    )
    # any row: a measured value is finite (null says it was not measured; the tuner writes null, never NaN)
    for name in ("us", "anchor_us", "nmse"):
        col.finite_at_least(
            table,
            name,
            path,
            minimum=-math.inf,
            strict=False,
            nullable=True,
            message="not a finite number: {value!r} (null says not measured)",
        )
    _check_duplicates(table, path)


# --------------------------------------------------------------------------------------------
# Identity and mixing


@dataclass(frozen=True)
class Provenance:
    """Who measured the rows: GPU identities and upstream commits with their row counts, and the
    distinct values of the other provenance columns."""

    gpus: tuple[tuple[schema.GpuId, int], ...]
    upstream_commits: tuple[tuple[str, int], ...]
    sources: tuple[str, ...]
    patch_hashes: tuple[str, ...] = ()
    harness_versions: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    cuda_versions: tuple[str, ...] = ()
    cublas_versions: tuple[str, ...] = ()

    @property
    def gpu(self) -> schema.GpuId:
        """The GPU that contributed most rows (the one a mixed table is stamped with)."""
        return sorted(self.gpus, key=lambda kv: (-kv[1], kv[0]))[0][0]

    @property
    def upstream_commit(self) -> str:
        return sorted(self.upstream_commits, key=lambda kv: (-kv[1], kv[0]))[0][0]


def _values(table: pa.Table, name: str) -> tuple[str, ...]:
    return tuple(sorted({x for x in table.column(name).to_pylist() if v.present(x)}))


def provenance(table: pa.Table, path: str | Path, *, allow_mixed: bool) -> Provenance:
    """The rows' provenance; refuses several GPUs or upstream commits unless ``allow_mixed``."""
    gpus = Counter(
        schema.GpuId(str(n), int(c), int(s))
        for n, c, s in zip(
            table.column("gpu_name").to_pylist(),
            table.column("gpu_cc").to_pylist(),
            table.column("gpu_sm_count").to_pylist(),
            strict=True,
        )
    )
    commits = Counter(str(c) for c in table.column("upstream_commit").to_pylist())
    v.check_one_gpu({g: f"{n} rows" for g, n in gpus.items()}, path, allow_mixed=allow_mixed)
    v.check_one_commit({c: f"{n} rows" for c, n in commits.items()}, path, allow_mixed=allow_mixed)
    return Provenance(
        gpus=tuple(sorted(gpus.items())),
        upstream_commits=tuple(sorted(commits.items())),
        sources=_values(table, "source"),
        patch_hashes=_values(table, "patch_hash"),
        harness_versions=_values(table, "harness_version"),
        drivers=_values(table, "driver"),
        cuda_versions=_values(table, "cuda_version"),
        cublas_versions=_values(table, "cublas_version"),
    )


def row_keys(table: pa.Table) -> list[tuple[Any, ...]]:
    """Each row's (GPU, commit, shape, M, route, trial): two rows with one key are the same trial."""
    names = (*ROW_IDENTITY, *ROW_KEY)
    cols = [table.column(n).to_pylist() for n in names]
    return list(zip(*cols, strict=True))


# --------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class Tuning:
    """A validated tuning file."""

    path: Path
    table: pa.Table  # exactly COLUMNS (required and optional), canonical types
    raw_meta: dict[str, str]
    provenance: Provenance
    cases: dict[str, Any] = field(default_factory=dict)  # ggml_dispatch.tuner_cases
    settings: Any = None  # ggml_dispatch.tuner

    @functools.cached_property
    def meta(self) -> dict[str, Any]:
        return v.decode_meta(self.raw_meta)

    def frame(self) -> pd.DataFrame:
        df: pd.DataFrame = self.table.to_pandas()
        return df

    @functools.cached_property
    def sha256(self) -> str:
        return fileio.sha256_file(self.path)

    def details(self) -> list[tuple[str, str]]:
        """What a provenance section says about the file: (label, value) pairs."""
        rows = self.table.select(
            [
                "gpu_name",
                "gpu_cc",
                "gpu_sm_count",
                "gpu_uuid",
                "driver",
                "cuda_version",
                "cublas_version",
                "upstream_commit",
                "patch_hash",
                "harness_version",
                "source",
            ]
        ).to_pylist()
        out = [
            ("GPU", distinct(rows, "gpu_name")),
            ("cc / SMs", distinct(rows, "gpu_cc", "gpu_sm_count")),
            ("GPU uuid", distinct(rows, "gpu_uuid")),
            ("driver / CUDA / cuBLAS", distinct(rows, "driver", "cuda_version", "cublas_version")),
            ("upstream commit", distinct(rows, "upstream_commit")),
            ("patch hash", distinct(rows, "patch_hash")),
            ("harness version", distinct(rows, "harness_version")),
            ("source", distinct(rows, "source")),
            ("rows", str(self.table.num_rows)),
        ]
        return out + describe(
            self.raw_meta,
            (
                ("schema", schema.META_SCHEMA),
                ("tool version", schema.META_TOOL_VERSION),
                ("metadata upstream commit", schema.META_UPSTREAM_COMMIT),
                ("metadata patch hash", schema.META_PATCH_HASH),
            ),
        )


def read(path: str | Path, *, allow_mixed: bool = False) -> Tuning:
    """The tuning file at ``path``, or one :class:`InputError` naming the file and the field."""
    p = Path(path)
    file_columns = pq_column_names(p)
    present = {n: k for n, k in COLUMNS.items() if n in schema.TUNING_COLUMNS or n in file_columns}
    table, raw = v.read_parquet(p, schema.TUNING_SCHEMA, present, WHAT)
    table = with_optional_columns(table)
    validate_table(table, p)
    prov = provenance(table, p, allow_mixed=allow_mixed)
    cases = v.meta_json(raw, META_TUNER_CASES, {}, p)
    if not isinstance(cases, dict):
        raise InputError(p, "must be a JSON object", field=META_TUNER_CASES)
    settings = v.meta_json(raw, META_TUNER, None, p)
    return Tuning(p, table, raw, prov, cases, settings)


def from_frame(df: pd.DataFrame, path: str | Path) -> pa.Table:
    """Tuning rows held in a DataFrame (NaN is null there) as the canonical Arrow table, checked like
    a file's rows."""
    missing = [c for c in schema.TUNING_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)}", field=missing[0])
    if df.empty:
        raise InputError(path, f"no rows: an empty {WHAT} file")
    optional = [c for c in schema.TUNING_OPTIONAL_COLUMNS if c in df.columns]
    try:
        table = pa.Table.from_pandas(df[list(schema.TUNING_COLUMNS) + optional], preserve_index=False)
    except (pa.ArrowException, ValueError, TypeError) as e:
        raise InputError(path, f"a column does not convert to Arrow: {e}") from None
    table = v.cast_columns(table, {n: k for n, k in COLUMNS.items() if n in table.column_names}, path)
    table = with_optional_columns(table)
    validate_table(table, path)
    return table


def concat(tables: Iterable[pa.Table]) -> pa.Table:
    ts = list(tables)
    return pa.concat_tables(ts) if ts else to_table([])


@dataclass(frozen=True)
class TuningSet:
    """Several validated tuning files read as one: the rows of all of them, checked across files."""

    files: tuple[Tuning, ...]
    table: pa.Table
    provenance: Provenance

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(t.path for t in self.files)

    def frame(self) -> pd.DataFrame:
        df: pd.DataFrame = self.table.to_pandas()
        return df

    @property
    def where(self) -> str:
        """How a message names the inputs: the one path, or the paths joined."""
        return str(self.files[0].path) if len(self.files) == 1 else " + ".join(str(p) for p in self.paths)


def read_many(paths: Sequence[str | Path], *, allow_mixed: bool = False) -> TuningSet:
    """Tuning files read as one set: each file by :func:`read`; across files the rows must come from one
    GPU (name, cc, SM count) and one upstream commit unless ``allow_mixed``, no trial may come in two
    files, and no file may be given twice. One :class:`InputError` naming the files otherwise."""
    if not paths:
        raise InputError("<tuning>", "no tuning file given")
    seen: dict[Path, str | Path] = {}
    for p in paths:
        r = Path(p).resolve()
        if r in seen:
            raise InputError(p, f"given twice (also as {seen[r]})")
        seen[r] = p
    files = tuple(read(p, allow_mixed=allow_mixed) for p in paths)
    if len(files) == 1:
        return TuningSet(files, files[0].table, files[0].provenance)
    table = pa.concat_tables([t.table for t in files])
    gpus: dict[schema.GpuId, list[str]] = {}
    commits: dict[str, list[str]] = {}
    for t in files:
        for g, _ in t.provenance.gpus:
            gpus.setdefault(g, []).append(str(t.path))
        for c, _ in t.provenance.upstream_commits:
            commits.setdefault(c, []).append(str(t.path))
    where = " + ".join(str(t.path) for t in files)
    v.check_one_gpu({g: ", ".join(ps) for g, ps in gpus.items()}, where, allow_mixed=allow_mixed)
    v.check_one_commit({c: ", ".join(ps) for c, ps in commits.items()}, where, allow_mixed=allow_mixed)
    first: dict[tuple[Any, ...], tuple[int, int]] = {}
    for f, t in enumerate(files):
        for i, key in enumerate(row_keys(t.table)):
            if key in first and first[key][0] != f:
                other, j = first[key]
                raise InputError(
                    t.path,
                    f"repeats row {j} of {files[other].path} (same GPU and uuid, upstream commit, shape, "
                    "configuration and trial): a trial counted twice would narrow its confidence interval; "
                    "give each trial in one file only",
                    field=f"row {i}: trial",
                )
            first.setdefault(key, (f, i))
    return TuningSet(files, table, provenance(table, where, allow_mixed=allow_mixed))
