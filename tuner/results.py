"""Journal records -> tuning rows (schema.TUNING_COLUMNS) -> Parquet; merging shard files.

One row per (shape, route, trial) for the five table routes. Stock is not a row of its own: it is
measured in every trial and carried by every row of that trial as ``anchor_us`` (DESIGN.md "Tuning
results"); what stock ran (its ``route_ran``), the harness' reasons for non-ok rows, and each case's
node/copy counts go to the Parquet metadata key ``ggml_dispatch.tuner_cases``.

Provenance columns come from the harness' header line (GPU name/UUID/cc/SM count from the CUDA
device properties, the driver from NVML, CUDA runtime and cuBLAS versions from the libraries the
process loaded) and from the tree's install stamp (upstream commit, patch hash).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.errors import InputError

META_TUNER: Final = schema.META_PREFIX + "tuner"  # sweep settings (JSON)
META_TUNER_CASES: Final = schema.META_PREFIX + "tuner_cases"  # per-case details (JSON)
TABLE_ROUTES: Final = frozenset(r.value for r in schema.Route)
ROW_KEY: Final = ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "route", "config", "trial")
COLUMNS: Final = {**schema.TUNING_COLUMNS, **schema.TUNING_OPTIONAL_COLUMNS}

_ARROW: Final = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
TUNING_ARROW_SCHEMA: Final = pa.schema([pa.field(n, _ARROW[t]) for n, t in COLUMNS.items()])


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def provenance(header: Mapping[str, Any], stamp: Mapping[str, str]) -> dict[str, Any]:
    return {
        "gpu_name": str(header.get("gpu_name", "")),
        "gpu_uuid": str(header.get("gpu_uuid", "")),
        "gpu_cc": int(header.get("gpu_cc", 0) or 0),
        "gpu_sm_count": int(header.get("gpu_sm_count", 0) or 0),
        "driver": str(header.get("driver", "")),
        "cuda_version": str(header.get("cuda_version", "")),
        "cublas_version": str(header.get("cublas_version", "")),
        "upstream_commit": str(stamp.get("upstream_commit", "")),
        "patch_hash": str(stamp.get("patch_hash", "")),
        "harness_version": str(header.get("harness_version", "")),
    }


def candidate_config(name: Any) -> registry.Config | None:
    """The configuration a harness candidate name spells (None: stock's own rows or not a configuration)."""
    try:
        return registry.Config.parse(str(name))
    except registry.ConfigError:
        return None


def rows_of_record(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tuning rows of one journal case record (done or failed)."""
    spec = rec["spec"]
    prov = provenance(rec.get("header") or {}, rec.get("stamp") or {})
    shape = {k: spec[k] for k in ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B")}
    base = {**prov, **shape, "source": schema.Source.MEASURED.value}
    status = str(rec["status"])
    if status.startswith(schema.FAILED_PREFIX):
        return [
            {
                **base,
                "route": cfg.route.value,
                "config": str(cfg),
                "trial": 0,
                "us": None,
                "replays": 0,
                "weight_copies": 0,
                "anchor_us": None,
                "nmse": None,
                "route_ran": "",
                "status": status,
            }
            for cfg in (candidate_config(r) for r in spec["routes"])
            if cfg is not None
        ]
    out = []
    for line in rec.get("trials", []):
        cfg = candidate_config(line.get("route"))
        if cfg is None:
            continue  # stock's own rows: carried as anchor_us
        out.append(
            {
                **base,
                "route": cfg.route.value,
                "config": str(cfg),
                "trial": int(line["trial"]),
                "us": _num(line.get("us")),
                "replays": int(line.get("replays") or 0),
                "weight_copies": int(line.get("weight_copies") or 0),
                "anchor_us": _num(line.get("anchor_us")),
                "nmse": _num(line.get("nmse")),
                "route_ran": str(line.get("route_ran") or ""),
                "status": str(line["status"]),
            }
        )
    return out


def case_details(rec: Mapping[str, Any]) -> dict[str, Any]:
    """What the columns do not carry: stock's route, non-ok reasons, node and copy counts."""
    info = rec.get("case_info") or {}
    reasons: dict[str, str] = {}
    for line in rec.get("trials", []):
        if line.get("reason") and line.get("route") not in reasons:
            reasons[str(line["route"])] = str(line["reason"])
    d: dict[str, Any] = {"status": rec["status"], "wall_s": rec.get("wall_s")}
    for k in (
        "stock_route_ran",
        "nodes",
        "weight_bytes",
        "weight_copies",
        "rotated_bytes",
        "l2_bytes",
        "ref_cols",
        "replays",
        "drifted",
        "nmse_max",
        "drift_max",
    ):
        if k in info:
            d[k] = info[k]
    if reasons:
        d["reasons"] = reasons
    if rec.get("stderr_tail"):
        d["stderr_tail"] = rec["stderr_tail"]
    return d


def to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in COLUMNS}
    return pa.Table.from_pydict(cols, schema=TUNING_ARROW_SCHEMA)


def write_tuning(
    path: str | Path,
    records: Iterable[Mapping[str, Any]],
    *,
    input_hashes: Mapping[str, str],
    settings: Mapping[str, Any],
) -> int:
    """Write the Parquet file of these journal records atomically; returns the row count."""
    recs = sorted(records, key=lambda r: str(r["case"]))
    rows = [row for rec in recs for row in rows_of_record(rec)]
    stamps = {
        (
            str((r.get("stamp") or {}).get("upstream_commit", "")),
            str((r.get("stamp") or {}).get("patch_hash", "")),
        )
        for r in recs
    }
    commit, phash = sorted(stamps)[0] if len(stamps) == 1 else ("", "")
    meta = fileio.base_metadata(
        schema.TUNING_SCHEMA,
        upstream_commit=commit,
        patch_hash=phash,
        input_hashes=dict(input_hashes),
        tuner=dict(settings),
        tuner_cases={str(r["case"]): case_details(r) for r in recs},
    )
    fileio.write_parquet(to_table(rows), path, meta)
    return len(rows)


def read_tuning(path: str | Path) -> tuple[pa.Table, dict[str, str]]:
    p = Path(path)
    try:
        meta = fileio.read_parquet_metadata(p)
        table = pq.read_table(p)
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(p, f"not a readable Parquet file: {e}") from None
    if meta.get(schema.META_SCHEMA) != schema.TUNING_SCHEMA:
        raise InputError(p, f"not a tuning file (schema {meta.get(schema.META_SCHEMA)!r})", field="schema")
    missing = [c for c in schema.TUNING_COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(p, f"missing columns {', '.join(missing)}")
    for name in schema.TUNING_OPTIONAL_COLUMNS:
        if name not in table.column_names:  # an older file: rows of plain routes
            table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
    return table.select(list(COLUMNS)).cast(TUNING_ARROW_SCHEMA), meta


def merge_tuning(paths: Sequence[Path], out: Path, *, allow_mixed: bool = False) -> int:
    """Concatenate shard files. Refuses rows from several GPUs or upstream commits (unless
    ``allow_mixed``) and a (shape, route, trial) present twice."""
    if not paths:
        raise InputError(None, "nothing to merge", field="inputs")
    tables: list[pa.Table] = []
    cases: dict[str, Any] = {}
    settings: list[Any] = []
    hashes: dict[str, str] = {}
    seen: dict[tuple[Any, ...], Path] = {}
    gpus: dict[tuple[str, int, int], Path] = {}
    commits: dict[str, Path] = {}
    for p in paths:
        table, meta = read_tuning(p)
        for i, row in enumerate(table.select(list(ROW_KEY)).to_pylist()):
            key = tuple(row[k] for k in ROW_KEY)
            if key in seen:
                raise InputError(
                    p, f"row {i} duplicates a row of {seen[key]} ({', '.join(map(str, key))})", field="route"
                )
            seen[key] = p
        for name, cc, sm, commit in zip(
            table["gpu_name"].to_pylist(),
            table["gpu_cc"].to_pylist(),
            table["gpu_sm_count"].to_pylist(),
            table["upstream_commit"].to_pylist(),
            strict=True,
        ):
            gpus.setdefault((name, cc, sm), p)
            commits.setdefault(commit, p)
        tables.append(table)
        cases.update(json.loads(meta.get(META_TUNER_CASES, "{}")))
        settings.append(json.loads(meta.get(META_TUNER, "null")))
        hashes[str(p)] = fileio.sha256_file(p)
    if not allow_mixed and len(gpus) > 1:
        listed = "; ".join(f"{n} cc {c} {s} SMs ({gpus[(n, c, s)]})" for n, c, s in sorted(gpus))
        raise InputError(
            None, f"inputs come from {len(gpus)} GPUs: {listed}; pass --allow-mixed", field="gpu_name"
        )
    if not allow_mixed and len(commits) > 1:
        listed = "; ".join(f"{c or '(none)'} ({commits[c]})" for c in sorted(commits))
        raise InputError(
            None,
            f"inputs come from {len(commits)} upstream commits: {listed}; pass --allow-mixed",
            field="upstream_commit",
        )
    merged = pa.concat_tables(tables) if tables else to_table([])
    commit = next(iter(commits)) if len(commits) == 1 else ""
    meta = fileio.base_metadata(
        schema.TUNING_SCHEMA,
        upstream_commit=commit,
        input_hashes=hashes,
        tuner={"merged": settings},
        tuner_cases=cases,
    )
    fileio.write_parquet(merged, out, meta)
    return int(merged.num_rows)
