"""The one prediction model (``codegen.predict``): the baseline is the measured stock time where the
tuning has the point and the census est_us elsewhere, and ``diff`` and ``report`` print the same figure
for the same files. (The trial times are synthetic except in the committed-table test.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_codegen_support import census_row, frame, trials, write_census, write_tuning

from ggml_dispatch import archive
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import decide, predict
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.report import analysis, inputs

H200_DIR = archive.path("tables/cuda-sm90-nvidia-h200-routes")  # the dense-route sweep, its census and table


def _tuning_rows() -> list[dict[str, object]]:
    rows = []
    for M in (256, 512, 1024):
        rows += trials(speed={"mmq": 1.0, "cublas": 2.0 if M < 1024 else 4.0}, M=M, stock_us=50.0, noise=0.0)
    return rows


def test_measured_stock_is_the_baseline_where_the_point_was_tuned() -> None:
    rows = _tuning_rows()
    evals, stock = decide.evaluate(frame(rows), decide.Params(resamples=0))
    b = tbl.empty_table()
    b["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    b["rules"] = [
        {"op": "MUL_MAT", "layout": "weight", "src0_type": "q4_K", "src1_type": "f32", "N": 4096, "K": 4096,
         "B": 1, "M_lo": 256, "M_hi": 1024, "route": "cublas"}
    ]  # fmt: skip
    census = [
        census_row(M=512, calls=10, est_us=100.0),  # tuned: 10 calls x 50 us stock = 500 us, cublas 2x
        census_row(M=768, calls=4, est_us=300.0),  # not tuned: est_us 300, interpolated min(2, 4) = 2x
        census_row(M=64, calls=1000, est_us=40.0),  # no rule, not tuned: est_us
    ]
    p = predict.predict(census, tbl.empty_table(), b, evals, stock)
    got = {r.M: (r.baseline, r.baseline_us, r.us_b, r.basis) for r in p.every_row}
    assert got == {
        512: ("measured stock", 500.0, 250.0, "measured"),
        768: ("est_us", 300.0, 150.0, "interpolated"),
        64: ("est_us", 40.0, 40.0, "same route"),
    }
    assert p.total_a_us == pytest.approx(840.0) and p.total_b_us == pytest.approx(440.0)
    assert p.measured_share == pytest.approx(500 / 840)
    assert any("measured stock time (calls x median anchor_us) for 1 rows" in n for n in p.notes)
    # without the tuning's stock times every baseline is est_us
    est = predict.predict(census, tbl.empty_table(), b, evals, None)
    assert {r.baseline for r in est.every_row} == {"est_us"}
    assert est.speedup == pytest.approx((100 + 300 + 40) / (50 + 150 + 40))
    # a fused row runs another kernel than the one tuned: it keeps est_us and is never overridden
    fused = predict.predict([census_row(M=512, calls=10, est_us=100.0, fused="glu")], tbl.empty_table(), b,
                            evals, stock)  # fmt: skip
    assert [(r.baseline, r.us_a, r.us_b) for r in fused.every_row] == [("est_us", 100.0, 100.0)]


def test_diff_and_report_print_the_same_prediction(tmp_path: Path) -> None:
    tuning = write_tuning(_tuning_rows(), tmp_path / "tuning.parquet")
    census = write_census(
        [
            census_row(M=512, calls=10, est_us=100.0),
            census_row(M=768, calls=4, est_us=300.0),
            census_row(M=1024, calls=3, est_us=900.0, tensor="blk.1.ffn_up.weight"),
            census_row(M=8, calls=100, est_us=70.0),
            census_row(M=512, calls=10, est_us=80.0, fused="glu"),
        ],
        tmp_path / "census.parquet",
    )
    runner = CliRunner()
    res = runner.invoke(main, ["codegen", str(tuning), "--census", str(census), "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    table = tmp_path / "t" / "table.json"
    res = runner.invoke(
        main, ["diff", "empty", str(table), "--census", str(census), "--tuning", str(tuning), "--json"]
    )
    assert res.exit_code == 0, res.output
    pred = json.loads(res.output)["prediction"]
    diff_speedup = pred["total_a_us"] / pred["total_b_us"]
    assert diff_speedup > 1.2
    out = tmp_path / "r"
    args = ["report", "--tuning", str(tuning), "--census", str(census), "--table", str(table), "-o", str(out)]
    res = runner.invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    md = (out / "REPORT.md").read_text()
    m = re.search(r"predicted matmul-time speed-up with the table: ([0-9.]+)x", md)
    assert m is not None and m.group(1) == f"{diff_speedup:.3f}"
    # the same number from the report's own analysis, exactly
    view, _ = inputs.load_table(table)
    rows, _ = inputs.load_census(census)
    df, _ = inputs.load_tuning(tuning, inputs.params_from_table(view))
    model = analysis.GainModel(rows, analysis.analyse_tuning(df, inputs.params_from_table(view)), view)
    gains = model.whole()
    assert gains is not None and gains.table is not None
    assert gains.table.total_a_us == pytest.approx(pred["total_a_us"], rel=1e-12)
    assert gains.table.total_b_us == pytest.approx(pred["total_b_us"], rel=1e-12)


def test_committed_h200_table_prediction_weights_by_measured_stock() -> None:
    """The committed H200 census, tuning and table: most of the baseline is measured, and weighting by
    it gives a larger predicted gain than the roofline est_us does (the small shapes the roofline
    underestimates gain most)."""
    census = pq.read_table(H200_DIR / "census.parquet").to_pylist()
    df = pq.read_table(H200_DIR / "tuning.parquet").to_pandas()
    table = tbl.load(H200_DIR / "table.json")
    evals, stock = decide.evaluate(df, decide.Params(resamples=0))
    measured = predict.predict(census, tbl.empty_table(), table, evals, stock)
    roofline = predict.predict(census, tbl.empty_table(), table, evals, None)
    assert measured.unpredicted == 0 and measured.measured_share > 0.9
    assert f"{measured.speedup:.2f}" == "1.36" and f"{roofline.speedup:.3f}" == "1.244"
