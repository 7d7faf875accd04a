"""The report's decode bandwidth section (issue #51): bytes read per node over the measured time against
the GPU's datasheet peak, for stock and for what the table runs, on the committed H200 tuning and table."""

from __future__ import annotations

import re

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
    assert "| best |" in md[4] and "fastest measured candidate" in md[2]
