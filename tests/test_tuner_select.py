"""Case selection: coverage by estimated time, M neighbours, skipped rows, shards, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggml_dispatch import archive, registry
from ggml_dispatch.cli import main
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner.select import (
    ALL_ROUTES,
    M_GRID,
    grid_neighbours,
    parse_shard,
    select_cases,
    shard_cases,
)


def row(
    src0: str = "q4_K", M: int = 1, N: int = 4096, K: int = 4096, est: float = 1.0, **kw: Any
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "op": "MUL_MAT",
        "layout": "weight",
        "fused": None,
        "src0_type": src0,
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": K,
        "B": 1,
        "est_us": est,
        "calls": 1,
    }
    r.update(kw)
    return r


def test_grid_neighbours() -> None:
    assert grid_neighbours(1) == (None, 2)
    assert grid_neighbours(5) == (4, 8)
    assert grid_neighbours(512) == (256, 1024)
    assert grid_neighbours(16384) == (8192, None)
    assert grid_neighbours(20000) == (16384, None)
    assert M_GRID[0] == 1 and M_GRID[-1] == 16384


def test_every_census_m_sits_between_measured_neighbours() -> None:
    sel = select_cases(
        [row(M=1, est=10), row(M=5, est=10), row(M=512, est=10), row(M=300, est=10)], coverage=1.0
    )
    ms = [c.M for c in sel.cases]
    assert ms == [1, 2, 4, 5, 8, 256, 300, 512, 1024]
    assert {c.M for c in sel.cases if c.census} == {1, 5, 300, 512}
    for m in (5, 300, 512):
        assert any(x < m for x in ms) and any(x > m for x in ms)


def test_coverage_is_by_estimated_time_not_calls() -> None:
    rows = [
        row(N=4096, M=1, est=900.0, calls=1),  # rare but expensive
        row(N=1024, M=1, est=50.0, calls=10_000),  # frequent but cheap
        row(N=2048, M=1, est=50.0, calls=5),
    ]
    sel = select_cases(rows, coverage=0.9)
    shapes = {c.shape.N for c in sel.cases}
    assert shapes == {4096}
    assert sel.covered_est_us == 900.0
    sel = select_cases(rows, coverage=0.95)  # 900 < 950: the next point by est_us is needed
    assert {c.shape.N for c in sel.cases} in ({4096, 1024}, {4096, 2048})
    assert math.isclose(sel.tunable_est_us, 1000.0)


def test_points_of_one_key_add_up_across_census_rows() -> None:
    # two tensors with one shape (e.g. attn_q and attn_output) are one tuning point
    rows = [
        row(N=4096, M=8, est=30, tensor="a"),
        row(N=4096, M=8, est=30, tensor="b"),
        row(N=1024, M=8, est=50),
    ]
    sel = select_cases(rows, coverage=0.5)
    census = [c for c in sel.cases if c.census]
    assert [(c.shape.N, c.est_us) for c in census] == [(4096, 60.0)]


def test_fused_and_expert_rows_are_skipped_and_reported() -> None:
    rows = [
        row(M=1, est=100),
        row(M=1, N=11008, est=300, fused="glu"),
        row(M=1, op="MUL_MAT_ID", layout="expert", est=100),
    ]
    sel = select_cases(rows, coverage=1.0)
    assert {c.shape.N for c in sel.cases} == {4096}
    assert sel.total_est_us == 500 and sel.tunable_est_us == 100
    assert sum(sel.skipped_rows.values()) == 2
    text = sel.summary()
    assert "fused" in text and "MUL_MAT_ID/expert" in text and "60.0% of est_us" in text


def test_attention_layout_is_opt_in_and_tuned_with_its_batch() -> None:
    rows = [row(M=1, est=5), row(src0="f16", layout="attention", N=256, K=128, B=32, M=1, est=5)]
    sel = select_cases(rows, coverage=1.0)
    assert {c.shape.layout for c in sel.cases} == {"weight"}
    assert "skipped 1 rows attention layout (not asked for: --layouts)" in sel.summary()
    sel = select_cases(rows, coverage=1.0, layouts=("weight", "attention"))
    assert {(c.shape.layout, c.shape.B) for c in sel.cases} == {("weight", 1), ("attention", 32)}
    with pytest.raises(InputError):
        select_cases(rows, coverage=1.0, layouts=("expert",))


def test_cases_ordered_by_shape_time_then_m_and_specs_follow_the_interface() -> None:
    rows = [row(N=1024, M=512, est=10), row(N=4096, M=1, est=20), row(N=4096, M=512, est=20)]
    sel = select_cases(rows, coverage=1.0, trials=3, nmse_max=1e-3, routes=("mmq", "cublas"))
    assert [c.shape.N for c in sel.cases][:5] == [4096] * 5
    assert [c.M for c in sel.cases if c.shape.N == 4096] == [1, 2, 256, 512, 1024]
    spec = sel.cases[0].spec()
    assert set(spec) == {
        "case",
        "op",
        "layout",
        "src0_type",
        "src1_type",
        "M",
        "N",
        "K",
        "B",
        "routes",
        "trials",
        "nmse_max",
    }
    assert spec["routes"] == ["mmq", "cublas"] and spec["trials"] == 3 and spec["nmse_max"] == 1e-3
    assert len({c.id for c in sel.cases}) == len(sel.cases)
    assert sel.cases[0].id == "MUL_MAT:weight:q4_K:f32:N4096:K4096:B1:M1"


def test_default_routes_are_the_five_table_routes() -> None:
    # the matmul routes (the FlashAttention kernels serve attention cases only); a MUL_MAT case leaves out
    # the MUL_MAT_ID fallback
    mul_mat = tuple(r.value for r in registry.OPS[registry.Op.MUL_MAT].routes)
    assert (*mul_mat, "id_sorted") == ALL_ROUTES
    sel = select_cases([row()], coverage=1.0)
    assert sel.cases[0].routes == mul_mat


def test_shards_partition_whole_shapes() -> None:
    rows = [row(N=n, M=m, est=float(n + m)) for n in (512, 1024, 2048, 4096, 8192) for m in (1, 512)]
    cases = select_cases(rows, coverage=1.0).cases
    parts = [shard_cases(cases, (i, 3)) for i in range(3)]
    ids = [c.id for p in parts for c in p]
    assert sorted(ids) == sorted(c.id for c in cases)
    assert len(ids) == len(set(ids))
    for p in parts:
        for q in parts:
            if p is not q:
                assert not {c.shape for c in p} & {c.shape for c in q}
    assert all(parts)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"est_us": float("nan")}, "row 0: est_us"),
        ({"est_us": -1.0}, "row 0: est_us"),
        ({"est_us": "x"}, "row 0: est_us"),
        ({"M": 0}, "row 0: M"),
        ({"N": 1.5}, "row 0: N"),
        ({"src0_type": "q9_Z"}, "row 0: src0_type"),
    ],
)
def test_bad_census_rows_name_the_row_and_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as e:
        select_cases([row(**bad)], coverage=1.0, path="c.parquet")
    assert e.value.field == field and e.value.path == "c.parquet"


def test_coverage_and_shard_arguments() -> None:
    with pytest.raises(InputError):
        select_cases([row()], coverage=0.0)
    with pytest.raises(InputError):
        select_cases([row()], coverage=1.5)
    assert parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(InputError):
            parse_shard(bad)


def test_whole_shapes_measures_every_census_m_of_a_picked_shape() -> None:
    rows = [
        row(N=14336, M=512, est=900.0),  # the prefill point that carries the estimated time
        row(N=14336, M=2, est=5.0),  # speculative verify: little estimated time
        row(N=14336, M=4, est=6.0),
        row(N=1024, M=512, est=10.0),  # a shape coverage does not pick
    ]
    points = select_cases(rows, coverage=0.9)
    assert {c.M for c in points.cases if c.census} == {512}
    whole = select_cases(rows, coverage=0.9, whole_shapes=True)
    assert {c.shape.N for c in whole.cases} == {14336}
    assert {c.M for c in whole.cases if c.census} == {2, 4, 512}
    assert {c.M for c in whole.cases} == {1, 2, 4, 8, 256, 512, 1024}  # with grid neighbours
    assert math.isclose(whole.covered_est_us, 911.0)


def test_candidates_are_every_configuration_of_each_route() -> None:
    from ggml_dispatch import registry
    from ggml_dispatch.tuner.select import ALL_ROUTES, candidate_configs

    assert candidate_configs(["mmq", "cublas"], "routes") == ("mmq", "cublas")
    every = candidate_configs(ALL_ROUTES, "all")
    assert (
        len(every)
        == len(set(every))
        == 3
        + (1 + 16 * 2 * 2 + 16 + len(registry.MMQ_FUSED_J) + 2)
        + (1 + 1 + 2 * 3 * 2)
        + 1
        + len(registry.MMVF_BLOCKS)  # mmvf/block=B
        + len(registry.MMVQ_CANDIDATES)  # mmvq/nwarps=N,rows=R[,regs=G]
    )
    cublas = [c for c in every if c.startswith("cublas/")]
    assert sorted(cublas) == sorted(
        [
            "cublas/weight=cached",
            *(
                f"cublas/out={o},compute={c}{w}"
                for o in ("f16", "f32")
                for c in ("f16", "f32", "bf16")
                for w in ("", ",weight=cached")
            ),
        ]
    )
    mmq = [registry.Config.parse(c) for c in every if c.startswith("mmq/")]
    # None: split=fit, the one configuration without a J
    assert {dict(c.params).get("j") for c in mmq} == {str(j) for j in range(8, 129, 8)} | {None}
    assert {dict(c.params)["stream_k"] for c in mmq} == {"on", "off"}
    assert sum(dict(c.params).get("split") == "2j" for c in mmq) == 16 * 2  # every J x stream-k, split
    assert sum(dict(c.params).get("split") == "2j_wave" for c in mmq) == 16  # every J, stream_k=off
    fused = [c for c in mmq if dict(c.params).get("split") == "2j_fused"]
    assert sorted(int(dict(c.params)["j"]) for c in fused) == list(registry.MMQ_FUSED_J)
    assert all(dict(c.params)["stream_k"] == "off" for c in fused)
    assert [str(c) for c in mmq if dict(c.params).get("split") == "fit"] == ["mmq/stream_k=off,split=fit"]
    assert [str(c) for c in mmq if dict(c.params).get("split") == "fit64"] == ["mmq/stream_k=off,split=fit64"]
    assert all(registry.canonical_config(c) == c for c in every)
    with pytest.raises(ValueError, match="configs mode"):
        candidate_configs(["mmq"], "some")


def test_cache_candidates_are_the_routes_and_f16_cublas_with_and_without_the_copy() -> None:
    from ggml_dispatch.tuner.select import ALL_ROUTES, candidate_configs

    got = candidate_configs(ALL_ROUTES, "cache")
    assert got[: len(ALL_ROUTES)] == ALL_ROUTES
    assert sorted(got[len(ALL_ROUTES) :]) == sorted(
        f"cublas/out={o},compute=f16{w}" for o in ("f16", "f32") for w in ("", ",weight=cached")
    )
    assert candidate_configs(["mmq"], "cache") == ("mmq",)


def test_mul_mat_cases_leave_out_the_mul_mat_id_split() -> None:
    from ggml_dispatch.tuner.select import ALL_ROUTES, candidate_configs

    every = candidate_configs(ALL_ROUTES, "all")
    sel = select_cases([row(M=512, est=10)], coverage=1.0, routes=every)
    routes = sel.cases[0].routes
    assert "mmq/j=48,stream_k=on" in routes and not any("split=" in r for r in routes)
    decode = len(registry.MMVF_BLOCKS) + len(registry.MMVQ_CANDIDATES)  # launch shapes of M <= 8 only
    assert (
        len(routes) == len(every) - 16 * 2 - 16 - len(registry.MMQ_FUSED_J) - 2 - 1 - decode
    )  # no id_sorted
    assert "id_sorted" in every and "id_sorted" not in routes


def test_only_keeps_the_matching_candidates_and_names_a_pattern_that_matches_none() -> None:
    from ggml_dispatch.tuner.select import candidate_configs, only_configs

    every = candidate_configs(["mmq", "cublas"], "all")
    assert only_configs(every, ()) == every
    fused = only_configs(every, ("*split=2j_fused", "mmq/j=64,stream_k=off"))
    assert sorted(fused) == sorted(
        ("mmq/j=64,stream_k=off", *(f"mmq/j={j},stream_k=off,split=2j_fused" for j in registry.MMQ_FUSED_J))
    )
    with pytest.raises(ValueError, match="'mmq/j=40,stream_k=off,split=2j_fused' matches no candidate"):
        only_configs(every, ("mmq/j=40,stream_k=off,split=2j_fused",))


def test_tune_run_only_focuses_the_mul_mat_id_cases_and_refuses_a_pattern_that_matches_none(
    tmp_path: Path,
) -> None:
    # an H100 MoE census (a real trace of the qwen3moe-a3b-L8-scaled model)
    census = archive.path("tables/cuda-sm90-nvidia-h100-moe-fused/census.parquet")
    out = tmp_path / "t.parquet"
    args = ["tune", "run", str(census), "--llama-cpp", str(tmp_path), "-o", str(out), "--dry-run"]
    r = CliRunner().invoke(main, [*args, "--only", "*split=fit", "--only", "mmq/j=64,stream_k=off"])
    assert r.exit_code == 0, r.output
    cases = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    moe = [c for c in cases if c["op"] == "MUL_MAT_ID" and c["M"] == 512]
    assert {c["routing_kind"] for c in moe} == {"trace", "uniform", "skewed", "few"}
    assert all(c["routes"] == ["mmq/j=64,stream_k=off", "mmq/stream_k=off,split=fit"] for c in moe)
    # the traced routing of that model is spread: every expert gets tokens, with a mild skew at most
    for c in (c for c in moe if c["routing_kind"] == "trace"):
        counts = c["routing"]["counts"]
        assert c["routing"]["kind"] == "counts" and len(counts) == 128 and min(counts) > 0.5
    r = CliRunner().invoke(main, [*args, "--only", "mmq/j=40,*fused"])
    assert r.exit_code == 2 and "'mmq/j=40,*fused' matches no candidate configuration" in r.output
    assert "Traceback" not in r.output and not out.exists()
