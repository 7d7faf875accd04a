"""The harness's MUL_MAT_ID op file (ggml_dispatch/tuner/harness/mul_mat_id.cpp), built against the pinned
tree's CPU
backend: cases with each routing kind run, their output matches the CPU reference, the routing the
nodes read is the one asked for, and bad cases are refused naming the field. Which CUDA route ran and
how fast is a GPU matter (lab/moe.sh PART=tune)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def run(harness: Path, cases: list[dict[str, Any]], tmp: Path) -> tuple[int, list[dict[str, Any]], str]:
    f = tmp / "cases.json"
    f.write_text(json.dumps(cases))
    p = subprocess.run(
        [str(harness), "--cases", str(f), "--threads", "1", "--trial-ms", "2", "--target-graph-us", "200"],
        capture_output=True,
        text=True,
    )
    return p.returncode, [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")], p.stderr


def case(cid: str, routing: dict[str, Any], U: int = 1, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "case": cid,
        "op": "MUL_MAT_ID",
        "layout": "expert",
        "src0_type": "q4_K",
        "src1_type": "f32",
        "M": 12,
        "N": 64,
        "K": 256,
        "E": 16,
        "U": U,
        "used": 4,
        "routing": routing,
        "routes": ["mmq", "mmvq"],
        "trials": 2,
    }
    d.update(kw)
    return d


def test_every_routing_kind_runs_and_matches_the_reference(harness: Path, tmp_path: Path) -> None:
    counts = [0] * 16
    counts[3], counts[5], counts[9], counts[10], counts[15] = 40, 10, 5, 5, 1
    cases = [
        case("uniform", {"kind": "uniform"}),
        case("skewed", {"kind": "skewed", "s": 1.5}),
        case("few", {"kind": "few"}, U=4),
        case("counts", {"kind": "counts", "counts": counts}),
    ]
    rc, lines, err = run(harness, cases, tmp_path)
    assert rc == 0, err
    ends = {x["case"]: x for x in lines if x.get("kind") == "case"}
    assert set(ends) == {"uniform", "skewed", "few", "counts"}
    stock = [x for x in lines if x.get("kind") == "trial" and x.get("route") == "stock"]
    # drifted: a shared CPU's timing noise; the numerics are checked all the same
    assert stock and all(x["status"] in ("ok", "drifted") and x["nmse"] <= 5e-4 for x in stock)
    # the routing the first node reads: all tokens on `used` experts for "few", every expert with
    # tokens among the five the counts name
    assert ends["few"]["experts"]["nonempty"] == 4 and ends["few"]["experts"]["max"] == 12
    assert ends["counts"]["experts"]["nonempty"] <= 5
    assert ends["uniform"]["experts"]["nonempty"] > 4
    assert ends["skewed"]["experts"]["cv"] > ends["uniform"]["experts"]["cv"] * 0.5
    # on the CPU backend there is no override API: candidates are refused, not timed
    refused = [x for x in lines if x.get("kind") == "trial" and x.get("route") in ("mmq", "mmvq")]
    assert refused and all(x["status"] == "ineligible" for x in refused)


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"used": 17}, "more than E"),
        ({"U": 2}, "U must be 1"),
        ({"src1_type": "f16"}, "src1_type f32"),
        ({"routing": {"kind": "zipf"}}, "routing.kind 'zipf'"),
        ({"routing": {"kind": "few", "experts": 2}}, "routing.experts"),
        ({"routing": {"kind": "counts", "counts": [1, 2]}}, "list of E token counts"),
        ({"layout": "weight"}, "layout 'expert'"),
    ],
)
def test_bad_cases_are_refused(harness: Path, tmp_path: Path, over: dict[str, Any], needle: str) -> None:
    rc, lines, _err = run(harness, [{**case("bad", {"kind": "uniform"}), **over}], tmp_path)
    (end,) = [x for x in lines if x.get("kind") == "case"]
    assert rc == 0 and end["status"].startswith("failed:") and needle in end["status"], end
    assert not [x for x in lines if x.get("kind") == "trial"]  # nothing was timed


# ---------------------------------------------------------------------------------------------
# `tune run` end to end on a MoE census: MUL_MAT_ID cases, tuning rows with E, U and routing bucket


def test_tune_run_on_a_moe_census_writes_mul_mat_id_rows_with_their_buckets(
    tree: Path, harness: Path, tmp_path: Path
) -> None:
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import write_gguf

    from ggml_dispatch.tuner import mul_mat_id as tmoe

    hidden, ffn, E, used = 256, 64, 128, 8
    model = write_gguf(
        tmp_path / "qwen3moe-tiny.gguf",
        [
            ("token_embd.weight", "q8_0", [hidden, 512]),
            ("blk.0.attn_q.weight", "q8_0", [hidden, hidden]),
            ("blk.0.ffn_gate_inp.weight", "f32", [hidden, E]),
            ("blk.0.ffn_up_exps.weight", "q8_0", [hidden, ffn, E]),
            ("blk.0.ffn_down_exps.weight", "q8_0", [ffn, hidden, E]),
            ("output.weight", "q8_0", [hidden, 512]),
        ],
        arch="qwen3moe",
        kv={"qwen3moe.block_count": 1, "qwen3moe.expert_count": E, "qwen3moe.expert_used_count": used},
    )
    cli = str(Path(sys.executable).parent / "ggml-dispatch")
    census = tmp_path / "census.parquet"
    subprocess.run(
        [cli, "census", "from-gguf", str(model), "--m", "64", "-o", str(census)],
        check=True,
        capture_output=True,
    )
    # what a traced census adds to its MUL_MAT_ID rows: tokens-per-expert statistics (routing kind "trace")
    declared = pq.read_table(census)
    moe_row = [op == "MUL_MAT_ID" for op in declared.column("op").to_pylist()]
    for name, value in (("experts_nonempty", 50.0), ("tokens_max", 30.0), ("tokens_cv", 0.5)):
        declared = declared.append_column(
            name, pa.array([value if m else None for m in moe_row], pa.float64())
        )
    pq.write_table(declared, census)
    out = tmp_path / "tuning.parquet"
    p = subprocess.run(
        [
            *(cli, "tune", "run", str(census), "--llama-cpp", str(tree)),
            *(
                "--harness",
                str(harness),
                "-o",
                str(out),
                "--routes",
                "mmvq,mmq,cublas",
                "--configs",
                "routes",
            ),
            *("--trials", "2", "--coverage", "1"),
            *(
                "--harness-arg=--trial-ms=2",
                "--harness-arg=--threads=1",
                "--harness-arg=--target-graph-us=200",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr
    rows = pq.read_table(out).to_pylist()
    moe = [r for r in rows if r["op"] == "MUL_MAT_ID"]
    dense = [r for r in rows if r["op"] == "MUL_MAT"]
    assert dense and all(r["E"] is None and r["routing"] is None for r in dense)
    # gate/up (U = 1, used from the down row of the same E) and down (U = used), each under three kinds
    points = {(r["N"], r["K"], r["E"], r["U"], r["M"]) for r in moe}
    assert points == {(ffn, hidden, E, 1, 64), (hidden, ffn, E, used, 64)}
    assert {r["routing_kind"] for r in moe} == set(tmoe.ROUTING_KINDS)
    # cuBLAS does not serve MUL_MAT_ID: only mmvq and mmq are its candidates (refused on the CPU backend)
    assert {r["route"] for r in moe} == {"mmvq", "mmq"} and {r["status"] for r in moe} == {"ineligible"}
    # the bucket is what the drawn routing measured: at M = 64 of 128 experts with 8 used, uniform
    # spreads, the 1/(rank+1)^1.2 draw is skewed, every token on the same 8 experts is concentrated, and
    # the traced statistics (50 of 128 experts get tokens) are skewed
    by_kind = {(r["routing_kind"], r["U"]): r["routing"] for r in moe}
    kinds = (("trace", 2), ("uniform", 1), ("skewed", 2), ("few", 3))
    assert by_kind == {(k, u): b for k, b in kinds for u in (1, used)}
    # the journal resumes: a second run measures nothing new
    again = subprocess.run(p.args, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "0 cases measured" in again.stderr, again.stderr
    assert pq.read_table(out).num_rows == len(rows)
