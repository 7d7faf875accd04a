"""The report's roofline fraction: the measured time over max(bytes / 4.8 TB/s, FLOPs / 989 TFLOP/s) on
the H200's datasheet figures, with the bytes and FLOPs counted independently here."""

from __future__ import annotations

import math

import pytest

from ggml_dispatch import registry, schema
from ggml_dispatch.report import analysis, markdown

H200 = analysis.gpu_spec("NVIDIA H200", 900, 132)


def key(t: str, N: int, K: int, B: int = 1, layout: str = "weight") -> schema.ShapeKey:
    return schema.ShapeKey("MUL_MAT", layout, t, "f32", N, K, B)


def test_the_h200_datasheet_figures_are_used() -> None:
    assert H200.hbm_gbs == 4800 and H200.tensor_tflops == 989 and "datasheet" in H200.source


def test_memory_bound_decode_point() -> None:
    # q4_K: 144 bytes per 256 weights; M = 1: activations f32 + their Q8_1 copy (36 bytes per 32) + f32 out
    N = K = 4096
    weights = N * (K // 256) * 144
    acts = K * 4 + 2 * K * 36 / 32
    out = N * 4
    limit_us = (weights + acts + out) / 4.8e12 * 1e6
    assert analysis.roofline_us(key("q4_K", N, K), 1, H200) == pytest.approx(limit_us)
    assert analysis.roofline_fraction(2 * limit_us, key("q4_K", N, K), 1, H200) == pytest.approx(2.0)


def test_compute_bound_prefill_point() -> None:
    N, K, M = 14336, 4096, 2048
    flops_us = 2.0 * M * N * K / 989e12 * 1e6
    assert analysis.roofline_us(key("f16", N, K), M, H200) == pytest.approx(flops_us)
    assert analysis.roofline_fraction(flops_us * 1.5, key("f16", N, K), M, H200) == pytest.approx(1.5)


def test_attention_layout_counts_every_head() -> None:
    one = analysis.roofline_us(key("f16", 256, 128, 1, "attention"), 7, H200)
    eight = analysis.roofline_us(key("f16", 256, 128, 8, "attention"), 7, H200)
    assert one is not None and eight == pytest.approx(8 * one)


def test_other_ops_have_no_roofline() -> None:
    k = registry.FlashAttnKey("FLASH_ATTN_EXT", "attention", "f16", "f16", 128, 128, 4, 4096)
    assert analysis.roofline_us(k, 7, H200) is None


@pytest.mark.parametrize("t", [None, math.nan, 0.0, -1.0, math.inf])
def test_no_fraction_without_a_time(t: float | None) -> None:
    assert analysis.roofline_fraction(t, key("q4_K", 4096, 4096), 1, H200) is None


def test_format() -> None:
    assert markdown.fmt_roofline(None) == "n/a" and markdown.fmt_roofline(1.234) == "1.23"
