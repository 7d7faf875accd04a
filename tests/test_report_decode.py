"""The report's decode bandwidth section (issue #51): bytes read per node over the measured time against
the GPU's datasheet peak, for stock and for what the table runs, on the committed H200 tuning and table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggml_dispatch import archive, schema
from ggml_dispatch.report import analysis, decode, inputs

H200 = archive.path("tables/cuda-sm90-nvidia-h200-routes")  # the dense-route sweep and its table


@pytest.mark.parametrize(
    ("name", "tbs"),
    [
        ("NVIDIA H200", 4.8),
        ("NVIDIA H200 NVL", 4.8),
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("Tesla V100-SXM2-32GB", 0.9),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_peak_bandwidth_by_gpu_name(name: str, tbs: float | None) -> None:
    got = decode.peak_bandwidth(name)
    assert (got[0] if got else None) == tbs


def test_bytes_are_the_weights_and_the_activations() -> None:
    key = schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 11008, 1)
    # q4_K: 144 bytes per 256 weights; activations f32
    assert decode.decode_bytes(key, 3) == 4096 * 11008 * 144 / 256 + 3 * 11008 * 4
    assert decode.achieved_tbs(key, 3, 10.0) == pytest.approx(decode.decode_bytes(key, 3) / 10e-6 / 1e12)
    assert decode.achieved_tbs(key, 3, None) is None and decode.achieved_tbs(key, 3, 0.0) is None


@pytest.fixture(scope="module")
def h200() -> tuple[analysis.TuningAnalysis, inputs.TableView]:
    table, _ = inputs.load_table(H200 / "table.json")
    params = inputs.params_from_table(table)
    df, _ = inputs.load_tuning(H200 / "tuning.parquet", params)
    return analysis.analyse_tuning(df, params), table


def test_section_on_the_committed_h200_tuning(h200: tuple[analysis.TuningAnalysis, inputs.TableView]) -> None:
    tuning, table = h200
    decode_points = [p for p in tuning.points if decode.is_decode_point(p)]
    assert decode_points, "the committed H200 tuning has decode points"
    md = decode.section(tuning.points, table, tuning.gpu.name)
    assert md[0] == "## Decode bandwidth (M ≤ 8)" and "4.8 TB/s peak" in "\n".join(md)
    rows = [ln for ln in md if ln.startswith("| ") and not ln.startswith("| shape")]
    assert len(rows) == len(decode_points)
    for p, line in zip(sorted(decode_points, key=lambda p: (p.shape, p.M)), rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == f"{p.shape.src0_type} N={p.shape.N} K={p.shape.K}" and int(cells[1]) == p.M
        stock = decode.decode_bytes(p.shape, p.M) / (p.stock.median * 1e-6) / 1e12
        assert float(cells[4]) == pytest.approx(stock, abs=0.006)
        assert cells[5] == f"{100 * stock / 4.8:.0f}%"
        assert cells[6] == (table.route_at(p.shape, p.M) or "stock")


def test_an_unknown_gpu_gets_a_note_instead_of_the_column(
    h200: tuple[analysis.TuningAnalysis, inputs.TableView],
) -> None:
    tuning, table = h200
    md = "\n".join(decode.section(tuning.points, table, "NVIDIA GeForce RTX 4090"))
    assert "No roofline column" in md and "RTX 4090" in md and not re.search(r"\| stock TB/s", md)


def test_without_a_table_the_fastest_candidate_is_shown(
    h200: tuple[analysis.TuningAnalysis, inputs.TableView],
) -> None:
    tuning, _ = h200
    md = decode.section(tuning.points, None, tuning.gpu.name)
    header = next(ln for ln in md if ln.startswith("| shape"))
    assert "| best |" in header and "fastest measured candidate" in md[2]


def test_a_point_below_the_bar_says_whether_its_size_or_its_kernel_stops_it() -> None:
    peak = 4.8
    big = schema.ShapeKey("MUL_MAT", "weight", "q8_0", "f32", 5120, 6144, 1)  # 33.4 MB: 7.0 us at peak
    tiny = schema.ShapeKey("MUL_MAT", "weight", "q8_0", "f32", 5120, 1024, 1)  # 5.6 MB: 1.2 us at peak
    assert decode.why_below(big, 1, 8.0, peak, 2.7) == ""  # 4.2 TB/s: above 70% of 4.8
    assert decode.why_below(big, 1, 15.0, peak, 2.7) == "kernel: 72% attainable"  # 7.0 / (7.0 + 2.7)
    small = decode.why_below(tiny, 1, 4.7, peak, 2.7)
    assert small.startswith("small: at most 30% (1.2 µs at peak + 2.7 µs fixed)")
    assert decode.why_below(big, 1, 15.0, peak, None) == "kernel"


def test_the_section_counts_the_points_below_the_bar(
    h200: tuple[analysis.TuningAnalysis, inputs.TableView],
) -> None:
    tuning, table = h200
    md = decode.section(tuning.points, table, tuning.gpu.name)
    rows = [ln for ln in md if ln.startswith("| ") and not ln.startswith("| shape")]
    whys = [ln.strip("|").split("|")[-1].strip() for ln in rows]
    small = sum(w.startswith("small") for w in whys)
    kernel = sum(w.startswith("kernel") for w in whys)
    # the committed H200 dense sweep: no decode point reaches 70% of 4.8 TB/s
    assert small + kernel == len(rows) and small > 0 and kernel > 0
    fixed = decode.fixed_cost_us([p for p in tuning.points if decode.is_decode_point(p)], 4.8)
    assert fixed is not None and 1.0 < fixed < 10.0
    summary = next(ln for ln in md if "decode points reach" in ln)
    assert summary == (
        f"0 of {len(rows)} decode points reach 70% of peak; below it: kernel {kernel}, small {small}; "
        f"fixed cost {fixed:.1f} µs."
    )


def test_the_fixed_cost_leaves_out_the_transfer_of_a_sweep_of_large_nodes() -> None:
    """The H100 sweep of the seed workload's projections has no small node: its fastest (q6_K 10240 x 5120
    at M = 1, 43 MB, 23.4 µs) spends 12.8 µs moving its bytes at 3.35 TB/s, so the fixed cost is what it
    spends beyond that, not all 23.4 µs (which called every point of the file `small`)."""
    h100 = Path(__file__).resolve().parents[1] / "tables" / "cuda-sm90-nvidia-h100"
    table, _ = inputs.load_table(h100 / "table.json")
    params = inputs.params_from_table(table)
    df, _ = inputs.load_tuning(h100 / "tuning" / "qwen35.parquet", params)
    points = [p for p in analysis.analyse_tuning(df, params).points if decode.is_decode_point(p)]
    times = [t for p in points for t in (p.stock.median, *(r.times.median for r in p.routes))]
    fastest = min(t for t in times if t is not None and t > 0)
    fixed = decode.fixed_cost_us(points, 3.35)
    assert fixed is not None and 20.0 < fastest < 25.0 and 8.0 < fixed < fastest - 10.0
    md = decode.section(points, table, "NVIDIA H100 80GB HBM3")
    verify = next(ln for ln in md if ln.startswith("| q5_K N=17408 K=5120 | 3 |"))
    assert "small: at most 6" in verify  # 18.3 µs at peak against 18.3 + 10.6: headroom above stock's 45%
