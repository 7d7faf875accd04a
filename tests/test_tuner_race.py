"""Racing in the harness trial loop (ggml_dispatch/tuner/harness/race.h), compiled alone with the system C++
compiler:
a candidate is pruned only after the minimum of paired trials and only when the whole 95% t-interval of
its paired ratio against the current best lies below 1 - noise."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CXX = shutil.which("g++") or shutil.which("c++")


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if CXX is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("race") / "race_unit"
    subprocess.run(
        [
            CXX,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{ROOT / 'ggml_dispatch/tuner/harness'}",
            str(ROOT / "tests/native/race_unit.cpp"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


def test_a_steadily_slower_candidate_is_pruned_after_the_minimum(unit: dict[str, Any]) -> None:
    assert unit["slow"] == 1 and unit["slow_after_2"] == 0 and unit["off"] == 0


def test_inside_the_noise_or_too_noisy_is_kept(unit: dict[str, Any]) -> None:
    assert unit["close"] == 0 and unit["noisy"] == 0


def test_the_interval_is_a_t_interval_of_log_ratios(unit: dict[str, Any]) -> None:
    best = [100, 101, 99, 100, 100]
    slow = [130, 131, 129, 130, 130]
    x = [math.log(b / c) for b, c in zip(best, slow, strict=True)]
    mean = sum(x) / len(x)
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
    half = 2.776 * sd / math.sqrt(len(x))
    assert unit["n"] == 5
    assert unit["lo"] == pytest.approx(math.exp(mean - half), rel=1e-5)
    assert unit["hi"] == pytest.approx(math.exp(mean + half), rel=1e-5)
    assert unit["t95_1"] == pytest.approx(12.706) and unit["t95_4"] == pytest.approx(2.776)
    assert 1.96 < unit["t95_100"] < 2.0


def test_pairs_need_both_times_and_the_best_is_the_lowest_median(unit: dict[str, Any]) -> None:
    assert unit["nan_pairs"] == 3
    assert unit["best"] == 1


def test_the_tile_model_prunes_wider_tiles_with_the_same_column_tile_count(unit: dict[str, Any]) -> None:
    # M = 8: one column tile for every J, so the wider widths of each stream-k setting are not timed
    assert unit["dom8"] == ["", "", "mmq/j=8,stream_k=on", "mmq/j=8,stream_k=off", "", ""]
    # an ineligible width neither dominates nor is pruned; the smallest eligible width of a count stays
    assert unit["dom100"] == ["", "", "mmq/j=56", ""]


def test_the_first_trial_screen_drops_candidates_far_behind_the_best(unit: dict[str, Any]) -> None:
    # 151 us against a best of 100 (> 1.5x) is screened, naming the best (index 1); 149 is kept, stock
    # (index 0, the anchor) is never screened, nor a candidate without a first time; 0 or 1 turns it off
    assert unit["screen"] == [-1, -1, 1, -1, -1]
    assert unit["screen_off"] == -1 and unit["screen_one"] == -1
    # MUL_MAT_ID's screen is against stock, not the best: only the candidate beyond 1.5 x stock goes
    assert unit["screen_vs_stock"] == [-1, -1, -1, 0, -1] and unit["screen_vs_none"] == -1


def test_a_per_call_candidate_races_only_against_per_call_rivals(unit: dict[str, Any]) -> None:
    # a table decided without a cache budget needs its per-call candidates measured in full: 280 us is
    # screened against the per-call best (180, index 2), not against the cached 100; 180 itself is kept
    assert unit["screen_per_call"] == [-1, -1, -1, 2]
    assert unit["screen_one_class"] == [-1, -1, 1, 1]  # without the classes the cached 100 screens both
    assert unit["best_among"] == 2 and unit["best_among_none"] == -1


def test_a_trial_that_will_be_marked_drifted_is_not_a_pair(unit: dict[str, Any]) -> None:
    assert unit["drifted"] == [0, 1, 0, 0, 0]


def test_each_trial_runs_the_candidates_in_its_own_order(unit: dict[str, Any]) -> None:
    # on the H200 a candidate's time depended on the candidate before it (up to 1.4x): a fixed or rotated
    # order gives each the same predecessor in every trial, so the order is drawn per trial
    orders = unit["orders"]
    assert len(orders) == 21 and all(sorted(o) == list(range(6)) for o in orders)
    first, other, again = orders[:7], orders[7:14], orders[14:]
    assert again == first and other != first  # deterministic per case, different between cases
    for cand in range(6):
        preds = {o[o.index(cand) - 1] if o.index(cand) > 0 else None for o in first}
        assert len(preds) >= 3, (cand, preds)
    assert unit["order_one"] == 0 and unit["order_none"] == 0


def test_a_graph_breaking_candidate_is_timed_only_where_its_node_beats_stock(unit: dict[str, Any]) -> None:
    slow, faster, captured, stock_direct = unit["graph_break"]
    assert slow == "breaks CUDA graphs: its graph ran directly, 25.00x stock's node time"
    assert faster == captured == stock_direct == ""
