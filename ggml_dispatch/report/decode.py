"""The report's decode bandwidth section: for MUL_MAT points of the weight layout at M <= 8 (decode and
speculative verify, where the vector kernels run and the weights dominate the bytes moved), the bytes
read per node (the weights, N x K at the weight type's bits per element, and the f32 activations, M x K)
over the measured time, as achieved TB/s and as a fraction of the GPU's peak memory bandwidth, for stock
and for what the table runs there (or, without a table, the fastest measured candidate).

The peak bandwidths are the datasheet figures of a few GPUs, matched on the name the tuning rows carry;
for any other GPU the section says so instead of guessing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ggml_dispatch import registry, schema
from ggml_dispatch.report.analysis import Point
from ggml_dispatch.report.inputs import TableView

DECODE_M_MAX = registry.MMVQ_MAX_COLS
TARGET_FRACTION = 0.70  # of peak bandwidth, where the weights dominate (issue #51's bar)

# Datasheet peak memory bandwidth (TB/s) by GPU model, most specific name first: (words the name holds,
# words it must not hold, TB/s, model).
PEAK_BANDWIDTH: tuple[tuple[tuple[str, ...], tuple[str, ...], float, str], ...] = (
    (("h200",), (), 4.8, "H200"),
    (("h100", "pcie"), (), 2.0, "H100 PCIe"),
    (("h100", "nvl"), (), 3.9, "H100 NVL"),
    (("h100",), ("pcie", "nvl"), 3.35, "H100 SXM"),
    (("v100s",), (), 1.134, "V100S"),
    (("v100",), ("v100s",), 0.9, "V100"),
)


def peak_bandwidth(gpu_name: str) -> tuple[float, str] | None:
    """(TB/s, model) of a GPU by its CUDA device name (e.g. "NVIDIA H100 80GB HBM3" is an H100 SXM); None
    for a GPU the table does not list."""
    name = gpu_name.lower()
    for words, excluded, tbs, model in PEAK_BANDWIDTH:
        if all(w in name for w in words) and not any(x in name for x in excluded):
            return tbs, model
    return None


def decode_bytes(key: schema.ShapeKey, M: int) -> float:
    """Bytes one node reads: its weights at the weight type's size and its M x K activations (f32)."""
    w = registry.GGML_TYPES[key.src0_type]
    a = registry.GGML_TYPES[key.src1_type]
    return key.N * key.K * w.bytes_per_element() + M * key.K * a.bytes_per_element()


def achieved_tbs(key: schema.ShapeKey, M: int, us: float | None) -> float | None:
    if us is None or not math.isfinite(us) or us <= 0:
        return None
    return decode_bytes(key, M) / (us * 1e-6) / 1e12


def is_decode_point(p: Point) -> bool:
    k = p.shape
    return k.op == schema.Op.MUL_MAT.value and k.layout == schema.Layout.WEIGHT.value and p.M <= DECODE_M_MAX


def fixed_cost_us(points: Sequence[Point], peak_tbs: float) -> float | None:
    """The least time any decode node measured here (any candidate, stock included) spent beyond moving
    its bytes at peak bandwidth: launch, the first wave, the tail. Where the fastest node moves almost
    nothing this is its time; where every node measured is large (a sweep of one model's projections),
    its transfer at peak is not counted as a fixed cost."""
    over = [
        t - decode_bytes(p.shape, p.M) / (peak_tbs * 1e12) * 1e6
        for p in points
        for t in (p.stock.median, *(rp.times.median for rp in p.routes))
        if t is not None and math.isfinite(t) and t > 0
    ]
    return max(0.0, min(over)) if over else None


def why_below(key: schema.ShapeKey, M: int, us: float | None, peak_tbs: float, fixed_us: float | None) -> str:
    """Why a node stays under TARGET_FRACTION of peak, from the file's own numbers: ``small`` when even
    the fixed cost plus the bytes at peak bandwidth cannot reach it (the most any kernel could attain at
    that size is given), else ``kernel`` (attainable, not reached). Empty where the node reaches it."""
    got = achieved_tbs(key, M, us)
    if got is None or got >= TARGET_FRACTION * peak_tbs:
        return ""
    at_peak_us = decode_bytes(key, M) / (peak_tbs * 1e12) * 1e6
    if fixed_us is None:
        return "kernel"
    attainable = at_peak_us / (at_peak_us + fixed_us)
    if attainable < TARGET_FRACTION:
        pct = math.floor(100 * attainable)  # never rounded up to the target it misses
        return f"small: at most {pct}% ({at_peak_us:.1f} µs at peak + {fixed_us:.1f} µs fixed)"
    return f"kernel: {math.floor(100 * attainable)}% attainable"


def _fmt_tbs(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _fmt_frac(x: float | None, peak: float) -> str:
    return "n/a" if x is None else f"{100 * x / peak:.0f}%"


def section(points: Sequence[Point], table: TableView | None, gpu_name: str) -> list[str]:
    """The section's Markdown lines (none where no point is a decode point)."""
    from ggml_dispatch.report.markdown import md_escape  # markdown.py renders this section

    decode = sorted((p for p in points if is_decode_point(p)), key=lambda p: (p.shape, p.M))
    if not decode:
        return []
    md = ["## Decode bandwidth (M ≤ 8)", ""]
    peak = peak_bandwidth(gpu_name)
    if peak is None:
        models = ", ".join(m for *_, m in PEAK_BANDWIDTH)
        return [
            *md,
            f"No roofline column: the peak memory bandwidth of {md_escape(gpu_name)} is not in the report's"
            f" table ({models}; ggml_dispatch/report/decode.py).",
            "",
        ]
    tbs, model = peak
    other = "table" if table is not None else "best"
    md += [
        f"Bytes read per node (weights N x K at the weight type's size, plus the M x K f32 activations) over"
        f" the median time, against the {model}'s {tbs:g} TB/s peak (datasheet). `{other}` is "
        + (
            "what the table runs at the point (stock where it has no rule)."
            if table is not None
            else "the fastest measured candidate (no table given)."
        ),
        "",
        f"`below {TARGET_FRACTION:.0%}`: why the faster of the two stays under {TARGET_FRACTION:.0%} of"
        " peak. `small`: the node's bytes at peak bandwidth plus the fixed cost of a node (the least time any"
        " decode node measured here spent beyond its bytes at peak) cannot reach it; `kernel`: they could, so"
        " the kernel's launch configuration or access pattern is what stops it.",
        "",
        f"| shape | M | MB read | stock µs | stock TB/s | stock % peak | {other} | {other} µs | {other} TB/s"
        f" | {other} % peak | below {TARGET_FRACTION:.0%} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fixed = fixed_cost_us(decode, tbs)
    reasons: dict[str, int] = {}
    for p in decode:
        stock_us = p.stock.median
        if table is not None:
            name = table.route_at(p.shape, p.M) or "stock"
            rp = p.route(name)
            us = stock_us if name == "stock" else (rp.times.median if rp is not None else None)
        else:
            name, us = "stock", stock_us
            for rp in p.routes:
                m = rp.times.median
                if m is not None and math.isfinite(m) and (us is None or not math.isfinite(us) or m < us):
                    name, us = rp.route, m
        s = achieved_tbs(p.shape, p.M, stock_us)
        t = achieved_tbs(p.shape, p.M, us)
        label = f"{p.shape.src0_type} N={p.shape.N} K={p.shape.K}"
        best = min((x for x in (stock_us, us) if x is not None and math.isfinite(x)), default=None)
        why = why_below(p.shape, p.M, best, tbs, fixed)
        if why:
            kind = why.split(":")[0]
            reasons[kind] = reasons.get(kind, 0) + 1
        md.append(
            f"| {md_escape(label)} | {p.M} | {decode_bytes(p.shape, p.M) / 1e6:.1f} | {_fmt_us(stock_us)}"
            f" | {_fmt_tbs(s)} | {_fmt_frac(s, tbs)} | {md_escape(name)} | {_fmt_us(us)} | {_fmt_tbs(t)}"
            f" | {_fmt_frac(t, tbs)} | {md_escape(why)} |"
        )
    below = sum(reasons.values())
    why = ", ".join(f"{k} {n}" for k, n in sorted(reasons.items()))
    fixed_words = f"; fixed cost {fixed:.1f} µs" if fixed is not None else ""
    md += [
        "",
        f"{len(decode) - below} of {len(decode)} decode points reach {TARGET_FRACTION:.0%} of peak"
        + (f"; below it: {why}{fixed_words}." if reasons else "."),
        "",
    ]
    return md


def _fmt_us(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2f}"
