"""The report's analysis: pure functions of the loaded inputs, no files and no figures.

The statistics are the decision code's own (:mod:`codegen.decide`), so the report and the table agree
on every verdict:

- a *point* is (shape key, M), the shape key being ``schema.SHAPE_KEY``;
- a route at a point: the median ``us`` of its ok trials; its speed-up over stock is the median of the
  per-trial ratios ``anchor_us / us`` with a 95% percentile bootstrap CI over trials;
  "beyond noise" means that CI lies entirely on one side of 1;
- stock at a point: the median ``anchor_us`` of the point's ok rows;
- predicted gains: :mod:`codegen.predict`, the model ``diff`` uses (measured stock time as the
  baseline where the tuning has the point, census est_us elsewhere);
- A/B: per pair, arm t/s / baseline t/s; the median of those ratios with the same bootstrap;
- roofline: a MUL_MAT point's limit is ``max(bytes / memory bandwidth, FLOPs / dense tensor peak)`` with
  the GPU's datasheet figures (``census.estimate``: NVIDIA H200 4.8 TB/s and 989 dense FP16 TFLOP/s) and
  the bytes and FLOPs the census' estimate counts for the node (weights in their stored type,
  activations, the f32 output and, for quantized weights, the Q8_1 copy of the activations); a measured
  time over it is 1.0 at the limit, 2.0 twice as long as the limit allows.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pandas as pd

from ggml_dispatch import registry, schema
from ggml_dispatch.census import estimate
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import predict as predict_mod
from ggml_dispatch.codegen import table as table_mod
from ggml_dispatch.report.ab import AB_ARMS, AbRecord
from ggml_dispatch.report.inputs import STATUS_KINDS, TableView, finite, records, status_kind

AB_COMPARISONS: Final = (
    ("table", "stock"),
    ("crude", "stock"),
    ("table", "crude"),
    ("cached", "stock"),  # the table chosen with a weight-cache budget
    ("cached", "table"),
    ("cached", "crude"),
    ("hook", "stock"),  # the hook's own cost: dispatch on, no table
    ("table", "hook"),  # the rules alone, the hook's cost on both sides
)


ROUTE_ORDER: Final = tuple(r.value for r in schema.ROUTE_CODES)


ShapeKey = decide.ShapeKey


@dataclass(frozen=True)
class Spread:
    """Median, quartiles (linear interpolation) and min/max of a sample; NaNs when empty."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float


def spread(xs: Sequence[float]) -> Spread:
    a = np.asarray(xs, dtype=np.float64)
    if not a.size:
        return Spread(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    q1, med, q3 = np.quantile(a, [0.25, 0.5, 0.75])
    return Spread(int(a.size), float(med), float(q1), float(q3), float(a.min()), float(a.max()))


def weighted_speedup(weights: Sequence[float], speedups: Sequence[float]) -> float:
    """Speed-up of a workload whose parts take ``weights`` time and speed up by ``speedups`` (Amdahl):
    sum(w) / sum(w / s). NaN when the weights sum to 0."""
    total = float(sum(weights))
    if total <= 0.0:
        return math.nan
    return total / float(sum(w / s for w, s in zip(weights, speedups, strict=True)))


@dataclass(frozen=True)
class Ratio:
    """A paired ratio: median of the per-pair ratios, bootstrap CI (None with fewer than 2 pairs)."""

    point: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def below(self) -> bool:
        return self.hi is not None and self.hi < 1.0

    @property
    def above(self) -> bool:
        return self.lo is not None and self.lo > 1.0


def paired_ratio(numer: Sequence[float], denom: Sequence[float], params: decide.Params) -> Ratio:
    """Median of numer_i/denom_i with the decision code's percentile bootstrap (fixed seed)."""
    ratios = [a / b for a, b in zip(numer, denom, strict=True)]
    if not ratios:
        return Ratio(math.nan, None, None, 0)
    point = float(np.median(ratios))
    if len(ratios) < 2:
        return Ratio(point, None, None, len(ratios))
    lo, hi = decide.bootstrap_ci(ratios, params, params.seed)
    return Ratio(point, lo, hi, len(ratios))


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def route_key(route: str) -> tuple[int, str]:
    return (ROUTE_ORDER.index(route), "") if route in ROUTE_ORDER else (len(ROUTE_ORDER), route)


def shape_sort_key(key: ShapeKey) -> tuple[Any, ...]:
    """The C rules array's order (op, layout, type ids, the op's key fields); unknown names after known
    ones."""
    ops = {o.value: c for o, c in schema.OP_CODES.items()}
    layouts = {x.value: c for x, c in schema.LAYOUT_CODES.items()}

    def tid(name: str) -> int:
        t = schema.GGML_TYPES.get(name)
        return t.id if t is not None else 1 << 20

    return (
        ops.get(key.op, 99),
        layouts.get(key.layout, 99),
        *(tid(getattr(key, f)) for f in key.TYPE_FIELDS),
        *(int(getattr(key, f)) for f in key.INT_FIELDS),
        *([0] * (registry.KEY_SLOTS - len(key.INT_FIELDS))),
        key.op,
        key.layout,
        *(str(getattr(key, f)) for f in key.TYPE_FIELDS),
    )


def shape_label(key: ShapeKey) -> str:
    return key.label()


def shape_slug(key: ShapeKey) -> str:
    ints = "-".join(f"{f[0] if f in ('N', 'K', 'B') else f}{getattr(key, f)}" for f in key.INT_FIELDS)
    t0, t1 = key.types
    raw = f"{key.op}-{key.layout}-{t0}-{t1}-{ints}"
    return safe_name(raw.lower())


def type_key(key: ShapeKey) -> tuple[str, str, str, str]:
    return (key.op, key.layout, *key.types)


@dataclass(frozen=True)
class RouteAtPoint:
    route: str
    ev: decide.RouteEval
    counts: Mapping[str, int]  # status kind -> trials
    times: Spread  # us of the ok trials
    check: decide.Verdict  # may it replace stock here (the decision rule, ignoring who is fastest)
    slower: bool  # slower than stock beyond noise

    @property
    def trials(self) -> int:
        return sum(self.counts.values())

    @property
    def faster(self) -> bool:
        return self.ev.ci_low is not None and self.ev.ci_low > 1.0

    def verdict(self) -> str:
        if self.ev.n_ok == 0:
            return "no ok trial"
        if self.ev.ratio is None:
            return "no stock anchor"
        if self.slower:
            return "slower"
        if self.faster:
            return "faster"
        if self.ev.is_anchor:
            return "stock's own route"
        if self.ev.reference:
            return "reference (no CI)"
        if self.ev.ci_low is None:
            return "n/a (<2 trials)"
        return "within noise"


@dataclass(frozen=True)
class Point:
    shape: ShapeKey
    M: int
    stock: Spread  # anchor_us of the point's ok rows
    stock_trials: int  # distinct trials with a stock anchor
    routes: tuple[RouteAtPoint, ...]
    winner: str | None  # lowest median among routes with ok trials
    chosen: str | None  # the winner if it passes the decision rule, else None (stock stays)

    def route(self, name: str | None) -> RouteAtPoint | None:
        for r in self.routes:
            if r.route == name:
                return r
        return None


@dataclass(frozen=True)
class AbComparison:
    model: str
    test: str
    ubatch: int
    arm: str  # numerator
    baseline: str  # denominator
    ratio: Ratio
    unpaired: int  # runs of either arm without a partner in the other
    pairs: tuple[tuple[int, float], ...]  # (pair id, arm/baseline) for every complete pair
    later: Ratio | None = None  # the same over repetitions 2.. only (AbRecord.later_tps); None: not recorded
    last: Ratio | None = None  # the same over the last repetition alone (AbRecord.last_tps)


def _good(x: Any) -> bool:
    return finite(x) and x > 0


@dataclass(frozen=True)
class TuningAnalysis:
    points: list[Point]  # sorted by shape key (C order) then M; routes in route-code order
    evals: predict_mod.Evals
    stock_us: predict_mod.StockUs  # key -> M -> median anchor_us of the point's ok rows
    gpu: schema.GpuId  # of the first row (a tuning file holds one GPU unless merged --allow-mixed)
    # (key, M) -> the configuration the decision rule picks there (typed; Point.chosen is its text)
    chosen: Mapping[tuple[ShapeKey, int], registry.Config] = field(default_factory=dict)


def analyse_tuning(df: pd.DataFrame, params: decide.Params) -> TuningAnalysis:
    """Every measured point with its routes' statistics and verdicts."""
    df = decide.with_configs(df)  # each row's configuration parsed once
    evals, stock = decide.evaluate(df, params)
    chosen: dict[tuple[ShapeKey, int], registry.Config] = {}
    rows_at: dict[tuple[ShapeKey, int], list[dict[str, Any]]] = defaultdict(list)
    for row in records(df):
        rows_at[(registry.shape_key(row), int(row["M"]))].append(row)
    points: list[Point] = []
    for key in sorted(evals, key=shape_sort_key):
        for M in sorted(evals[key]):
            prow = rows_at[(key, M)]
            ok = [r for r in prow if r["status"] == "ok"]
            anchors = [float(r["anchor_us"]) for r in ok if _good(r["anchor_us"])]
            stock_trials = len({int(r["trial"]) for r in ok if _good(r["anchor_us"])})
            routes: list[RouteAtPoint] = []
            for config in sorted(evals[key][M], key=lambda c: route_key(str(c))):
                ev = evals[key][M][config]
                rrows = [r for r in prow if decide.config_of(r) == config]
                counts = Counter(status_kind(str(r["status"])) or "failed" for r in rrows)
                routes.append(
                    RouteAtPoint(
                        route=str(config),
                        ev=ev,
                        counts={k: counts.get(k, 0) for k in STATUS_KINDS},
                        times=spread([float(r["us"]) for r in rrows if r["status"] == "ok"]),
                        check=decide.verdict(ev, params),
                        slower=decide.slower_beyond_noise(ev, params),
                    )
                )
            pick = decide.passing_route(evals[key][M], params)
            if pick is not None:
                chosen[(key, M)] = pick
            points.append(
                Point(
                    shape=key,
                    M=M,
                    stock=spread(anchors),
                    stock_trials=stock_trials,
                    routes=tuple(routes),
                    winner=_text(decide.winner(evals[key][M])),
                    chosen=_text(pick),
                )
            )
    first = df.iloc[0]
    gpu = schema.GpuId(str(first["gpu_name"]), int(first["gpu_cc"]), int(first["gpu_sm_count"]))
    return TuningAnalysis(points, evals, stock, gpu, chosen)


def _text(config: registry.Config | None) -> str | None:
    return None if config is None else str(config)


def failure_messages(df: pd.DataFrame) -> list[tuple[str, int, str]]:
    """(message, trials, first point) for every distinct ``failed:<msg>``, most frequent first."""
    counts: Counter[str] = Counter()
    first: dict[str, tuple[Any, ...]] = {}
    for row in records(df):
        status = str(row["status"])
        if status_kind(status) != "failed":
            continue
        msg = status[len(schema.FAILED_PREFIX) :].strip() or "(no message)"
        counts[msg] += 1
        key = registry.shape_key(row)
        where = (shape_sort_key(key), int(row["M"]), route_key(str(row["route"])), int(row["trial"]))
        label = f"{shape_label(key)}, M={row['M']}, {row['route']}"
        if msg not in first or where < first[msg][0]:
            first[msg] = (where, label)
    return sorted(((m, c, str(first[m][1])) for m, c in counts.items()), key=lambda t: (-t[1], t[0]))


@dataclass(frozen=True)
class CensusPoint:
    shape: ShapeKey
    M: int
    fused: bool
    calls: int
    est_us: float


def census_points(rows: Sequence[Mapping[str, Any]]) -> list[CensusPoint]:
    """Census rows summed per (shape key, M, fused or not)."""
    acc: dict[tuple[ShapeKey, int, bool], list[float]] = {}
    for r in rows:
        key = (registry.shape_key(r), int(r["M"]), bool(r["fused"]))
        a = acc.setdefault(key, [0.0, 0.0])
        a[0] += float(r["calls"])
        a[1] += float(r["est_us"])
    order = sorted(acc, key=lambda k: (shape_sort_key(k[0]), k[1], k[2]))
    return [CensusPoint(s, m, f, int(acc[(s, m, f)][0]), acc[(s, m, f)][1]) for s, m, f in order]


def census_shares(
    rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]
) -> list[tuple[str, float]]:
    """(group, est_us) sorted by est_us descending, then name."""
    acc: dict[str, float] = defaultdict(float)
    for r in rows:
        acc[key(r)] += float(r["est_us"])
    return sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass(frozen=True)
class Gains:
    """The shared prediction model (:mod:`codegen.predict`) over a set of census rows."""

    table: predict_mod.Prediction | None  # stock -> the table; None without a table
    chosen: predict_mod.Prediction  # stock -> the decision rule's route at every measured point


@dataclass(frozen=True)
class PointGain:
    """One census point (rows summed per shape key, M, fused or not) under the prediction model."""

    point: CensusPoint
    measured: Point | None  # None: no tuning data at this (shape key, M)
    table_route: str | None  # None without a table or where the table keeps stock
    baseline_us: float  # the model's stock time of the point's calls
    baseline: str  # measured stock or est_us (mixed: some rows each)
    table: float | None  # stock time / table time; 1 where stock stays; None: no timing for the route
    table_basis: str  # where the table route's ratio comes from (measured, interpolated, ...)
    chosen: float  # stock time / time with the decision rule's route (1 where stock stays)

    @property
    def covered(self) -> bool:
        """Tunable and measured: not fused, and stock plus at least one route timed here."""
        m = self.measured
        return not self.point.fused and m is not None and m.stock.n > 0 and m.winner is not None


def _rows_speedup(rows: Sequence[predict_mod.AffectedRow]) -> float | None:
    done = [r for r in rows if r.us_a is not None and r.us_b is not None]
    if not done:
        return None
    a = sum(r.us_a or 0.0 for r in done)
    b = sum(r.us_b or 0.0 for r in done)
    return a / b if b > 0 else 1.0


def _by_point(
    rows: Sequence[predict_mod.AffectedRow],
) -> dict[tuple[ShapeKey, int, bool], list[predict_mod.AffectedRow]]:
    out: dict[tuple[ShapeKey, int, bool], list[predict_mod.AffectedRow]] = defaultdict(list)
    for r in rows:
        out[(r.key, r.M, r.fused)].append(r)
    return out


class GainModel:
    """Predicted gains over the census, per M or overall, both for the table and for the decision rule;
    each M's prediction is made once."""

    def __init__(
        self, census: Sequence[Mapping[str, Any]], tuning: TuningAnalysis, table: TableView | None
    ) -> None:
        self._census = census
        self._tuning = tuning
        self._table = table
        self._chosen = tuning.chosen
        self._cache: dict[int | None, Gains | None] = {}

    def _chosen_route(self, rec: Mapping[str, Any], _gpu: schema.GpuId) -> registry.Config | None:
        return self._chosen.get((registry.shape_key(rec), int(rec["M"])))

    def whole(self) -> Gains | None:
        """Gains over every census row; None for an empty census."""
        return self._over(None)

    def at(self, M: int | None) -> Gains | None:
        """Gains over the census rows at ``M``; None where M is unknown (``effective_M`` of an unknown
        test) or the census has no row there."""
        return None if M is None else self._over(M)

    def _over(self, M: int | None) -> Gains | None:
        if M not in self._cache:
            rows = [r for r in self._census if M is None or int(r["M"]) == M]
            self._cache[M] = self._predict(rows) if rows else None
        return self._cache[M]

    def _predict(self, rows: Sequence[Mapping[str, Any]]) -> Gains:
        t = self._tuning
        table = None
        if self._table is not None:
            table = predict_mod.predict(rows, table_mod.empty_table(), self._table.data, t.evals, t.stock_us)
        chosen = predict_mod.predict_rows(
            rows,
            lambda _rec, _gpu: None,
            self._chosen_route,
            t.evals,
            t.stock_us,
            t.gpu,
            considered=lambda g: g == t.gpu,
        )
        return Gains(table, chosen)

    def points(self) -> list[PointGain]:
        """Every census point with its share of the model's baseline, census order of points."""
        gains = self.whole()
        if gains is None:
            return []
        by_key = {(p.shape, p.M): p for p in self._tuning.points}
        chosen_at = _by_point(gains.chosen.every_row)
        table_at = _by_point(gains.table.every_row) if gains.table is not None else {}
        out = []
        for cp in census_points(self._census):
            at = (cp.shape, cp.M, cp.fused)
            chosen_rows, table_rows = chosen_at[at], table_at.get(at, [])
            kinds = {r.baseline for r in chosen_rows}
            changed = [r for r in table_rows if r.route_b is not None]
            out.append(
                PointGain(
                    point=cp,
                    measured=by_key.get((cp.shape, cp.M)),
                    table_route=changed[0].route_b if changed else None,
                    baseline_us=sum(r.baseline_us for r in chosen_rows),
                    baseline=kinds.pop() if len(kinds) == 1 else "mixed",
                    table=_rows_speedup(table_rows) if table_rows else None,
                    table_basis=", ".join(sorted({r.basis for r in changed})) or "stock",
                    chosen=_rows_speedup(chosen_rows) or 1.0,
                )
            )
        return out


def effective_M(test: str, ubatch: int) -> int | None:
    """M of the matmuls a llama-bench test runs: ppN -> min(N, ubatch), tgN -> 1, also at a depth and KV
    cache (``pp3 @ d16384 kv q8_0``: the timed step, not the untimed depth fill); None if unknown."""
    base = re.sub(r"( @ d\d+)?( kv \S+(/\S+)?)?$", "", test)
    m = re.fullmatch(r"pp(\d+)", base)
    if m:
        return min(int(m.group(1)), ubatch)
    if re.fullmatch(r"tg\d+", base):
        return 1
    return None


def ab_model_label(r: AbRecord) -> str:
    """The model as tables show it: with its run (A/B file) when several runs are reported."""
    return f"{r.model} [{r.run}]" if r.run else r.model


def ab_comparisons(records: Sequence[AbRecord], params: decide.Params) -> list[AbComparison]:
    """Per (model, test, ubatch): table/stock, crude/stock and table/crude, paired by ``pair``."""
    Tps = dict[tuple[str, str, int], dict[str, dict[int, float]]]
    groups: Tps = defaultdict(lambda: defaultdict(dict))
    later: Tps = defaultdict(lambda: defaultdict(dict))
    last: Tps = defaultdict(lambda: defaultdict(dict))
    for r in records:
        key = (ab_model_label(r), r.test, r.ubatch)
        groups[key][r.arm][r.pair] = r.tps
        if r.later_tps is not None:
            later[key][r.arm][r.pair] = r.later_tps
        if r.last_tps is not None:
            last[key][r.arm][r.pair] = r.last_tps

    def paired(by_arm: Mapping[str, dict[int, float]], arm: str, base: str) -> Ratio | None:
        a, b = by_arm.get(arm, {}), by_arm.get(base, {})
        common = sorted(set(a) & set(b))
        return paired_ratio([a[p] for p in common], [b[p] for p in common], params) if common else None

    out: list[AbComparison] = []
    for key, arms in sorted(groups.items()):
        model, test, ubatch = key
        for arm, base in AB_COMPARISONS:
            if arm not in arms or base not in arms:
                continue
            common = sorted(set(arms[arm]) & set(arms[base]))
            ratio = paired_ratio([arms[arm][p] for p in common], [arms[base][p] for p in common], params)
            unpaired = len(set(arms[arm]) ^ set(arms[base]))
            pairs = tuple((p, arms[arm][p] / arms[base][p]) for p in common)
            out.append(
                AbComparison(
                    model, test, ubatch, arm, base, ratio, unpaired, pairs,
                    later=paired(later[key], arm, base), last=paired(last[key], arm, base),
                )
            )  # fmt: skip
    return out


def ab_arm_spreads(records: Sequence[AbRecord]) -> list[tuple[str, str, int, str, Spread]]:
    acc: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    for r in records:
        acc[(ab_model_label(r), r.test, r.ubatch, r.arm)].append(r.tps)
    keys = sorted(acc, key=lambda k: (k[0], k[1], k[2], AB_ARMS.index(k[3])))
    return [(*k, spread(acc[k])) for k in keys]


def ab_arm_vram(records: Sequence[AbRecord]) -> dict[tuple[str, str, int, str], float]:
    """The largest recorded peak GPU memory (MiB) per (model, test, ubatch, arm); absent: not measured."""
    out: dict[tuple[str, str, int, str], float] = {}
    for r in records:
        if r.peak_vram_mib is not None:
            k = (ab_model_label(r), r.test, r.ubatch, r.arm)
            out[k] = max(out.get(k, 0.0), r.peak_vram_mib)
    return out


def status_total(df: pd.DataFrame) -> Counter[str]:
    return Counter(status_kind(str(s)) or "failed" for s in df["status"])


def table_losses(
    points: Sequence[Point], table: TableView
) -> tuple[list[tuple[Point, RouteAtPoint]], list[tuple[Point, str]]]:
    """Measured points where the table's route is slower than stock beyond noise, and the points where
    the table's route has no ok trial."""
    losses: list[tuple[Point, RouteAtPoint]] = []
    unmeasured: list[tuple[Point, str]] = []
    for p in points:
        route = table.route_at(p.shape, p.M)
        if route is None:
            continue
        rp = p.route(route)
        if rp is None or rp.ev.n_ok == 0:
            unmeasured.append((p, route))
        elif rp.slower:
            losses.append((p, rp))
    return losses, unmeasured


@dataclass(frozen=True)
class Workload:
    """One (model [run], test, ubatch) of the A/B runs and its three comparisons."""

    model: str
    test: str
    ubatch: int
    table: AbComparison | None  # table/stock
    crude: AbComparison | None  # crude/stock
    vs_crude: AbComparison | None  # table/crude
    cached: AbComparison | None = None  # cached/stock: the table with its weight cache
    cached_vs_table: AbComparison | None = None  # cached/table: the same table without the cache
    cached_vs_crude: AbComparison | None = None  # cached/crude
    hook: AbComparison | None = None  # hook/stock: the hook's own cost (dispatch on, no table)
    table_vs_hook: AbComparison | None = None  # table/hook: the rules alone

    @property
    def ties_crude(self) -> bool:
        """The table/crude CI includes 1: the table does what the crude rule does, within noise."""
        c = self.vs_crude
        return c is not None and c.ratio.lo is not None and not c.ratio.below and not c.ratio.above


def workloads(comps: Sequence[AbComparison]) -> list[Workload]:
    """The comparisons grouped per (model, test, ubatch), in the comparisons' order."""
    by: dict[tuple[str, str, int], dict[tuple[str, str], AbComparison]] = {}
    for c in comps:
        by.setdefault((c.model, c.test, c.ubatch), {})[(c.arm, c.baseline)] = c
    return [
        Workload(
            m,
            t,
            u,
            cs.get(("table", "stock")),
            cs.get(("crude", "stock")),
            cs.get(("table", "crude")),
            cs.get(("cached", "stock")),
            cs.get(("cached", "table")),
            cs.get(("cached", "crude")),
            cs.get(("hook", "stock")),
            cs.get(("table", "hook")),
        )
        for (m, t, u), cs in by.items()
    ]


# --------------------------------------------------------------------------------------------
# Roofline


def roofline_us(key: ShapeKey, M: int, spec: estimate.GpuSpec) -> float | None:
    """The roofline limit of one MUL_MAT node of this shape at M tokens, in microseconds (None for the
    other ops: their shape keys do not give the node's operands)."""
    if key.op != schema.Op.MUL_MAT.value:
        return None
    N, K, B = int(key.N), int(key.K), int(key.B)
    if key.layout == schema.Layout.ATTENTION.value:
        src0_ne, src1_ne = (K, N, B, 1), (K, M, B, 1)
    else:
        src0_ne, src1_ne = (K, N, 1, 1), (K, M, B, 1)
    work = estimate.work_of(key.op, key.src0_type, key.src1_type, src0_ne, src1_ne)
    return estimate.per_call_us(spec, work)


def roofline_fraction(best_us: float | None, key: ShapeKey, M: int, spec: estimate.GpuSpec) -> float | None:
    """The measured time as a fraction of the roofline limit (>= 1 unless the model undercounts); None
    without a finite positive time or a limit."""
    if best_us is None or not math.isfinite(best_us) or best_us <= 0:
        return None
    limit = roofline_us(key, M, spec)
    return best_us / limit if limit is not None and limit > 0 else None


def gpu_spec(name: str, cc: int, sm_count: int) -> estimate.GpuSpec:
    """The datasheet spec of the GPU the rows were measured on (the labelled fallback for others)."""
    return estimate.spec_for(schema.GpuId(name, int(cc), int(sm_count)))


def best_time(p: Point) -> tuple[str, float | None]:
    """The fastest measured candidate of a point (stock included) and its median time."""
    best: tuple[str, float | None] = ("stock", p.stock.median if finite(p.stock.median) else None)
    for rp in p.routes:
        m = rp.times.median
        if finite(m) and (best[1] is None or m < best[1]):
            best = (rp.route, m)
    return best
