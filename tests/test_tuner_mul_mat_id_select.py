"""tuner.mul_mat_id: MUL_MAT_ID cases from census rows (pure; the harness runs them in
tests/test_tuner_mul_mat_id.py)."""

from __future__ import annotations

from typing import Any

import pytest

from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import mul_mat_id as tmoe
from ggml_dispatch.tuner import select


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
    # the rows carry no tokens-per-expert statistics: no trace case, counted
    kinds = [k for k in tmoe.ROUTING_KINDS if k != "trace"]
    assert ids[:3] == [f"MUL_MAT_ID:expert:q4_K:f32:N768:K2048:E128:U1:M512:{k}" for k in kinds]
    assert len(ids) == 6 and {c.used for c in sel.cases} == {8}
    assert sel.cases[0].est_us == 80.0  # summed over the census buckets
    spec = sel.cases[0].spec()
    assert spec["routes"] == ["mmq", "mmq/j=64,stream_k=off", split]  # cuBLAS does not serve MUL_MAT_ID
    assert spec["routing"] == {"kind": "uniform"} and spec["used"] == 8 and spec["B"] == 1
    assert sel.skipped_rows == {tmoe.SKIP_NO_USED: 1, tmoe.SKIP_NO_STATS: 2}
    assert sel.skipped == {tmoe.SKIP_NO_USED: 5.0, tmoe.SKIP_NO_STATS: 0.0}


def test_a_trace_case_draws_with_weights_from_the_points_largest_census_bucket() -> None:
    rows = [
        row(512, 2048, 768, 128, 8, 30.0, routing=2, experts_nonempty=90.0, tokens_max=200.0, tokens_cv=1.1),
        row(512, 2048, 768, 128, 8, 50.0, routing=1, experts_nonempty=120.0, tokens_max=60.0, tokens_cv=0.4),
    ]
    sel = tmoe.select_mul_mat_id(rows, coverage=1.0, routing_kinds=("trace", "few"))
    trace, few = sel.cases
    assert trace.id.endswith(":M512:trace") and few.routing_kind == "few" and trace.est_us == 80.0
    spec = trace.spec()
    assert spec["routing"]["kind"] == "counts" and spec["routing_kind"] == "trace"
    counts = spec["routing"]["counts"]
    assert len(counts) == 128 and sum(c > 0 for c in counts) == 120  # the spread bucket's 50 us > 30 us
    assert counts == sorted(counts, reverse=True) and counts[0] == 1.0
    assert few.spec()["routing"] == {"kind": "few"}
    assert not sel.skipped_rows


def test_trace_weights_leave_the_drawing_noise_out_of_the_cv() -> None:
    # a uniform routing's traced CV is about sqrt(n / picks): equal weights over the non-empty experts
    assert set(tmoe.trace_weights(128, 8, 512, 128.0, 0.17)) == {1.0}
    w = tmoe.trace_weights(128, 8, 512, 100.0, 0.9)
    nz = w[:100]
    assert all(x > 0 for x in nz) and not any(w[100:])
    assert tmoe._cv(nz) == pytest.approx((0.9**2 - 100 / 4096) ** 0.5, rel=1e-3)
    # at least `used` experts, at most E; a CV beyond reach gets the steepest weights
    assert sum(x > 0 for x in tmoe.trace_weights(128, 8, 64, 3.0, 0.0)) == 8
    assert sum(x > 0 for x in tmoe.trace_weights(16, 2, 64, 40.0, 0.0)) == 16
    steep = tmoe.trace_weights(128, 8, 512, 128.0, 50.0)
    assert steep[1] == pytest.approx(2.0**-8, rel=1e-4)


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
