"""lab/moe_split.py on a recorded H200 MUL_MAT_ID sweep (real rows, both splits)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ggml_dispatch import archive
from lab import moe_split

ROOT = Path(__file__).resolve().parents[1]
SWEEP = archive.path("evidence/h200-2026-12-04-s18/moe-tuning.parquet")


@pytest.fixture(scope="module")
def tuning() -> pd.DataFrame:
    return pd.read_parquet(SWEEP)


def _ratio(cell: str) -> float:
    return float(cell.split("/")[0])


def test_split_table_keeps_each_split_kind_apart(tuning: pd.DataFrame) -> None:
    t = moe_split.split_table(tuning)
    assert len(t) == 21  # 7 points (types, N, K, M) x 3 routing kinds
    # s18 ran no fused split: no value, not a wrong one
    assert t[["best_2j_fused", "best_fit"]].isna().all().all()
    for s in ("2j", "2j_wave"):
        picked = t[f"best_{s}"].dropna()
        assert len(picked) == len(t) and all(c.endswith(f",split={s}") for c in picked)
    assert not t["best_plain"].str.contains("split=").any()
    # the split is the fastest kind under skewed routing at every M >= 128 of this sweep
    skewed = t[(t["routing"] == "skewed") & (t["M"] >= 128)]
    assert (skewed[["x_2j", "x_2j_wave"]].max(axis=1) > skewed["x_plain"]).all()


def test_same_j_shows_the_wave_cheaper_than_the_split_where_its_first_launch_is_empty(
    tuning: pd.DataFrame,
) -> None:
    t = moe_split.same_j_table(tuning, "few")
    # under `few` at M = 512 every expert has 512 tokens: J <= 48 leaves the first launch empty
    empty = t[(t["M"] == 512) & (t["J"] <= 48)]
    assert len(empty) == 3 * 6
    assert all(_ratio(w) > _ratio(s) for w, s in zip(empty["2j_wave"], empty["2j"], strict=True))
    # and still not free: no J there reaches stock
    assert max(_ratio(w) for w in empty["2j_wave"]) < 1.0


def test_cli_refuses_a_file_that_is_no_tuning_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "census.parquet"
    pd.DataFrame({"op": ["MUL_MAT_ID"], "N": [768]}).to_parquet(bad)
    assert moe_split.main([str(bad)]) == 1
    assert "not a MUL_MAT_ID tuning file" in capsys.readouterr().err
    assert moe_split.main([str(SWEEP), "--same-j"]) == 2
