"""Size-class defaults: routes for unseen (N, K) of a measured type, by the weight's size N*K. Pure.

A per-type default (N = K = 0) is admitted only where a route passes at every measured (N, K) of the
type, so one small shape (or an LM head measured at M = 1, 2 only) keeps a type's large shapes at stock.
A size class is narrower:

* Classes: per (op, layout, src0_type, src1_type, B) the measured shapes are sorted by N*K (the weight's
  element count, which sets both the bytes a decode reads and the FLOPs per token) and split where two
  neighbours differ by a factor ``class_gap`` (default 4) or more. A class needs at least
  ``min_default_shapes`` shapes.
* Grid and choice: a class's grid is every M measured at ``min_default_shapes`` or more of its shapes.
  At a grid M the candidate is the route with the smallest worst-case regret over the shapes measured
  there (min-max regret, as the per-type default), admitted only where it passes at every one of them;
  a run of grid M extends over a gap only when the route passes at every measured M of every shape of
  the class inside the gap. No-harm therefore holds at every measured point the rule covers.
* Size range: a rule covers N*K from the smallest to the largest size it was fitted on. It reaches
  further -- towards halfway (geometrically) to the neighbouring class, or above the largest class (the
  70B-class shapes of a type measured at 8B sizes), but never more than a factor ``class_gap`` past its
  fitted sizes -- only where the evidence carries: the least-squares trend of log ratio over log N*K
  across the fitted shapes (only its losing part) applied to each fitted shape's ratio and CI low end
  must keep them >= 1 + theta and > 1 at the extended bound, at every grid M of the run (see
  :func:`extent`); a run of grid M is split where the extent changes. Where sizes do not differ the rule
  stops at the measured sizes.
* Between grid M: inside a gap (a, b) of the class grid that no class rule spans and where no shape of
  the class is measured, the route the class takes at a or b is fitted per shape (``codegen.crossover``)
  and claimed at an M only where every shape measured at both ends passes on its fitted curve.
* A class default is used at run time only where no exact (N, K) rule covers the query, and before the
  per-type default (N = K = 0). It records the shapes it was fitted on and its N*K range.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from ggml_dispatch import registry
from ggml_dispatch.codegen import crossover
from ggml_dispatch.codegen.decide import (
    KIND_DEFAULT,
    Config,
    Params,
    Refusal,
    RouteEval,
    Rule,
    ShapeKey,
    _runs,
    grid_labels,
)

Evals = Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]]

NK_MAX: Final = 2**62  # "no upper bound" (fits the C header's int64)


def size(key: ShapeKey) -> int:
    return key.N * key.K


def size_classes(shapes: Sequence[ShapeKey], gap: float) -> list[list[ShapeKey]]:
    """Shapes of one type, sorted by N*K, split where neighbours differ by a factor ``gap`` or more."""
    ordered = sorted(shapes, key=lambda s: (size(s), s.N, s.K))
    out: list[list[ShapeKey]] = []
    for s in ordered:
        if out and size(s) < size(out[-1][-1]) * gap:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def class_bounds(classes: Sequence[Sequence[ShapeKey]]) -> list[tuple[int, int]]:
    """Each class's cell on the N*K axis: from just above the geometric midpoint to the class below to the
    midpoint to the class above (1 and NK_MAX at the ends). Cells never overlap."""
    mids = [math.isqrt(size(lo[-1]) * size(hi[0])) for lo, hi in itertools.pairwise(classes)]
    cells = []
    for i in range(len(classes)):
        lo = 1 if i == 0 else mids[i - 1] + 1
        hi = NK_MAX if i == len(classes) - 1 else mids[i]
        cells.append((lo, hi))
    return cells


def _slope(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares slope of log ratio over log N*K, or None with fewer than two distinct sizes."""
    if len({s for s, _ in points}) < 2:
        return None
    x = np.log([float(s) for s, _ in points])
    y = np.log([r for _, r in points])
    return float(np.polyfit(x, y, 1)[0])


def _low(ev: RouteEval, params: Params) -> float:
    if ev.ci_low is not None:
        return ev.ci_low
    return (ev.ratio or 0.0) / (1.0 + (params.reference_margin or 0.0))


def extent(
    evals: Evals,
    shapes: Sequence[ShapeKey],
    route: Config,
    run: Sequence[int],
    cell: tuple[int, int],
    params: Params,
) -> tuple[int, int]:
    """The N*K range a class rule may claim: its fitted sizes, extended towards each bound of the class's
    cell (but never past ``class_gap`` times its largest size, or below its smallest / ``class_gap``)
    only where every fitted shape's ratio, carried to that bound along the least-squares size trend of
    log ratio over log N*K (only the part of the trend that loses), stays >= 1 + theta with its CI low end
    above 1, at every M of the run."""
    per_m = [
        [
            (size(s), float(ev.ratio), _low(ev, params))
            for s in shapes
            if (ev := evals[s].get(M, {}).get(route)) is not None and ev.ratio is not None and ev.ratio > 0
        ]
        for M in run
    ]
    return _extent(per_m, cell, params)


def _extent(
    per_m: Sequence[Sequence[tuple[int, float, float]]], cell: tuple[int, int], params: Params
) -> tuple[int, int]:
    """:func:`extent` on (size, ratio, CI low end) per shape, one list per M of the run."""
    sizes = [S for pts in per_m for S, _, _ in pts]
    smin, smax = min(sizes), max(sizes)
    up_to = min(cell[1], int(smax * params.class_gap))
    down_to = max(cell[0], math.ceil(smin / params.class_gap))
    up = down = True
    need = 1.0 + params.theta
    for pts in per_m:
        sl = _slope([(S, r) for S, r, _ in pts])
        if sl is None:
            return smin, smax
        for S, r, low in pts:
            f_up = (up_to / S) ** min(sl, 0.0)
            f_down = (down_to / S) ** max(sl, 0.0)
            up = up and r * f_up >= need and low * f_up > 1.0
            down = down and r * f_down >= need and low * f_down > 1.0
    return (down_to if down else smin), (up_to if up else smax)


def class_rules(evals: Evals, params: Params) -> tuple[list[Rule], list[Refusal]]:
    groups: dict[ShapeKey, list[ShapeKey]] = defaultdict(list)
    for key in evals:
        if key.DEFAULT_FIELDS:  # an op without per-type defaults has no size classes either
            groups[key.group()].append(key)
    rules: list[Rule] = []
    refusals: list[Refusal] = []
    need = params.min_default_shapes
    for group in sorted(groups, key=ShapeKey.codes):
        classes = size_classes(groups[group], params.class_gap)
        cells = class_bounds(classes)
        for shapes, (cell_lo, cell_hi) in zip(classes, cells, strict=True):
            if len(shapes) < need:
                continue
            label = f"size class N*K {cell_lo}..{cell_hi if cell_hi < NK_MAX else 'inf'}"
            r, f = _one_class(evals, group, shapes, (cell_lo, cell_hi), label, params)
            rules += r
            refusals += f
    r, f = family_rules(evals, groups, params)
    return rules + r, refusals + f


def family(group: ShapeKey) -> str | None:
    """The dequantization family of a group's weight type (registry.GgmlType.family); None for an
    unquantized weight (f32/f16/bf16 take routes of their own: they are not pooled)."""
    t = registry.GGML_TYPES.get(group.types[0])
    return t.family if t is not None and t.quantized else None


def family_rules(
    evals: Evals, groups: Mapping[ShapeKey, Sequence[ShapeKey]], params: Params
) -> tuple[list[Rule], list[Refusal]]:
    """Size-class defaults for a type measured at fewer than ``min_default_shapes`` shapes (no class of
    its own): its shapes pooled with those of the other types of its dequantization family (same op,
    layout, activation type and B), split into size classes as above. A class that holds at least one
    shape of the type gives the type rules by the same choice and no-harm test over every shape of the
    class, whatever its type, with the type's own shape required at every grid M it claims. The rules
    record each fitted shape with its type (``shape_types``)."""
    need = params.min_default_shapes
    rules: list[Rule] = []
    refusals: list[Refusal] = []
    for group in sorted(groups, key=ShapeKey.codes):
        own = groups[group]
        fam = family(group)
        if len(own) >= need or fam is None:
            continue
        kin = [
            s
            for g, shapes in groups.items()
            if g != group and family(g) == fam and g.with_type0(group.types[0]) == group
            for s in shapes
        ]
        if not kin:
            continue
        classes = size_classes([*own, *kin], params.class_gap)
        cells = class_bounds(classes)
        for shapes, (cell_lo, cell_hi) in zip(classes, cells, strict=True):
            mine = [s for s in shapes if s in own]
            if not mine or len(shapes) < need:
                continue
            label = f"{fam} family size class N*K {cell_lo}..{cell_hi if cell_hi < NK_MAX else 'inf'}"
            r, f = _one_class(evals, group, shapes, (cell_lo, cell_hi), label, params, required=mine)
            rules += r
            refusals += f
    return rules, refusals


def _one_class(
    evals: Evals,
    group: ShapeKey,
    shapes: Sequence[ShapeKey],
    cell: tuple[int, int],
    label: str,
    params: Params,
    required: Sequence[ShapeKey] = (),
) -> tuple[list[Rule], list[Refusal]]:
    """One size class's rules (grid M, between grid M) under ``group``'s key; ``required``: shapes that
    must be measured at every grid M (a family class: the type's own)."""
    rules: list[Rule] = []
    need = params.min_default_shapes
    counts: dict[int, int] = defaultdict(int)
    for s in shapes:
        for m in evals[s]:
            counts[m] += 1
    grid = sorted(m for m, n in counts.items() if n >= need and all(m in evals[r] for r in required))
    labels, refusals = grid_labels(evals, group, shapes, grid, label, params)
    pieces: list[tuple[Config, list[int]]] = []
    for route, run in _runs(labels):
        # split a run where the size extent changes, so each piece extends as far as it may
        run = sorted(set(run))
        sides = {m: extent(evals, shapes, route, [m], cell, params) for m in run}
        for _, sub in itertools.groupby(run, key=sides.__getitem__):
            pieces.append((route, list(sub)))
    typed = any(s.types[0] != group.types[0] for s in shapes)
    for route, run in pieces:
        fitted = [s for s in shapes if any(run[0] <= m <= run[-1] for m in evals[s])]
        ratios = [
            r
            for s in fitted
            for m, point in evals[s].items()
            if run[0] <= m <= run[-1] and (ev := point.get(route)) is not None and (r := ev.ratio) is not None
        ]
        lo, hi = extent(evals, fitted, route, run, cell, params)
        rules.append(
            Rule(
                group,
                run[0],
                run[-1],
                route,
                tuple(run),
                min(ratios),
                shapes=tuple((s.N, s.K) for s in fitted),
                rule_kind=KIND_DEFAULT,
                NK=(lo, hi),
                shape_types=tuple(s.types[0] for s in fitted) if typed else (),
            )
        )
    spanned = {g for _, run in pieces for g in itertools.pairwise(run)}
    last = dict(labels)  # grid M -> the class's route there (the last label wins)
    r2, f2 = _gap_rules(evals, group, shapes, grid, spanned, last, cell, label, params, typed)
    return rules + r2, refusals + f2


def _gap_rules(
    evals: Evals,
    group: ShapeKey,
    shapes: Sequence[ShapeKey],
    grid: Sequence[int],
    spanned: set[tuple[int, int]],
    at_grid: Mapping[int, Config | None],
    cell: tuple[int, int],
    label: str,
    params: Params,
    typed: bool = False,
) -> tuple[list[Rule], list[Refusal]]:
    """Class defaults inside a gap (a, b) of the class grid that no class rule spans: the route the class
    takes at a or b, fitted per shape (codegen.crossover) and claimed at an M only where every shape
    measured at both ends has a fitted ratio >= 1 + theta with its lower end above 1."""
    rules: list[Rule] = []
    refusals: list[Refusal] = []
    need = 1.0 + params.theta
    for a, b in itertools.pairwise(grid):
        if b - a < 2 or (a, b) in spanned:
            continue
        cands = sorted({r for r in (at_grid.get(a), at_grid.get(b)) if r is not None})
        at = [s for s in shapes if a in evals[s] and b in evals[s]]
        if not cands or len(at) < params.min_default_shapes:
            continue
        if any(a < m < b for sh in shapes for m in evals[sh]):
            continue  # a shape measured inside the gap: its own point decides there, not a line
        worst: dict[Config, tuple[np.ndarray, np.ndarray]] = {}
        fitted: dict[Config, list[tuple[int, crossover.Fit]]] = {}
        for route in cands:
            fits = []
            for s in at:
                f = crossover.try_fit(s, a, b, evals[s][a], evals[s][b], route, params)
                if isinstance(f, str):
                    refusals.append(
                        Refusal(
                            route,
                            group,
                            a + 1,
                            f"{label} default over M={a + 1}..{b - 1}: at N={s.N} K={s.K}: {f}",
                        )
                    )
                    break
                fits.append(f)
            else:
                fitted[route] = [(size(sh), f) for sh, f in zip(at, fits, strict=True)]
                worst[route] = (
                    np.min(np.stack([f.ratio for f in fits]), axis=0),
                    np.min(np.stack([f.ci_low for f in fits]), axis=0),
                )
        if not worst:
            continue
        Ms = np.arange(a + 1, b, dtype=np.int64)
        labels: list[tuple[int, Config | None]] = []
        for i, M in enumerate(Ms):
            best = max(worst, key=lambda r: float(worst[r][0][i]))
            ok = worst[best][0][i] >= need and worst[best][1][i] > 1.0
            labels.append((int(M), best if ok else None))
        for route, run in _runs(labels):
            # the size trend of the fitted curves at each claimed M (an end of the gap where the route
            # loses says nothing about the M it is claimed at); the run is split where that reach changes
            sized = fitted[route]
            reach = {
                m: _extent(
                    [[(S, float(g.ratio[m - a - 1]), float(g.ci_low[m - a - 1])) for S, g in sized]],
                    cell,
                    params,
                )
                for m in run
            }
            for nk, piece in itertools.groupby(run, key=reach.__getitem__):
                ms = list(piece)
                lo_i, hi_i = ms[0] - (a + 1), ms[-1] - (a + 1)
                rules.append(
                    Rule(
                        group,
                        ms[0],
                        ms[-1],
                        route,
                        (),
                        float(np.min(worst[route][0][lo_i : hi_i + 1])),
                        shapes=tuple((s.N, s.K) for s in at),
                        rule_kind=KIND_DEFAULT,
                        between=(a, b),
                        ci_low=float(np.min(worst[route][1][lo_i : hi_i + 1])),
                        NK=nk,
                        shape_types=tuple(s.types[0] for s in at) if typed else (),
                    )
                )
    return rules, refusals


def applies(rule_nk: tuple[int, int], N: int, K: int) -> bool:
    return rule_nk[0] <= N * K <= rule_nk[1]
