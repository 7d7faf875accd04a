"""codegen.loo on a real attention sweep (the committed H200 FlashAttention tuning): the in-sample check
scores every measured point of an op whose key has no N/K, and labels points by their own key fields."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ggml_dispatch import archive
from ggml_dispatch.artifacts import tuning
from ggml_dispatch.codegen import decide, kv_shadow, loo

TUNING = archive.path("tables/cuda-sm90-nvidia-h200-attn/tuning.parquet")


def test_in_sample_scores_every_attention_point_with_its_own_key() -> None:
    df = pd.read_parquet(TUNING)
    params = decide.Params()
    held = loo.in_sample(df, params)
    fields = ["k_type", "v_type", "D_K", "D_V", "gqa", "kv", "M"]
    points = set(df[df["status"] == "ok"][fields].drop_duplicates().itertuples(index=False))
    assert len(held) == len(points) and {h.key.op for h in held} == {"FLASH_ATTN_EXT"}
    assert {h.via for h in held} <= {"measured", "stock"}  # attention rules: the exact key or stock
    for h in held:
        assert h.predicted_us is not None and h.oracle_us <= h.stock_us
    lines = loo.report(held)
    assert lines[0].startswith(f"in-sample: {len(held)} held-out points")
    first = next(h for h in held)
    label = loo._point(first)
    assert label.startswith(f"{first.key.k_type}/{first.key.v_type} D_K=") and label.endswith(f"M={first.M}")


def test_a_mul_mat_id_point_of_any_bucket_is_answered_by_its_routing_0_rule() -> None:
    df = pd.read_parquet(archive.path("tables/cuda-sm90-nvidia-h200-moe/tuning.parquet"))
    held = loo.in_sample(df, decide.Params())
    claimed = [h for h in held if h.predicted is not None]
    assert claimed and {h.key.routing for h in claimed} == {1, 2, 3}  # each answered by the routing-0 rule
    assert {h.via for h in claimed} == {"measured"}
    assert all(f"routing={h.key.routing}" in loo._point(h) for h in held)


SHADOW_SWEEP = archive.path("tables/cuda-sm90-nvidia-h200-attn-shadow/tuning-q8_0.parquet")


def test_main_answers_bad_input_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_parquet = tmp_path / "tuning.parquet"
    not_parquet.write_text("M,N,K\n1,2,3\n")
    assert loo.main([str(not_parquet)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {not_parquet}: ")
    assert loo.main([str(SHADOW_SWEEP), "--vram-budget", "-5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--vram-budget" in err and err.count("\n") == 1


def test_kv_shadow_rows_decide_only_under_a_budget_as_in_codegen() -> None:
    df = tuning.read(SHADOW_SWEEP).frame()
    claimed: dict[int | None, set[str]] = {}
    for budget in (None, 16384):
        kept = df if budget else df[~kv_shadow.shadow_rows(df)]
        claimed[budget] = {h.predicted for h in loo.in_sample(kept, decide.Params()) if h.predicted}
    assert not any("kv=shadow" in c for c in claimed[None])
    assert any("kv=shadow" in c for c in claimed[16384])
