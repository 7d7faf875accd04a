"""codegen.loo on a real attention sweep (the committed H200 FlashAttention tuning): the in-sample check
scores every measured point of an op whose key has no N/K, and labels points by their own key fields."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from codegen import decide, loo

TUNING = Path(__file__).resolve().parent.parent / "tables" / "cuda-sm90-nvidia-h200-attn" / "tuning.parquet"


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
    df = pd.read_parquet(TUNING.parent.parent / "cuda-sm90-nvidia-h200-moe" / "tuning.parquet")
    held = loo.in_sample(df, decide.Params())
    claimed = [h for h in held if h.predicted is not None]
    assert claimed and {h.key.routing for h in claimed} == {1, 2, 3}  # each answered by the routing-0 rule
    assert {h.via for h in claimed} == {"measured"}
    assert all(f"routing={h.key.routing}" in loo._point(h) for h in held)
