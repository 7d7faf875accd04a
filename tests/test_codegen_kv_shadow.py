"""``codegen --kv-shadow-budget``: the KV shadow's configurations enter a table only under a budget.

On the committed sweep of the H200 attention-shadow table (its q8_0 points, each configuration also
with ``kv=shadow``), measured on the GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from codegen import kv_shadow
from ggml_dispatch.cli import main

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "tables" / "cuda-sm90-nvidia-h200-attn-shadow" / "tuning-q8_0.parquet"


def _codegen(out: Path, *extra: str) -> tuple[str, dict]:
    res = CliRunner().invoke(main, ["codegen", str(SWEEP), "-o", str(out), *extra])
    assert res.exit_code == 0, res.output
    return res.output, json.loads((out / "table.json").read_text())


def _shadow_rules(table: dict) -> list[dict]:
    return [r for r in table["rules"] if kv_shadow.is_shadow(r["config"])]


def test_without_a_budget_the_shadow_is_left_out_and_said_so(tmp_path: Path) -> None:
    output, table = _codegen(tmp_path / "none")
    assert not _shadow_rules(table) and "kv_shadow" not in table
    m = re.search(r"KV shadow: left out \(no --kv-shadow-budget\): at (\d+) attention points", output)
    assert m and int(m.group(1)) > 0, output
    assert (
        "GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES 0"
        in (tmp_path / "none" / "ggml-dispatch-table.h").read_text()
    )


def test_a_budget_admits_the_shadow_and_compiles_it_in(tmp_path: Path) -> None:
    output, table = _codegen(tmp_path / "b", "--kv-shadow-budget", "16384")
    assert _shadow_rules(table) and table["kv_shadow"] == {"budget_mib": 16384, "budget_bytes": 16384 << 20}
    assert "left out" not in output and "KV shadow: budget 16384 MiB" in output
    header = (tmp_path / "b" / "ggml-dispatch-table.h").read_text()
    assert f"GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES {16384 << 20}" in header


def test_a_bad_budget_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["codegen", str(SWEEP), "-o", str(tmp_path / "x"), "--kv-shadow-budget", "-1"]
    )
    assert res.exit_code == 2 and "--kv-shadow-budget" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()
