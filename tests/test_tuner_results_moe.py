"""MUL_MAT_ID journal records -> tuning rows with E, U, the routing kind and the bucket the case measured;
the tuning reader's checks of those columns; files without them. The records have the shape of the
harness' MUL_MAT_ID output on a GPU (timings constructed; tests/test_tuner_mul_mat_id.py runs the real
harness on the CPU backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_tuner_results import HEADER, STAMP

from ggml_dispatch import fileio, schema
from ggml_dispatch.artifacts import tuning
from ggml_dispatch.codegen import decide
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import mul_mat_id as tmoe
from ggml_dispatch.tuner import results

KEY = {"N": 768, "K": 2048, "E": 128, "U": 1}
# the harness' case-end statistics of the routing each kind drew at M = 512, 8 used of 128
EXPERTS = {
    "trace": {"nonempty": 128, "max": 47, "mean": 32.0, "cv": 0.19},  # a traced spread routing
    "uniform": {"nonempty": 128, "max": 48, "mean": 32.0, "cv": 0.18},
    "skewed": {"nonempty": 128, "max": 512, "mean": 32.0, "cv": 2.1},
    "few": {"nonempty": 8, "max": 512, "mean": 512.0, "cv": 0.0},
}


def record(kind: str, speed: float = 1.3, failed: bool = False) -> dict[str, Any]:
    key = tmoe.registry.MulMatIdKey("MUL_MAT_ID", "expert", "q4_K", "f32", **KEY, routing=0)
    case = tmoe.MoeCase(key, 512, kind, 8, 10.0, routes=("mmq", "mmq/j=64,stream_k=off"), trials=4)
    s = case.spec()
    trials = []
    for t in range(4):
        a = 100.0 * (1 + 0.002 * t)
        trials += [
            {"kind": "trial", "case": s["case"], "route": "stock", "trial": t, "us": a, "anchor_us": a,
             "status": "ok", "route_ran": "mmq"},
            {"kind": "trial", "case": s["case"], "route": "mmq", "trial": t, "us": a * 1.001, "anchor_us": a,
             "status": "ok", "route_ran": "mmq"},
            {"kind": "trial", "case": s["case"], "route": "mmq/j=64,stream_k=off", "trial": t,
             "us": a / speed, "anchor_us": a, "status": "ok", "route_ran": "mmq"},
        ]  # fmt: skip
    rec: dict[str, Any] = {
        "case": s["case"],
        "spec": s,
        "status": "failed:killed by SIGKILL" if failed else "done",
        "header": HEADER,
        "stamp": STAMP,
        "trials": [] if failed else trials,
        "case_info": {} if failed else {"status": "done", "routing": kind, "experts": EXPERTS[kind]},
    }
    return rec


def test_rows_carry_E_U_the_kind_and_the_measured_bucket(tmp_path: Path) -> None:
    recs = [record(k) for k in tmoe.ROUTING_KINDS]
    rows = [r for rec in recs for r in results.rows_of_record(rec)]
    assert {(r["routing_kind"], r["routing"]) for r in rows} == {
        ("trace", 1),
        ("uniform", 1),
        ("skewed", 2),
        ("few", 3),
    }
    assert {(r["E"], r["U"], r["B"], r["op"]) for r in rows} == {(128, 1, 1, "MUL_MAT_ID")}
    out = tmp_path / "t.parquet"
    assert results.write_tuning(out, recs, input_hashes={}, settings={}) == len(rows)
    t = tuning.read(out)
    assert {"E", "U", "routing_kind", "routing"} <= set(t.table.column_names)
    # and codegen decides on the file: one routing-0 rule from the three buckets (trace and uniform pooled)
    d = decide.decide(t.frame(), decide.Params())
    (rule,) = d.rules
    assert rule.key.routing == 0 and str(rule.route) == "mmq/j=64,stream_k=off"
    assert [b for b, _ in rule.buckets] == ["spread", "skewed", "concentrated"]


def test_a_failed_case_has_no_bucket_and_the_rows_of_one_point_merge_apart(tmp_path: Path) -> None:
    rows = results.rows_of_record(record("few", failed=True))
    assert rows and all(r["routing"] is None and r["routing_kind"] == "few" for r in rows)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    results.write_tuning(a, [record("uniform")], input_hashes={}, settings={})
    results.write_tuning(b, [record("skewed")], input_hashes={}, settings={})
    # one shape, M, configuration and trial under two routing kinds: not duplicates
    assert results.merge_tuning([a, b], tmp_path / "m.parquet") == 2 * len(
        results.rows_of_record(record("few"))
    )
    with pytest.raises(InputError, match="duplicates"):
        results.merge_tuning([a, a], tmp_path / "m2.parquet")


def _write(rows: list[dict[str, Any]], path: Path) -> Path:
    fileio.write_parquet(tuning.to_table(rows), path, fileio.base_metadata(schema.TUNING_SCHEMA))
    return path


def test_the_reader_checks_mul_mat_id_columns(tmp_path: Path) -> None:
    rows = results.rows_of_record(record("uniform"))
    bad_e = [dict(r) for r in rows]
    bad_e[2]["E"] = None
    with pytest.raises(InputError, match=r"row 2: E: MUL_MAT_ID rows need a positive integer E"):
        tuning.read(_write(bad_e, tmp_path / "e.parquet"))
    bad_b = [dict(r) for r in rows]
    bad_b[1]["routing"] = 4
    with pytest.raises(InputError, match=r"row 1: routing: routing bucket 4 is not one of \[1, 2, 3\]"):
        tuning.read(_write(bad_b, tmp_path / "b.parquet"))


def test_a_file_without_the_new_columns_reads_with_nulls(tmp_path: Path) -> None:
    old = [
        {k: v for k, v in r.items() if k in schema.TUNING_COLUMNS}
        for r in results.rows_of_record(record("few"))
    ]
    for r in old:
        r["op"], r["layout"] = "MUL_MAT", "weight"  # a MUL_MAT file of before the MUL_MAT_ID columns
    # without the routing column the record's rows per routing bucket would repeat a trial, which the reader
    # refuses: such a file held one row per trial
    old = list({tuple(r.get(k) for k in (*tuning.ROW_IDENTITY, *tuning.ROW_KEY)): r for r in old}.values())
    table = pa.Table.from_pylist(old, schema=tuning.v.arrow_schema(schema.TUNING_COLUMNS))
    path = tmp_path / "old.parquet"
    fileio.write_parquet(table, path, fileio.base_metadata(schema.TUNING_SCHEMA))
    assert set(pq.read_schema(path).names) == set(schema.TUNING_COLUMNS)
    t = tuning.read(path)
    assert t.table.column("routing").null_count == t.table.num_rows
    assert t.table.column("E").null_count == t.table.num_rows
