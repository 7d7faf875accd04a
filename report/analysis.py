"""How far a measured time is from the hardware: the roofline limit of a MUL_MAT point.

The limit is ``max(bytes / memory bandwidth, FLOPs / dense tensor peak)`` with the GPU's datasheet
figures (``census.estimate``: NVIDIA H200 4.8 TB/s and 989 dense FP16 TFLOP/s) and the bytes and FLOPs
the census' estimate counts for the node (weights in their stored type, activations, the f32 output and,
for quantized weights, the Q8_1 copy of the activations). A fraction of 1.0 is a kernel at the limit;
2.0 takes twice as long as the limit allows.
"""

from __future__ import annotations

import math

from census import estimate
from ggml_dispatch import schema


def roofline_us(key: schema.ShapeKey, M: int, spec: estimate.GpuSpec) -> float:
    """The roofline limit of one MUL_MAT node of this shape at M tokens, in microseconds."""
    if key.layout == schema.Layout.ATTENTION.value:
        src0_ne, src1_ne = (key.K, key.N, key.B, 1), (key.K, M, key.B, 1)
    else:
        src0_ne, src1_ne = (key.K, key.N, 1, 1), (key.K, M, key.B, 1)
    work = estimate.work_of(key.op, key.src0_type, key.src1_type, src0_ne, src1_ne)
    return estimate.per_call_us(spec, work)


def roofline_fraction(
    best_us: float | None, key: schema.ShapeKey, M: int, spec: estimate.GpuSpec
) -> float | None:
    """The measured time as a fraction of the roofline limit (>= 1 unless the model undercounts); None
    without a finite positive time."""
    if best_us is None or not math.isfinite(best_us) or best_us <= 0:
        return None
    limit = roofline_us(key, M, spec)
    return best_us / limit if limit > 0 else None


def gpu_spec(name: str, cc: int, sm_count: int) -> estimate.GpuSpec:
    """The datasheet spec of the GPU the rows were measured on (the labelled fallback for others)."""
    return estimate.spec_for(schema.GpuId(name, int(cc), int(sm_count)))
