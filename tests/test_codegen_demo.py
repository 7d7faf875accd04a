"""The demo's ggml_dispatch/codegen/diff stage on its real inputs: the committed reference-shape trace through
``census ingest``, samples/reference's TSV through ``tune import-reference``, then codegen and diff."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from click.testing import CliRunner
from test_codegen_support import REPO, reference_tsv

from ggml_dispatch.cli import main
from ggml_dispatch.codegen import table as tbl

TRACE = REPO / "samples" / "trace-reference-shapes.jsonl"


def test_committed_trace_is_what_its_script_writes() -> None:
    spec = importlib.util.spec_from_file_location("mk", REPO / "samples" / "make_trace_reference_shapes.py")
    assert spec is not None and spec.loader is not None
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    lines = [json.dumps(r, separators=(",", ":")) for r in mk.build()]
    assert TRACE.read_text() == "\n".join(lines) + "\n"
    assert "not captured" in lines[0]


def _run(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_demo_pipeline_yields_non_stock_rules_with_a_predicted_gain(tmp_path: Path) -> None:
    census, tuning, out = tmp_path / "census.parquet", tmp_path / "tuning.parquet", tmp_path / "table"
    _run("census", "ingest", str(TRACE), "-o", str(census))
    _run("tune", "import-reference", str(reference_tsv()), "--sm-count", "132", "-o", str(tuning))
    text = _run("codegen", str(tuning), "--census", str(census), "--reference-margin", "0.10", "-o", str(out))
    assert "declared margin 10%" in text and "never under tables/" in text
    t = tbl.load(out / "table.json")
    rules = {(r["src0_type"], r["N"], r["K"], r["M_lo"], r["M_hi"], r["route"]) for r in t["rules"]}
    # the reference file's headline findings, as rules: mmq beats mmvq at M = 8 and cuBLAS beats mmq at
    # M = 1024 on 17408x5120; on the 8B shapes cuBLAS wins from M = 256 where the margin allows
    assert ("q4_K", 17408, 5120, 8, 8, "mmq") in rules
    assert ("q4_K", 17408, 5120, 1024, 1024, "cublas") in rules
    assert ("q6_K", 1024, 4096, 256, 512, "cublas") in rules
    # 17408x5120 q4_K at M = 256: mmq (stock) still wins, so no cuBLAS rule covers it
    assert not any(r[:3] == ("q4_K", 17408, 5120) and r[3] <= 256 <= r[4] for r in rules)
    assert "predicted change vs stock:" in text and "stock -> cublas" in text
    diff = _run(
        "diff", "empty", str(out / "table.json"), "--census", str(census), "--tuning", str(tuning), "--json"
    )
    pred = json.loads(diff)["prediction"]
    assert pred["delta_us"] < 0 and pred["unpredicted"] == 0 and pred["fused_rows"] > 0
    assert {r["route_b"] for r in pred["rows"]} == {"mmq", "cublas"}
    assert all(r["delta_us"] < 0 for r in pred["rows"])
