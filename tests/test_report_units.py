"""The report's pure pieces: spreads, Amdahl weighting, test -> M, table lookups, census sums, A/B pairing."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from test_codegen_support import H200, rule

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import ab, analysis, inputs, markdown


def test_spread_matches_statistics_module() -> None:
    xs = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.5]
    s = analysis.spread(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    assert (s.n, s.min, s.max) == (7, 1.0, 9.0)
    assert s.median == pytest.approx(statistics.median(xs))
    assert (s.q1, s.q3) == (pytest.approx(q[0]), pytest.approx(q[2]))
    empty = analysis.spread([])
    assert empty.n == 0 and math.isnan(empty.median)


def test_weighted_speedup_is_amdahl() -> None:
    # half the time 2x faster, half unchanged: 1 / (0.5 + 0.25)
    assert analysis.weighted_speedup([5.0, 5.0], [2.0, 1.0]) == pytest.approx(4 / 3)
    assert analysis.weighted_speedup([1.0], [0.5]) == pytest.approx(0.5)
    assert math.isnan(analysis.weighted_speedup([0.0], [2.0]))


@pytest.mark.parametrize(
    ("test", "ubatch", "M"),
    [
        ("pp512", 512, 512),
        ("pp2048", 512, 512),
        ("pp2048", 2048, 2048),
        ("pp64", 512, 64),
        ("tg128", 512, 1),
        ("pp3 @ d16384", 512, 3),
        ("pp512 @ d16384 kv q8_0", 256, 256),
        ("tg32 @ d49152 kv q8_0/f16", 512, 1),
    ],
)
def test_effective_M(test: str, ubatch: int, M: int) -> None:
    assert analysis.effective_M(test, ubatch) == M


def test_effective_M_unknown() -> None:
    assert analysis.effective_M("pp512+tg128", 512) is None
    assert analysis.effective_M("pp512+tg128 @ d4096", 512) is None


def test_paired_ratio() -> None:
    params = decide.Params()
    r = analysis.paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], params)
    assert (r.point, r.lo, r.hi, r.n) == (2.0, 2.0, 2.0, 3)
    assert r.above and not r.below
    one = analysis.paired_ratio([1.0], [2.0], params)
    assert (one.point, one.lo, one.hi, one.n) == (0.5, None, None, 1)
    assert not one.below  # one pair is never beyond noise
    slower = analysis.paired_ratio([0.9, 0.91, 0.89, 0.9], [1.0, 1.0, 1.0, 1.0], params)
    assert slower.below and slower.hi is not None and slower.hi < 1


def key(N: int, K: int, t: str = "q4_K") -> decide.ShapeKey:
    return decide.ShapeKey("MUL_MAT", "weight", t, "f32", N, K, 1)


def table_view(rules: list[dict[str, object]]) -> inputs.TableView:
    data = {
        "schema": schema.TABLE_SCHEMA,
        "layout_version": schema.TABLE_LAYOUT_VERSION,
        "gpu": {"name": "NVIDIA H200", "cc": 900, "sm_count": 132},
        "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
        "provenance": {"source": "measured"},
        "rules": rules,
        "refused": [],
    }
    return inputs.TableView(data)


def test_table_lookup_prefers_exact_rules_then_type_defaults() -> None:
    t = table_view([rule(4096, 4096, 8, 16, "mmq"), rule(0, 0, 256, 1024, "cublas"), rule(0, 0, 8, 8, "mmf")])
    k = key(4096, 4096)
    assert t.route_at(k, 8) == "mmq"  # exact beats the default at the same M
    assert t.route_at(k, 12) == "mmq"
    assert t.route_at(k, 512) == "cublas"  # default where no exact rule covers M
    assert t.route_at(k, 1) is None
    assert t.route_at(key(1024, 4096), 8) == "mmf"
    assert t.route_at(key(4096, 4096, "q6_K"), 512) is None
    assert [(r["M_lo"], r["route"]) for r in t.rules_for(k)] == [(8, "mmq"), (8, "mmf"), (256, "cublas")]
    assert [r["route"] for r in t.rules_for(key(1024, 4096))] == ["mmf", "cublas"]


def test_params_from_table() -> None:
    t = table_view([])
    assert inputs.params_from_table(t) == decide.Params()
    t.data["provenance"]["decision"] = {  # type: ignore[index]
        "theta": 0.05,
        "bootstrap_resamples": 500,
        "seed": 7,
        "reference_margin": None,
        "ratio_statistic": "text",
    }
    p = inputs.params_from_table(t, reference_margin=0.2)
    assert (p.theta, p.resamples, p.seed, p.reference_margin) == (0.05, 500, 7, 0.2)


def census_row(
    M: int, est_us: float, calls: int, fused: str | None = None, role: str = "attn_q"
) -> dict[str, object]:
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": "q4_K",
        "src1_type": "f32",
        "N": 4096,
        "K": 4096,
        "B": 1,
        "M": M,
        "fused": fused,
        "role": role,
        "calls": calls,
        "est_us": est_us,
    }


def test_census_points_sum_per_point_and_keep_fused_apart() -> None:
    rows = [
        census_row(1, 10.0, 5),
        census_row(1, 30.0, 7, role="attn_k"),
        census_row(1, 4.0, 2, fused="glu"),
        census_row(512, 100.0, 1),
    ]
    pts = analysis.census_points(rows)
    assert [(p.M, p.fused, p.calls, p.est_us) for p in pts] == [
        (1, False, 12, 40.0),
        (1, True, 2, 4.0),
        (512, False, 1, 100.0),
    ]
    shares = analysis.census_shares(rows, lambda r: str(r["role"]))
    assert shares == [("attn_q", 114.0), ("attn_k", 30.0)]


def test_ab_pairs_by_pair_id_and_counts_unpaired() -> None:
    recs = [
        ab.AbRecord("m", "pp512", 512, "stock", 0, 100.0),
        ab.AbRecord("m", "pp512", 512, "table", 0, 120.0),
        ab.AbRecord("m", "pp512", 512, "stock", 1, 200.0),
        ab.AbRecord("m", "pp512", 512, "table", 1, 220.0),
        ab.AbRecord("m", "pp512", 512, "table", 2, 999.0),
        ab.AbRecord("m", "pp512", 512, "crude", 0, 110.0),
    ]
    comps = analysis.ab_comparisons(recs, decide.Params())
    by = {(c.arm, c.baseline): c for c in comps}
    assert set(by) == {("table", "stock"), ("crude", "stock"), ("table", "crude")}
    ts = by[("table", "stock")]
    assert ts.ratio.point == pytest.approx(statistics.median([1.2, 1.1]))
    assert (ts.ratio.n, ts.unpaired) == (2, 1)
    assert by[("crude", "stock")].ratio.n == 1 and by[("crude", "stock")].ratio.lo is None
    assert by[("table", "crude")].unpaired == 2


def test_parse_ab_lines_ignores_blank_lines_and_extra_keys() -> None:
    lines = [
        "",
        '{"model": "m", "test": "tg128", "ubatch": 512, "arm": "crude", "pair": 3, "tps": 50, "note": "x"}',
    ]
    [(lineno, rec)] = ab.parse_ab_lines(lines, Path("ab.jsonl"))
    assert lineno == 2 and rec == ab.AbRecord("m", "tg128", 512, "crude", 3, 50.0)
    with pytest.raises(InputError, match=r"ab.jsonl:1: model: expected a str"):
        ab.parse_ab_lines(
            ['{"model": "", "test": "t", "ubatch": 1, "arm": "stock", "pair": 0, "tps": 1}'], Path("ab.jsonl")
        )


def test_status_kind() -> None:
    assert [inputs.status_kind(s) for s in ("ok", "drifted", "failed:trap", "wrong", "ineligible")] == [
        "ok",
        "drifted",
        "failed",
        "wrong",
        "ineligible",
    ]
    assert inputs.status_kind("fail") is None
    assert inputs.status_kind("pruned") == "pruned"  # racing stopped timing the candidate


def test_md_escape_keeps_table_cells_intact() -> None:
    assert markdown.md_escape("a|b\nc") == "a\\|b c"


def test_table_view_finds_mul_mat_id_rules_and_class_defaults() -> None:
    def id_rule(N: int, K: int, lo: int, hi: int, config: str, **extra: object) -> dict[str, object]:
        key = registry.MulMatIdKey("MUL_MAT_ID", "expert", "mxfp4", "f32", N, K, 32, 4, 0)
        return {
            **key.as_dict(),
            "M_lo": lo,
            "M_hi": hi,
            "config": config,
            "route": config.split("/")[0],
            **extra,
        }

    t = tbl.empty_table()
    t["gpu"] = {"name": H200.name, "cc": H200.cc, "sm_count": H200.sm_count}
    t["provenance"] = {"source": "measured"}
    t["rules"] = [
        rule(4096, 4096, 8, 8, "mmq"),
        id_rule(2880, 2880, 1, 8, "mmq/j=16"),
        id_rule(0, 0, 1, 8, "mmvq", kind="default", NK_lo=1, NK_hi=10_000_000),
        id_rule(0, 0, 1, 64, "mmq", kind="default"),
    ]
    view = inputs.TableView(tbl.validate(tbl.canonicalize(t)))
    seen = registry.MulMatIdKey("MUL_MAT_ID", "expert", "mxfp4", "f32", 2880, 2880, 32, 4, 0)
    unseen = registry.MulMatIdKey("MUL_MAT_ID", "expert", "mxfp4", "f32", 3000, 2880, 32, 4, 0)
    big = registry.MulMatIdKey("MUL_MAT_ID", "expert", "mxfp4", "f32", 8192, 8192, 32, 4, 0)
    assert [view.route_at(k, 4) for k in (seen, unseen, big)] == ["mmq/j=16", "mmvq", "mmq"]
    assert view.route_at(big, 100) is None
    own, *defaults = view.rules_for(seen)  # its own rule, then its type's defaults
    assert own["config"] == "mmq/j=16" and sorted(r["config"] for r in defaults) == ["mmq", "mmvq"]
    assert not inputs.is_default_rule(t["rules"][1]) and inputs.is_default_rule(t["rules"][3])
    assert analysis.shape_slug(seen) == "mul_mat_id-expert-mxfp4-f32-n2880-k2880-e32-u4-routing0"
