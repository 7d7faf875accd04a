"""``ggml-dispatch codegen`` end to end through the real CLI root (Parquet in, table.json + header out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_codegen_support import census_row, trials, tuning_row, write_census, write_tuning

from ggml_dispatch import fileio, schema
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import render
from ggml_dispatch.codegen import table as tbl


def _tuning(tmp_path: Path) -> Path:
    rows = []
    for M in (256, 512):
        rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=M, noise=0.0)
    rows += trials(speed={"mmvq": 1.0, "mmq": 0.9}, M=8)
    return write_tuning(rows, tmp_path / "tuning.parquet")


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def test_codegen_writes_table_and_header_deterministically(tmp_path: Path) -> None:
    tuning = _tuning(tmp_path)
    code, out = _run("codegen", str(tuning), "-o", str(tmp_path / "out"))
    assert code == 0, out
    t = tbl.load(tmp_path / "out" / "table.json")
    assert [(r["M_lo"], r["M_hi"], r["route"]) for r in t["rules"]] == [(256, 512, "cublas")]
    assert t["provenance"]["tuning_sha256"] == fileio.sha256_file(tuning)
    header = (tmp_path / "out" / "ggml-dispatch-table.h").read_text()
    assert render.parse_header(header)[1] == tbl.table_hash(t)
    assert "MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 M=256..512 -> cublas" in out
    # by default refusals are counted by reason; --verbose lists each
    assert "refused candidates: 5 by reason (--verbose lists each):" in out
    assert "not the fastest route" in out
    assert "not the fastest: mmvq" not in out
    assert "pass --census" in out
    code, verbose = _run("codegen", str(tuning), "-o", str(tmp_path / "verbose"), "--verbose")
    assert code == 0, verbose
    assert "mmq at MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 M=8: not the fastest: mmvq" in verbose
    assert "refused candidates (5):" in verbose
    first = (tmp_path / "out" / "table.json").read_bytes(), header
    code, _ = _run("codegen", str(tuning), "-o", str(tmp_path / "out"))
    assert code == 0
    assert (
        (tmp_path / "out" / "table.json").read_bytes(),
        (tmp_path / "out" / "ggml-dispatch-table.h").read_text(),
    ) == first
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ggml-dispatch-table.h", "table.json"]


def test_codegen_predicts_the_gain_for_a_census(tmp_path: Path) -> None:
    census = write_census(
        [
            census_row(M=512, calls=10, est_us=900.0),  # measured stock 10 x 100 us; cublas 2x -> 500 us
            census_row(M=300, calls=5, est_us=400.0),  # not tuned: est_us; between 256 and 512 -> 200 us
            census_row(M=64, calls=100, est_us=50.0),  # no rule: unchanged
            census_row(M=512, calls=10, est_us=1000.0, fused="glu"),  # fused: never overridden
        ],
        tmp_path / "census.parquet",
    )
    code, out = _run("codegen", str(_tuning(tmp_path)), "--census", str(census), "-o", str(tmp_path / "o"))
    assert code == 0, out
    assert "census: 4 rows, 2 affected, 0 without timing" in out
    assert "2,450.0 us -> 1,750.0 us (-700.0 us, -28.57%)" in out
    assert "M=512 x10: stock -> cublas: 1,000.0 -> 500.0 us (-500.0; measured; baseline measured stock)" in (
        out
    )
    assert "M=300 x5: stock -> cublas: 400.0 -> 200.0 us (-200.0; interpolated; baseline est_us)" in out
    assert json.loads((tmp_path / "o" / "table.json").read_text())["provenance"]["census_sha256"] == (
        fileio.sha256_file(census)
    )


def _reference(tmp_path: Path) -> Path:
    rows = [
        tuning_row(route="mmq", M=512, us=100.0, anchor_us=100.0, source="reference"),
        tuning_row(route="cublas", M=512, us=50.0, anchor_us=100.0, source="reference"),
    ]
    return write_tuning(rows, tmp_path / "ref.parquet")


def test_reference_rows_need_a_margin_and_stay_out_of_tables(tmp_path: Path) -> None:
    ref = _reference(tmp_path)
    code, out = _run("codegen", str(ref), "-o", str(tmp_path / "o"))
    assert code == 2 and "ggml-dispatch: error:" in out and "--reference-margin" in out
    assert not (tmp_path / "o").exists()
    tables = tmp_path / "repo" / "tables" / "cuda-sm90-nvidia-h200"
    code, out = _run("codegen", str(ref), "--reference-margin", "0.1", "-o", str(tables))
    assert code == 2 and "never written under tables/" in out
    assert not tables.exists()
    code, out = _run("codegen", str(ref), "--reference-margin", "0.1", "-o", str(tmp_path / "o"))
    assert code == 0, out
    assert "source = reference rows (one sample each, no CI); declared margin 10%" in out
    assert json.loads((tmp_path / "o" / "table.json").read_text())["provenance"]["source"] == "reference"
    assert (
        '#define GGML_DISPATCH_TABLE_SOURCE "reference"'
        in (tmp_path / "o" / "ggml-dispatch-table.h").read_text()
    )


def test_measured_tables_may_go_under_tables(tmp_path: Path) -> None:
    dest = tmp_path / "tables" / "cuda-sm90-nvidia-h200"
    code, out = _run("codegen", str(_tuning(tmp_path)), "-o", str(dest))
    assert code == 0, out and (dest / "table.json").is_file()


@pytest.mark.parametrize("what", ["garbage", "census", "empty"])
def test_bad_tuning_input(what: str, tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    if what == "garbage":
        p.write_text("not parquet")
        expect = "not a readable Parquet file"
    elif what == "census":
        write_census([census_row(M=1)], p)
        expect = f"expected {schema.TUNING_SCHEMA!r}"
    else:
        write_tuning([], p)
        expect = "no rows: an empty tuning file"
    code, out = _run("codegen", str(p), "-o", str(tmp_path / "o"))
    assert code == 2 and out.startswith(f"ggml-dispatch: error: {p}") and expect in out
    assert not (tmp_path / "o").exists()


def test_mixed_gpus_are_refused_unless_allowed(tmp_path: Path) -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=256, gpu=schema.GpuId("NVIDIA H100", 900, 132))
    p = write_tuning(rows, tmp_path / "t.parquet")
    code, out = _run("codegen", str(p), "-o", str(tmp_path / "o"))
    assert code == 2 and "a table belongs to one GPU" in out
    code, out = _run("codegen", str(p), "--allow-mixed", "-o", str(tmp_path / "o"))
    assert code == 0 and "--allow-mixed" in out
