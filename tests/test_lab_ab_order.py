"""lab/ab_order.py on the recorded H200 f16 A/B runs (s16 calls 1-2, s18: real ggml-dispatch-ab/1 records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggml_dispatch import archive
from ggml_dispatch.codegen import decide
from lab import ab_order

ROOT = Path(__file__).resolve().parents[1]
RUNS = [
    archive.path("evidence/h200-2026-12-04-s18/ab-qwen3-seed-f16-hook.jsonl"),
    archive.path("evidence/h200-2026-12-04-s16/ab-qwen3-seed-f16-hook-call1.jsonl"),
    archive.path("evidence/h200-2026-12-04-s16/ab-qwen3-seed-f16-hook-call2.jsonl"),
]


def test_pooled_ratio_is_the_pooled_a_b_and_order_splits_every_pair() -> None:
    pairs = ab_order.ordered_pairs(RUNS)
    ps = pairs[("qwen3-seed", "pp3 @ d49152")]
    assert len(ps) == 24  # 8 pairs in each of the three calls
    first, after, every = ab_order.split(ps, decide.Params())
    assert first.n + after.n == every.n == 24
    assert first.n == 9  # three arms rotated over 8 pairs: table before stock in 3 of each call's pairs
    # the pooled value evidence/h200-2026-12-04-s18/ab-qwen3-seed-f16-hook-pooled-s16-s18.md reports
    assert every.point == pytest.approx(0.971, abs=5e-4)


def test_order_follows_the_started_times(tmp_path: Path) -> None:
    lines = RUNS[0].read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    pick = ("table", "stock")
    one = [r for r in recs if r["test"] == "pp2 @ d49152" and r["pair"] == 1 and r["arm"] in pick]
    assert len(one) == 2
    # swap the two start times: the pair moves to the other column
    one[0]["started"], one[1]["started"] = one[1]["started"], one[0]["started"]
    f = tmp_path / "ab.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in one))
    before = {p[2] for p in ab_order.ordered_pairs([RUNS[0]])[("qwen3-seed", "pp2 @ d49152")][:1]}
    after = {p[2] for p in ab_order.ordered_pairs([f])[("qwen3-seed", "pp2 @ d49152")]}
    assert before != after


def test_cli_bad_arms_and_missing_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    assert ab_order.main(["--arms", "table/table", str(RUNS[0])]) == 2
    assert "--arms" in capsys.readouterr().err
    assert ab_order.main(["--test", "pp9 @ d1", str(RUNS[0])]) == 1
    assert "no table/stock pairs" in capsys.readouterr().err
    assert ab_order.main(["--test", "tg32 @ d49152", *map(str, RUNS)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| model | test | table first |") and "tg32 @ d49152" in out
