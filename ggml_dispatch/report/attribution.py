"""Where a server's GPU time goes, per phase: the Amdahl table at the top of a report (--attribution).

``lab/serve_ab.py profile`` runs one llama-server per mode (``mtp``: MTP draft 2; ``plain``: no speculation)
under the CUPTI kernel-timeline library and sends, per workload, a prefill request (1 generated token)
and then the generation from the cached prompt, each after an idle gap; ``phases-<mode>.jsonl`` lists
them in order. Here each ``<mode>.ktl`` is cut at idle gaps into segments, the last segments are matched
to the listed phases, and every kernel's GPU time is attributed to an op and route:

- the matmul routes and conversions of :func:`ggml_dispatch.report.timeline.classify` (mmq, mmvq, mmvf,
  mmf, cuBLAS, conversion), FlashAttention;
- the other ggml ops by their kernel's name (``gated_delta_net_cuda`` -> GATED_DELTA_NET, ``ssm_conv_f32``
  -> SSM_CONV, ``rms_norm_f32`` -> RMS_NORM, ...), the name itself where no op is listed;
- copies (memcpy / memset) as ``copy``.

A kernel whose op is not listed is still attributed, to its own name; ``coverage`` is the share of GPU
time attributed to a listed op or route. ``tunable`` is the share a table chooses the kernel of (the
matmul routes, their conversions and FlashAttention): Amdahl's bound on what a table can win in that
phase is 1 / (1 - tunable), reached only if those kernels took no time at all.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch.artifacts import timeline as timeline_artifact
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import timeline as tl

MODES: Final = ("mtp", "plain")
# A graph evaluation's kernels follow each other within microseconds; between evaluations the host samples,
# drafts and builds the next graph (hundreds of microseconds and more).
EVAL_GAP_NS: Final = 50_000
PHASE_GAP_NS: Final = (
    1_000_000_000  # serve_ab profile idles 2 s between phases; kernels of one phase never 1 s
)

# ggml-cuda kernel base names -> the ggml op they implement (the seed model's graph; see the pinned tree's
# ggml/src/ggml-cuda/*.cu). Routes of the matmul ops come from report.timeline.classify.
KERNEL_OPS: Final[Mapping[str, str]] = {
    "gated_delta_net_cuda": "GATED_DELTA_NET",
    "ssm_conv_f32": "SSM_CONV",
    "ssm_conv_long_token_f32": "SSM_CONV",
    "rms_norm_f32": "RMS_NORM",
    "rms_norm_mul_rope_f32": "RMS_NORM+ROPE",
    "l2_norm_f32": "L2_NORM",
    "norm_f32": "NORM",
    "rope_multi": "ROPE",
    "rope_neox": "ROPE",
    "rope_norm": "ROPE",
    "k_bin_bcast": "ADD/MUL",
    "k_bin_bcast_unravel": "ADD/MUL",
    "unary_op_kernel": "UNARY",
    "unary_gated_op_kernel": "GLU",
    "swiglu_clamp_kernel": "GLU",
    "k_get_rows": "GET_ROWS",
    "k_get_rows_float": "GET_ROWS",
    "k_get_rows_float_vec": "GET_ROWS",
    "k_set_rows": "SET_ROWS",
    "k_set_rows_quant": "SET_ROWS (KV quantize)",
    "cpy_scalar": "CPY",
    "cpy_scalar_contiguous": "CPY",
    "cpy_scalar_transpose": "CPY",
    "cpy_f32_q": "CPY",
    "cpy_q_f32": "CPY",
    "soft_max_f32": "SOFT_MAX",
    "argmax_f32": "ARGMAX",
    "scale_f32": "SCALE",
    "fill_kernel": "FILL",
    "cumsum_kernel": "CUMSUM",
    "cumsum_cub_kernel": "CUMSUM",
    "tri_kernel": "TRI",
    "solve_tri_f32_fast": "SOLVE_TRI",
    "pad_f32": "PAD",
    "op_clamp_kernel": "CLAMP",
    "k_argsort_f32_i32": "ARGSORT",
    "top_k_radix_histogram": "TOP_K",
    "top_k_radix_select": "TOP_K",
    "top_k_radix_gather": "TOP_K",
    "top_k_radix_init": "TOP_K",
    "top_k_radix_reset_counters": "TOP_K",
    "reduce_rows_f32": "SUM_ROWS",
    "flash_attn_combine_results": "FLASH_ATTN_EXT",
    "flash_attn_stream_k_fixup_general": "FLASH_ATTN_EXT",
    "flash_attn_stream_k_fixup_uniform": "FLASH_ATTN_EXT",
}
_ROUTE_LABEL: Final = {
    "mmq": "MUL_MAT mmq",
    "mmvq": "MUL_MAT mmvq",
    "mmvf": "MUL_MAT mmvf",
    "mmf": "MUL_MAT mmf",
    "cublas": "MUL_MAT cuBLAS",
    "conversion": "MUL_MAT conversion",
    "attention": "FLASH_ATTN_EXT",
}


TUNABLE: Final = frozenset(_ROUTE_LABEL.values())


def label(kernel: str) -> str:
    """The op (and route, for matmuls) of one kernel; ``?<name>`` for a kernel no op is listed for."""
    category = tl.classify(kernel)
    if category in _ROUTE_LABEL:
        return _ROUTE_LABEL[category]
    base = tl.base_name(kernel)
    if base in KERNEL_OPS:
        return KERNEL_OPS[base]
    return "?" + base


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    kernels: tuple[tuple[int, int, str], ...]
    copies: tuple[tuple[int, int], ...]


COPY: Final = "\0copy"  # the label of a copy among a segment's events


def segments(timeline: timeline_artifact.Timeline, gap_ns: int) -> list[Segment]:
    """The timeline's kernels and copies cut wherever the GPU idles at least ``gap_ns``."""
    events = [(s, e, lab) for s, e, lab in timeline.kernels] + [(s, e, COPY) for s, e in timeline.copies]
    return _split(events, gap_ns)


def _split(events: Sequence[tuple[int, int, str]], gap_ns: int) -> list[Segment]:
    out: list[Segment] = []
    cur: list[tuple[int, int, str]] = []
    end = None
    for ev in sorted(events):
        if end is not None and ev[0] - end >= gap_ns and cur:
            out.append(_segment(cur))
            cur = []
        cur.append(ev)
        end = ev[1] if end is None else max(end, ev[1])
    if cur:
        out.append(_segment(cur))
    return out


def _segment(events: Sequence[tuple[int, int, str]]) -> Segment:
    kernels = tuple(e for e in events if e[2] != COPY)
    copies = tuple((s, e) for s, e, lab in events if lab == COPY)
    return Segment(events[0][0], max(e[1] for e in events), kernels, copies)


def evaluations(seg: Segment, gap_ns: int = EVAL_GAP_NS) -> int:
    """The segment's bursts of GPU work that hold kernels, cut where the GPU idles at least ``gap_ns``: the
    graph evaluations the host launched (a burst of copies alone, a sampled token read back, is none)."""
    events = [*seg.kernels, *((s, e, COPY) for s, e in seg.copies)]
    return sum(1 for burst in _split(events, gap_ns) if burst.kernels)


def attribute(seg: Segment) -> dict[str, float]:
    """GPU milliseconds per op/route label in one segment (kernel durations; overlap counted per kernel)."""
    ms: dict[str, float] = defaultdict(float)
    for s, e, lab in seg.kernels:
        ms[lab] += (e - s) / 1e6
    for s, e in seg.copies:
        ms["copy"] += (e - s) / 1e6
    return dict(ms)


@dataclass(frozen=True)
class Phase:
    mode: str
    phase: str
    depth: int
    slots: int
    gen: int
    committed: int  # tokens the requests output (predicted_n summed)
    acceptance: float | None
    ms: Mapping[str, float]
    wall_ms: float
    evaluations: int = 0  # bursts of kernels with idle gaps of at least EVAL_GAP_NS between them

    @property
    def name(self) -> str:
        if self.phase == "prefill":
            return f"prefill d{self.depth} s{self.slots}" + (" (MTP server)" if self.mode == "mtp" else "")
        what = "MTP decode" if self.mode == "mtp" else "plain decode"
        return f"{what} d{self.depth} s{self.slots}"

    @property
    def total(self) -> float:
        return sum(self.ms.values())

    @property
    def tunable_ms(self) -> float:
        """GPU milliseconds in kernels a table chooses (matmul routes, conversions, FlashAttention)."""
        return sum(v for k, v in self.ms.items() if k in TUNABLE)

    @property
    def tunable(self) -> float:
        """The share of GPU time in kernels a table chooses."""
        return self.tunable_ms / self.total if self.total else 0.0

    @property
    def bound(self) -> float | None:
        """Amdahl's bound on the phase's speed-up from a table: the tunable kernels taking no time."""
        return 1.0 / (1.0 - self.tunable) if self.tunable < 1.0 else None

    @property
    def wall_bound(self) -> float | None:
        """The same bound on the phase's wall time, which is what tokens/s follow: the host's share (the gaps
        between kernels: sampling, drafting, graph upkeep) is out of a table's reach and lowers it further."""
        chosen = self.tunable_ms
        return self.wall_ms / (self.wall_ms - chosen) if self.wall_ms > chosen else None

    def needed(self, target: float) -> float | None:
        """How many times faster the tunable kernels must get for the phase's wall time to gain ``target``
        (everything else unchanged); None where even taking no time they would not reach it."""
        chosen = self.tunable_ms
        save = self.wall_ms * (1.0 - 1.0 / target)
        return chosen / (chosen - save) if chosen > save else None

    @property
    def coverage(self) -> float:
        listed = sum(v for k, v in self.ms.items() if not k.startswith("?"))
        return listed / self.total if self.total else 0.0


def load(path: Path, modes: Sequence[str] | None = None) -> list[Phase]:
    """The phases of a server profile (a folder or archive of ``<mode>.ktl`` + ``phases-<mode>.jsonl``, what
    ``lab/serve_ab.py profile`` writes), mode by mode (default: each mode the profile lists phases of, in
    ``MODES`` order); InputError naming the file on any mismatch."""
    files = tl.profile_files(path)
    if modes is None:
        modes = [m for m in MODES if f"phases-{m}.jsonl" in files]
        if not modes:
            raise InputError(path, f"no phases-<mode>.jsonl, mode {' or '.join(MODES)}: not a server profile")
    return [p for mode in modes for p in _load_mode(files, path, mode)]


def _load_mode(files: Mapping[str, tuple[Path, str]], where: Path, mode: str) -> list[Phase]:
    for name in (f"{mode}.ktl", f"phases-{mode}.jsonl"):
        if name not in files:
            raise InputError(Path(f"{where}:{name}"), "missing (lab/serve_ab.py profile writes it)")
    ktl, ktl_text = files[f"{mode}.ktl"]
    listed, listed_text = files[f"phases-{mode}.jsonl"]
    timeline = timeline_artifact.parse_ktl(ktl_text.splitlines(keepends=True), ktl, label)
    rows = []
    for i, line in enumerate(listed_text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append((row, [int(t["predicted_n"]) for t in row["timings"]], int(row["depth"])))
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(listed, f"not a phase record: {e}", line=i) from None
    segs = segments(timeline, gap_ns=PHASE_GAP_NS)
    if len(segs) < len(rows):
        raise InputError(
            ktl, f"{len(segs)} busy segments, fewer than the {len(rows)} phases of {listed.name}"
        )
    out = []
    for (row, predicted, depth), seg in zip(rows, segs[len(segs) - len(rows) :], strict=True):
        out.append(
            Phase(
                mode, str(row["phase"]), depth, int(row["slots"]), int(row["gen"]), sum(predicted),
                row.get("acceptance"), attribute(seg), (seg.end - seg.start) / 1e6, evaluations(seg),
            )
        )  # fmt: skip
    return out


TARGET: Final = 1.10  # the speed-up the "for 1.10x" column asks of the tunable kernels


def _times(x: float | None) -> str:
    return f"{x:.2f}x" if x is not None else "-"


def markdown(phases: Sequence[Phase], top: int = 14) -> str:
    """The Amdahl table: per phase, each op/route's share of GPU time (largest first), coverage, what a
    table can win at most (GPU time, wall time) and how much faster its kernels must get for 1.10x."""
    lines = [
        "| phase | GPU ms | wall ms | ms/token | coverage | tunable | bound | wall bound "
        f"| for {TARGET:.2f}x | top ops and routes (share of GPU time) |"
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for p in phases:
        ranked = sorted(p.ms.items(), key=lambda kv: -kv[1])
        shares = ", ".join(f"{k} {v / p.total:.1%}" for k, v in ranked[:top] if p.total)
        per_tok = f"{p.total / p.committed:.2f}" if p.phase == "decode" and p.committed else ""
        acc = f" (acceptance {p.acceptance:.2f})" if p.acceptance is not None else ""
        lines.append(
            f"| {p.name}{acc} | {p.total:.1f} | {p.wall_ms:.1f} | {per_tok} | {p.coverage:.1%} "
            f"| {p.tunable:.1%} | {_times(p.bound)} | {_times(p.wall_bound)} | {_times(p.needed(TARGET))} "
            f"| {shares} |"
        )
    lines.append(
        f"\n*tunable*: the share of GPU time in kernels a table chooses (matmul routes, their conversions, "
        f"FlashAttention). *bound*: the phase's speed-up if they took no time, on GPU time; *wall bound*: "
        f"the same on wall time, which holds the host's gaps too. *for {TARGET:.2f}x*: how many times faster "
        f"those kernels must run for the wall time to gain {TARGET:.2f}x (- where it cannot)."
    )
    decode = [p for p in phases if p.phase == "decode" and p.committed]
    if decode:
        lines.append(
            "\n| decode phase | graph evaluations per committed token | GPU idle per committed token (ms) |"
        )
        lines.append("|---|---:|---:|")
        for p in decode:
            idle = max(p.wall_ms - p.total, 0.0) / p.committed
            lines.append(f"| {p.name} | {p.evaluations / p.committed:.2f} | {idle:.2f} |")
        lines.append(
            "\nA graph evaluation is a burst of kernels with less than "
            f"{EVAL_GAP_NS // 1000} us of GPU idle inside; between them the host samples, drafts and builds "
            "the next graph, which no table shortens."
        )
    return "\n".join(lines) + "\n"


def as_json(phases: Iterable[Phase]) -> list[dict[str, Any]]:
    return [
        {
            "mode": p.mode,
            "phase": p.phase,
            "depth": p.depth,
            "slots": p.slots,
            "gen": p.gen,
            "committed": p.committed,
            "acceptance": p.acceptance,
            "gpu_ms": p.total,
            "wall_ms": p.wall_ms,
            "coverage": p.coverage,
            "tunable": p.tunable,
            "evaluations": p.evaluations,
            "bound": p.bound,
            "wall_bound": p.wall_bound,
            "needed_for_1_10": p.needed(TARGET),
            "ms": dict(sorted(p.ms.items(), key=lambda kv: -kv[1])),
        }
        for p in phases
    ]
