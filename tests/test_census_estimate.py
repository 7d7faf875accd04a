"""Roofline estimate: GPU spec lookup and bytes/FLOPs of a node, checked against hand arithmetic."""

from __future__ import annotations

import pytest

from ggml_dispatch import schema
from ggml_dispatch.census import estimate


@pytest.mark.parametrize(
    ("device_name", "canonical", "gbs", "tflops"),
    [
        ("NVIDIA H200", "NVIDIA H200", 4800, 989),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL", 4800, 836),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 3350, 989),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 2000, 756),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB", 2039, 312),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM4 40GB", 1555, 312),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB", 1555, 312),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB", 1935, 312),
        ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2", 900, 125),
        ("Tesla V100-PCIE-16GB", "Tesla V100 PCIe", 900, 112),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 1008, 165.2),
        ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090", 936, 71),
        ("NVIDIA L40S", "NVIDIA L40S", 864, 362),
        ("NVIDIA L40", "NVIDIA L40", 864, 181),
        ("NVIDIA L4", "NVIDIA L4", 300, 121),
        ("NVIDIA A10", "NVIDIA A10", 600, 125),
        ("h200", "NVIDIA H200", 4800, 989),
    ],
)
def test_datasheet_lookup(device_name: str, canonical: str, gbs: float, tflops: float) -> None:
    s = estimate.lookup_name(device_name)
    assert s is not None and (s.name, s.hbm_gbs, s.tensor_tflops) == (canonical, gbs, tflops)


def test_unknown_gpu_gets_a_labelled_fallback() -> None:
    s = estimate.spec_for(schema.GpuId("NVIDIA GH300 Experimental", 1000, 160))
    assert s.source.startswith("fallback") and "rough" in s.source
    assert s.hbm_gbs == pytest.approx(54.0 * 160)
    assert s.tensor_tflops == pytest.approx(8192 * 160 * 1.5e9 / 1e12)
    # a known name whose cc disagrees is not trusted either (a renamed or misreported device)
    assert estimate.spec_for(schema.GpuId("NVIDIA H200", 800, 132)).source.startswith("fallback")
    assert estimate.lookup_name("Radeon RX 7900 XTX") is None


def test_recorded_gpu_uses_datasheet_and_scales_with_fewer_sms() -> None:
    full = estimate.spec_for(schema.GpuId("NVIDIA H200", 900, 132))
    assert (full.hbm_gbs, full.tensor_tflops) == (4800, 989) and full.source == "datasheet (NVIDIA H200)"
    mig = estimate.spec_for(schema.GpuId("NVIDIA H200 MIG 3g.71gb", 900, 60))
    assert mig.hbm_gbs == pytest.approx(4800 * 60 / 132) and "scaled to 60 of 132 SMs" in mig.source


def test_decode_weight_matmul_is_bandwidth_bound() -> None:
    # SmolLM2 attn_q: q4_1 [576, 576] at M = 1
    w = estimate.work_of("MUL_MAT", "q4_1", "f32", (576, 576, 1, 1), (576, 1, 1, 1))
    weights = 576 // 32 * 20 * 576  # 18 blocks of 20 bytes per row
    acts = 576 * 4 + 576 * 4  # f32 in, f32 out
    q8_1 = 2 * 576 // 32 * 36  # Q8_1 copy written and read
    assert w.bytes == weights + acts + q8_1
    assert w.flops == 2 * 576 * 576
    h200 = estimate.spec_for(schema.GpuId("NVIDIA H200", 900, 132))
    assert estimate.per_call_us(h200, w) == pytest.approx(w.bytes / 4800e9 * 1e6)


def test_prefill_matmul_can_be_compute_bound() -> None:
    # f16 [4096, 4096] at M = 4096: 137 GFLOP, 100 MB
    w = estimate.work_of("MUL_MAT", "f16", "f32", (4096, 4096, 1, 1), (4096, 4096, 1, 1))
    assert w.bytes == 4096 * 4096 * 2 + 4096 * 4096 * 4 * 2  # no Q8_1 copy for f16
    h200 = estimate.spec_for(schema.GpuId("NVIDIA H200", 900, 132))
    assert estimate.per_call_us(h200, w) == pytest.approx(2 * 4096**3 / 989e12 * 1e6)


def test_attention_broadcast_counts_heads() -> None:
    # KQ: K view [64, n_kv=512, 3 kv heads], q [64, M=512, 9 heads]
    w = estimate.work_of("MUL_MAT", "f16", "f32", (64, 512, 3, 1), (64, 512, 9, 1))
    assert w.flops == 2 * 64 * 512 * 512 * 9
    assert w.bytes == 64 * 512 * 3 * 2 + 64 * 512 * 9 * 4 + 512 * 512 * 9 * 4


def test_mul_mat_id_counts_used_experts() -> None:
    # up_exps [K=2048, N=768, E=128], src1 [2048, 1, M=4], 8 experts used per token
    w = estimate.work_of("MUL_MAT_ID", "q8_0", "f32", (2048, 768, 128, 1), (2048, 1, 4, 1), n_expert_used=8)
    assert w.flops == 2 * 2048 * 768 * 8 * 4
    touched = min(128, 4 * 8)
    row = 2048 // 32 * 34
    assert w.bytes == touched * 768 * row + 2048 * 4 * 4 + 768 * 8 * 4 * 4 + 2 * 2048 * 4 // 32 * 36
    # without the GGUF's expert count, src1.ne[1] is all there is
    assert (
        estimate.work_of("MUL_MAT_ID", "q8_0", "f32", (2048, 768, 128, 1), (2048, 1, 4, 1)).flops
        == 2 * 2048 * 768 * 4
    )
