"""lab/race_replay.py on the recorded H200 configurations sweep (its journal,
tables/cuda-sm90-nvidia-h200/tuning/configs.journal.jsonl.gz): the fitted cost model reproduces the sweep's
measured wall time, and each pruning rule only removes trials."""

from __future__ import annotations

from pathlib import Path

from lab import race_replay as replay

ROOT = Path(__file__).resolve().parent.parent
JOURNAL = ROOT / "tables" / "cuda-sm90-nvidia-h200" / "tuning" / "configs.journal.jsonl.gz"


def test_the_replay_reproduces_the_recorded_sweep_and_pruning_only_saves() -> None:
    cases = list(replay.cases(JOURNAL))
    coef = replay.fit(cases)
    assert coef[0] > 0 and coef[1] > 0  # trial 0 pays a setup; every timed candidate costs
    measured = sum(d["wall_s"] for d in cases)
    recorded = sum(replay.cost(d, coef, False, 0.0) for d in cases)
    assert abs(recorded - measured) < 0.03 * measured
    per_case = [
        (replay.cost(d, coef, False, 0.0), replay.cost(d, coef, True, 0.0), replay.cost(d, coef, True, 1.5))
        for d in cases
    ]
    assert all(r >= t - 1e-9 >= s - 2e-9 for r, t, s in per_case)
    assert sum(s for *_, s in per_case) < 0.6 * recorded


def test_the_tile_model_keeps_the_smallest_width_of_each_tile_count() -> None:
    names = {"mmq/j=8,stream_k=on", "mmq/j=16,stream_k=on", "mmq/j=16,stream_k=off", "cublas", "mmq"}
    assert replay.dominated(names, 8) == {"mmq/j=16,stream_k=on"}  # one tile either way; off has no j=8
    assert replay.dominated(names, 16) == set()  # 2 tiles of 8, 1 of 16
