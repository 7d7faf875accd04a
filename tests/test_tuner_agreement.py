"""The agreement experiment's pure parts: reading the reference TSV, case lists, test-backend-ops SQL,
the precision-cost statistic. (The pipeline itself runs in tests/test_tuner_native.py on the CPU.)"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ggml_dispatch.tuner import agreement

REFERENCE = Path(__file__).resolve().parent.parent / "samples" / "reference" / "h200-mul-mat-routes.tsv"


@pytest.fixture(scope="module")
def ref() -> list[agreement.RefRow]:
    return agreement.parse_reference_tsv(REFERENCE)


def test_reference_is_converted_at_the_border(ref: list[agreement.RefRow]) -> None:
    # "q4_K 17408 1024 5120 cublas 1947 513.79": m = N (output features), n = M (tokens), k = K
    r = next(x for x in ref if x.src0_type == "q4_K" and x.N == 17408 and x.M == 1024 and x.route == "cublas")
    assert (r.K, r.us) == (5120, 513.79)


def test_agreement_cases_are_the_shapes_with_m_at_least_64(ref: list[agreement.RefRow]) -> None:
    cases = agreement.agreement_cases(ref, min_m=64, trials=5)
    assert len(cases) == 31
    assert all(c["M"] >= 64 and c["routes"] == ["cublas", "mmq"] for c in cases)
    assert len({c["case"] for c in cases}) == 31
    c = next(c for c in cases if c["case"] == "q5_K:N17408:K5120:M256")
    assert (c["op"], c["layout"], c["src1_type"], c["B"], c["nmse_max"]) == (
        "MUL_MAT",
        "weight",
        "f32",
        1,
        5e-4,
    )


def test_l2_cases_pair_rotated_and_one_copy(ref: list[agreement.RefRow]) -> None:
    cases = agreement.l2_cases(ref)
    assert len(cases) == 16
    assert [c["rotate"] for c in cases[:2]] == [True, False]
    assert cases[0]["case"].endswith(":rotated") and cases[1]["case"].endswith(":one-copy")
    q8 = [c for c in cases if c["src0_type"] == "q8_0"]
    assert q8 and all(c["routes"] == ["mmvq"] for c in q8)


SQL_HEAD = """CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);
"""


def insert(name: str, us: float) -> str:
    """One INSERT as test-backend-ops' sql_printer writes it."""
    fields = (
        "test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, "
        "error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, "
        "backend_reg_name"
    )
    params = f"name={name},type=f32,ne=[256,8,1,1],op_params=[],sources=q4_K[512,256,1,1],f32[512,8,1,1]"
    values = [
        "2026-11-30T10:59:01Z",
        "x",
        "CUDA0",
        "MUL_MAT",
        params,
        "perf",
        "1",
        "1",
        "",
        f"{us:.6f}",
        "0.000000",
        "0.7",
        "96",
        "16384",
        "",
        "",
    ]
    return f"INSERT INTO test_backend_ops ({fields}) VALUES (" + ", ".join(f"'{v}'" for v in values) + ");"


def test_tbo_sql_runs_are_told_apart_by_their_comment_lines() -> None:
    text = (
        "-- run: config=stock rep=0 wall_s=4.0 cases=2 rc=0\n" + SQL_HEAD + insert("a:N1:K2:M3", 10.0) + "\n"
        "Some stray line\n" + insert("b", 20.0) + "\n"
        "-- run: config=mmq rep=0 wall_s=3.0 cases=2 rc=0\n" + SQL_HEAD + insert("a:N1:K2:M3", 8.0) + "\n"
    )
    rows = agreement.parse_tbo_sql(text)
    assert [(r["case"], r["config"], r["time_us"]) for r in rows] == [
        ("a:N1:K2:M3", "stock", 10.0),
        ("b", "stock", 20.0),
        ("a:N1:K2:M3", "mmq", 8.0),
    ]
    assert rows[2]["wall_s"] == "3.0"


def test_ci_narrows_with_trials_and_the_cost_is_where_it_first_is_precise() -> None:
    rng = random.Random(1)
    ratios = [1.25 * (1 + rng.gauss(0, 0.01)) for _ in range(30)]
    costs = [0.5 * (i + 1) for i in range(30)]
    res = agreement.first_precise(ratios, costs)
    assert res["reached"] and res["half_width"] <= 0.01
    assert res["cost_s"] == costs[res["n"] - 1]
    assert abs(res["ratio"] - 1.25) < 0.02 and res["lo"] <= res["ratio"] <= res["hi"]
    noisy = [1.25 * (1 + rng.gauss(0, 0.2)) for _ in range(8)]
    res = agreement.first_precise(noisy, costs[:8])
    assert not res["reached"] and res["n"] == 8


def _trial(case: str, route: str, t: int, us: float, anchor: float, t_end: float) -> str:
    return json.dumps(
        {
            "kind": "trial",
            "case": case,
            "route": route,
            "trial": t,
            "us": us,
            "anchor_us": anchor,
            "status": "ok",
            "t_end_s": t_end,
        }
    )


def test_cost_summary_pairs_the_tools_samples() -> None:
    rng = random.Random(2)
    lines = []
    for t in range(12):
        a = 100 * (1 + rng.gauss(0, 0.002))
        lines.append(_trial("c", "stock", t, a, a, 1.0 + 0.2 * t))
        lines.append(_trial("c", "mmq", t, 80 * (1 + rng.gauss(0, 0.002)), a, 1.1 + 0.2 * t))
    sql = ""
    for rep in range(4):
        for cfg, us in (("stock", 100.0 * (1 + 0.03 * rep)), ("mmq", 80.0 * (1 - 0.02 * rep))):
            sql += f"-- run: rep={rep} config={cfg} wall_s=2.0 cases=1 rc=0\n{SQL_HEAD}{insert('c', us)}\n"
    (res,) = agreement.summarize_cost("\n".join(lines), sql, [{"case": "c", "routes": ["mmq"]}])
    assert res["harness"]["reached"] and res["harness"]["n"] >= 3
    # the cost of trial n is the end of that whole trial (stock and every candidate)
    assert res["harness"]["cost_s"] == pytest.approx(1.1 + 0.2 * (res["harness"]["n"] - 1))
    # one stock and one mmq process per repetition, 2 s each; four pairs do not reach +-1% here
    assert not res["tbo"]["reached"] and res["tbo"]["n"] == 4 and res["tbo"]["cost_s"] == pytest.approx(16.0)
    assert res["tbo_over_harness"] == pytest.approx(res["tbo"]["cost_s"] / res["harness"]["cost_s"])


def test_markdown_summary_mentions_every_part() -> None:
    md = agreement.render_markdown(
        {
            "device": "NVIDIA H200",
            "agreement": [
                {
                    "case": "c",
                    "route": "stock",
                    "weight_mb": 61.0,
                    "fits_l2": False,
                    "harness_us": 100.0,
                    "tbo_us": 104.0,
                    "harness_over_tbo": 0.96,
                    "within_10pct": True,
                    "tbo_route_ran": ["mmq"],
                    "reference_us": 101.0,
                }
            ],
            "cost": [],
            "l2": [],
        }
    )
    assert "1/1 within 10% where the weights exceed L2" in md and "| c | stock | 61.0 | no |" in md
