"""The report's figures: matplotlib's Agg canvas (no pyplot state), each a PNG as bytes. Pure: the same
inputs give the same bytes (no timestamp in the PNG metadata)."""

from __future__ import annotations

import io
import math
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from ggml_dispatch.codegen import decide
from ggml_dispatch.report import timeline
from ggml_dispatch.report.analysis import (
    AbComparison,
    Point,
    PointGain,
    Spread,
    route_key,
    shape_label,
    shape_sort_key,
)
from ggml_dispatch.report.inputs import is_default_rule

ShapeKey = decide.ShapeKey

_ROUTE_COLORS: Final = {
    "mmvf": "#1f77b4",
    "mmf": "#ff7f0e",
    "mmvq": "#2ca02c",
    "mmq": "#d62728",
    "cublas": "#9467bd",
}


_OTHER_COLORS: Final = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


STOCK_COLOR: Final = "#000000"


_TOP_BARS: Final = 20


_DPI: Final = 100


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        # a plot with many routes' legends may not fit tightly; it is still readable, so no warning on stderr
        warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def route_color(route: str, others: list[str]) -> str:
    if route in _ROUTE_COLORS:
        return _ROUTE_COLORS[route]
    if route not in others:
        others.append(route)
    return _OTHER_COLORS[others.index(route) % len(_OTHER_COLORS)]


def _log_m_axis(ax: Axes, Ms: Iterable[int]) -> None:
    """Log-2 M axis labelled with the measured M values (at most about 12 labels)."""
    ticks = sorted(set(Ms))
    ax.set_xscale("log", base=2)
    if ticks:
        step = max(1, math.ceil(len(ticks) / 12))
        ax.set_xticks(ticks[::step], [str(m) for m in ticks[::step]])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("M (tokens)")


def _tick_label(value: float, _pos: int) -> str:
    return f"{value:g}"


def _minor_tick_label(value: float, _pos: int) -> str:
    """Label the 2x and 5x minor ticks of a log axis, leave the others blank."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(mantissa, 6) in (2.0, 5.0) else ""


def _errorbar(ax: Axes, Ms: list[int], sp: list[Spread], color: str, label: str, style: str) -> None:
    med = [s.median for s in sp]
    ax.errorbar(
        Ms,
        med,
        yerr=[[s.median - s.q1 for s in sp], [s.q3 - s.median for s in sp]],
        fmt=style,
        color=color,
        label=label,
        capsize=3,
        ms=4,
        lw=1.2,
    )
    if len(Ms) > 1:
        ax.fill_between(Ms, [s.min for s in sp], [s.max for s in sp], color=color, alpha=0.12, lw=0)


def plot_shape(key: ShapeKey, points: Sequence[Point], rules: Sequence[Mapping[str, Any]], gpu: str) -> bytes:
    """Time vs M per route (median, IQR bars, min-max band), the stock anchor and the rules' M ranges."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    others: list[str] = []
    stock = [(p.M, p.stock) for p in points if p.stock.n > 0]
    if stock:
        _errorbar(ax, [m for m, _ in stock], [s for _, s in stock], STOCK_COLOR, "stock (anchor)", "--o")
    for route in sorted({r.route for p in points for r in p.routes}, key=route_key):
        series = [(p.M, rp.times) for p in points if (rp := p.route(route)) is not None and rp.times.n > 0]
        if series:
            color = route_color(route, others)
            _errorbar(ax, [m for m, _ in series], [s for _, s in series], color, route, "-o")
    _log_m_axis(ax, [p.M for p in points])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_tick_label))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_tick_label))
    for rule in rules:
        color = route_color(str(rule["route"]), others)
        lo, hi = int(rule["M_lo"]), int(rule["M_hi"])
        default = is_default_rule(rule)
        ax.axvspan(lo / 1.1, hi * 1.1, color=color, alpha=0.06 if default else 0.12, lw=0, hatch=None)
        ax.annotate(
            f"{'default' if default else 'rule'}: {rule['route']} M {lo}–{hi}",
            xy=((lo * hi) ** 0.5, 0.99 if not default else 0.94),
            xycoords=("data", "axes fraction"),
            ha="center",
            va="top",
            fontsize=7,
            color=color,
        )
    ax.set_ylabel("time per op (µs): median, IQR bars, min–max band")
    ax.set_title(f"{shape_label(key)}\n{gpu}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def plot_type_speedups(tkey: tuple[str, str, str, str], points: Sequence[Point], gpu: str) -> bytes:
    """The fastest route's stock/route ratio (95% CI) vs M, one line per (N, K, B) of this type pair."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    by_shape: dict[ShapeKey, list[tuple[int, decide.RouteEval]]] = defaultdict(list)
    for p in points:
        rp = p.route(p.winner)
        if rp is not None and rp.ev.ratio is not None:
            by_shape[p.shape].append((p.M, rp.ev))
    for i, key in enumerate(sorted(by_shape, key=shape_sort_key)):
        series = by_shape[key]
        ratios = [ev.ratio or math.nan for _, ev in series]
        lo = [
            r - ev.ci_low if ev.ci_low is not None else 0.0 for r, (_, ev) in zip(ratios, series, strict=True)
        ]
        hi = [
            ev.ci_high - r if ev.ci_high is not None else 0.0
            for r, (_, ev) in zip(ratios, series, strict=True)
        ]
        ax.errorbar(
            [m for m, _ in series],
            ratios,
            yerr=[lo, hi],
            fmt="-o",
            ms=4,
            capsize=3,
            color=f"C{i % 10}",
            label=" ".join(f"{f}={getattr(key, f)}" for f in key.INT_FIELDS),
        )
    ax.axhline(1.0, color=STOCK_COLOR, lw=1, ls="--")
    _log_m_axis(ax, [p.M for p in points])
    ax.set_ylabel("stock / fastest route (median of paired ratios, 95% CI)")
    ax.set_title(f"{' '.join(tkey[:2])} {tkey[2]} x {tkey[3]}: fastest route vs stock\n{gpu}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if by_shape:
        ax.legend(fontsize=7, loc="best")
    return _png(fig)


def plot_census(title: str, shares: Sequence[tuple[str, float]]) -> bytes:
    total = sum(v for _, v in shares) or 1.0
    top = list(shares[:_TOP_BARS])
    rest = shares[_TOP_BARS:]
    if rest:
        top.append((f"other ({len(rest)})", sum(v for _, v in rest)))
    fig = Figure(figsize=(8, 1.4 + 0.28 * len(top)))
    ax = fig.add_subplot()
    ax.barh(range(len(top)), [100.0 * v / total for _, v in reversed(top)], color="#4c72b0")
    ax.set_yticks(range(len(top)), [k for k, _ in reversed(top)], fontsize=7)
    ax.set_xlabel("share of census est_us (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def _short_label(key: ShapeKey, M: int, fused: bool) -> str:
    """A y-axis label: what tells two census points apart in a one-op-kind table."""
    parts = [key.src0_type if key.src1_type == "f32" else f"{key.src0_type}x{key.src1_type}", f"N={key.N}"]
    parts.append(f"K={key.K}")
    parts += [f"{f}={getattr(key, f)}" for f in key.INT_FIELDS if f not in ("N", "K", "B")]
    if getattr(key, "B", 1) != 1:
        parts.append(f"B={key.B}")
    if key.op != "MUL_MAT" or key.layout != "weight":
        parts.insert(0, f"{key.op} {key.layout}")
    return " ".join(parts) + f"  M={M}" + (" fused" if fused else "")


def _row_height(n: int) -> float:
    """Figure height (inches) for ``n`` labelled rows of 8-point text, never overlapping."""
    return 1.6 + 0.26 * max(n, 1)


def plot_gain(gains: Sequence[PointGain], with_table: bool) -> bytes:
    """Horizontal bars, one per census point the table (or, without a table, the decision rule) changes:
    the predicted per-op speed-up, coloured by route, with the point's share of the baseline."""
    total = sum(g.baseline_us for g in gains) or 1.0
    if with_table:
        shown = [g for g in gains if g.table_route is not None]
    else:
        shown = [g for g in gains if g.measured is not None and g.measured.chosen is not None]
    shown.sort(key=lambda g: (shape_sort_key(g.point.shape), g.point.M, g.point.fused))
    fig = Figure(figsize=(9, _row_height(len(shown))))
    ax = fig.add_subplot()
    ys = list(range(len(shown)))
    others: list[str] = []
    routes = [
        (g.table_route if with_table else g.measured.chosen if g.measured is not None else None) or "stock"
        for g in shown
    ]
    values = [(g.table if with_table else g.chosen) for g in shown]
    widths = [v - 1.0 if v is not None else 0.0 for v in values]
    colors = [route_color(r, others) if r != "stock" else STOCK_COLOR for r in routes]
    ax.barh(ys, widths, left=1.0, color=colors, height=0.7)
    if with_table:
        rule = [(i, g.chosen) for i, g in enumerate(shown) if g.covered]
        if rule:
            ax.scatter([v for _, v in rule], [i for i, _ in rule], marker="D", s=14, color=STOCK_COLOR,
                       zorder=3, label="decision rule at the point")  # fmt: skip
    for y, g, v in zip(ys, shown, values, strict=True):
        text = "no timing" if v is None else f"{v:.2f}x"
        ax.annotate(
            f"{text}  ({100.0 * g.baseline_us / total:.1f}% of baseline)",
            xy=(max(1.0, v or 1.0), y),
            xytext=(7, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.axvline(1.0, color=STOCK_COLOR, lw=1, ls="--")
    ax.set_yticks(ys, [_short_label(g.point.shape, g.point.M, g.point.fused) for g in shown], fontsize=8)
    ax.set_ylim(max(len(shown), 1) - 0.5, -0.5)
    hi = max([v for v in values if v is not None] + [1.0])
    ax.set_xlim(min([v for v in values if v is not None] + [1.0]) - 0.05, hi + 0.35 * (hi - 1.0) + 0.3)
    ax.set_xlabel("predicted per-op speed-up (stock time / route time)")
    what = "the table's route" if with_table else "the decision rule's route"
    ax.set_title(
        f"census points where {what} replaces stock ({len(shown)} of {len(gains)}; the rest stay at 1)",
        fontsize=9,
    )
    used = sorted(set(routes) - {"stock"}, key=route_key)
    handles = [Patch(color=route_color(r, others), label=r) for r in used]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=8, loc="upper right")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def plot_ab(comps: Sequence[AbComparison], predicted: Mapping[int, float]) -> bytes:
    """One row per workload (model, test, ubatch): table/stock and crude/stock with their 95% CIs, and
    the table's predicted matmul-time speed-up at the test's M."""
    order: list[tuple[str, str, int]] = []
    for c in comps:
        if (c.model, c.test, c.ubatch) not in order:
            order.append((c.model, c.test, c.ubatch))
    row = {w: i for i, w in enumerate(order)}
    fig = Figure(figsize=(9, _row_height(len(order))))
    ax = fig.add_subplot()
    series = (("table", "stock", "#d62728", -0.15), ("crude", "stock", "#7f7f7f", 0.15))
    for arm, base, color, dy in series:
        sel = [c for c in comps if (c.arm, c.baseline) == (arm, base)]
        if not sel:
            continue
        pts = [c.ratio.point for c in sel]
        lo = [c.ratio.point - c.ratio.lo if c.ratio.lo is not None else 0.0 for c in sel]
        hi = [c.ratio.hi - c.ratio.point if c.ratio.hi is not None else 0.0 for c in sel]
        ax.errorbar(pts, [row[(c.model, c.test, c.ubatch)] + dy for c in sel], xerr=[lo, hi], fmt="o",
                    ms=4, capsize=2, color=color, label=f"{arm}/{base} (95% CI)")  # fmt: skip
    pred = [(row[(comps[i].model, comps[i].test, comps[i].ubatch)], v) for i, v in sorted(predicted.items())]
    if pred:
        ax.scatter([v for _, v in pred], [y - 0.15 for y, _ in pred], marker="D", facecolors="none",
                   edgecolors="#d62728", s=30, label="table predicted, matmul time only")  # fmt: skip
    ax.axvline(1.0, color=STOCK_COLOR, lw=1, ls="--")
    ax.set_yticks(range(len(order)), [f"{m} {t} ub{u}" for m, t, u in order], fontsize=8)
    ax.set_ylim(max(len(order), 1) - 0.5, -0.5)
    ax.set_xlabel("end-to-end t/s ratio (median of paired runs)")
    ax.set_title("measured A/B per workload", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    if comps:
        ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


_PROFILE_COLORS: Final = {
    **_ROUTE_COLORS,
    "conversion": "#f0a0c0",
    "attention": "#17becf",
    "other": "#bcbd22",
    "copy": "#8c564b",
    "idle": "#dddddd",
}


def plot_profile(profile: timeline.Profile) -> bytes:
    """Stacked bars: GPU ms per run by kernel category, then idle, for each (test, arm)."""
    rows = timeline.ordered(profile.rows)
    fig = Figure(figsize=(9, 2.0 + 0.32 * len(rows)))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    left = [0.0] * len(rows)
    for cat in (*timeline.CATEGORIES, "idle"):
        widths = [max(0.0, b.idle_ms) if cat == "idle" else b.ms[cat] for b in rows]
        if not any(widths):
            continue
        ax.barh(ys, widths, left=left, color=_PROFILE_COLORS[cat], label=cat, height=0.7)
        left = [lo + w for lo, w in zip(left, widths, strict=True)]
    ax.scatter([b.wall_ms for b in rows], ys, marker="|", s=200, color=STOCK_COLOR, label="wall", zorder=3)
    ax.set_yticks(ys, [f"{timeline.test_label(b.test)} {b.arm}" for b in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "ms per run: kernel time by category, then idle (wall - busy)\n"
        "a bar passes its wall mark by the kernel time that overlapped other kernels"
    )
    ax.set_title("where a run's time goes (CUPTI kernel timelines)", fontsize=9)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)
