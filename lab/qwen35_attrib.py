# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""Where the seed workload's GPU time goes: kernel timelines of ``lab.serve_ab profile`` -> the Amdahl table.

``lab.serve_ab profile`` runs one llama-server per mode (``mtp``: MTP draft 2; ``plain``: no speculation)
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
time attributed to a listed op or route. Decode phases are also given per generated (committed) token.

    python3 -m lab.qwen35_attrib out/profile -o out/profile/attribution.md [--json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch.errors import InputError
from ggml_dispatch.report import timeline as tl

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


def segments(timeline: tl.Timeline, gap_ns: int) -> list[Segment]:
    """The timeline's kernels and copies cut wherever the GPU idles at least ``gap_ns``."""
    events = sorted(
        [(s, e, lab) for s, e, lab in timeline.kernels] + [(s, e, "\0copy") for s, e in timeline.copies]
    )
    out: list[Segment] = []
    cur: list[tuple[int, int, str]] = []
    end = None
    for ev in events:
        if end is not None and ev[0] - end >= gap_ns and cur:
            out.append(_segment(cur))
            cur = []
        cur.append(ev)
        end = ev[1] if end is None else max(end, ev[1])
    if cur:
        out.append(_segment(cur))
    return out


def _segment(events: Sequence[tuple[int, int, str]]) -> Segment:
    kernels = tuple(e for e in events if e[2] != "\0copy")
    copies = tuple((s, e) for s, e, lab in events if lab == "\0copy")
    return Segment(events[0][0], max(e[1] for e in events), kernels, copies)


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

    @property
    def name(self) -> str:
        if self.phase == "prefill":
            return f"prefill d{self.depth} s{self.slots}"
        what = "MTP decode" if self.mode == "mtp" else "plain decode"
        return f"{what} d{self.depth} s{self.slots}"

    @property
    def total(self) -> float:
        return sum(self.ms.values())

    @property
    def coverage(self) -> float:
        listed = sum(v for k, v in self.ms.items() if not k.startswith("?"))
        return listed / self.total if self.total else 0.0


def load_mode(folder: Path, mode: str) -> list[Phase]:
    """The phases of ``<mode>.ktl`` with ``phases-<mode>.jsonl`` (InputError on a mismatch)."""
    ktl = folder / f"{mode}.ktl"
    listed = folder / f"phases-{mode}.jsonl"
    for p in (ktl, listed):
        if not p.is_file():
            raise InputError(p, "missing (lab.serve_ab profile writes it)")
    with ktl.open() as f:
        timeline = tl.timeline_artifact.parse_ktl(f, ktl, label)
    rows = [json.loads(line) for line in listed.read_text().splitlines() if line.strip()]
    segs = segments(timeline, gap_ns=1_000_000_000)
    if len(segs) < len(rows):
        raise InputError(
            ktl, f"{len(segs)} busy segments, fewer than the {len(rows)} phases of {listed.name}"
        )
    out = []
    for row, seg in zip(rows, segs[len(segs) - len(rows) :], strict=True):
        timings = row["timings"]
        out.append(
            Phase(
                mode, row["phase"], int(row["depth"]), int(row["slots"]), int(row["gen"]),
                sum(int(t["predicted_n"]) for t in timings), row.get("acceptance"),
                attribute(seg), (seg.end - seg.start) / 1e6,
            )
        )  # fmt: skip
    return out


def markdown(phases: Sequence[Phase], top: int = 14) -> str:
    """The Amdahl table: per phase, each op/route's share of GPU time (largest first), coverage."""
    lines = ["| phase | GPU ms | wall ms | ms/token | coverage | top ops and routes (share of GPU time) |"]
    lines.append("|---|---:|---:|---:|---:|---|")
    for p in phases:
        ranked = sorted(p.ms.items(), key=lambda kv: -kv[1])
        shares = ", ".join(f"{k} {v / p.total:.1%}" for k, v in ranked[:top] if p.total)
        per_tok = f"{p.total / p.committed:.2f}" if p.phase == "decode" and p.committed else ""
        acc = f" (acceptance {p.acceptance:.2f})" if p.acceptance is not None else ""
        lines.append(
            f"| {p.name}{acc} | {p.total:.1f} | {p.wall_ms:.1f} | {per_tok} | {p.coverage:.1%} | {shares} |"
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
            "ms": dict(sorted(p.ms.items(), key=lambda kv: -kv[1])),
        }
        for p in phases
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m lab.qwen35_attrib", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("folder", type=Path, help="lab.serve_ab profile's output folder")
    ap.add_argument("--modes", default="mtp,plain")
    ap.add_argument("-o", "--out", type=Path, help="Markdown to write (default: stdout)")
    ap.add_argument("--json", type=Path, help="the same as JSON")
    args = ap.parse_args(argv)
    try:
        phases = [p for m in args.modes.split(",") for p in load_mode(args.folder, m)]
    except InputError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    text = markdown(phases)
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    if args.json:
        args.json.write_text(json.dumps(as_json(phases), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
