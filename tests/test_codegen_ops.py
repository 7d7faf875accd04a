"""``codegen --op``: a table decided over some ops only, the others left to stock.

On the tuning file autotune measured on an H100 (evidence/h100-2026-12-06-s25; MUL_MAT rows of the depth
fill's matmuls and FLASH_ATTN_EXT rows at depth), real GPU measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggml_dispatch import archive, registry
from ggml_dispatch.cli import main

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = archive.path("evidence/h100-2026-12-06-s25")
TUNING = EVIDENCE / "autotune-fill-tuning.parquet"
BUDGET = ["--vram-budget", "16384"]


def _codegen(out: Path, *extra: str) -> tuple[str, dict]:
    res = CliRunner().invoke(main, ["codegen", str(TUNING), "-o", str(out), *BUDGET, *extra])
    assert res.exit_code == 0, res.output
    return res.output, json.loads((out / "table.json").read_text())


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _codegen(tmp_path_factory.mktemp("full"))[1]


def _rules_of(table: dict, op: str) -> list[dict]:
    return [r for r in table["rules"] if r["op"] == op]


def test_one_op_keeps_exactly_that_ops_rules(tmp_path: Path, full: dict) -> None:
    output, attn = _codegen(tmp_path / "attn", "--op", "FLASH_ATTN_EXT")
    assert _rules_of(full, "MUL_MAT") and _rules_of(full, "FLASH_ATTN_EXT")
    assert attn["rules"] == _rules_of(full, "FLASH_ATTN_EXT")
    assert attn["provenance"]["decision"]["ops"] == ["FLASH_ATTN_EXT"]
    assert "decided: FLASH_ATTN_EXT only" in output
    # the shadow the attention rules read is still budgeted and compiled in
    assert attn["kv_shadow"]["budget_mib"] == 16384
    header = (tmp_path / "attn" / "ggml-dispatch-table.h").read_text()
    assert f"GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES {16384 << 20}" in header

    _, mm = _codegen(tmp_path / "mm", "--op", "MUL_MAT")
    assert mm["rules"] == _rules_of(full, "MUL_MAT") and "kv_shadow" not in mm


def test_without_op_the_decision_record_is_unchanged(full: dict) -> None:
    # tables decided over every op keep the bytes they had before --op existed: the autotune table
    # measured on the GPU (same tuning, with --census) has the same rules and no "ops" entry
    # (since then, shallow shadow rules read kv=reuse: the same configurations as measured)
    measured = json.loads((EVIDENCE / "autotune-fill-table.json").read_text())
    assert "ops" not in full["provenance"]["decision"]
    as_measured = [{**r, "config": registry.measured_config(r["config"])} for r in full["rules"]]
    assert as_measured == measured["rules"]
    assert full["provenance"]["decision"] == measured["provenance"]["decision"]
    reuse = json.loads((archive.path("evidence/h100-2026-12-06-s26/fill-reuse/table.json")).read_text())
    assert full["rules"] == reuse["rules"] and any("kv=reuse" in r["config"] for r in full["rules"])


def test_every_op_named_is_the_same_table_as_none(tmp_path: Path, full: dict) -> None:
    _, both = _codegen(tmp_path / "both", "--op", "MUL_MAT", "--op", "FLASH_ATTN_EXT")
    assert both["rules"] == full["rules"]
    assert both["provenance"]["decision"]["ops"] == ["FLASH_ATTN_EXT", "MUL_MAT"]


def test_an_op_the_file_has_no_rows_of_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "x"
    res = CliRunner().invoke(main, ["codegen", str(TUNING), "-o", str(out), "--op", "MUL_MAT_ID"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.startswith(f"ggml-dispatch: error: {TUNING}: --op: ") and "--op" in res.output
    assert "no tuning rows of MUL_MAT_ID" in res.output and "FLASH_ATTN_EXT, MUL_MAT" in res.output
    assert not out.exists()


def test_an_unknown_op_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["codegen", str(TUNING), "-o", str(tmp_path / "x"), "--op", "SOFTMAX"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "Invalid value for '--op'" in res.output and "'SOFTMAX' is not one of" in res.output
    assert not (tmp_path / "x").exists()
