"""Interpolated rules: routes between two adjacent measured M of one shape, from a fitted crossover. Pure.

A measured rule covers only M between two measured neighbours where the same route passes. Between a
measured M where stock wins and one where a route wins (M = 4 and 8, or 256 and 512) the measurements
still say where the route becomes faster. This module fits that, per shape key and per gap (a, b) of
adjacent measured M (b - a >= 2) that no measured rule spans:

* Model: each route's time is log-log linear in M between a and b (a power law per gap). Then the
  stock/route ratio is log-log linear too: ``log r(M) = (1 - w) log r(a) + w log r(b)`` with
  ``w = log(M / a) / log(b / a)``. The end ratios are the measured statistic (median of the per-trial
  paired ratios anchor_us/us).
* Uncertainty: the trials at a and at b are resampled independently (percentile bootstrap, the same
  resample count and seed scheme as the measured CI); every resample gives an interpolated curve, and
  ``ci_low(M)`` is its lower quantile at M.
* The gap is fitted only when the evidence supports a line: stock runs the same route at both ends
  (the route whose paired ratio is within ``stock_tolerance`` of 1; a stock switch inside the gap, as
  mmvq -> mmq above M = 8, makes the line meaningless), the route has at least ``min_trials`` paired ok
  trials at both ends, measured (not reference) rows, and both the route's and stock's median time do not
  fall from a to b by more than theta (time grows with M; a fall means a kernel switch in between).
* Claim and no-harm: at each integer M inside the gap the candidate with the largest fitted ratio is
  the fitted winner; it is claimed only where its fitted ratio >= 1 + theta and its ``ci_low(M)`` > 1,
  so an interpolated rule never covers a point where the fitted curve, with its uncertainty, is not
  faster than stock. M outside [a, b] is never claimed: outside the measured range stays stock.
* The crossover is reported per rule: the M where the fitted ratio reaches 1 + theta, with the 95%
  interval of that M over the bootstrap curves (a side that never crosses inside the gap is clipped to
  the gap's end).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from ggml_dispatch.codegen.decide import (
    Config,
    Params,
    Refusal,
    RouteEval,
    Rule,
    ShapeKey,
    _runs,
    _seed_for,
    verdict,
)

Evals = Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]]

KIND: Final = "interpolated"
_MAX_GAP_POINTS: Final = 1 << 16  # a gap wider than this is evaluated in chunks


@dataclass(frozen=True)
class Fit:
    """One route's fitted ratio over one gap's interior."""

    route: Config
    a: int
    b: int
    Ms: np.ndarray  # the interior integers a+1 .. b-1
    ratio: np.ndarray  # fitted stock/route ratio at each M
    ci_low: np.ndarray  # lower end of its bootstrap interval at each M
    boot_a: np.ndarray  # bootstrap medians of the ratio at a and b (for the crossover interval)
    boot_b: np.ndarray
    ratio_a: float
    ratio_b: float


def stock_route(point: Mapping[Config, RouteEval], params: Params) -> Config | None:
    """The route stock ran at a measured point: the one whose paired ratio is within tolerance of 1
    (closest wins); None when no route is (stock's own route was not among the candidates, or noise)."""
    best: tuple[float, Config] | None = None
    for route, ev in point.items():
        if ev.ratio is None or ev.n_paired == 0 or ev.reference:
            continue
        dev = abs(math.log(ev.ratio))
        if dev <= math.log1p(params.stock_tolerance) and (best is None or dev < best[0]):
            best = (dev, route)
    return best[1] if best else None


def boot_medians(ratios: Sequence[float], params: Params, seed: int) -> np.ndarray:
    r = np.asarray(ratios, dtype=np.float64)
    rng = np.random.Generator(np.random.PCG64(seed))
    idx = rng.integers(0, len(r), size=(params.resamples, len(r)))
    out: np.ndarray = np.median(r[idx], axis=1)
    return out


def _weights(a: int, b: int, Ms: np.ndarray) -> np.ndarray:
    w: np.ndarray = np.log(Ms / a) / math.log(b / a)
    return w


def fit_gap(key: ShapeKey, a: int, b: int, ev_a: RouteEval, ev_b: RouteEval, params: Params) -> Fit:
    """The fitted ratio of one route over the interior of (a, b) and its bootstrap lower bound."""
    assert ev_a.ratio is not None and ev_b.ratio is not None
    Ms = np.arange(a + 1, b, dtype=np.float64)
    ba = boot_medians(ev_a.ratios, params, _seed_for(params.seed, key, a, ev_a.route))
    bb = boot_medians(ev_b.ratios, params, _seed_for(params.seed, key, b, ev_b.route))
    la, lb = np.log(ba), np.log(bb)
    w = _weights(a, b, Ms)
    ratio = np.exp((1 - w) * math.log(ev_a.ratio) + w * math.log(ev_b.ratio))
    tail = (1.0 - params.confidence) / 2.0
    lows = []
    for s in range(0, len(w), _MAX_GAP_POINTS):
        ws = w[s : s + _MAX_GAP_POINTS, None]
        curves = (1 - ws) * la[None, :] + ws * lb[None, :]
        lows.append(np.exp(np.quantile(curves, tail, axis=1)))
    ci_low = np.concatenate(lows) if lows else np.zeros(0)
    return Fit(ev_a.route, a, b, Ms, ratio, ci_low, ba, bb, ev_a.ratio, ev_b.ratio)


def crossover(fit: Fit, level: float, params: Params) -> tuple[float, float, float] | None:
    """M where the fitted ratio reaches ``level`` (point, interval low, interval high), or None when the
    fitted ratio does not cross it inside the gap."""

    def m_at(ra: np.ndarray | float, rb: np.ndarray | float) -> np.ndarray:
        la, lb = np.log(ra), np.log(rb)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = (math.log(level) - la) / (lb - la)
        w = np.where(np.isfinite(w), w, np.where(lb > la, 0.0, 1.0))
        out: np.ndarray = fit.a * (fit.b / fit.a) ** np.clip(w, 0.0, 1.0)
        return out

    lo_end, hi_end = sorted((fit.ratio_a, fit.ratio_b))
    if not lo_end < level <= hi_end:
        return None
    point = float(m_at(fit.ratio_a, fit.ratio_b))
    boots = m_at(fit.boot_a, fit.boot_b)
    tail = (1.0 - params.confidence) / 2.0
    lo, hi = np.quantile(boots, [tail, 1.0 - tail])
    return point, float(lo), float(hi)


def _monotone(ev_a: RouteEval, ev_b: RouteEval, params: Params) -> str:
    """Empty when neither the route's time nor stock's falls from a to b by more than theta."""
    for what, ta, tb in (
        (ev_a.route, ev_a.median_us, ev_b.median_us),
        ("stock", ev_a.stock_us, ev_b.stock_us),
    ):
        if ta is None or tb is None:
            return f"{what} has no time at one end"
        if tb < ta * (1.0 - params.theta):
            return f"{what} time falls from {ta:.2f} us to {tb:.2f} us (not monotone in M: no line to fit)"
    return ""


def try_fit(
    key: ShapeKey,
    a: int,
    b: int,
    pa: Mapping[Config, RouteEval],
    pb: Mapping[Config, RouteEval],
    route: Config,
    params: Params,
) -> Fit | str:
    """The fitted curve of ``route`` over (a, b), or why the evidence does not support one."""
    sa, sb = stock_route(pa, params), stock_route(pb, params)
    if sa is None or sb is None or sa != sb:
        unknown = "an unidentified route"
        return f"stock runs {sa or unknown} at {a} and {sb or unknown} at {b}"
    if route == sa:
        return "it is stock's own route"
    if route not in pa or route not in pb:
        return "not measured at both ends"
    ea, eb = pa[route], pb[route]
    if ea.reference or eb.reference:
        return "reference rows (one sample, no interval)"
    if ea.ratio is None or eb.ratio is None:
        return "no paired ok trial at one end"
    if min(ea.n_paired, eb.n_paired) < params.min_trials:
        return f"fewer than {params.min_trials} paired ok trials at one end"
    why = _monotone(ea, eb, params)
    return why or fit_gap(key, a, b, ea, eb, params)


def _covered_gaps(rules: Sequence[Rule], key: ShapeKey) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for r in rules:
        if r.key == key:
            out.update(itertools.pairwise(r.measured_M))
    return out


def _gap_refusal(key: ShapeKey, route: Config, a: int, b: int, why: str) -> Refusal:
    what = f"interpolation over M={a + 1}..{b - 1} (between measured {a} and {b}): {why}"
    return Refusal(route, key, a + 1, what, refusal_kind=KIND)


def interpolated_rules(
    evals: Evals, measured_rules: Sequence[Rule], params: Params
) -> tuple[list[Rule], list[Refusal]]:
    """Rules of kind ``interpolated`` in the gaps no measured rule spans, and what was refused there."""
    rules: list[Rule] = []
    refusals: list[Refusal] = []
    for key in sorted(evals, key=ShapeKey.codes):
        by_m = evals[key]
        covered = _covered_gaps(measured_rules, key)
        for a, b in itertools.pairwise(sorted(by_m)):
            if b - a < 2 or (a, b) in covered:
                continue
            pa, pb = by_m[a], by_m[b]
            # only a gap with a route that passes at one end has anything to claim
            hopeful = sorted({r for p in (pa, pb) for r, ev in p.items() if verdict(ev, params).passes})
            if not hopeful:
                continue
            sa, sb = stock_route(pa, params), stock_route(pb, params)
            if sa is None or sb is None or sa != sb:
                unknown = "an unidentified route"
                why = f"stock runs {sa or unknown} at {a} and {sb or unknown} at {b}"
                refusals.extend(_gap_refusal(key, r, a, b, why) for r in hopeful)
                continue
            fits: list[Fit] = []
            for route in sorted(set(pa) & set(pb)):
                if route == sa:
                    continue
                ea, eb = pa[route], pb[route]
                why = ""
                if ea.reference or eb.reference:
                    why = "reference rows (one sample, no interval)"
                elif ea.ratio is None or eb.ratio is None:
                    why = "no paired ok trial at one end"
                elif min(ea.n_paired, eb.n_paired) < params.min_trials:
                    why = f"fewer than {params.min_trials} paired ok trials at one end"
                else:
                    why = _monotone(ea, eb, params)
                if why:
                    if route in hopeful:
                        refusals.append(_gap_refusal(key, route, a, b, why))
                    continue
                fits.append(fit_gap(key, a, b, ea, eb, params))
            for route in hopeful:
                if route != sa and route not in {f.route for f in fits} and not (route in pa and route in pb):
                    refusals.append(_gap_refusal(key, route, a, b, "not measured at both ends"))
            if not fits:
                continue
            rules_here, refused_here = _claim(key, a, b, fits, params)
            rules.extend(rules_here)
            refusals.extend(refused_here)
    return rules, refusals


def _claim(
    key: ShapeKey, a: int, b: int, fits: Sequence[Fit], params: Params
) -> tuple[list[Rule], list[Refusal]]:
    ratios = np.stack([f.ratio for f in fits])
    best = np.argmax(ratios, axis=0)  # the fitted winner at each interior M
    Ms = fits[0].Ms.astype(np.int64)
    need = 1.0 + params.theta
    labels: list[tuple[int, Config | None]] = []
    for i, M in enumerate(Ms):
        f = fits[int(best[i])]
        ok = f.ratio[i] >= need and f.ci_low[i] > 1.0
        labels.append((int(M), f.route if ok else None))
    by_route = {f.route: f for f in fits}
    rules: list[Rule] = []
    for route, run in _runs(labels):
        f = by_route[route]
        lo, hi = run[0] - (a + 1), run[-1] - (a + 1)
        cross = crossover(f, need, params)
        rules.append(
            Rule(
                key,
                run[0],
                run[-1],
                route,
                (),
                float(np.min(f.ratio[lo : hi + 1])),
                rule_kind=KIND,
                between=(a, b),
                ci_low=float(np.min(f.ci_low[lo : hi + 1])),
                crossover=cross,
            )
        )
    refusals: list[Refusal] = []
    claimed = {m for _, run in _runs(labels) for m in run}
    for f in fits:
        if any(r.route == f.route for r in rules):
            continue
        i = int(np.argmax(f.ratio))
        reason = (
            f"fitted ratio at most {f.ratio[i]:.3f}x (at M={int(Ms[i])}, {params.confidence:.0%} low end "
            f"{f.ci_low[i]:.3f}); needs >= {need:.3f}x with the low end above 1"
        )
        if f.ratio[i] >= need and f.ci_low[i] > 1.0:
            reason = "another route is fitted faster wherever this one passes"
        if len(claimed) < len(Ms) or not claimed:
            refusals.append(_gap_refusal(key, f.route, a, b, reason))
    return rules, refusals
