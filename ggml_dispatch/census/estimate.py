"""Roofline estimate of a matmul node's time on a GPU, used until a measured time exists.

time per call = max(bytes / memory bandwidth, FLOPs / dense tensor peak), where

* bytes = weights (ggml type size) + activations in (src1 type, f32 in practice) + f32 out, plus the
  Q8_1 copy of the activations that mmvq/mmq write and read for quantized weights;
* FLOPs = 2 * M * N * K * B (MUL_MAT_ID: per used expert).

Launch overhead is left out on purpose: it is a property of the route, which the tuner measures.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from ggml_dispatch import schema


@dataclass(frozen=True)
class GpuSpec:
    name: str
    cc: int
    sm_count: int
    hbm_gbs: float  # memory bandwidth, 1e9 bytes/s
    tensor_tflops: float  # dense FP16 tensor-core peak (FP32 accumulate, no sparsity), 1e12 FLOP/s
    source: str  # "datasheet", "datasheet scaled to <n> SMs", or "fallback ..." (a rough cc/SM guess)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cc": self.cc,
            "sm_count": self.sm_count,
            "hbm_gbs": self.hbm_gbs,
            "tensor_tflops": self.tensor_tflops,
            "source": self.source,
        }


# Vendor datasheet figures (dense, no sparsity). Patterns match the lower-cased CUDA device name;
# the first match wins, so more specific names come first.
_DATASHEET: Final[tuple[tuple[str, str, int, int, float, float], ...]] = (
    # pattern, canonical name, cc, SMs, GB/s, TFLOP/s
    (r"\bh200\b.*\bnvl\b", "NVIDIA H200 NVL", 900, 132, 4800, 836),
    (r"\bh200\b", "NVIDIA H200", 900, 132, 4800, 989),
    (r"\bh100\b.*\bnvl\b", "NVIDIA H100 NVL", 900, 132, 3900, 835),
    (r"\bh100\b.*\bpcie\b", "NVIDIA H100 PCIe", 900, 114, 2000, 756),
    (r"\bh100\b", "NVIDIA H100 SXM", 900, 132, 3350, 989),
    (r"\bb200\b", "NVIDIA B200", 1000, 148, 8000, 2250),
    (r"\ba100\b.*\bpcie\b.*\b40\s?gb\b", "NVIDIA A100 PCIe 40GB", 800, 108, 1555, 312),
    (r"\ba100\b.*\bpcie\b", "NVIDIA A100 PCIe 80GB", 800, 108, 1935, 312),
    (r"\ba100\b.*\b40\s?gb\b", "NVIDIA A100 SXM4 40GB", 800, 108, 1555, 312),
    (r"\ba100\b", "NVIDIA A100 SXM4 80GB", 800, 108, 2039, 312),
    (r"\bv100s\b", "Tesla V100S PCIe", 700, 80, 1134, 130),
    (r"\bv100\b.*\bpcie\b", "Tesla V100 PCIe", 700, 80, 900, 112),
    (r"\bv100\b", "Tesla V100 SXM2", 700, 80, 900, 125),
    (r"\brtx 5090\b", "NVIDIA GeForce RTX 5090", 1200, 170, 1792, 209.5),
    (r"\brtx 4090\b", "NVIDIA GeForce RTX 4090", 890, 128, 1008, 165.2),
    (r"\brtx 3090 ti\b", "NVIDIA GeForce RTX 3090 Ti", 860, 84, 1008, 80),
    (r"\brtx 3090\b", "NVIDIA GeForce RTX 3090", 860, 82, 936, 71),
    (r"\bl40s\b", "NVIDIA L40S", 890, 142, 864, 362),
    (r"\bl40\b", "NVIDIA L40", 890, 142, 864, 181),
    (r"\bl4\b", "NVIDIA L4", 890, 58, 300, 121),
    (r"\ba10\b", "NVIDIA A10", 860, 72, 600, 125),
    (r"\bt4\b", "Tesla T4", 750, 40, 320, 65),
)
_DATASHEET_RE: Final = tuple((re.compile(p), n, cc, sm, bw, tf) for p, n, cc, sm, bw, tf in _DATASHEET)

# Fallback for GPUs not in the datasheet table: per-SM dense FP16 tensor FLOP/clock and memory bandwidth
# per SM, by compute capability major.minor, at an assumed 1.5 GHz clock. Rough by construction.
_FALLBACK_CLOCK_GHZ: Final = 1.5
_FALLBACK_PER_SM: Final[dict[int, tuple[int, float]]] = {
    # cc: (FLOP/clock/SM, GB/s per SM)
    700: (1024, 11.0),
    720: (1024, 11.0),
    750: (1024, 8.0),
    800: (2048, 18.9),
    860: (512, 11.4),
    870: (512, 11.4),
    890: (512, 7.9),
    900: (4096, 25.4),
    1000: (8192, 54.0),
    1200: (512, 10.5),
}
_FALLBACK_DEFAULT: Final = (1024, 10.0)


def datasheet_names() -> list[str]:
    return [n for _, n, *_ in _DATASHEET]


def lookup_name(name: str) -> GpuSpec | None:
    """The datasheet entry whose pattern matches ``name`` (a CUDA device name or a short form: "h200")."""
    low = " ".join(name.lower().replace("_", " ").split())
    for pat, canon, cc, sm, bw, tf in _DATASHEET_RE:
        if pat.search(low):
            return GpuSpec(canon, cc, sm, bw, tf, "datasheet")
    return None


def fallback_spec(name: str, cc: int, sm_count: int) -> GpuSpec:
    flop_clk, gbs_sm = _FALLBACK_PER_SM.get(cc, _FALLBACK_DEFAULT)
    sms = max(sm_count, 1)
    return GpuSpec(
        name=name,
        cc=cc,
        sm_count=sm_count,
        hbm_gbs=gbs_sm * sms,
        tensor_tflops=flop_clk * sms * _FALLBACK_CLOCK_GHZ * 1e9 / 1e12,
        source=f"fallback (cc {cc}, {sm_count} SMs, {_FALLBACK_CLOCK_GHZ} GHz assumed): rough",
    )


def spec_for(gpu: schema.GpuId) -> GpuSpec:
    """Datasheet figures for a recorded GPU, scaled when it has fewer SMs (MIG slice, cut-down part);
    a cc/SM fallback when the name is unknown or its cc disagrees with the datasheet."""
    ds = lookup_name(gpu.name)
    if ds is None or ds.cc != gpu.cc or gpu.sm_count <= 0:
        return fallback_spec(gpu.name, gpu.cc, gpu.sm_count)
    if gpu.sm_count == ds.sm_count:
        return GpuSpec(gpu.name, gpu.cc, gpu.sm_count, ds.hbm_gbs, ds.tensor_tflops, f"datasheet ({ds.name})")
    f = gpu.sm_count / ds.sm_count
    return GpuSpec(
        gpu.name,
        gpu.cc,
        gpu.sm_count,
        ds.hbm_gbs * f,
        ds.tensor_tflops * f,
        f"datasheet ({ds.name}) scaled to {gpu.sm_count} of {ds.sm_count} SMs",
    )


_Q8_1 = schema.GGML_TYPES["q8_1"]
_F32_BYTES = 4


@dataclass(frozen=True)
class Work:
    bytes: float
    flops: float


def work_of(
    op: str,
    src0_type: str,
    src1_type: str,
    src0_ne: tuple[int, ...],
    src1_ne: tuple[int, ...],
    n_expert_used: int = 0,
    experts_touched: float | None = None,
) -> Work:
    """Bytes moved and FLOPs of one MUL_MAT / MUL_MAT_ID node.

    ``n_expert_used`` (from the GGUF) fixes MUL_MAT_ID gate/up nodes, whose src1 has one row per token
    (``src1.ne[1] == 1``) though each token uses that many experts. ``experts_touched`` (a traced
    call's mean non-empty experts) replaces the bound min(E, M * used) on the experts whose weights are
    read: only experts that get tokens cost bytes.
    """
    t0 = schema.ggml_type(src0_type)
    t1 = schema.ggml_type(src1_type)
    K = src0_ne[0]
    N = src0_ne[1]
    src1_elems = math.prod(src1_ne)
    q8 = 2 * src1_elems * _Q8_1.bytes_per_element() if t0.quantized else 0.0
    if op == schema.Op.MUL_MAT_ID:
        E = src0_ne[2]
        M = src1_ne[2]
        used = max(src1_ne[1], n_expert_used, 1)
        touched = min(E, M * used) if experts_touched is None else min(float(E), experts_touched)
        w = touched * N * t0.row_bytes(K)
        out = N * used * M * _F32_BYTES
        flops = 2.0 * M * N * K * used
    else:
        w = t0.row_bytes(K) * N * src0_ne[2] * src0_ne[3]
        rows = src1_ne[1] * src1_ne[2] * src1_ne[3]
        out = N * rows * _F32_BYTES
        flops = 2.0 * K * N * rows
    return Work(bytes=float(w + src1_elems * t1.bytes_per_element() + out + q8), flops=flops)


def per_call_us(spec: GpuSpec, work: Work) -> float:
    return max(work.bytes / (spec.hbm_gbs * 1e9), work.flops / (spec.tensor_tflops * 1e12)) * 1e6
