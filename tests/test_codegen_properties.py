"""Property tests over random tuning sets (hypothesis): emitted rules never overlap, never name a route
without ok trials at the points they cover, never cover M beyond measured neighbours, and never pick a
route slower than stock at a covered point. The trial times are drawn at random: they stand in for GPU
measurements."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codegen_support import H200, frame, tuning_row

from ggml_dispatch import registry
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl

ROUTES = ("mmvq", "mmq", "cublas")
STATUSES = ("ok", "ok", "ok", "ok", "drifted", "failed:err", "ineligible", "wrong")
SHAPES = ((4096, 4096), (1024, 4096), (14336, 4096))
MS = (1, 2, 4, 8, 16, 64, 256, 512)


@st.composite
def tuning_sets(draw: st.DrawFn) -> tuple[list[dict[str, Any]], decide.Params]:
    reference = draw(st.booleans())
    rows: list[dict[str, Any]] = []
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3, unique=True))
    types = draw(st.lists(st.sampled_from(("q4_K", "q6_K")), min_size=1, max_size=2, unique=True))
    for typ in types:
        for N, K in shapes:
            for M in draw(st.lists(st.sampled_from(MS), min_size=1, max_size=6, unique=True)):
                routes = draw(st.lists(st.sampled_from(ROUTES), min_size=1, max_size=3, unique=True))
                speeds = {r: draw(st.floats(0.5, 2.0)) for r in routes}
                n = 1 if reference else draw(st.integers(1, 5))
                noise = draw(st.sampled_from((0.0, 0.01, 0.1, 0.3)))
                anchor_missing = draw(st.integers(0, 9)) == 0
                for t in range(n):
                    stock = 100.0 * (1 + noise * draw(st.floats(-1, 1)))
                    for r in routes:
                        us = 100.0 / speeds[r] * (1 + noise * draw(st.floats(-1, 1)))
                        status = "ok" if reference else draw(st.sampled_from(STATUSES))
                        rows.append(
                            tuning_row(
                                route=r,
                                M=M,
                                N=N,
                                K=K,
                                us=us,
                                anchor_us=None if anchor_missing else stock,
                                trial=t,
                                status=status,
                                src0_type=typ,
                                source="reference" if reference else "measured",
                            )
                        )
    params = decide.Params(
        theta=draw(st.sampled_from((0.0, 0.03, 0.1))),
        reference_margin=draw(st.sampled_from((0.05, 0.1))) if reference else None,
        min_trials=draw(st.integers(2, 4)),
        resamples=200,
    )
    return rows, params


def _passes(d: decide.Decisions, key: decide.ShapeKey, M: int, route: registry.Config | str) -> bool:
    ev = d.evals[key][M].get(route if isinstance(route, registry.Config) else registry.Config.parse(route))
    return bool(
        ev is not None
        and ev.n_ok > 0
        and ev.ratio is not None
        and ev.ratio >= decide.required_ratio(ev, d.params)
        and (
            ev.reference or (ev.n_paired >= d.params.min_trials and ev.ci_low is not None and ev.ci_low > 1.0)
        )
        and not decide.slower_beyond_noise(ev, d.params)
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tuning_sets())
def test_emitted_rules_are_safe(data: tuple[list[dict[str, Any]], decide.Params]) -> None:
    rows, params = data
    if not rows:
        return
    d = decide.decide(frame(rows), params)
    t = tbl.build_table(d, tuning_sha256="0" * 64)  # validate(): no overlaps within a key
    by_key: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for r in t["rules"]:
        # size-class rules may share M with other classes of the type (validate() checks their boxes)
        by_key.setdefault((*tbl.key_codes(r), *tbl.class_codes(r)), []).append((r["M_lo"], r["M_hi"]))
    for spans in by_key.values():
        spans.sort()
        assert all(a_hi < b_lo for (_, a_hi), (b_lo, _) in itertools.pairwise(spans))

    for rule in d.rules:
        shapes = [k for k in d.evals if k.group() == rule.key] if rule.key.is_default else [rule.key]
        if rule.NK is not None:  # a size-class default stands on the shapes it was fitted on
            shapes = [k for k in shapes if (k.N, k.K) in rule.shapes]
        assert shapes
        if rule.between is not None:
            # inside one gap between adjacent measured M of every shape it stands on, never beyond them,
            # and its fitted curve passes with its lower end above 1
            a, b = rule.between
            for s in shapes:
                measured = sorted(d.evals[s])
                assert a in measured and b in measured and measured.index(b) == measured.index(a) + 1
            assert a < rule.M_lo <= rule.M_hi < b
            assert rule.min_ratio >= 1 + params.theta and rule.ci_low is not None and rule.ci_low > 1
            continue
        for s in shapes:
            measured = sorted(d.evals[s])
            # the ends are measured points of the shapes the rule stands on: never beyond neighbours
            if rule.NK is None:
                assert rule.M_lo in measured and rule.M_hi in measured
            else:
                assert rule.M_lo in rule.measured_M and rule.M_hi in rule.measured_M
            covered = [m for m in measured if rule.M_lo <= m <= rule.M_hi]
            for m in covered:
                # ok trials there, at least theta (or the margin) faster, CI above 1, not slower beyond noise
                assert _passes(d, s, m, rule.route), (rule, s, m)
                if not rule.key.is_default:
                    assert decide.winner(d.evals[s][m]) == rule.route
    # interpolation never reaches outside a shape's measured M range
    for rule in d.rules:
        if rule.kind == "interpolated":
            assert min(d.evals[rule.key]) < rule.M_lo and rule.M_hi < max(d.evals[rule.key])

    # and the lookup, at every measured point, picks stock or a route that passes there
    for key, by_m in d.evals.items():
        for M in by_m:
            got = tbl.lookup(
                t, H200, key.op, key.layout, key.src0_type, key.src1_type, M, key.N, key.K, key.B
            )
            if got is not None:
                assert _passes(d, key, M, got), (key, M, got)


@settings(max_examples=60, deadline=None)
@given(tuning_sets())
def test_every_candidate_is_either_chosen_or_refused_with_its_point(
    data: tuple[list[dict[str, Any]], decide.Params],
) -> None:
    rows, params = data
    if not rows:
        return
    d = decide.decide(frame(rows), params)
    refused = {(f.key, f.M, f.route) for f in d.refusals if not f.key.is_default}
    chosen = {(r.key, m, r.route) for r in d.rules if not r.key.is_default for m in r.measured_M}
    for key, by_m in d.evals.items():
        for M, point in by_m.items():
            for route in point:
                assert ((key, M, route) in chosen) != ((key, M, route) in refused)
    assert all(f.reason for f in d.refusals)
