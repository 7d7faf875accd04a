"""tuner.mul_mat_id: MUL_MAT_ID cases from census rows (pure; the harness runs them in
tests/test_tuner_mul_mat_id.py)."""

from __future__ import annotations

from typing import Any

import pytest

from ggml_dispatch.errors import InputError
from tuner import mul_mat_id as tmoe
from tuner import select


def row(M: int, N: int, K: int, E: int, U: int, est: float, **kw: Any) -> dict[str, Any]:
    d = {
        "op": "MUL_MAT_ID",
        "layout": "expert",
        "fused": None,
        "src0_type": "q4_K",
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": K,
        "B": 1,
        "E": E,
        "U": U,
        "est_us": est,
    }
    return d | kw


def test_each_point_under_every_routing_kind_with_used_from_the_down_rows() -> None:
    rows = [
        row(512, 768, 2048, 128, 1, 50.0, routing=1),
        row(512, 768, 2048, 128, 1, 30.0, routing=2),  # the same point in another census bucket
        row(512, 2048, 768, 128, 8, 40.0),
        row(512, 768, 2048, 64, 1, 5.0),  # no down row with E = 64: used unknown
    ]
    split = "mmq/j=48,stream_k=on,split=2j"
    routes = ("mmq", "cublas", "mmq/j=64,stream_k=off", split)
    sel = tmoe.select_mul_mat_id(rows, coverage=1.0, routes=routes)
    ids = [c.id for c in sel.cases]
    assert ids[:3] == [f"MUL_MAT_ID:expert:q4_K:f32:N768:K2048:E128:U1:M512:{k}" for k in tmoe.ROUTING_KINDS]
    assert len(ids) == 6 and {c.used for c in sel.cases} == {8}
    assert sel.cases[0].est_us == 80.0  # summed over the census buckets
    spec = sel.cases[0].spec()
    assert spec["routes"] == ["mmq", "mmq/j=64,stream_k=off", split]  # cuBLAS does not serve MUL_MAT_ID
    assert spec["routing"] == {"kind": "uniform"} and spec["used"] == 8 and spec["B"] == 1
    assert sel.skipped_rows == {tmoe.SKIP_NO_USED: 1} and sel.skipped == {tmoe.SKIP_NO_USED: 5.0}


def test_coverage_and_routing_kinds() -> None:
    rows = [row(512, 2048, 768, 128, 8, 90.0), row(1, 2048, 768, 128, 8, 10.0)]
    sel = tmoe.select_mul_mat_id(rows, coverage=0.5, routing_kinds=("few",))
    assert [(c.M, c.routing_kind) for c in sel.cases] == [(512, "few")]
    assert sel.skipped_rows == {"MUL_MAT_ID beyond the coverage": 1}
    assert tmoe.parse_routing_kinds("none") == ()
    assert tmoe.parse_routing_kinds("few,uniform") == ("few", "uniform")
    with pytest.raises(ValueError, match="routing kinds"):
        tmoe.parse_routing_kinds("zipf")
    none = tmoe.select_mul_mat_id(rows, routes=("cublas",))
    assert none.cases == [] and none.skipped_rows == {"MUL_MAT_ID (no candidate serves it among --routes)": 2}
    with pytest.raises(InputError, match="positive integer"):
        tmoe.select_mul_mat_id([row(512, 0, 768, 128, 8, 1.0)])


def test_mixed_with_the_mul_mat_selection_by_estimated_time() -> None:
    dense = {"op": "MUL_MAT", "layout": "weight", "fused": None, "src0_type": "q4_K", "src1_type": "f32"}
    rows = [
        dense | {"M": 512, "N": 4096, "K": 4096, "B": 1, "est_us": 10.0},
        row(512, 2048, 768, 128, 8, 100.0),
        row(512, 768, 2048, 128, 1, 1.0, fused="glu"),
    ]
    base = select.select_cases(rows, coverage=1.0)
    assert "MUL_MAT_ID/expert (no tuning key for it)" in base.skipped
    sel = tmoe.with_mul_mat_id(base, tmoe.select_mul_mat_id(rows, coverage=1.0))
    assert [c.shape.op for c in sel.cases][:3] == ["MUL_MAT_ID"] * 3  # the larger est_us first
    assert sel.cases[3].shape.op == "MUL_MAT"
    assert "MUL_MAT_ID/expert (no tuning key for it)" not in sel.skipped
    assert sel.tunable_est_us == 110.0 and sel.covered_est_us == 110.0
    text = sel.summary()
    assert (
        "fused" in text
        and "1 census points + 2 grid neighbours + 3 MUL_MAT_ID cases: 1 census points x 3" in text
    )
