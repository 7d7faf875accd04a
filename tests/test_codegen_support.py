"""Builders the codegen, diff and reference tests share: tuning rows with paired trials, census rows,
Parquet files with the schema's metadata, and the real reference TSV. (The trial times are synthetic:
they stand in for GPU measurements, which these CPU-only tests cannot take.)"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ggml_dispatch import fileio, schema

REPO = Path(__file__).resolve().parent.parent
# the reference measurements, copied into the repository with their provenance (samples/reference/README.md)
REFERENCE_TSV = REPO / "samples" / "reference" / "h200-mul-mat-routes.tsv"
H200 = schema.GpuId("NVIDIA H200", 900, 132)
COMMIT = schema.PINNED_UPSTREAM_COMMIT

_ARROW = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


def reference_tsv() -> Path:
    assert REFERENCE_TSV.is_file(), f"{REFERENCE_TSV} is part of the repository"
    return REFERENCE_TSV


def tuning_row(
    *,
    route: str,
    M: int,
    N: int = 4096,
    K: int = 4096,
    us: float,
    anchor_us: float | None,
    trial: int = 0,
    status: str = "ok",
    src0_type: str = "q4_K",
    src1_type: str = "f32",
    op: str = "MUL_MAT",
    layout: str = "weight",
    B: int = 1,
    gpu: schema.GpuId = H200,
    commit: str = COMMIT,
    source: str = "measured",
) -> dict[str, Any]:
    return {
        "gpu_name": gpu.name,
        "gpu_uuid": "GPU-test",
        "gpu_cc": gpu.cc,
        "gpu_sm_count": gpu.sm_count,
        "driver": "580.159.04",
        "cuda_version": "13.0",
        "cublas_version": "13.0.2",
        "upstream_commit": commit,
        "patch_hash": "p" * 64,
        "harness_version": "test",
        "op": op,
        "layout": layout,
        "src0_type": src0_type,
        "src1_type": src1_type,
        "M": M,
        "N": N,
        "K": K,
        "B": B,
        "route": route,
        "trial": trial,
        "us": us,
        "replays": 100,
        "weight_copies": 8,
        "anchor_us": anchor_us,
        "nmse": 1e-6,
        "route_ran": route,
        "status": status,
        "source": source,
    }


def trials(
    *,
    speed: Mapping[str, float],
    M: int,
    stock_us: float = 100.0,
    n: int = 5,
    noise: float = 0.005,
    seed: int = 0,
    status: Mapping[str, str] | None = None,
    **key: Any,
) -> list[dict[str, Any]]:
    """``n`` paired trials per route at one point. ``speed[route]`` = stock time / route time (true);
    each trial re-measures stock (the anchor) and every route with multiplicative noise."""
    rng = np.random.default_rng(seed + 7919 * M + 31 * key.get("N", 4096) + key.get("K", 4096))
    rows = []
    for t in range(n):
        anchor = stock_us * (1 + noise * rng.standard_normal())
        for route in sorted(speed):
            us = stock_us / speed[route] * (1 + noise * rng.standard_normal())
            st = (status or {}).get(route, "ok")
            rows.append(tuning_row(route=route, M=M, us=us, anchor_us=anchor, trial=t, status=st, **key))
    return rows


def _arrow_table(rows: Iterable[Mapping[str, Any]], columns: Mapping[str, str]) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(r) for r in rows], schema=pa.schema([(c, _ARROW[k]) for c, k in columns.items()])
    )


def frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    return _arrow_table(rows, schema.TUNING_COLUMNS).to_pandas()


def write_tuning(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    table = _arrow_table(rows, schema.TUNING_COLUMNS)
    fileio.write_parquet(table, path, fileio.base_metadata(schema.TUNING_SCHEMA))
    return path


def rule(N: int, K: int, lo: int, hi: int, route: str, typ: str = "q4_K") -> dict[str, Any]:
    """A table.json rule of the MUL_MAT weight layout (N = K = 0: a per-type default)."""
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": typ,
        "src1_type": "f32",
        "N": N,
        "K": K,
        "B": 1,
        "M_lo": lo,
        "M_hi": hi,
        "route": route,
        "config": route,
    }


def census_row(
    *,
    M: int,
    N: int = 4096,
    K: int = 4096,
    calls: int = 10,
    est_us: float = 1000.0,
    src0_type: str = "q4_K",
    src1_type: str = "f32",
    op: str = "MUL_MAT",
    layout: str = "weight",
    B: int = 1,
    fused: str | None = None,
    tensor: str = "blk.0.ffn_up.weight",
    gpu: schema.GpuId | None = H200,
) -> dict[str, Any]:
    return {
        "gpu_name": gpu.name if gpu else None,
        "gpu_cc": gpu.cc if gpu else None,
        "gpu_sm_count": gpu.sm_count if gpu else None,
        "op": op,
        "layout": layout,
        "fused": fused,
        "src0_type": src0_type,
        "src1_type": src1_type,
        "M": M,
        "N": N,
        "K": K,
        "B": B,
        "E": 1,
        "U": 1,
        "src0_contiguous": True,
        "src0_nb_aligned": True,
        "tensor": tensor,
        "role": tensor.split(".")[2] if tensor.count(".") >= 3 else "other",
        "route": "mmq",
        "stock_route": "mmq",
        "reason": "stock",
        "calls": calls,
        "est_us": est_us,
        "est_kind": "roofline",
        "source": "trace",
    }


def write_census(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    table = _arrow_table(rows, schema.CENSUS_COLUMNS)
    fileio.write_parquet(table, path, fileio.base_metadata(schema.CENSUS_SCHEMA))
    return path


def test_trials_are_paired_and_noisy() -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512, n=4)
    assert len(rows) == 8
    by_trial: dict[int, set[float]] = {}
    for r in rows:
        by_trial.setdefault(r["trial"], set()).add(r["anchor_us"])
    assert all(len(a) == 1 for a in by_trial.values())  # one anchor per trial, shared by its routes
    ratios = [r["anchor_us"] / r["us"] for r in rows if r["route"] == "cublas"]
    assert all(math.isclose(x, 2.0, rel_tol=0.05) for x in ratios)
    assert len(set(ratios)) == 4
