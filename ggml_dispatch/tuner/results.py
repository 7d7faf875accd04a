"""Journal records -> tuning rows (schema.TUNING_COLUMNS) -> Parquet; merging shard files.

One row per (shape, route, trial) for the five table routes. Stock is not a row of its own: it is
measured in every trial and carried by every row of that trial as ``anchor_us`` (ARCHITECTURE.md "Tuning
results"); what stock ran (its ``route_ran``), the harness' reasons for non-ok rows, and each case's
node/copy counts go to the Parquet metadata key ``ggml_dispatch.tuner_cases``.

Provenance columns come from the harness' header line (GPU name/UUID/cc/SM count from the CUDA
device properties, the driver from NVML, CUDA runtime and cuBLAS versions from the libraries the
process loaded) and from the tree's install stamp (upstream commit, patch hash).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.artifacts import tuning as artifact
from ggml_dispatch.artifacts import validators
from ggml_dispatch.artifacts.tuning import (
    COLUMNS,
    META_TUNER,
    META_TUNER_CASES,
    ROW_KEY,
    TABLE_ROUTES,
    TUNING_ARROW_SCHEMA,
)
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import mul_mat_id as tmoe

__all__ = ["COLUMNS", "META_TUNER", "META_TUNER_CASES", "ROW_KEY", "TABLE_ROUTES", "TUNING_ARROW_SCHEMA"]


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


def stock_wrong_trials(rec: Mapping[str, Any]) -> list[int]:
    """The trials of a case record in which stock's own run failed the numerics check."""
    return sorted(
        {
            int(line["trial"])
            for line in rec.get("trials", [])
            if line.get("route") == "stock" and line.get("status") == schema.TrialStatus.WRONG.value
        }
    )


def stock_wrong_warning(records: Iterable[Mapping[str, Any]]) -> str | None:
    """One line naming the cases where stock itself was wrong (their trials pair with nothing), or None."""
    hit = [(str(r["case"]), stock_wrong_trials(r)) for r in records]
    hit = [(c, t) for c, t in hit if t]
    if not hit:
        return None
    first = ", ".join(f"{c} (trials {','.join(map(str, t))})" for c, t in hit[:3])
    more = f" and {len(hit) - 3} more" if len(hit) > 3 else ""
    return (
        f"warning: stock itself failed the numerics check in {sum(len(t) for _, t in hit)} trials of "
        f"{len(hit)} cases: {first}{more}; those trials have no stock anchor (lab/stock_wrong.py lists them)"
    )


def rows_of_record(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tuning rows of one journal case record (done or failed)."""
    spec = rec["spec"]
    prov = provenance(rec.get("header") or {}, rec.get("stamp") or {})
    shape = {k: spec[k] for k in ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B")}
    # the attention key's own columns (null on matmul rows)
    fa_fields = (*registry.FlashAttnKey.TYPE_FIELDS, *registry.FlashAttnKey.INT_FIELDS)
    fa = spec["op"] == registry.Op.FLASH_ATTN_EXT.value
    shape |= {k: spec[k] if fa else None for k in fa_fields}
    # MUL_MAT_ID: E, U, the routing kind asked for and the routing bucket the case measured
    moe = spec["op"] == registry.Op.MUL_MAT_ID.value
    shape |= {
        "E": spec["E"] if moe else None,
        "U": spec["U"] if moe else None,
        "routing_kind": spec.get("routing_kind") if moe else None,
        "routing": tmoe.measured_bucket(spec, rec.get("case_info") or {}) if moe else None,
        "used": spec.get("used") if moe else None,
    }
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
    # a trial whose stock run failed the numerics check has no anchor: that time is not stock's computation
    # (on the H200 such runs were also 8-12% slower), so its rows pair with nothing
    stock_wrong = set(stock_wrong_trials(rec))
    for line in rec.get("trials", []):
        cfg = candidate_config(line.get("route"))
        if cfg is None:
            continue  # stock's own rows: carried as anchor_us
        us = _num(line.get("us"))
        anchor = None if int(line["trial"]) in stock_wrong else _num(line.get("anchor_us"))
        status = str(line["status"])
        if status == schema.TrialStatus.OK.value and (us is None or us <= 0):
            # an ok row needs a time (the tuning reader refuses one without): record what came instead
            status = f"{schema.FAILED_PREFIX}ok trial without a positive finite time (us = {line.get('us')})"
        out.append(
            {
                **base,
                "route": cfg.route.value,
                "config": str(cfg),
                "trial": int(line["trial"]),
                "us": us,
                "replays": int(line.get("replays") or 0),
                "weight_copies": int(line.get("weight_copies") or 0),
                "anchor_us": anchor if anchor is None or anchor > 0 else None,
                "nmse": _num(line.get("nmse")),
                "route_ran": str(line.get("route_ran") or ""),
                "status": status,
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
    return artifact.to_table(rows)


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
    """A tuning file through the one reader (:func:`ggml_dispatch.artifacts.tuning.read`)."""
    t = artifact.read(path)
    return t.table, t.raw_meta


def merge_tuning(paths: Sequence[Path], out: Path, *, allow_mixed: bool = False) -> int:
    """Concatenate shard files. Refuses rows from several GPUs or upstream commits (unless
    ``allow_mixed``) and a trial (GPU, commit, shape, route, trial) present twice."""
    if not paths:
        raise InputError(out, "nothing to merge: no input files", field="inputs")
    tables: list[pa.Table] = []
    cases: dict[str, Any] = {}
    settings: list[Any] = []
    hashes: dict[str, str] = {}
    seen: dict[tuple[Any, ...], Path] = {}
    gpus: dict[schema.GpuId, Path] = {}
    commits: dict[str, Path] = {}
    for p in paths:
        t = artifact.read(p, allow_mixed=allow_mixed)
        for i, key in enumerate(artifact.row_keys(t.table)):
            if key in seen:
                raise InputError(
                    p, f"row {i} duplicates a row of {seen[key]} ({', '.join(map(str, key))})", field="route"
                )
            seen[key] = p
        for g, _ in t.provenance.gpus:
            gpus.setdefault(g, p)
        for c, _ in t.provenance.upstream_commits:
            commits.setdefault(c, p)
        # the first input that brings a second GPU or commit is the one named
        validators.check_one_gpu(
            {g: str(q) for g, q in gpus.items()}, p, allow_mixed=allow_mixed, what="inputs"
        )
        validators.check_one_commit(
            {c: str(q) for c, q in commits.items()}, p, allow_mixed=allow_mixed, what="inputs"
        )
        tables.append(t.table)
        cases.update(t.cases)
        settings.append(t.settings)
        hashes[str(p)] = t.sha256
    merged = artifact.concat(tables)
    commit = next(iter(commits)) if len(commits) == 1 else ""
    meta = fileio.base_metadata(
        schema.TUNING_SCHEMA,
        upstream_commit=commit,
        input_hashes=hashes,
        tuner={"merged": settings},
        tuner_cases=cases,
    )
    artifact.write(merged, out, meta)
    return int(merged.num_rows)
