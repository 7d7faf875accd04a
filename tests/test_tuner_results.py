"""Journal records -> tuning rows and Parquet; shard merge. The records here have the shape of the
harness' output on a GPU (which CI does not have); tests/test_tuner_native.py runs the real harness."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from ggml_dispatch import fileio, schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import results

HEADER = {
    "kind": "header",
    "harness_version": "0.1.0+abc",
    "gpu_name": "NVIDIA H200",
    "gpu_uuid": "GPU-1234",
    "gpu_cc": 900,
    "gpu_sm_count": 132,
    "driver": "580.159.04",
    "cuda_version": "13.0",
    "cublas_version": "13.0.2",
}
STAMP = {"upstream_commit": schema.PINNED_UPSTREAM_COMMIT, "patch_hash": "f" * 64}


def spec(M: int, N: int = 4096) -> dict[str, Any]:
    return {
        "case": f"MUL_MAT:weight:q4_K:f32:N{N}:K4096:B1:M{M}",
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": "q4_K",
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": 4096,
        "B": 1,
        "routes": ["mmvf", "mmf", "mmvq", "mmq", "cublas"],
        "trials": 4,
        "nmse_max": 5e-4,
    }


def done_record(M: int, N: int = 4096, mmq_us: float = 80.0, stock_us: float = 100.0) -> dict[str, Any]:
    s = spec(M, N)
    trials = []
    for t in range(4):
        a = stock_us * (1 + 0.002 * t)
        trials.append(
            {
                "kind": "trial",
                "case": s["case"],
                "route": "stock",
                "trial": t,
                "us": a,
                "anchor_us": a,
                "replays": 9,
                "weight_copies": 5,
                "nmse": 1e-6,
                "route_ran": "mmvq",
                "status": "ok",
            }
        )
        trials.append(
            {
                "kind": "trial",
                "case": s["case"],
                "route": "mmq",
                "trial": t,
                "us": mmq_us * (1 + 0.001 * t),
                "anchor_us": a,
                "replays": 9,
                "weight_copies": 5,
                "nmse": 2e-6,
                "route_ran": "mmq",
                "status": "ok",
            }
        )
        for r, st in (("mmvf", "ineligible"), ("mmf", "ineligible"), ("cublas", "wrong")):
            trials.append(
                {
                    "kind": "trial",
                    "case": s["case"],
                    "route": r,
                    "trial": t,
                    "us": None,
                    "anchor_us": a,
                    "replays": 0,
                    "weight_copies": 5,
                    "nmse": None,
                    "route_ran": "mmvq",
                    "status": st,
                    "reason": "fell-back:mmvq" if st == "ineligible" else "nmse 0.1 > 0.0005",
                }
            )
        trials.append(
            {
                "kind": "trial",
                "case": s["case"],
                "route": "mmvq",
                "trial": t,
                "us": stock_us,
                "anchor_us": a,
                "replays": 9,
                "weight_copies": 5,
                "nmse": 1e-6,
                "route_ran": "mmvq",
                "status": "drifted" if t == 3 else "ok",
            }
        )
    return {
        "case": s["case"],
        "spec": s,
        "status": "done",
        "header": HEADER,
        "stamp": STAMP,
        "trials": trials,
        "case_info": {"stock_route_ran": "mmvq", "nodes": 10, "weight_copies": 5},
        "wall_s": 2.5,
    }


def failed_record(M: int) -> dict[str, Any]:
    s = spec(M)
    return {
        "case": s["case"],
        "spec": s,
        "status": "failed:killed by SIGABRT during trial 2 route=mmq",
        "header": HEADER,
        "stamp": STAMP,
        "trials": [],
        "case_info": {},
        "wall_s": 1.0,
    }


def test_rows_carry_stock_as_anchor_not_as_a_route() -> None:
    rows = results.rows_of_record(done_record(8))
    assert {r["route"] for r in rows} == {"mmvf", "mmf", "mmvq", "mmq", "cublas"}
    assert len(rows) == 5 * 4
    mmq = [r for r in rows if r["route"] == "mmq"]
    assert all(r["anchor_us"] > r["us"] for r in mmq)
    inel = [r for r in rows if r["status"] == "ineligible"]
    assert inel and all(r["us"] is None and r["anchor_us"] > 0 for r in inel)
    r0 = rows[0]
    assert r0["gpu_name"] == "NVIDIA H200" and r0["gpu_cc"] == 900 and r0["patch_hash"] == "f" * 64
    assert r0["source"] == "measured" and set(r0) == set(results.COLUMNS)
    assert all(r["config"] == r["route"] for r in rows)  # plain routes


def test_failed_case_gives_one_failed_row_per_route() -> None:
    rows = results.rows_of_record(failed_record(8))
    assert [r["route"] for r in rows] == ["mmvf", "mmf", "mmvq", "mmq", "cublas"]
    assert all(r["status"].startswith("failed:killed by SIGABRT") and r["us"] is None for r in rows)


def test_parquet_has_exactly_the_tuning_columns_and_provenance(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    n = results.write_tuning(
        out, [done_record(8), failed_record(16)], input_hashes={"c": "00"}, settings={"x": 1}
    )
    assert n == 25
    t = pq.read_table(out)
    cols = {**schema.TUNING_COLUMNS, **schema.TUNING_OPTIONAL_COLUMNS}
    assert t.column_names == list(cols)
    assert [str(f.type) for f in t.schema] == [
        {"string": "string", "int64": "int64", "float64": "double"}[v] for v in cols.values()
    ]
    meta = fileio.read_parquet_metadata(out)
    assert meta[schema.META_SCHEMA] == schema.TUNING_SCHEMA
    assert meta[schema.META_UPSTREAM_COMMIT] == schema.PINNED_UPSTREAM_COMMIT
    assert meta[schema.META_PATCH_HASH] == "f" * 64
    cases = json.loads(meta[results.META_TUNER_CASES])
    assert cases[spec(8)["case"]]["stock_route_ran"] == "mmvq"
    assert cases[spec(8)["case"]]["reasons"]["mmvf"] == "fell-back:mmvq"
    assert cases[spec(16)["case"]]["status"].startswith("failed:")
    assert not list(tmp_path.glob(".*tmp"))


def test_codegen_accepts_the_rows_and_decides_on_them(tmp_path: Path) -> None:
    """Contract with codegen: the file the tuner writes is what `ggml-dispatch codegen` reads."""
    out = tmp_path / "t.parquet"
    recs = [done_record(m) for m in (4, 8, 16)]
    results.write_tuning(out, recs, input_hashes={}, settings={})
    df = pd.read_parquet(out)
    params = decide.Params()
    ident = decide.check_rows(df, out, params)
    assert ident.gpu == schema.GpuId("NVIDIA H200", 900, 132)
    d = decide.decide(df, params, out)
    exact = [r for r in d.rules if r.kind == "measured"]
    assert [(str(r.route), r.M_lo, r.M_hi) for r in exact] == [("mmq", 4, 16)]


def test_merge_refuses_duplicates_and_mixed_gpus(tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    results.write_tuning(a, [done_record(8)], input_hashes={}, settings={"shard": "0/2"})
    results.write_tuning(b, [done_record(16), failed_record(32)], input_hashes={}, settings={"shard": "1/2"})
    m = tmp_path / "m.parquet"
    assert results.merge_tuning([a, b], m) == 20 + 25
    meta = fileio.read_parquet_metadata(m)
    assert len(json.loads(meta[results.META_TUNER_CASES])) == 3
    with pytest.raises(InputError) as e:
        results.merge_tuning([a, a], tmp_path / "x.parquet")
    assert "duplicates" in e.value.message and not (tmp_path / "x.parquet").exists()
    other = done_record(64)
    other["header"] = {**HEADER, "gpu_name": "NVIDIA H100 80GB HBM3"}
    c = tmp_path / "c.parquet"
    results.write_tuning(c, [other], input_hashes={}, settings={})
    with pytest.raises(InputError) as e:
        results.merge_tuning([a, c], tmp_path / "x.parquet")
    assert "2 GPUs" in e.value.message
    assert results.merge_tuning([a, c], tmp_path / "x.parquet", allow_mixed=True) == 40


def test_merge_refuses_a_file_that_is_not_tuning(tmp_path: Path) -> None:
    p = tmp_path / "n.parquet"
    fileio.write_parquet(results.to_table([]), p, fileio.base_metadata(schema.CENSUS_SCHEMA))
    with pytest.raises(InputError) as e:
        results.merge_tuning([p], tmp_path / "x.parquet")
    assert e.value.field == schema.META_SCHEMA


def test_non_finite_times_become_nulls() -> None:
    r = done_record(8)
    mmq = next(t for t in r["trials"] if t["route"] == "mmq")
    mmq["us"] = float("inf")
    rows = results.rows_of_record(r)
    assert all(x["us"] is None or math.isfinite(x["us"]) for x in rows)
    assert sum(x["us"] is None for x in rows if x["route"] == "mmq") == 1
    # an ok trial without a time is recorded as failed: the file stays readable by the tuning reader
    assert [x["status"] for x in rows if x["us"] is None and x["route"] == "mmq"] == [
        "failed:ok trial without a positive finite time (us = inf)"
    ]


def test_configurations_become_rows_of_their_route_with_a_canonical_config(tmp_path: Path) -> None:
    rec = done_record(512)
    rec["spec"] = {**rec["spec"], "routes": ["cublas/compute=f16,out=f32", "mmq/j=64,stream_k=off"]}
    for line in rec["trials"]:
        if line.get("route") == "cublas":
            line["route"] = "cublas/compute=f16,out=f32"
        elif line.get("route") == "mmq":
            line["route"] = "mmq/stream_k=off,j=64"
    rows = results.rows_of_record(rec)
    by = {(r["route"], r["config"]) for r in rows}
    assert ("cublas", "cublas/out=f32,compute=f16") in by and ("mmq", "mmq/j=64,stream_k=off") in by
    out = tmp_path / "t.parquet"
    results.write_tuning(out, [rec], input_hashes={}, settings={})
    table, _ = results.read_tuning(out)
    assert "cublas/out=f32,compute=f16" in table["config"].to_pylist()
    failed = failed_record(8)
    failed["spec"] = {**failed["spec"], "routes": ["mmq/j=64", "stock", "nope"]}
    assert [(r["route"], r["config"]) for r in results.rows_of_record(failed)] == [("mmq", "mmq/j=64")]


def test_a_file_without_the_config_column_reads_with_nulls(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "t.parquet"
    results.write_tuning(out, [done_record(8)], input_hashes={}, settings={})
    table = pq.read_table(out)
    meta = table.schema.metadata
    old = table.drop(["config"]).replace_schema_metadata(meta)
    pq.write_table(old, tmp_path / "old.parquet")
    back, _ = results.read_tuning(tmp_path / "old.parquet")
    assert back.num_rows == table.num_rows and set(back["config"].to_pylist()) == {None}
    assert back.schema.field("config").type == pa.string()


def test_a_trial_whose_stock_run_was_wrong_has_no_anchor() -> None:
    # the H200 configurations sweep: stock itself failed the CPU check in some trials (lab/stock_wrong.py)
    rec = done_record(8)
    rec["trials"].append(
        {"kind": "trial", "case": rec["case"], "route": "stock", "trial": 1, "us": 9.0, "anchor_us": 9.0,
         "nmse": 0.07, "route_ran": "mmvq", "status": "wrong", "reason": "nmse 0.07 > 0.0005"}
    )  # fmt: skip
    rows = results.rows_of_record(rec)
    assert {r["route"] for r in rows} == {"mmvf", "mmf", "mmvq", "mmq", "cublas"}  # stock is still no row
    assert all(r["anchor_us"] is None for r in rows if r["trial"] == 1)
    assert all(r["anchor_us"] is not None for r in rows if r["trial"] != 1)
    assert all(r["anchor_us"] is not None for r in results.rows_of_record(done_record(8)) if r["trial"] == 1)


def test_a_sweep_with_stock_wrong_warns_once_naming_the_cases() -> None:
    rec = done_record(8)
    assert results.stock_wrong_warning([rec]) is None
    for t in (0, 2):
        rec["trials"].append(
            {"kind": "trial", "case": rec["case"], "route": "stock", "trial": t, "us": 9.0, "anchor_us": 9.0,
             "nmse": 0.07, "route_ran": "mmvq", "status": "wrong"}
        )  # fmt: skip
    assert results.stock_wrong_trials(rec) == [0, 2]
    w = results.stock_wrong_warning([done_record(16), rec])
    assert w is not None and "in 2 trials of 1 cases" in w and f"{rec['case']} (trials 0,2)" in w
