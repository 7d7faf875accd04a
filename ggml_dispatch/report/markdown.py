"""REPORT.md: the analysis rendered as Markdown, with the figures it links. Pure: the same inputs give
byte-identical Markdown (stable ordering, fixed bootstrap seeds, no clock)."""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeGuard

import pandas as pd

from ggml_dispatch import schema
from ggml_dispatch.census import estimate
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import predict as predict_mod
from ggml_dispatch.report import analysis, attribution, decode, plots, timeline
from ggml_dispatch.report.ab import AbRecord, pair_label
from ggml_dispatch.report.analysis import (
    AbComparison,
    GainModel,
    Point,
    Ratio,
    RouteAtPoint,
    ShapeKey,
    Spread,
    TuningAnalysis,
    ab_arm_spreads,
    ab_arm_vram,
    ab_comparisons,
    analyse_tuning,
    census_shares,
    effective_M,
    failure_messages,
    route_key,
    safe_name,
    shape_label,
    shape_slug,
    shape_sort_key,
    status_total,
    type_key,
)
from ggml_dispatch.report.inputs import STATUS_KINDS, Inputs, TableView, is_default_rule, records

PLOTS_DIR: Final = "plots"


REPORT_NAME: Final = "REPORT.md"


@dataclass
class Report:
    markdown: str
    figures: dict[str, bytes] = field(default_factory=dict)  # file name under plots/ -> PNG bytes


def fmt_us(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.2f}"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.3f}"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"


def fmt_share(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def fmt_tps(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:,.1f}"


def fmt_iqr(s: Spread) -> str:
    return "–" if s.n == 0 else f"{s.q1:.2f}–{s.q3:.2f}"


def fmt_minmax(s: Spread) -> str:
    return "–" if s.n == 0 else f"{s.min:.2f}–{s.max:.2f}"


def ab_verdict(r: Ratio) -> str:
    if r.lo is None:
        return "n/a (<2 pairs)"
    return "LOSS" if r.below else "gain" if r.above else "within noise"


def md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


class _Figures:
    """Collects rendered figures and reports progress."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self.files: dict[str, bytes] = {}
        self._progress = progress

    def add(self, name: str, png: bytes) -> str:
        self.files[name] = png
        if self._progress is not None:
            self._progress(1)
        return f"{PLOTS_DIR}/{name}"


def figure_count(inputs: Inputs) -> int:
    """How many figures :func:`build_report` renders (for a progress bar)."""
    shapes = {ShapeKey.of(r) for r in records(inputs.tuning[list(schema.SHAPE_KEY)])}
    census = 4 if inputs.census is not None else 0
    profile = 1 if inputs.profile is not None else 0
    ab = 1 if inputs.ab is not None else 0
    return len(shapes) + len({type_key(s) for s in shapes}) + census + profile + ab


def _gpu_label(df: pd.DataFrame) -> str:
    r = df.iloc[0]
    return f"{r['gpu_name']} (cc {int(r['gpu_cc'])}, {int(r['gpu_sm_count'])} SMs)"


def build_report(inputs: Inputs, progress: Callable[[int], None] | None = None) -> Report:
    """The whole report. ``progress(1)`` is called after each figure."""
    params = inputs.params
    tuning = analyse_tuning(inputs.tuning, params)
    points = tuning.points
    gpu = _gpu_label(inputs.tuning)
    figs = _Figures(progress)
    model = GainModel(inputs.census, tuning, inputs.table) if inputs.census is not None else None
    comps = ab_comparisons(inputs.ab, params) if inputs.ab else []
    ab_predicted = _ab_predicted(comps, model, inputs.table)

    md: list[str] = ["# ggml-dispatch report", "", f"GPU: {md_escape(gpu)}.", ""]
    if inputs.attribution is not None:
        md += _section_attribution(inputs.attribution)
    summary, all_workloads = _section_summary(inputs, tuning, model, comps, ab_predicted, len(md))
    md += summary + all_workloads
    md += _section_provenance(inputs, gpu)
    md += _section_overview(inputs, tuning, model)
    md += _section_losing(inputs, points, comps)
    if inputs.ab is not None:
        md += _section_ab(inputs.ab, comps, model, ab_predicted, figs)
    if model is not None:
        md += _section_predictions(model, inputs.table, figs)
    if inputs.profile is not None:
        md += _section_profile(inputs.profile, figs, model, comps)
    if inputs.census is not None:
        md += _section_census(inputs.census, figs)
    md += _section_status(inputs.tuning, points)
    md += decode.section(points, inputs.table, tuning.gpu.name)
    spec = analysis.gpu_spec(tuning.gpu.name, tuning.gpu.cc, tuning.gpu.sm_count)
    md += _section_shapes(points, inputs.table, params, gpu, figs, spec)
    if inputs.notes and inputs.notes.strip():
        md += ["## Notes", "", inputs.notes.strip(), ""]
    return Report("\n".join(md).rstrip("\n") + "\n", figs.files)


ATTRIBUTION_TOP: Final = 5  # ops and routes named per phase in the report's opening table


def _section_attribution(phases: Sequence[attribution.Phase]) -> list[str]:
    """Where the GPU time goes per phase of a served workload: the first thing a reader needs to weigh the
    rest (a table can only speed up the share it chooses kernels for)."""
    return [
        "## Where the GPU time goes",
        "",
        "Per phase of the profiled server run: GPU time by op and route (largest first), `tunable` the "
        "share in kernels a table chooses (matmul routes, their conversions, FlashAttention), `bound` "
        "Amdahl's limit on the phase's speed-up from any table (those kernels taking no time).",
        "",
        *attribution.markdown(phases, top=ATTRIBUTION_TOP).rstrip("\n").split("\n"),
        "",
    ]


def _section_provenance(inputs: Inputs, gpu: str) -> list[str]:
    md = ["## Data provenance", ""]
    for f in inputs.files:
        md.append(f"- **{f.role}** `{md_escape(f.name)}` (sha256 `{f.sha256}`)")
        md += [f"  - {label}: {md_escape(value)}" for label, value in f.details]
    md.append("")
    if inputs.table is not None:
        g = inputs.table.data["gpu"]
        table_gpu = f"{g['name']} (cc {g['cc']}, {g['sm_count']} SMs)"
        if inputs.table.rules and table_gpu != gpu:
            md += [
                f"**The table belongs to {md_escape(table_gpu)}, not to the tuning GPU {md_escape(gpu)}.**",
                "",
            ]
    p = inputs.params
    md += [
        f"Decision parameters used for the verdicts: theta {p.theta}, min trials {p.min_trials}, "
        f"{p.resamples} bootstrap resamples, {p.confidence:.0%} CI, seed {p.seed}"
        + (f", reference margin {p.reference_margin}" if p.reference_margin is not None else "")
        + ".",
        "",
    ]
    return md


def _profile_prediction_rows(
    profile: timeline.Profile,
    deltas: Sequence[timeline.ArmDelta],
    gain_model: GainModel,
    comps: Sequence[AbComparison],
) -> list[list[str]]:
    """Per profiled test: the census' predicted matmul speed-up for the table at that M, carried to the
    whole run through the stock run's measured matmul share, against what was measured."""
    stock = {b.test: b for b in profile.rows if b.arm == "stock"}
    model = timeline.profile_model(profile.note)
    rows: list[list[str]] = []
    for d in deltas:
        if d.arm != "table" or d.test not in stock:
            continue
        test, ubatch = timeline.test_case(d.test)
        gains = gain_model.at(effective_M(test, ubatch or 1))
        pred = gains.table if gains is not None else None
        if pred is None:
            continue
        base = stock[d.test]
        f = base.matmul_ms / base.wall_ms
        e2e = 1.0 / (1.0 - f + f / pred.speedup)
        ab = [
            f"{fmt_ratio(c.ratio.point)} {fmt_ci(c.ratio.lo, c.ratio.hi)}"
            for c in comps
            if (c.arm, c.baseline) == ("table", "stock")
            and c.test == test
            and (ubatch is None or c.ubatch == ubatch)
            and model is not None
            and (c.model == model or c.model.startswith(f"{model} ["))
        ]
        rows.append(
            [
                timeline.test_label(d.test),
                fmt_share(f),
                fmt_ratio(pred.speedup),
                fmt_ratio(e2e),
                fmt_ratio(d.measured),
                "; ".join(ab) or "–",
            ]
        )
    return rows


def _section_profile(
    profile: timeline.Profile,
    figs: _Figures,
    model: GainModel | None = None,
    comps: Sequence[AbComparison] = (),
) -> list[str]:
    md = [
        "## Where a step's time goes (kernel timelines)",
        "",
        f"Profile `{md_escape(Path(profile.source).name)}`"
        + (f" ({md_escape(profile.note)})" if profile.note else "")
        + ": one llama-bench process per arm and test, every kernel's GPU time from CUPTI "
        "(`ggml_dispatch/report/native/kernel_timeline.cpp`). Milliseconds per run: pp2048 (one prompt) or "
        "tg128 (128 tokens). "
        "`matmul` is the route kernels (mmvq/mmq/mmvf/mmf/cuBLAS, activation quantization included); "
        "`conversion` is what the cuBLAS route adds around its GEMM (weight dequantization to f16, "
        "activation and result casts); `idle` is llama-bench's wall time minus the time any kernel or copy "
        "ran (launch and graph gaps, host work, synchronisation); `overlap` is kernel time that ran "
        "concurrently with other kernels. The profiler's own cost is in these runs: compare arms with each "
        "other, not with the A/B.",
        "",
    ]
    rows = timeline.ordered(profile.rows)
    routes = [c for c in timeline.MATMUL_CATEGORIES if c != "conversion"]
    md += md_table(
        [
            "test",
            "arm",
            "wall",
            "matmul",
            "conversion",
            "attention",
            "other",
            "copy",
            "idle",
            "overlap",
            "matmul+conv share",
            "routes",
        ],
        (
            [
                timeline.test_label(b.test),
                b.arm,
                f"{b.wall_ms:.2f}",
                f"{sum(b.ms[c] for c in routes):.2f}",
                f"{b.ms['conversion']:.2f}",
                f"{b.ms['attention']:.2f}",
                f"{b.ms['other']:.2f}",
                f"{b.ms['copy']:.2f}",
                f"{b.idle_ms:.2f}",
                f"{b.overlap_ms:.2f}",
                fmt_share(b.share(b.matmul_ms)),
                ", ".join(f"{c} {b.ms[c]:.2f}" for c in routes if b.ms[c] >= 0.005),
            ]
            for b in rows
        ),
    )
    md.append("")
    deltas = timeline.arm_deltas(profile.rows)
    if deltas:
        md += [
            "Against stock in the same profile: matmul time saved (conversions included), what that alone "
            "predicts for the run (stock wall / (stock wall - saved)), and the ratio these profiled runs "
            "measured. Where measured < predicted, the rest went into idle gaps or other kernels.",
            "",
        ]
        md += md_table(
            ["test", "arm", "matmul saved ms", "other kernels Δ ms", "idle Δ ms", "predicted", "measured"],
            (
                [
                    timeline.test_label(d.test),
                    d.arm,
                    f"{d.matmul_saved_ms:+.2f}",
                    f"{d.other_delta_ms:+.2f}",
                    f"{d.idle_delta_ms:+.2f}",
                    fmt_ratio(d.predicted),
                    fmt_ratio(d.measured),
                ]
                for d in deltas
            ),
        )
        md.append("")
    pred_rows = _profile_prediction_rows(profile, deltas, model, comps) if model is not None else []
    if pred_rows:
        md += [
            "From per-op numbers to the run: the census' predicted matmul-time speed-up of the table at each "
            "test's M, carried through the matmul share f that the stock run measured "
            "(1 / (1 - f + f / s)), against the profiled runs and the A/B runs of the same model.",
            "",
        ]
        md += md_table(
            ["test", "stock matmul share f", "predicted matmul s", "predicted run", "profiled runs",
             "A/B table/stock"],
            pred_rows,
        )  # fmt: skip
        md.append("")
    dropped = sum(b.dropped for b in rows)
    if dropped:
        md += [f"CUPTI dropped {dropped} records: those runs' kernel times are incomplete.", ""]
    md += [f"![profile]({figs.add('profile.png', plots.plot_profile(profile))})", ""]
    return md


def _anchor(title: str) -> str:
    """The link target a Markdown renderer (GitHub's rule) gives a heading."""
    slug = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return "#" + slug.replace(" ", "-")


_DETAILS: Final = (
    "Losing cases",
    "End-to-end A/B",
    "Predicted gain per census point",
    "Where a step's time goes (kernel timelines)",
    "Time vs M per shape key",
)


def _ab_cell(c: AbComparison | None) -> list[str]:
    if c is None:
        return ["–", ""]
    return [f"{fmt_ratio(c.ratio.point)} {fmt_ci(c.ratio.lo, c.ratio.hi)}", ab_verdict(c.ratio)]


def _vs_crude_cell(w: analysis.Workload) -> list[str]:
    c = w.vs_crude
    if c is None:
        return ["–", ""]
    word = "ties crude" if w.ties_crude else ab_verdict(c.ratio)
    return [f"{fmt_ratio(c.ratio.point)} {fmt_ci(c.ratio.lo, c.ratio.hi)}", word]


def _ab_label(c: AbComparison) -> str:
    return f"{md_escape(c.model)} {md_escape(c.test)} ub{c.ubatch} {c.arm}/{c.baseline}"


# A 95% CI lies wholly below 1 in about 2.5% of comparisons where nothing differs.
CHANCE_LOSS_RATE = 0.025
CHANCE_NOTE_MIN = 10  # fewer comparisons: the expected count is too small to be worth a line


def chance_note(comps: Sequence[AbComparison]) -> list[str]:
    """How many losses beyond noise chance alone gives among this many comparisons: each verdict is a
    per-comparison 95% CI, so a summary of dozens of them flags about one in forty with no difference."""
    with_ci = [c for c in comps if c.ratio.lo is not None]
    if len(with_ci) < CHANCE_NOTE_MIN:
        return []
    found = sum(c.ratio.below for c in with_ci)
    return [
        f"- Chance: with no true difference, a 95% CI lies wholly below 1 in about 1 comparison of 40, "
        f"so about {CHANCE_LOSS_RATE * len(with_ci):.1f} of these {len(with_ci)} comparisons would show "
        f"a loss ({found} do). A loss that comes back in another call of the same A/B, or over calls "
        f"pooled with `--pool-ab`, is the one to trust."
    ]


def _subset_ratios(comps: Sequence[AbComparison], which: str) -> str:
    """'label ratio [lo, hi]; ...' of each comparison's ``later`` or ``last`` ratio."""
    parts = []
    for c in comps:
        r = getattr(c, which)
        parts.append(f"{_ab_label(c)} {fmt_ratio(r.point)} {fmt_ci(r.lo, r.hi)}")
    return "; ".join(parts)


def _measured(r: Ratio | None) -> TypeGuard[Ratio]:
    return r is not None and r.lo is not None


def repetition_notes(comps: Sequence[AbComparison]) -> list[str]:
    """The A/B's losses that repetition 1 alone carries, and its gains that repetitions 2.. alone
    (AbComparison.later) or the last repetition alone (AbComparison.last) do not show: repetition 1 is the
    first time a test's shapes run at their depth in the process, where one-off costs land."""
    md: list[str] = []
    losses = [c for c in comps if c.ratio.below]
    first_only = [c for c in losses if _measured(c.later) and not c.later.below]
    if first_only:
        if len(first_only) < len(losses):
            which = f"{len(first_only)} of these {len(losses)} losses are"
        else:
            which = "This loss is" if len(losses) == 1 else f"All {len(losses)} of these losses are"
        md.append(
            f"- {which} in repetition 1 alone: over repetitions 2.. the same pairs are not slower beyond "
            f"noise ({_subset_ratios(first_only, 'later')}). Repetition 1 is the first time a test's shapes "
            "run at their depth in the process, where one-off costs land (CUDA loads a kernel at its first "
            "launch)."
        )
    gains = [c for c in comps if c.ratio.above]
    first_gains = [c for c in gains if _measured(c.later) and not c.later.above]
    if first_gains:
        md.append(
            "- Gains beyond noise over the means that repetitions 2.. alone do not show: "
            f"{len(first_gains)} of {len(gains)} ({_subset_ratios(first_gains, 'later')})."
        )
    not_steady = [c for c in gains if c not in first_gains and _measured(c.last) and not c.last.above]
    if not_steady:
        md.append(
            "- Gains beyond noise that the last repetition alone does not show (by then CUDA graphs replay: "
            f"the steady state): {len(not_steady)} of {len(gains)} ({_subset_ratios(not_steady, 'last')}). "
            "Such a gain is a one-off cost of the base arm's early repetitions (a kernel CUDA loads at its "
            "first launch, say, which the table's first-use warm-up had launched already) or a last "
            "repetition too noisy to tell."
        )
    return md


# REPORT.md's title, GPU line and summary fit one screen: a reader sees the key numbers before scrolling.
SUMMARY_MAX_LINES: Final = 40
SUMMARY_MIN_ROWS: Final = 3  # a summary table shows at least this many workloads, whatever its bullets take
ALL_WORKLOADS: Final = "All workloads"


def _workload_row(
    w: analysis.Workload,
    predicted: Mapping[tuple[str, str, int], float],
    cached: bool,
    cached_crude: bool,
    hook: bool,
) -> list[str]:
    return [
        f"{md_escape(w.model)} {md_escape(w.test)} ub{w.ubatch}",
        *_ab_cell(w.table),
        *_vs_crude_cell(w),
        *([*_ab_cell(w.cached), *_ab_cell(w.cached_vs_table)] if cached else []),
        *(_ab_cell(w.cached_vs_crude) if cached_crude else []),
        *([*_ab_cell(w.hook), *_ab_cell(w.table_vs_hook)] if hook else []),
        fmt_ratio(predicted.get((w.model, w.test, w.ubatch))),
    ]


def _workload_comps(w: analysis.Workload) -> list[AbComparison]:
    return [c for c in (w.table, w.vs_crude, w.cached, w.cached_vs_table, w.cached_vs_crude, w.hook) if c]


def key_workloads(works: Sequence[analysis.Workload], n: int) -> list[analysis.Workload]:
    """The ``n`` workloads a summary shows when all of them do not fit: every one with a loss beyond noise
    (worst first), then the gains beyond noise over stock (the cached arm's where there is one), largest
    first, then the largest ratios within noise; listed in the A/B's order."""

    def headline(w: analysis.Workload) -> tuple[bool, float]:
        c = w.cached or w.table
        if c is None or not math.isfinite(c.ratio.point):
            return (False, -math.inf)
        return (c.ratio.above, c.ratio.point)

    def worst(w: analysis.Workload) -> float:
        return min(c.ratio.point for c in _workload_comps(w) if c.ratio.below)

    losing = sorted((w for w in works if any(c.ratio.below for c in _workload_comps(w))), key=worst)
    rest = sorted((w for w in works if w not in losing), key=headline, reverse=True)
    chosen = {id(w) for w in [*losing, *rest][:n]}
    return [w for w in works if id(w) in chosen]


def _section_summary(
    inputs: Inputs,
    tuning: TuningAnalysis,
    model: GainModel | None,
    comps: Sequence[AbComparison],
    ab_predicted: Mapping[int, float],
    lines_before: int,
) -> tuple[list[str], list[str]]:
    """One screen: the end-to-end gain per workload, ties with the crude rule, every loss beyond noise, in
    at most SUMMARY_MAX_LINES lines of the report counting the ``lines_before`` it; and, where the
    workloads do not all fit, the section with all of them (placed right after the summary)."""
    head = ["## Summary", ""]
    bullets: list[str] = []
    works = analysis.workloads(comps)
    predicted = {(comps[i].model, comps[i].test, comps[i].ubatch): s for i, s in ab_predicted.items()}
    header: list[str] = []
    if works:
        head += [
            "End to end: llama-bench t/s of the table over stock and over the crude rule (median of paired "
            "runs, 95% bootstrap CI; `gain` and `LOSS` only where the CI excludes 1, `ties crude` where the "
            "table/crude CI includes 1), and the matmul-time speed-up the census and tuning predict at the "
            "test's M.",
            "",
        ]
        cached = any(w.cached is not None for w in works)
        hook = any(w.hook is not None for w in works)
        notes = {
            "The `cached` arm runs the table with its weight cache (persistent f16 weight copies); the "
            "`table` arm the same measurements decided without it.": cached,
            "The `hook` arm runs a hooked build with the dispatch on and no table compiled in: "
            "hook/stock is what the hook itself costs, table/hook what the rules alone change.": hook,
        }
        for note, present in notes.items():
            head += [note, ""] if present else []
        cached_crude = any(w.cached_vs_crude is not None for w in works)
        cached_cols = ["cached/stock", "", "cached/table", ""] if cached else []
        cached_cols += ["cached/crude", ""] if cached_crude else []
        cached_cols += ["hook/stock", "", "table/hook", ""] if hook else []
        header = ["workload", "table/stock", "", "table/crude", "", *cached_cols, "predicted matmul"]
        with_crude = [w for w in works if w.vs_crude is not None and w.vs_crude.ratio.lo is not None]
        if with_crude:
            ties = sum(w.ties_crude for w in with_crude)
            beats = sum(w.vs_crude is not None and w.vs_crude.ratio.above for w in with_crude)
            bullets.append(
                f"- Against the crude rule: ties at {ties} of {len(with_crude)} workloads, faster beyond "
                f"noise at {beats}, slower beyond noise at {len(with_crude) - ties - beats}."
            )
        losses = [c for c in comps if c.ratio.below]
        if losses:
            bullets.append(
                "- Losses beyond noise (CI upper end < 1): "
                + "; ".join(f"{_ab_label(c)} {fmt_ratio(c.ratio.point)} {fmt_ci(c.ratio.lo, c.ratio.hi)}"
                            for c in losses)
                + "."
            )  # fmt: skip
        else:
            bullets.append("- Losses beyond noise (CI upper end < 1): none end to end.")
        bullets += chance_note(comps)
        bullets += repetition_notes(comps)
    else:
        head += ["No A/B runs (--ab): nothing was measured end to end.", ""]
    if inputs.table is not None:
        rule_losses, _ = analysis.table_losses(tuning.points, inputs.table)
        if rule_losses:
            bullets.append(
                f"- Per op: the table's route is slower than stock beyond noise at {len(rule_losses)} "
                f"measured point{'s' if len(rule_losses) != 1 else ''}: "
                + "; ".join(f"{md_escape(shape_label(p.shape))} M={p.M} {rp.route} {fmt_ratio(rp.ev.ratio)}"
                            for p, rp in rule_losses)
                + "."
            )  # fmt: skip
        else:
            bullets.append("- Per op: no table rule is slower than stock beyond noise at a measured point.")
    gains = model.whole() if model is not None else None
    if gains is not None and gains.table is not None:
        bullets.append(
            f"- Predicted matmul-time speed-up of the table over the whole census: "
            f"{fmt_ratio(gains.table.speedup)}x ({_baseline_words(gains.table)})."
        )
    links = [t for t in _DETAILS if _has_section(t, inputs)]
    if not works:
        return [*head, *bullets, _details_line(links), ""], []
    flags = (any(w.cached is not None for w in works), any(w.cached_vs_crude is not None for w in works))
    hook_col = any(w.hook is not None for w in works)

    def table(ws: Sequence[analysis.Workload]) -> list[str]:
        return md_table(header, (_workload_row(w, predicted, *flags, hook_col) for w in ws))

    # lines besides the table's rows: title and GPU line, head, the table's two header lines and the blank
    # after it, the bullets, the details line (and the shown-of line when rows are left out), the last blank
    fixed = lines_before + len(head) + 3 + len(bullets) + 1 + 1
    if fixed + len(works) <= SUMMARY_MAX_LINES:
        return [*head, *table(works), "", *bullets, _details_line(links), ""], []
    shown = key_workloads(works, max(SUMMARY_MIN_ROWS, SUMMARY_MAX_LINES - fixed - 1))
    bullets.append(
        f"- Shown above: {len(shown)} of {len(works)} workloads (every loss beyond noise, then the largest "
        f"gains); all {len(works)}: [{ALL_WORKLOADS}]({_anchor(ALL_WORKLOADS)})."
    )
    everything = [f"## {ALL_WORKLOADS}", "", *table(works), ""]
    return [*head, *table(shown), "", *bullets, _details_line(links), ""], everything


def _details_line(links: Sequence[str]) -> str:
    return "- Details below: " + ", ".join(f"[{t}]({_anchor(t)})" for t in links) + "."


def _has_section(title: str, inputs: Inputs) -> bool:
    if title == "End-to-end A/B":
        return inputs.ab is not None
    if title == "Predicted gain per census point":
        return inputs.census is not None
    if title.startswith("Where a step's time goes"):
        return inputs.profile is not None
    return True


def _baseline_words(p: predict_mod.Prediction) -> str:
    return (
        f"baseline: measured stock time for {fmt_share(p.measured_share)} of it, census est_us for the rest"
    )


def _section_overview(inputs: Inputs, tuning: TuningAnalysis, model: GainModel | None) -> list[str]:
    points = tuning.points
    total = status_total(inputs.tuning)
    md = ["## Tuning and table", ""]
    md.append(
        f"- tuning: {len({p.shape for p in points})} shape keys, {len(points)} points (shape key, M), "
        f"{len(inputs.tuning)} trial rows: " + ", ".join(f"{k} {total.get(k, 0)}" for k in STATUS_KINDS) + "."
    )
    md.append(
        f"- the decision rule picks a route other than stock at {sum(p.chosen is not None for p in points)} "
        f"of {len(points)} points; a candidate is slower than stock beyond noise at "
        f"{sum(rp.slower for p in points for rp in p.routes)} (point, route) pairs."
    )
    if inputs.table is not None:
        md.append(f"- table: {len(inputs.table.rules)} rules.")
    gains = model.whole() if model is not None else None
    if gains is not None:
        md.append(
            f"- census: {_baseline_words(gains.chosen)}; predicted matmul-time speed-up if every measured "
            f"point took the decision rule's route: {fmt_ratio(gains.chosen.speedup)}x."
        )
        if gains.table is not None:
            md.append(
                f"- predicted matmul-time speed-up with the table: {fmt_ratio(gains.table.speedup)}x "
                f"({len(gains.table.rows)} census rows change route, {gains.table.unpredicted} of them "
                "without timing)."
            )
    md.append(
        "- predictions: the model `ggml-dispatch diff` prints (`codegen.predict`): each census row's stock "
        "time is calls x the median stock time measured at its point where the tuning has the point, else "
        "its est_us; a route changed by the table divides it by the stock/route ratio measured there, "
        "interpolated between measured M, or the type's worst measured shape."
    )
    return [*md, ""]


_LOSS_HEADER: Final = ("shape key", "M", "route", "stock µs", "route µs", "stock/route", "95% CI", "n")


def _loss_row(p: Point, rp: RouteAtPoint) -> list[str]:
    return [
        md_escape(shape_label(p.shape)),
        str(p.M),
        rp.route,
        fmt_us(p.stock.median),
        fmt_us(rp.times.median),
        fmt_ratio(rp.ev.ratio),
        fmt_ci(rp.ev.ci_low, rp.ev.ci_high),
        str(rp.ev.n_paired),
    ]


def _section_losing(inputs: Inputs, points: Sequence[Point], comps: Sequence[AbComparison]) -> list[str]:
    md = ["## Losing cases", ""]
    table = inputs.table
    if table is not None:
        md += ["### Table rules slower than stock beyond noise at a measured point", ""]
        found, missing = analysis.table_losses(points, table)
        losses = [_loss_row(p, rp) for p, rp in found]
        unmeasured = [f"{md_escape(shape_label(p.shape))} M={p.M} ({route})" for p, route in missing]
        md += md_table(_LOSS_HEADER, losses) if losses else ["None."]
        md.append("")
        if unmeasured:
            md += [
                "Measured points where the table's route has no ok trial: " + "; ".join(unmeasured) + ".",
                "",
            ]
    md += ["### Candidates slower than stock beyond noise", ""]
    losing = [_loss_row(p, rp) for p in points for rp in p.routes if rp.slower]
    md += md_table(_LOSS_HEADER, losing) if losing else ["None."]
    md.append("")
    if inputs.ab is not None:
        md += ["### A/B comparisons with the 95% CI below 1", ""]
        below = [c for c in comps if c.ratio.below]
        md += _ab_rows(below) if below else ["None."]
        md.append("")
        soft = [c for c in comps if not c.ratio.below and c.ratio.point < 1.0]
        if soft:
            md += ["A/B comparisons with a median below 1 but within noise (or fewer than 2 pairs):", ""]
            md += [*_ab_rows(soft), ""]
    return md


def _ab_rows(comps: Sequence[AbComparison]) -> list[str]:
    return md_table(
        [
            "model",
            "test",
            "ubatch",
            "comparison",
            "pairs",
            "median ratio",
            "95% CI",
            "unpaired runs",
            "verdict",
        ],
        (
            [
                md_escape(c.model),
                md_escape(c.test),
                str(c.ubatch),
                f"{c.arm}/{c.baseline}",
                str(c.ratio.n),
                fmt_ratio(c.ratio.point),
                fmt_ci(c.ratio.lo, c.ratio.hi),
                str(c.unpaired),
                ab_verdict(c.ratio),
            ]
            for c in comps
        ),
    )


def _ab_predicted(
    comps: Sequence[AbComparison], model: GainModel | None, table: TableView | None
) -> dict[int, float]:
    """For each table/stock comparison (by index): the table's predicted matmul speed-up at its M."""
    out: dict[int, float] = {}
    if table is None or model is None:
        return out
    for i, c in enumerate(comps):
        if (c.arm, c.baseline) == ("table", "stock"):
            gains = model.at(effective_M(c.test, c.ubatch))
            if gains is not None and gains.table is not None:
                out[i] = gains.table.speedup
    return out


def _section_ab(
    records: Sequence[AbRecord],
    comps: Sequence[AbComparison],
    model: GainModel | None,
    ab_predicted: Mapping[int, float],
    figs: _Figures,
) -> list[str]:
    md = ["## End-to-end A/B", ""]
    md += [f"![measured A/B ratios]({figs.add('ab.png', plots.plot_ab(comps, ab_predicted))})", ""]
    vram = ab_arm_vram(records)
    md += md_table(
        ["model", "test", "ubatch", "arm", "runs", "median t/s", "IQR t/s", "peak VRAM MiB"],
        (
            [
                md_escape(m),
                md_escape(t),
                str(u),
                a,
                str(s.n),
                fmt_tps(s.median),
                f"{fmt_tps(s.q1)}–{fmt_tps(s.q3)}",
                f"{vram[(m, t, u, a)]:.0f}" if (m, t, u, a) in vram else "not measured",
            ]
            for m, t, u, a, s in ab_arm_spreads(records)
        ),
    )
    md.append("")
    md += _ab_rows(comps) if comps else ["No arm has a partner (stock or crude) to compare with."]
    md.append("")
    if comps:
        md += ["Paired ratios, pair by pair:", ""]
        md += md_table(
            ["model", "test", "ubatch", "comparison", "pair: ratio"],
            (
                [
                    md_escape(c.model),
                    md_escape(c.test),
                    str(c.ubatch),
                    f"{c.arm}/{c.baseline}",
                    ", ".join(f"{pair_label(p)}: {r:.3f}" for p, r in c.pairs),
                ]
                for c in comps
            ),
        )
        md.append("")
    if model is None:
        return md
    md += [
        "Predicted matmul-time speed-up at each comparison's M (the census rows at that M under the model "
        "above: measured stock time where tuned, else est_us; `baseline measured` is the measured share). "
        "End-to-end time also holds non-matmul work, so a "
        "measured ratio r should fall between 1 and the predicted s. `implied matmul share` is the share f "
        "of end-to-end time in matmuls that would explain r (1/r = 1 - f + f/s); outside 0-100% the "
        "per-op numbers do not explain the end-to-end result.",
        "",
    ]
    rows: list[list[str]] = []
    for i, c in enumerate(comps):
        M = effective_M(c.test, c.ubatch)
        pred = ab_predicted.get(i)
        gains = model.at(M)
        rule = gains.chosen if gains is not None else None
        implied = "–"
        if pred is not None and pred != 1.0:
            implied = fmt_share((1.0 - 1.0 / c.ratio.point) / (1.0 - 1.0 / pred))
        rows.append(
            [
                md_escape(c.model),
                md_escape(c.test),
                str(c.ubatch),
                f"{c.arm}/{c.baseline}",
                "–" if M is None else str(M),
                fmt_ratio(c.ratio.point),
                fmt_ratio(pred),
                "–" if rule is None else fmt_ratio(rule.speedup),
                "–" if rule is None else fmt_share(rule.measured_share),
                implied,
            ]
        )
    header = [
        "model",
        "test",
        "ubatch",
        "comparison",
        "M",
        "measured",
        "predicted (table)",
        "predicted (decision rule)",
        "baseline measured",
        "implied matmul share",
    ]
    return [*md, *md_table(header, rows), ""]


def _section_predictions(model: GainModel, table: TableView | None, figs: _Figures) -> list[str]:
    md = ["## Predicted gain per census point", ""]
    gains = model.points()
    link = figs.add("gain.png", plots.plot_gain(gains, table is not None))
    md += [
        f"![predicted per-op gain]({link})",
        "",
        "Census rows summed per (shape key, M), heaviest first by the model's baseline (`baseline`: "
        "`measured stock` is calls x the median stock time measured at the point, `est_us` the census "
        "estimate where the point was not tuned). `fastest` is the route with the lowest median; "
        "`stock/route` its median paired ratio; `decision` the route the decision rule would use there "
        "(stock unless the fastest passes). Fused groups are never overridden."
        + (
            " `table stock/route` is the model's ratio for the table's route and `basis` where it comes "
            "from (measured at the point, interpolated between measured M, or the type's worst measured "
            "shape)."
            if table is not None
            else ""
        ),
        "",
    ]
    total = sum(g.baseline_us for g in gains) or 1.0
    header = [
        "shape key",
        "M",
        "baseline share",
        "baseline",
        "calls",
        "stock µs (IQR)",
        "fastest",
        "route µs (IQR)",
        "stock/route",
        "95% CI",
        "n trials",
        "decision",
    ]
    if table is not None:
        header += ["table route", "table stock/route", "basis"]
    rows: list[list[str]] = []
    for g in sorted(
        gains, key=lambda x: (-x.baseline_us, shape_sort_key(x.point.shape), x.point.M, x.point.fused)
    ):
        cp, m = g.point, g.measured
        row = [
            md_escape(shape_label(cp.shape)) + (" (fused)" if cp.fused else ""),
            str(cp.M),
            fmt_share(g.baseline_us / total),
            g.baseline,
            str(cp.calls),
        ]
        rp = m.route(m.winner) if m is not None else None
        if cp.fused:
            row += ["–", "fused: not tunable", "–", "–", "n/a", "0", "stock"]
        elif m is None or rp is None or not g.covered:
            row += ["–", "not measured", "–", "–", "n/a", "0", "stock"]
        else:
            row += [
                f"{fmt_us(m.stock.median)} ({fmt_iqr(m.stock)})",
                rp.route,
                f"{fmt_us(rp.times.median)} ({fmt_iqr(rp.times)})",
                fmt_ratio(rp.ev.ratio),
                fmt_ci(rp.ev.ci_low, rp.ev.ci_high),
                str(rp.ev.n_paired),
                m.chosen or "stock",
            ]
        if table is not None:
            if g.table_route is None:
                row += ["stock", "1.000", "–"]
            else:
                row += [g.table_route, "no timing" if g.table is None else fmt_ratio(g.table), g.table_basis]
        rows.append(row)
    return [*md, *md_table(header, rows), ""]


def _census_groups() -> list[tuple[str, str, Callable[[Mapping[str, Any]], str]]]:
    def by_shape(r: Mapping[str, Any]) -> str:
        return shape_label(ShapeKey.of(r)) + (f" fused:{r['fused']}" if r["fused"] else "")

    def by_role(r: Mapping[str, Any]) -> str:
        return str(r["role"]) if r["role"] else "(none)"

    def by_type(r: Mapping[str, Any]) -> str:
        return str(r["src0_type"])

    return [
        ("shape key", "census-shape", by_shape),
        ("tensor role", "census-role", by_role),
        ("quant type (src0)", "census-type", by_type),
    ]


def _section_census(rows: Sequence[Mapping[str, Any]], figs: _Figures) -> list[str]:
    md = [
        "## Census weights",
        "",
        "Shares of the census's estimated matmul time (est_us), not of call counts.",
        "",
    ]
    kinds = Counter(str(r["est_kind"]) for r in rows)
    md += ["Estimates: " + ", ".join(f"{k} {v} rows" for k, v in sorted(kinds.items())) + ".", ""]
    for title, stem, key in _census_groups():
        shares = census_shares(rows, key)
        total = sum(v for _, v in shares) or 1.0
        link = figs.add(f"{stem}.png", plots.plot_census(f"census est_us by {title}", shares))
        md += [f"### By {title}", "", f"![census weights by {title}]({link})", ""]
        md += md_table(
            [title, "est_us", "share"], ([md_escape(k), f"{v:.1f}", fmt_share(v / total)] for k, v in shares)
        )
        md.append("")
    return md


def _status_cells(counts: Mapping[str, int]) -> list[str]:
    return [str(sum(counts.values())), *(str(counts.get(k, 0)) for k in STATUS_KINDS)]


def _section_status(df: pd.DataFrame, points: Sequence[Point]) -> list[str]:
    md = ["## Trial status", "", "Every trial row by status; nothing is left out of the counts.", ""]
    per: dict[tuple[ShapeKey, str], Counter[str]] = defaultdict(Counter)
    for p in points:
        for rp in p.routes:
            per[(p.shape, rp.route)].update(rp.counts)
    rows = [
        [md_escape(shape_label(key)), route, *_status_cells(per[(key, route)])]
        for key, route in sorted(per, key=lambda k: (shape_sort_key(k[0]), route_key(k[1])))
    ]
    rows.append(["**all**", "", *_status_cells(status_total(df))])
    md += [*md_table(["shape key", "route", "trials", *STATUS_KINDS], rows), ""]
    fails = failure_messages(df)
    if fails:
        md += ["Failure messages:", ""]
        md += md_table(
            ["message", "trials", "first seen"], ([md_escape(m), str(c), md_escape(w)] for m, c, w in fails)
        )
        md.append("")
    return md


def _section_shapes(
    points: Sequence[Point],
    table: TableView | None,
    params: decide.Params,
    gpu: str,
    figs: _Figures,
    spec: estimate.GpuSpec,
) -> list[str]:
    md = [
        "## Time vs M per shape key",
        "",
        "Median time per op over the ok trials (plots: IQR error bars, min–max band, log axes). "
        "`stock/route` is the median of the per-trial ratios anchor_us/us with a 95% paired bootstrap CI "
        f"({params.resamples} resamples); `faster`/`slower` only beyond noise (the CI excludes 1). "
        "`decision` marks the route the decision rule picks (the fastest, if it passes); otherwise the "
        "reason it does not pass is given. `× roofline` is the median time over the roofline limit "
        f"max(bytes / {spec.hbm_gbs / 1000:g} TB/s, FLOPs / {spec.tensor_tflops:g} TFLOP/s) of {spec.name} "
        f"({spec.source}): 1 is at the hardware limit; the per-M line `best` gives it for the fastest.",
        "",
    ]
    by_type: dict[tuple[str, str, str, str], list[Point]] = defaultdict(list)
    for p in points:
        by_type[type_key(p.shape)].append(p)
    for tkey in sorted(by_type, key=lambda t: shape_sort_key(ShapeKey(t[0], t[1], t[2], t[3], 0, 0, 0))):
        tpoints = by_type[tkey]
        name = "speedup-" + safe_name("-".join(tkey).lower()) + ".png"
        link = figs.add(name, plots.plot_type_speedups(tkey, tpoints, gpu))
        md += [f"### {tkey[0]} {tkey[1]} {tkey[2]} x {tkey[3]}", "", f"![fastest route vs stock]({link})", ""]
        for key in sorted({p.shape for p in tpoints}, key=shape_sort_key):
            spoints = [p for p in tpoints if p.shape == key]
            rules = table.rules_for(key) if table is not None else []
            link = figs.add(f"time-{shape_slug(key)}.png", plots.plot_shape(key, spoints, rules, gpu))
            md += [f"#### {md_escape(shape_label(key))}", "", f"![time vs M]({link})", ""]
            if table is not None:
                described = "; ".join(
                    f"M {r['M_lo']}–{r['M_hi']} → {r['route']}"
                    + (" (type default)" if is_default_rule(r) else "")
                    for r in rules
                )
                md += [f"Table rules: {described}." if rules else "Table rules: none (stock everywhere).", ""]
            header = [
                "M",
                "route",
                "trials",
                "ok",
                "median µs",
                "IQR µs",
                "min–max µs",
                "stock/route",
                "95% CI",
            ]
            md += [
                *md_table([*header, "verdict", "decision", "× roofline"], _point_rows(spoints, table, spec)),
                "",
            ]
    return md


def fmt_roofline(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _point_rows(points: Sequence[Point], table: TableView | None, spec: estimate.GpuSpec) -> list[list[str]]:
    rows: list[list[str]] = []
    for p in points:
        roof = functools.partial(analysis.roofline_fraction, key=p.shape, M=p.M, spec=spec)
        st = p.stock
        table_route = table.route_at(p.shape, p.M) if table is not None else None
        stock_note = "stock stays" if p.chosen is None else ""
        if table is not None and table_route is None:
            stock_note = (stock_note + "; table: stock").lstrip("; ")
        rows.append(
            [
                str(p.M),
                "stock (anchor)",
                str(p.stock_trials),
                str(p.stock_trials),
                fmt_us(st.median),
                fmt_iqr(st),
                fmt_minmax(st),
                "1",
                "",
                "",
                stock_note,
                fmt_roofline(roof(st.median)),
            ]
        )
        for rp in p.routes:
            notes = []
            if rp.route == p.chosen:
                notes.append("chosen")
            elif rp.route == p.winner:
                notes.append(f"fastest, not chosen: {rp.check.reason}")
            if table_route == rp.route:
                notes.append("table rule")
            rows.append(
                [
                    str(p.M),
                    rp.route,
                    str(rp.trials),
                    str(rp.counts.get("ok", 0)),
                    fmt_us(rp.times.median),
                    fmt_iqr(rp.times),
                    fmt_minmax(rp.times),
                    fmt_ratio(rp.ev.ratio),
                    fmt_ci(rp.ev.ci_low, rp.ev.ci_high),
                    rp.verdict(),
                    md_escape("; ".join(notes)),
                    fmt_roofline(roof(rp.times.median)),
                ]
            )
        name, t = analysis.best_time(p)
        rows.append(
            [
                str(p.M),
                f"best: {md_escape(name)}",
                "",
                "",
                fmt_us(t),
                "",
                "",
                "",
                "",
                "",
                "",
                fmt_roofline(roof(t)),
            ]
        )
    return rows
