"""lab/moe_cases.py: MUL_MAT_ID harness cases from a real census file (ingested from a trace with expert
statistics), and lab/moe.sh parsing with bash. The cases run on a GPU only (lab/moe.sh PART=tune)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner
from conftest import H200_DEVICE, TraceBuilder

from ggml_dispatch import registry
from ggml_dispatch.cli import main
from lab import moe_cases

REPO = Path(__file__).resolve().parent.parent


def _census(tb: TraceBuilder, tmp_path: Path) -> Path:
    def rec(tensor: str, ne: list[int], nb: list[int], src1: list[int], count: int) -> dict[str, object]:
        return tb.route(
            op="MUL_MAT_ID",
            tensor=tensor,
            src0_type="q4_K",
            src0_ne=ne,
            src0_nb=nb,
            src1_ne=src1,
            layout="expert",
            route="mmq",
            stock_route="mmq",
            count=count,
        )

    up = rec(
        "blk.0.ffn_up_exps.weight", [2048, 768, 128, 1], [144, 1152, 884736, 113246208], [2048, 1, 512, 1], 4
    )
    down = rec(
        "blk.0.ffn_down_exps.weight", [768, 2048, 128, 1], [144, 432, 884736, 113246208], [768, 8, 512, 1], 4
    )
    dense = tb.route(M=512)
    path = tb.write("t.jsonl", [tb.header(devices=[H200_DEVICE]), up, down, dense, tb.footer()])
    out = tmp_path / "census.parquet"
    res = CliRunner().invoke(main, ["census", "ingest", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_cases_cover_every_shape_routing_and_configuration(make_trace: TraceBuilder, tmp_path: Path) -> None:
    census = _census(make_trace, tmp_path)
    out = tmp_path / "cases.json"
    assert moe_cases.main([str(census), "-o", str(out), "--trials", "3"]) == 0
    cases = json.loads(out.read_text())
    assert len(cases) == 2 * 3  # up and down, each uniform / skewed / few; the MUL_MAT row is not a case
    by = {(c["K"], c["routing"]["kind"]): c for c in cases}
    up, down = by[(2048, "uniform")], by[(768, "few")]
    assert (up["U"], up["used"], up["E"], up["M"], up["N"]) == (1, 8, 128, 512, 768)
    assert (down["U"], down["used"], down["N"]) == (8, 8, 2048)
    for c in cases:
        assert c["op"] == "MUL_MAT_ID" and c["layout"] == "expert" and c["trials"] == 3
        # every candidate is a configuration of a route that serves MUL_MAT_ID
        assert all(registry.route_allowed("MUL_MAT_ID", x) for x in c["routes"])
        assert (
            "cublas" not in c["routes"] and "mmq/j=64,stream_k=off" in c["routes"] and "mmvq" in c["routes"]
        )
    assert len({c["case"] for c in cases}) == len(cases)


def test_unknown_routing_and_a_census_without_experts(make_trace: TraceBuilder, tmp_path: Path) -> None:
    census = _census(make_trace, tmp_path)
    assert moe_cases.main([str(census), "-o", str(tmp_path / "c.json"), "--routing", "zipf"]) == 2
    assert not (tmp_path / "c.json").exists()
    path = make_trace.write("d.jsonl", [make_trace.header(), make_trace.route(M=4), make_trace.footer()])
    dense = tmp_path / "dense.parquet"
    assert CliRunner().invoke(main, ["census", "ingest", str(path), "-o", str(dense)]).exit_code == 0
    assert moe_cases.main([str(dense), "-o", str(tmp_path / "c.json")]) == 2


def test_the_lab_script_parses() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    res = subprocess.run([bash, "-n", str(REPO / "lab" / "moe.sh")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
