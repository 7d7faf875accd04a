"""The prediction model: what a change of dispatch decisions does to a census's matmul time. Pure.

``diff`` and ``report`` both use it, so a table's predicted effect is one figure wherever it is printed.

Each census row (fused groups excepted: a table never overrides them) gets a *baseline*, the time its
calls take on stock:

* ``measured stock``: calls x the point's median stock time (``anchor_us`` of its ok trials) where the
  tuning measured the row's point (shape key, M);
* ``est_us``: the census estimate (a roofline unless the trace carried times) everywhere else.

Each side's route then runs in ``baseline / ratio``, the ratio being the tuning file's stock/route ratio
(the statistic decisions use)

* at that exact point (basis ``measured``);
* else the smaller ratio of the two measured neighbours in M (``interpolated``);
* else, for a shape never measured, the smallest such ratio over the measured shapes of the same type
  (``type default, worst measured shape``).

Rows where none applies are counted as unpredicted and left at their baseline. The speed-up is
``total_a / total_b``, the Amdahl sum over the rows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.codegen.decide import RouteEval, ShapeKey

Evals = Mapping[ShapeKey, Mapping[int, Mapping[registry.Config, RouteEval]]]
StockUs = Mapping[ShapeKey, Mapping[int, float]]  # key -> M -> median stock time of one op (us)
# census row -> configuration (None: stock)
RouteOf = Callable[[Mapping[str, Any], schema.GpuId], registry.Config | None]

BASELINE_MEASURED: Final = "measured stock"
BASELINE_ESTIMATE: Final = "est_us"


@dataclass
class AffectedRow:
    tensor: str | None
    role: str | None
    op: str
    layout: str
    src0_type: str
    src1_type: str
    M: int
    N: int
    K: int
    B: int
    calls: int
    route_a: str | None
    route_b: str | None
    us_a: float | None  # total over the row's calls
    us_b: float | None
    delta_us: float | None
    basis: str  # where the route ratio comes from
    baseline: str = BASELINE_ESTIMATE  # where the row's stock time comes from
    baseline_us: float = 0.0  # the row's stock time
    fused: bool = False
    shape: Any = field(default=None, repr=False, compare=False)  # the op's shape key (any key class)

    @property
    def key(self) -> ShapeKey:
        if self.shape is not None:
            return cast(ShapeKey, self.shape)
        return ShapeKey(self.op, self.layout, self.src0_type, self.src1_type, self.N, self.K, self.B)


@dataclass
class Prediction:
    census_rows: int
    considered_rows: int  # rows of a GPU at least one table applies to
    fused_rows: int
    total_a_us: float
    total_b_us: float
    rows: list[AffectedRow]  # rows whose route differs, most time saved first
    unpredicted: int
    notes: list[str]
    measured_us: float = 0.0  # baseline time that is measured stock
    estimated_us: float = 0.0  # baseline time that is the census est_us
    every_row: list[AffectedRow] = field(default_factory=list, repr=False)  # all rows, census order

    @property
    def delta_us(self) -> float:
        return self.total_b_us - self.total_a_us

    @property
    def delta_pct(self) -> float:
        return 100.0 * self.delta_us / self.total_a_us if self.total_a_us > 0 else 0.0

    @property
    def speedup(self) -> float:
        """Time under A over time under B (NaN for an empty census)."""
        return self.total_a_us / self.total_b_us if self.total_b_us > 0 else math.nan

    @property
    def measured_share(self) -> float:
        """Share of the baseline that is measured stock time (the rest is est_us)."""
        total = self.measured_us + self.estimated_us
        return self.measured_us / total if total > 0 else 0.0


def _neighbour_ratio(
    by_m: Mapping[int, Mapping[registry.Config, RouteEval]], route: registry.Config, M: int
) -> float | None:
    lo = [m for m, p in by_m.items() if m < M and route in p and p[route].ratio is not None]
    hi = [m for m, p in by_m.items() if m > M and route in p and p[route].ratio is not None]
    if not lo or not hi:
        return None
    r_lo, r_hi = by_m[max(lo)][route].ratio, by_m[min(hi)][route].ratio
    assert r_lo is not None and r_hi is not None
    return min(r_lo, r_hi)


def route_factor(
    route: registry.Config | None, key: ShapeKey, M: int, evals: Evals
) -> tuple[float, str] | None:
    """Time of ``route`` (None = stock) relative to stock at a census point and its basis, or None."""
    if route is None:
        return 1.0, "stock"
    if isinstance(key, registry.MulMatIdKey) and key.routing == registry.ROUTING_ANY:
        # a census row without a routing bucket: the slowest of the buckets measured for the route
        per_bucket = [
            route_factor(route, key._replace_ints({"routing": b}), M, evals) for b in registry.ROUTING_BUCKETS
        ]
        got = [f for f in per_bucket if f is not None]
        return (max(got)[0], f"{max(got)[1]}, the slowest routing bucket") if got else None
    ev = evals.get(key, {}).get(M, {}).get(route)
    if ev is not None and ev.ratio is not None:
        return 1.0 / ev.ratio, "reference sample" if ev.reference else "measured"
    if key in evals:
        r = _neighbour_ratio(evals[key], route, M)
        return (1.0 / r, "interpolated") if r is not None else None
    ratios = []
    for s, by_m in evals.items():
        if s.group() != key.group():
            continue
        at_m = by_m.get(M, {}).get(route)
        for r in (_neighbour_ratio(by_m, route, M), at_m.ratio if at_m is not None else None):
            if r is not None:
                ratios.append(r)
    return (1.0 / min(ratios), "type default, worst measured shape") if ratios else None


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def _gpu_of(row: Mapping[str, Any], fallback: schema.GpuId) -> tuple[schema.GpuId, bool]:
    if not _present(row.get("gpu_name")):
        return fallback, True
    return schema.GpuId(str(row["gpu_name"]), int(row["gpu_cc"]), int(row["gpu_sm_count"])), False


def baseline_us(
    key: ShapeKey, M: int, calls: int, est_us: float, fused: bool, stock_us: StockUs | None
) -> tuple[float, str]:
    """A census row's stock time and which it is: measured (calls x median anchor) or the census est_us.
    Fused groups run another kernel than the one tuned, so they keep est_us."""
    stock = None if fused or stock_us is None else stock_us.get(key, {}).get(M)
    if stock is not None and math.isfinite(stock) and stock > 0:
        return calls * stock, BASELINE_MEASURED
    return (est_us if math.isfinite(est_us) else 0.0), BASELINE_ESTIMATE


def _row(
    rec: Mapping[str, Any],
    key: ShapeKey,
    M: int,
    calls: int,
    route_a: registry.Config | None,
    route_b: registry.Config | None,
    us_a: float | None,
    us_b: float | None,
    basis: str,
    baseline: tuple[float, str],
    fused: bool,
) -> AffectedRow:
    tensor, role = rec.get("tensor"), rec.get("role")
    return AffectedRow(
        tensor=str(tensor) if _present(tensor) else None,
        role=str(role) if _present(role) else None,
        op=key.op,
        layout=key.layout,
        src0_type=key.src0_type,
        src1_type=key.src1_type,
        M=M,
        N=key.N,
        K=key.K,
        B=int(getattr(key, "B", 1)),
        shape=key,
        calls=calls,
        route_a=None if route_a is None else str(route_a),
        route_b=None if route_b is None else str(route_b),
        us_a=us_a,
        us_b=us_b,
        delta_us=None if us_a is None or us_b is None else us_b - us_a,
        basis=basis,
        baseline=baseline[1],
        baseline_us=baseline[0],
        fused=fused,
    )


def predict_rows(
    census: Sequence[Mapping[str, Any]],
    route_a: RouteOf,
    route_b: RouteOf,
    evals: Evals,
    stock_us: StockUs | None,
    gpu: schema.GpuId,
    considered: Callable[[schema.GpuId], bool] = lambda _g: True,
) -> Prediction:
    """The model over census rows, with the routes of side A and side B given per row (None = stock);
    ``gpu`` stands in for rows that name none; ``considered`` tells the GPUs the decisions (and the
    tuning's stock times) apply to."""
    every: list[AffectedRow] = []
    total_a = total_b = measured = estimated = 0.0
    unpredicted = fused_rows = n_considered = assumed_gpu = 0
    for rec in census:
        est = float(rec["est_us"]) if _present(rec.get("est_us")) else 0.0
        calls = int(rec["calls"])
        row_gpu, assumed = _gpu_of(rec, gpu)
        assumed_gpu += assumed
        applies = considered(row_gpu)
        n_considered += applies
        fused = _present(rec.get("fused"))
        M = int(rec["M"])
        key = census_key(rec)
        # the tuning's stock times are of the GPU the tables apply to, not of a row's other GPU
        base, kind = baseline_us(key, M, calls, est, fused, stock_us if applies else None)
        baseline = (base, kind)
        if kind == BASELINE_MEASURED:
            measured += base
        else:
            estimated += base
        ra = None if fused else route_a(rec, row_gpu)
        rb = None if fused else route_b(rec, row_gpu)
        fused_rows += fused

        common = (rec, key, M, calls, ra, rb)
        if ra == rb:
            total_a += base
            total_b += base
            every.append(_row(*common, base, base, "fused" if fused else "same route", baseline, fused))
            continue
        fa = route_factor(ra, key, M, evals)
        fb = route_factor(rb, key, M, evals)
        if fa is None or fb is None:
            unpredicted += 1
            total_a += base
            total_b += base
            every.append(_row(*common, None, None, "no timing for this point", baseline, fused))
            continue
        ua, ub = base * fa[0], base * fb[0]
        total_a += ua
        total_b += ub
        every.append(_row(*common, ua, ub, fb[1] if rb is not None else fa[1], baseline, fused))
    notes = []
    n_measured = sum(r.baseline == BASELINE_MEASURED for r in every)
    kinds = Counter(str(r["est_kind"]) for r in census if _present(r.get("est_kind")))
    listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    total = measured + estimated
    notes.append(
        f"baseline: measured stock time (calls x median anchor_us) for {n_measured} rows "
        f"({100.0 * measured / total if total > 0 else 0.0:.1f}% of it), census est_us"
        + (f" ({listed} rows in the census)" if listed else "")
        + f" for the other {len(every) - n_measured}; a changed row gets it / the stock/route ratio"
    )
    if assumed_gpu:
        notes.append(f"{assumed_gpu} census rows name no GPU: assumed to run on the table's GPU")
    if fused_rows:
        notes.append(f"{fused_rows} fused census rows are never overridden by a table")
    affected = [r for r in every if r.route_a != r.route_b]
    affected.sort(key=lambda r: (r.delta_us if r.delta_us is not None else 0.0, r.tensor or ""))
    return Prediction(
        census_rows=len(census),
        considered_rows=n_considered,
        fused_rows=fused_rows,
        total_a_us=total_a,
        total_b_us=total_b,
        rows=affected,
        unpredicted=unpredicted,
        notes=notes,
        measured_us=measured,
        estimated_us=estimated,
        every_row=every,
    )


def census_key(rec: Mapping[str, Any]) -> ShapeKey:
    """The shape key of a census row, of its op's key class (MUL_MAT_ID: N, K, E, U, routing)."""
    # annotated as MUL_MAT's ShapeKey: every op's key class has its interface
    return cast(ShapeKey, registry.shape_key(rec))


def _table_route(table: Mapping[str, Any]) -> RouteOf:
    def route(rec: Mapping[str, Any], gpu: schema.GpuId) -> registry.Config | None:
        # MUL_MAT_ID: the routing-0 rule is what runs for a call of any bucket
        return tbl.lookup_measured_config(table, gpu, registry.runtime_key(census_key(rec)), int(rec["M"]))

    return route


def predict(
    census: Sequence[Mapping[str, Any]],
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    evals: Evals,
    stock_us: StockUs | None,
) -> Prediction:
    """Predicted change in matmul time over ``census`` when table ``a`` is replaced by ``b``: each row
    is looked up in both tables with the row's GPU, as the runtime would."""
    fallback = tbl.table_gpu(b) if b["rules"] else tbl.table_gpu(a)
    return predict_rows(
        census,
        _table_route(a),
        _table_route(b),
        evals,
        stock_us,
        fallback,
        considered=lambda g: bool(tbl.gpu_matches(a, g) or tbl.gpu_matches(b, g)),
    )


def format_prediction(p: Prediction, top: int = 20) -> list[str]:
    out = [
        f"census: {p.census_rows} rows, {len(p.rows)} affected, {p.unpredicted} without timing; "
        f"predicted matmul time {p.total_a_us:,.1f} us -> {p.total_b_us:,.1f} us "
        f"({p.delta_us:+,.1f} us, {p.delta_pct:+.2f}%), {p.speedup:.3f}x"
    ]
    for r in p.rows[:top]:
        what = f"{r.tensor or '?'} {r.src0_type} N={r.N} K={r.K} M={r.M} x{r.calls}"
        routes = f"{r.route_a or 'stock'} -> {r.route_b or 'stock'}"
        if r.delta_us is None:
            out.append(f"  {what}: {routes}: unpredicted ({r.basis})")
        else:
            out.append(
                f"  {what}: {routes}: {r.us_a:,.1f} -> {r.us_b:,.1f} us "
                f"({r.delta_us:+,.1f}; {r.basis}; baseline {r.baseline})"
            )
    if len(p.rows) > top:
        out.append(f"  ... {len(p.rows) - top} more affected rows (--json lists all)")
    out.extend(f"  note: {n}" for n in p.notes)
    return out
