"""codegen.decide: the DESIGN decision rule on paired trials (synthetic timings stand in for the GPU)."""

from __future__ import annotations

import pytest
from test_codegen_support import H200, frame, trials, tuning_row

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError

P = decide.Params(interpolate=False, class_defaults=False)  # the measured rule and the per-type default alone
KEY = decide.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 4096, 1)


def _rules(d: decide.Decisions) -> list[tuple[int, int, int, int, str]]:
    return [(r.key.N, r.key.K, r.M_lo, r.M_hi, str(r.route)) for r in d.rules]


def test_rule_covers_consecutive_passing_measured_M_only() -> None:
    rows = []
    rows += trials(speed={"mmvq": 1.0, "mmq": 0.8}, M=4)  # mmq slower: stock stays
    for M in (8, 16, 32):
        rows += trials(speed={"mmvq": 1.0, "mmq": 1.5}, M=M)
    rows += trials(speed={"mmq": 1.0, "cublas": 0.9}, M=64)  # the stock route wins: stock stays
    d = decide.decide(frame(rows), P)
    assert _rules(d) == [(4096, 4096, 8, 32, "mmq")]
    r = d.rules[0]
    assert r.measured_M == (8, 16, 32) and r.min_ratio == pytest.approx(1.5, rel=0.03)
    refused = {(str(f.route), f.M) for f in d.refusals}
    assert ("mmq", 4) in refused and ("mmvq", 8) in refused and ("cublas", 64) in refused


def test_a_failing_measured_point_splits_the_interval() -> None:
    rows = trials(speed={"mmvq": 1.0, "mmq": 1.5}, M=8)
    rows += trials(speed={"mmvq": 1.0, "mmq": 1.01}, M=12)  # below theta
    rows += trials(speed={"mmvq": 1.0, "mmq": 1.5}, M=16)
    d = decide.decide(frame(rows), P)
    assert _rules(d) == [(4096, 4096, 8, 8, "mmq"), (4096, 4096, 16, 16, "mmq")]
    (why,) = [f.reason for f in d.refusals if str(f.route) == "mmq" and f.M == 12]
    assert "below 1.030x" in why


def test_theta_boundary() -> None:
    below = decide.decide(frame(trials(speed={"mmq": 1.0, "cublas": 1.02}, M=512, noise=0.001)), P)
    above = decide.decide(frame(trials(speed={"mmq": 1.0, "cublas": 1.05}, M=512, noise=0.001)), P)
    assert below.rules == [] and _rules(above) == [(4096, 4096, 512, 512, "cublas")]
    strict = decide.decide(
        frame(trials(speed={"mmq": 1.0, "cublas": 1.05}, M=512, noise=0.001)), decide.Params(theta=0.10)
    )
    assert strict.rules == []


def test_ci_must_clear_one() -> None:
    # median ratio 1.06 (>= 1 + theta), but the trials scatter: the bootstrap CI reaches below 1
    ratios = [1.30, 0.85, 1.06, 1.10, 0.95]
    rows = [tuning_row(route="mmq", M=512, us=100.0, anchor_us=100.0, trial=t) for t in range(5)]
    rows += [
        tuning_row(route="cublas", M=512, us=100.0 / r, anchor_us=100.0, trial=t)
        for t, r in enumerate(ratios)
    ]
    d = decide.decide(frame(rows), P)
    ev = d.evals[KEY][512][registry.Config.parse("cublas")]
    assert ev.ratio == pytest.approx(1.06)
    assert ev.ci_low is not None and ev.ci_high is not None
    assert ev.ci_low <= 1.0 < 1.06 <= ev.ci_high
    assert d.rules == []
    (why,) = [f.reason for f in d.refusals if str(f.route) == "cublas"]
    assert "CI low end" in why
    # the same median with tight trials passes
    tight = [tuning_row(route="cublas", M=512, us=100.0 / 1.06, anchor_us=100.0, trial=t) for t in range(5)]
    assert _rules(decide.decide(frame(rows[:5] + tight), P)) == [(4096, 4096, 512, 512, "cublas")]


def test_only_ok_trials_count() -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 3.0}, M=512, status={"cublas": "failed:illegal address"})
    rows += trials(speed={"mmq": 1.0, "cublas": 3.0}, M=1024, status={"cublas": "drifted"})
    d = decide.decide(frame(rows), P)
    assert d.rules == []
    reasons = {f.M: f.reason for f in d.refusals if str(f.route) == "cublas"}
    assert reasons[512] == "no ok trial (failed:illegal address x5)"
    assert reasons[1024] == "no ok trial (drifted x5)"


def test_a_trial_counts_only_if_the_route_really_ran() -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 3.0}, M=512)
    for r in rows:
        if r["route"] == "cublas":
            r["route_ran"] = "mmq"  # e.g. a replayed CUDA graph ran the old route
    d = decide.decide(frame(rows), P)
    assert d.rules == []
    assert [f.reason for f in d.refusals if str(f.route) == "cublas"] == ["no ok trial (ok but mmq ran x5)"]


def test_too_few_trials_and_missing_anchor() -> None:
    few = decide.decide(frame(trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512, n=2)), P)
    assert few.rules == []
    assert any("only 2 paired ok trials" in f.reason for f in few.refusals)
    rows = [tuning_row(route="cublas", M=512, us=50.0, anchor_us=None, trial=t) for t in range(5)] + [
        tuning_row(route="mmq", M=512, us=100.0, anchor_us=None, trial=t) for t in range(5)
    ]
    d = decide.decide(frame(rows), P)
    assert d.rules == [] and any(f.reason == "no stock anchor in its ok trials" for f in d.refusals)


def test_only_the_fastest_route_may_replace_stock() -> None:
    d = decide.decide(frame(trials(speed={"mmvq": 1.0, "mmq": 1.4, "cublas": 1.2}, M=8)), P)
    assert _rules(d) == [(4096, 4096, 8, 8, "mmq")]
    (why,) = [f.reason for f in d.refusals if str(f.route) == "cublas"]
    assert why.startswith("not the fastest: mmq")


def test_adjacent_routes_make_disjoint_rules() -> None:
    rows = trials(speed={"mmvq": 1.0, "mmq": 1.5, "cublas": 0.5}, M=8)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=16)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=32)
    d = decide.decide(frame(rows), P)
    assert _rules(d) == [(4096, 4096, 8, 8, "mmq"), (4096, 4096, 16, 32, "cublas")]


def test_layout_classes_and_types_never_mix() -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512, layout="attention", B=32)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512, src0_type="q6_K")
    d = decide.decide(frame(rows), P)
    keys = {(r.key.layout, r.key.src0_type, r.key.B) for r in d.rules}
    assert keys == {("weight", "q4_K", 1), ("attention", "q4_K", 32), ("weight", "q6_K", 1)}


def _three_shapes(extra: list[dict[str, object]] | None = None) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for N, K in ((4096, 4096), (1024, 4096), (14336, 4096)):
        for M in (256, 512):
            rows += trials(speed={"mmq": 1.0, "cublas": 1.4}, M=M, N=N, K=K)
    return rows + (extra or [])


def test_type_default_under_min_max_regret() -> None:
    d = decide.decide(frame(_three_shapes()), P)
    defaults = [r for r in d.rules if r.key.is_default]
    assert [(r.M_lo, r.M_hi, str(r.route)) for r in defaults] == [(256, 512, "cublas")]
    assert set(defaults[0].shapes) == {(4096, 4096), (1024, 4096), (14336, 4096)}
    t = tbl.build_table(d, tuning_sha256="0" * 64)
    # an unseen (N, K) of the type gets the default; another type does not
    assert tbl.lookup(t, H200, "MUL_MAT", "weight", "q4_K", "f32", 300, 5120, 5120, 1) == "cublas"
    assert tbl.lookup(t, H200, "MUL_MAT", "weight", "q6_K", "f32", 300, 5120, 5120, 1) is None
    assert tbl.lookup(t, H200, "MUL_MAT", "weight", "q4_K", "f32", 513, 5120, 5120, 1) is None


def test_type_default_refused_where_one_shape_is_harmed() -> None:
    harmed = trials(speed={"mmq": 1.0, "cublas": 0.8}, M=256, N=17408, K=5120)
    harmed += trials(speed={"mmq": 1.0, "cublas": 1.4}, M=512, N=17408, K=5120)
    d = decide.decide(frame(_three_shapes(harmed)), P)
    defaults = [(r.M_lo, r.M_hi, str(r.route)) for r in d.rules if r.key.is_default]
    assert defaults == [(512, 512, "cublas")]
    (why,) = [f.reason for f in d.refusals if f.kind == "default" and f.M == 256]
    assert "N=17408 K=5120" in why


def test_type_default_does_not_jump_a_failing_point_of_any_shape() -> None:
    rows: list[dict[str, object]] = []
    for N, K in ((4096, 4096), (1024, 4096)):
        for M in (256, 1024):
            rows += trials(speed={"mmq": 1.0, "cublas": 1.5}, M=M, N=N, K=K)
    rows += trials(speed={"mmq": 1.0, "cublas": 1.0}, M=512, N=4096, K=4096)  # only this shape has M=512
    d = decide.decide(frame(rows), P)
    defaults = [(r.M_lo, r.M_hi) for r in d.rules if r.key.is_default]
    assert defaults == [(256, 256), (1024, 1024)]
    assert any("cannot join" in f.reason for f in d.refusals)


def test_one_shape_makes_no_default() -> None:
    d = decide.decide(frame(trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512)), P)
    assert all(not r.key.is_default for r in d.rules)


def test_decisions_are_deterministic_and_order_free() -> None:
    rows = _three_shapes(trials(speed={"mmvq": 1.0, "mmq": 1.3}, M=8, noise=0.05))
    a = tbl.dumps(tbl.build_table(decide.decide(frame(rows), P), tuning_sha256="x"))
    b = tbl.dumps(tbl.build_table(decide.decide(frame(list(reversed(rows))), P), tuning_sha256="x"))
    assert a == b
    # a point's CI does not depend on which other points are in the file
    alone = decide.decide(frame(trials(speed={"mmvq": 1.0, "mmq": 1.3}, M=8, noise=0.05)), P)
    ev_alone = alone.evals[next(iter(alone.evals))][8][registry.Config.parse("mmq")]
    ev_all = decide.decide(frame(rows), P).evals[KEY][8][registry.Config.parse("mmq")]
    assert (ev_alone.ci_low, ev_alone.ci_high) == (ev_all.ci_low, ev_all.ci_high)


def test_one_gpu_and_one_commit_per_table() -> None:
    other = schema.GpuId("NVIDIA H100 80GB HBM3", 900, 132)
    rows = trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=256)
    rows += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=1024, gpu=other)
    with pytest.raises(InputError, match=r"2 GPUs.*--allow-mixed"):
        decide.decide(frame(rows), P, "t.parquet")
    d = decide.decide(frame(rows), decide.Params(allow_mixed=True))
    assert d.identity.mixed and d.identity.gpu == H200  # the GPU with the most rows
    t = tbl.build_table(d, tuning_sha256="x")
    assert len(t["provenance"]["mixed"]["gpus"]) == 2
    rows2 = trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512)
    rows2 += trials(speed={"mmq": 1.0, "cublas": 2.0}, M=1024, commit="f" * 40)
    with pytest.raises(InputError, match="2 upstream commits"):
        decide.decide(frame(rows2), P)


def test_reference_rows_need_a_declared_margin() -> None:
    rows = [
        tuning_row(route="mmq", M=512, us=100.0, anchor_us=100.0, source="reference"),
        tuning_row(route="cublas", M=512, us=80.0, anchor_us=100.0, source="reference"),
    ]
    with pytest.raises(InputError, match="--reference-margin"):
        decide.decide(frame(rows), P)
    d = decide.decide(frame(rows), decide.Params(reference_margin=0.10))
    assert _rules(d) == [(4096, 4096, 512, 512, "cublas")]  # 1.25x >= 1.10x
    d = decide.decide(frame(rows), decide.Params(reference_margin=0.30))
    assert d.rules == [] and any("below 1.300x" in f.reason for f in d.refusals)
    assert any("stock's own route" in f.reason for f in d.refusals if str(f.route) == "mmq")
    mixed = [*rows, *trials(speed={"mmq": 1.0, "cublas": 2.0}, M=1024)]
    with pytest.raises(InputError, match="mix source"):
        decide.decide(frame(mixed), decide.Params(reference_margin=0.1))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("route", "magic", "unknown route"),
        ("src0_type", "q9_K", "unknown ggml type"),
        ("M", 0, "positive integer"),
        ("us", float("nan"), "ok trial with time"),
        ("anchor_us", -1.0, "stock anchor"),
        ("source", "guess", "source must be"),
        ("gpu_name", "", "empty GPU name"),
    ],
)
def test_bad_rows_are_named(field: str, value: object, message: str) -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 2.0}, M=512, n=3)
    rows[4][field] = value
    with pytest.raises(InputError, match=message) as e:
        decide.decide(frame(rows), P, "t.parquet")
    assert f"row 4: {field}" in str(e.value) and str(e.value).startswith("t.parquet")


def test_missing_columns() -> None:
    df = frame(trials(speed={"mmq": 1.0}, M=1)).drop(columns=["anchor_us"])
    with pytest.raises(InputError, match="anchor_us: missing column"):
        decide.decide(df, P)


def test_a_raced_out_route_never_wins_on_its_early_median() -> None:
    # the H200 configurations sweep, q4_1 N=1536 K=576 M=32: mmq/j=8 lost the race to cublas over its
    # first three trials (8.62 vs 8.10 us), then cublas slowed to 9.65 us in the later trials; on medians
    # the stopped route looked fastest and, with too few trials, left the point to stock
    rows = []
    for t in range(7):
        rows.append(tuning_row(route="cublas", M=32, us=8.1 if t < 3 else 9.65, anchor_us=12.0, trial=t))
        early = t < 3
        rows.append(
            tuning_row(
                route="mmq",
                M=32,
                us=8.62 if early else float("nan"),
                anchor_us=12.0,
                trial=t,
                status="ok" if early else "pruned",
            )
        )
    d = decide.decide(frame(rows), P)
    assert _rules(d) == [(4096, 4096, 32, 32, "cublas")]
    assert str(decide.winner(d.evals[KEY][32])) == "cublas"
    # without the race's verdict (no pruned rows) the lower median wins as before
    plain = [r for r in rows if r["status"] == "ok"]
    assert str(decide.winner(decide.decide(frame(plain), P).evals[KEY][32])) == "mmq"


def test_a_route_wrong_in_any_trial_is_never_chosen() -> None:
    # the H200 configurations sweep, q4_1 N=1536 K=576: mmq/j=8,stream_k=on failed the NMSE check in
    # trials 0-2 and passed in 3-6; its passing trials do not make it trustworthy
    rows = []
    for t in range(7):
        rows.append(tuning_row(route="cublas", M=32, us=9.0, anchor_us=12.0, trial=t))
        rows.append(
            tuning_row(route="mmq", M=32, us=6.0, anchor_us=12.0, trial=t, status="wrong" if t < 3 else "ok")
        )
    d = decide.decide(frame(rows), P)
    assert _rules(d) == [(4096, 4096, 32, 32, "cublas")]
    (why,) = [f.reason for f in d.refusals if str(f.route) == "mmq"]
    assert why.startswith("wrong in 3 trial(s)")
