"""lab/moe_decide.py: decisions per routing bucket and the routing-0 choice from harness MUL_MAT_ID output.
The harness lines here are written by the test (their times need a GPU); their form is the harness'
(trial and case lines as tuner/harness/bench.cpp and mul_mat_id.cpp emit them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab import moe_decide

SPEC = {"src0_type": "q4_K", "src1_type": "f32", "M": 512, "N": 768, "K": 2048, "E": 128, "U": 1, "used": 8}
# what the harness reports for the first node's routing of each kind at M = 512, 8 of 128 experts
EXPERTS = {
    "uniform": {"nonempty": 128, "max": 51, "mean": 32.0, "cv": 0.17},
    "skewed": {"nonempty": 90, "max": 420, "mean": 45.5, "cv": 1.8},
    "few": {"nonempty": 8, "max": 512, "mean": 512.0, "cv": 0.0},
}


def _lines(ratios: dict[str, dict[str, float]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cases, lines = [], []
    for kind, by_config in ratios.items():
        cid = f"c:{kind}"
        cases.append({"case": cid, "routing": {"kind": kind}, **SPEC})
        for t in range(5):
            jitter = 1.0 + 0.002 * (t - 2)
            lines.append(
                {"kind": "trial", "case": cid, "route": "stock", "trial": t, "status": "ok", "us": 100.0}
            )
            for cfg, r in by_config.items():
                lines.append(
                    {
                        "kind": "trial",
                        "case": cid,
                        "route": cfg,
                        "trial": t,
                        "status": "ok",
                        "us": 100.0 / (r * jitter),
                        "anchor_us": 100.0,
                        "route_ran": cfg.split("/")[0],
                    }
                )
        lines.append({"kind": "case", "case": cid, "status": "done", "experts": EXPERTS[kind]})
    return cases, lines


def test_buckets_and_the_routing0_choice(tmp_path: Path) -> None:
    j64 = "mmq/j=64,stream_k=off"
    cases, lines = _lines(
        {
            "uniform": {j64: 1.20, "mmvf": 0.5, "mmf": 1.40},
            "skewed": {j64: 1.10, "mmf": 1.30},
            "few": {j64: 1.08, "mmf": 0.80},  # mmf wins elsewhere but harms the few-experts case
        }
    )
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "d.json"
    assert moe_decide.main([str(tmp_path / "cases.json"), str(tmp_path / "h.jsonl"), "-o", str(out)]) == 0
    (d,) = json.loads(out.read_text())
    assert set(d["buckets"]) == {"spread", "skewed", "concentrated"}
    assert d["buckets"]["spread"]["passing"] == "mmf" and d["buckets"]["skewed"]["passing"] == "mmf"
    assert d["buckets"]["concentrated"]["passing"] == j64
    # mmvf was measured in one bucket only, mmf is slower than stock beyond noise in one: neither
    assert d["routing0"] == j64


def test_no_routing0_rule_where_nothing_passes_everywhere(tmp_path: Path) -> None:
    cases, lines = _lines({"uniform": {"mmf": 1.4}, "few": {"mmf": 1.01}})
    d = moe_decide.decisions(cases, lines, moe_decide.decide.Params())
    assert d[0]["routing0"] is None and d[0]["buckets"]["spread"]["passing"] == "mmf"
    assert d[0]["buckets"]["concentrated"]["passing"] is None
