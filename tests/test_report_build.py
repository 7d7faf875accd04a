"""``ggml-dispatch report`` end to end on real Parquet files: Markdown numbers, PNGs, determinism.

The tuning rows are synthetic (no GPU here) but written through ``fileio.write_parquet`` with the real
schema; every number the test expects is computed here from the rows, with the ``statistics`` module.
Ratios that are exactly constant across trials have a degenerate bootstrap CI [r, r], which pins the
CI without re-implementing the bootstrap; the one varying A/B CI is checked against the definition.
"""

from __future__ import annotations

import json
import statistics
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result

from ggml_dispatch import fileio, schema
from ggml_dispatch.cli import main

GPU = {"gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-6b1c", "gpu_cc": 900, "gpu_sm_count": 132}
PATCH = "3f2a" * 16
_ARROW = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


def _weight_shape(src0_type: str, N: int, K: int) -> dict[str, Any]:
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": src0_type,
        "src1_type": "f32",
        "N": N,
        "K": K,
        "B": 1,
    }


Q4 = _weight_shape("q4_K", 4096, 4096)
Q6 = _weight_shape("q6_K", 4096, 14336)
Q8 = _weight_shape("q8_0", 576, 576)
TRIALS = range(5)
MMVQ_NOISE = (0.98, 1.02, 1.0, 0.99, 1.01)  # per-trial stock/route ratios straddling 1


def arrow_table(columns: dict[str, str], rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema([(c, _ARROW[t]) for c, t in columns.items()]))


def anchor(shape: dict[str, Any], M: int, trial: int) -> float:
    base = 10.0 + 0.05 * M + (3.0 if shape is Q6 else 0.0)
    return base * (1.0 + 0.01 * (0, 3, 1, 4, 2)[trial])


def trow(
    shape: dict[str, Any], M: int, route: str, trial: int, status: str, ratio: float | None
) -> dict[str, Any]:
    a = anchor(shape, M, trial)
    return {
        **GPU,
        "driver": "580.159.04",
        "cuda_version": "13.0",
        "cublas_version": "13.0.2",
        "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
        "patch_hash": PATCH,
        "harness_version": "1",
        **shape,
        "M": M,
        "route": route,
        "trial": trial,
        "us": a / ratio if ratio is not None else None,
        "replays": 20,
        "weight_copies": 8,
        "anchor_us": a,
        "nmse": 1e-6,
        "route_ran": route,
        "status": status,
        "source": "measured",
    }


def tuning_rows() -> list[dict[str, Any]]:
    rows = []
    for t in TRIALS:
        # q4_K M=1: mmvq within noise, mmq 2x slower, cublas refused
        rows.append(trow(Q4, 1, "mmvq", t, "ok", MMVQ_NOISE[t]))
        rows.append(trow(Q4, 1, "mmq", t, "ok", 0.5))
        rows.append(trow(Q4, 1, "cublas", t, "ineligible", None))
        # q4_K M=8: mmq 1.25x faster (chosen), cublas 3x slower with one failed trial
        rows.append(trow(Q4, 8, "mmvq", t, "ok", 1.0))
        rows.append(trow(Q4, 8, "mmq", t, "ok", 1.25))
        if t == 2:
            rows.append(trow(Q4, 8, "cublas", t, "failed:cudaErrorIllegalAddress", None))
        else:
            rows.append(trow(Q4, 8, "cublas", t, "ok", 1 / 3))
        # q4_K M=512: cublas 2x (chosen), mmq 1.4x with one drifted trial, mmvq wrong everywhere
        rows.append(trow(Q4, 512, "mmvq", t, "wrong", 0.3))
        rows.append(trow(Q4, 512, "mmq", t, "drifted" if t == 0 else "ok", 1.4))
        rows.append(trow(Q4, 512, "cublas", t, "ok", 2.0))
        # q6_K
        rows.append(trow(Q6, 1, "mmvq", t, "ok", 1.0))
        rows.append(trow(Q6, 8, "mmq", t, "ok", 1.1))
        rows.append(trow(Q6, 8, "mmvq", t, "ok", 1.0))
    return rows


def crow(
    shape: dict[str, Any], M: int, role: str, est_us: float, calls: int, fused: str | None = None
) -> dict[str, Any]:
    return {
        "gpu_name": GPU["gpu_name"],
        "gpu_cc": 900,
        "gpu_sm_count": 132,
        **shape,
        "fused": fused,
        "M": M,
        "E": 1,
        "U": 1,
        "src0_contiguous": True,
        "src0_nb_aligned": True,
        "tensor": f"blk.0.{role}.weight",
        "role": role,
        "route": "mmvq",
        "stock_route": "mmvq",
        "reason": "stock",
        "calls": calls,
        "est_us": est_us,
        "est_kind": "roofline",
        "source": "trace",
    }


CENSUS = [
    crow(Q4, 1, "attn_q", 300.0, 100),
    crow(Q4, 512, "attn_q", 500.0, 10),
    crow(Q6, 8, "ffn_down", 150.0, 100),
    crow(Q4, 1, "ffn_gate", 50.0, 100, fused="glu"),
    crow(Q8, 1, "output", 100.0, 100),
]

DECISION = {
    "theta": 0.03,
    "reference_margin": None,
    "min_trials": 3,
    "bootstrap_resamples": 2000,
    "confidence": 0.95,
    "seed": 20261130,
    "min_default_shapes": 2,
}


def rule(shape: dict[str, Any], lo: int, hi: int, route: str) -> dict[str, Any]:
    return {**shape, "M_lo": lo, "M_hi": hi, "route": route}


TABLE = {
    "schema": schema.TABLE_SCHEMA,
    "layout_version": schema.TABLE_LAYOUT_VERSION,
    "gpu": {"name": "NVIDIA H200", "cc": 900, "sm_count": 132},
    "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
    "provenance": {"source": "measured", "decision": DECISION},
    "rules": [rule(Q4, 8, 8, "mmq"), rule(Q4, 512, 512, "cublas"), rule(Q6, 8, 8, "mmq")],
    "refused": [],
}

# A/B: stock t/s per pair; table = 1.2x stock at pp512 and 0.95x at tg128 exactly
STOCK_TPS = (1000.0, 1010.0, 990.0, 1005.0, 995.0)
CRUDE_FACTORS = (1.10, 1.12, 1.08, 1.10, 1.09)


def ab_records() -> list[dict[str, Any]]:
    recs = []
    for p, s in enumerate(STOCK_TPS):
        base = {"model": "llama-8b q4_K_M", "test": "pp512", "ubatch": 512, "pair": p}
        recs.append({**base, "arm": "stock", "tps": s})
        recs.append({**base, "arm": "table", "tps": s * 1.2})
        recs.append({**base, "arm": "crude", "tps": s * CRUDE_FACTORS[p]})
        base = {"model": "llama-8b q4_K_M", "test": "tg128", "ubatch": 512, "pair": p}
        recs.append({**base, "arm": "stock", "tps": s / 10})
        recs.append({**base, "arm": "table", "tps": s / 10 * 0.95, "extra_key": "ignored"})
    # one stock run without partners
    recs.append(
        {"model": "llama-8b q4_K_M", "test": "pp512", "ubatch": 512, "pair": 9, "arm": "stock", "tps": 999.0}
    )
    return recs


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "tuning": tmp_path / "tuning.parquet",
        "census": tmp_path / "census.parquet",
        "table": tmp_path / "table.json",
        "ab": tmp_path / "ab.jsonl",
    }
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, tuning_rows()),
        paths["tuning"],
        fileio.base_metadata(schema.TUNING_SCHEMA, upstream_commit=schema.PINNED_UPSTREAM_COMMIT),
    )
    fileio.write_parquet(
        arrow_table(schema.CENSUS_COLUMNS, CENSUS),
        paths["census"],
        fileio.base_metadata(schema.CENSUS_SCHEMA),
    )
    paths["table"].write_text(json.dumps(TABLE, indent=1))
    paths["ab"].write_text("\n".join(json.dumps(r) for r in ab_records()) + "\n")
    return paths


def run_report(args: list[str]) -> Result:
    return CliRunner().invoke(main, ["report", *args], catch_exceptions=False)


def full_args(p: dict[str, Path], out: Path) -> list[str]:
    return [
        "--tuning", str(p["tuning"]), "--census", str(p["census"]), "--table", str(p["table"]),
        "--ab", str(p["ab"]), "-o", str(out),
    ]  # fmt: skip


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def fus(x: float) -> str:
    return f"{x:.2f}"


def quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def route_times(shape: dict[str, Any], M: int, ratio: float, trials: list[int]) -> list[float]:
    return [anchor(shape, M, t) / ratio for t in trials]


def stock_anchors(rows: list[dict[str, Any]], shape: dict[str, Any], M: int) -> list[float]:
    return [
        r["anchor_us"]
        for r in rows
        if r["status"] == "ok" and r["M"] == M and all(r[k] == v for k, v in shape.items())
    ]


def row_line(M: int, route: str, trials: int, ok: int, times: list[float], ratio: str, ci: str) -> str:
    q1, q3 = quartiles(times)
    return (
        f"| {M} | {route} | {trials} | {ok} | {fus(statistics.median(times))} | {fus(q1)}–{fus(q3)} | "
        f"{fus(min(times))}–{fus(max(times))} | {ratio} | {ci} |"
    )


def test_full_report(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_report(full_args(inputs, out))
    assert result.exit_code == 0, result.output
    md = (out / "REPORT.md").read_text()
    rows = tuning_rows()

    # provenance from the rows and the Parquet metadata; no wall-clock time in the text
    assert f"sha256 `{fileio.sha256_file(inputs['tuning'])}`" in md
    assert f"upstream commit: {schema.PINNED_UPSTREAM_COMMIT}" in md
    assert f"patch hash: {PATCH}" in md
    assert "harness version: 1" in md
    assert "GPU: NVIDIA H200 (cc 900, 132 SMs)." in md
    assert "created" not in md.lower()

    # status counts, nothing hidden
    n_rows = len(rows)
    assert (
        f"{n_rows} trial rows: ok {n_rows - 5 - 5 - 1 - 1}, ineligible 5, wrong 5, drifted 1, "
        "pruned 0, failed 1." in md
    )
    assert "| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 | cublas | 15 | 9 | 5 | 0 | 0 | 0 | 1 |" in md
    assert "| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 | mmvq | 15 | 10 | 0 | 5 | 0 | 0 | 0 |" in md
    assert "| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 | mmq | 15 | 14 | 0 | 0 | 1 | 0 | 0 |" in md
    assert f"| **all** |  | {n_rows} | {n_rows - 12} | 5 | 5 | 1 | 0 | 1 |" in md
    assert "| cudaErrorIllegalAddress | 1 | MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1, M=8, cublas |" in md

    # the roofline column: each row's median over the H200 datasheet limit, and the per-M best
    from ggml_dispatch.report import analysis

    assert "| verdict | decision | × roofline |" in md and "4.8 TB/s" in md and "989 TFLOP/s" in md
    best = [ln for ln in md.splitlines() if ln.startswith("| 8 | best: ")]
    assert best, "no best line at M=8"
    cells = [c.strip() for c in best[0].strip("|").split("|")]
    spec = analysis.gpu_spec("NVIDIA H200", 900, 132)
    k = schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 4096, 1)
    assert float(cells[-1]) == pytest.approx(float(cells[4]) / analysis.roofline_us(k, 8, spec), abs=0.01)

    # per-point rows: medians, IQR, min-max, ratio and CI computed here
    all_t = list(TRIALS)
    assert (
        row_line(8, "mmq", 5, 5, route_times(Q4, 8, 1.25, all_t), "1.250", "[1.250, 1.250]")
        + (" faster | chosen; table rule |")
        in md
    )
    no_fail = [0, 1, 3, 4]
    assert (
        row_line(8, "cublas", 5, 4, route_times(Q4, 8, 1 / 3, no_fail), "0.333", "[0.333, 0.333]")
        + (" slower |  |")
        in md
    )
    assert (
        row_line(512, "cublas", 5, 5, route_times(Q4, 512, 2.0, all_t), "2.000", "[2.000, 2.000]")
        + (" faster | chosen; table rule |")
        in md
    )
    assert (
        row_line(512, "mmq", 5, 4, route_times(Q4, 512, 1.4, [1, 2, 3, 4]), "1.400", "[1.400, 1.400]") in md
    )
    assert "| 512 | mmvq | 5 | 0 | – | – | – | – | n/a | no ok trial |" in md
    mmvq1 = [anchor(Q4, 1, t) / MMVQ_NOISE[t] for t in TRIALS]
    mmvq1_line = row_line(1, "mmvq", 5, 5, mmvq1, f"{statistics.median(MMVQ_NOISE):.3f}", "")
    q4_section = md[
        md.index("#### MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1") : md.index("### MUL_MAT weight q6_K")
    ]
    line = next(x for x in q4_section.splitlines() if x.startswith("| 1 | mmvq |"))
    assert line.startswith(mmvq1_line[: mmvq1_line.rindex("|  |")])
    assert "| within noise | fastest, not chosen: ratio 1.000x below 1.030x (1 + theta) |" in line
    # stock anchor: the median of the anchors of every ok row at the point
    st8 = stock_anchors(rows, Q4, 8)
    q1, q3 = quartiles(st8)
    assert (
        f"| 8 | stock (anchor) | 5 | 5 | {fus(statistics.median(st8))} | {fus(q1)}–{fus(q3)} | "
        f"{fus(min(st8))}–{fus(max(st8))} | 1 |  |  |  |"
    ) in md
    assert "Table rules: M 8–8 → mmq; M 512–512 → cublas." in md

    # losing cases: every candidate slower than stock beyond noise, and the A/B loss
    losing = md[
        md.index("### Candidates slower than stock beyond noise") : md.index("### A/B comparisons with")
    ]
    assert losing.count("\n| MUL_MAT") == 2
    assert (
        f"| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 | 1 | mmq "
        f"| {fus(statistics.median(stock_anchors(rows, Q4, 1)))} "
        f"| {fus(statistics.median(route_times(Q4, 1, 0.5, all_t)))} | 0.500 | [0.500, 0.500] | 5 |"
    ) in losing
    assert (
        "| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 | 8 | cublas |" in losing
        and "| 0.333 | [0.333, 0.333] | 4 |" in losing
    )
    table_losses = md[md.index("### Table rules slower") : md.index("### Candidates slower")]
    assert "None." in table_losses
    ab_losing = md[md.index("### A/B comparisons with the 95% CI below 1") : md.index("## End-to-end A/B")]
    assert (
        "| llama-8b q4_K_M | tg128 | 512 | table/stock | 5 | 0.950 | [0.950, 0.950] | 0 | LOSS |" in ab_losing
    )
    assert "pp512" not in ab_losing

    # A/B medians per arm and paired ratios
    pp_stock = [*STOCK_TPS, 999.0]
    assert f"| llama-8b q4_K_M | pp512 | 512 | stock | 6 | {statistics.median(pp_stock):,.1f} |" in md
    assert f"| llama-8b q4_K_M | pp512 | 512 | table | 5 | {statistics.median(STOCK_TPS) * 1.2:,.1f} |" in md
    assert "| llama-8b q4_K_M | pp512 | 512 | table/stock | 5 | 1.200 | [1.200, 1.200] | 1 | gain |" in md
    crude = [s * f / s for s, f in zip(STOCK_TPS, CRUDE_FACTORS, strict=True)]
    table_crude = [1.2 / f for f in CRUDE_FACTORS]
    lo, hi = bootstrap_median_ci(table_crude, resamples=2000, seed=20261130)
    assert (
        f"| llama-8b q4_K_M | pp512 | 512 | table/crude | 5 | {statistics.median(table_crude):.3f} | "
        f"[{lo:.3f}, {hi:.3f}] | 0 | gain |"
    ) in md
    assert f"| crude/stock | 5 | {statistics.median(crude):.3f} |" in md
    pair_ratios = ", ".join(f"{p}: {f:.3f}" for p, f in enumerate(CRUDE_FACTORS))
    assert f"| llama-8b q4_K_M | pp512 | 512 | crude/stock | {pair_ratios} |" in md

    # predicted gains (the model diff uses): Amdahl over each census row's baseline, which is calls x the
    # point's median stock anchor where the point was tuned and est_us elsewhere; fused rows stay at est_us
    b1 = 100 * statistics.median(stock_anchors(rows, Q4, 1))
    b512 = 10 * statistics.median(stock_anchors(rows, Q4, 512))
    b6 = 100 * statistics.median(stock_anchors(rows, Q6, 8))
    total = b1 + b512 + b6 + 50.0 + 100.0
    speedup = total / (b1 + b512 / 2.0 + b6 / 1.1 + 50.0 + 100.0)
    assert f"predicted matmul-time speed-up with the table: {speedup:.3f}x (2 census rows change route" in md
    measured = (b1 + b512 + b6) / total
    assert f"census: baseline: measured stock time for {100 * measured:.1f}% of it, census est_us" in md
    summary = md[md.index("## Summary") : md.index("## Data provenance")]
    assert f"table over the whole census: {speedup:.3f}x (baseline: measured stock time for" in summary
    # pp512 -> M = 512: only the q4_K M=512 point (cublas 2x); implied matmul share (1-1/1.2)/(1-1/2)
    share = (1 - 1 / 1.2) / (1 - 1 / 2.0)
    assert (
        "| llama-8b q4_K_M | pp512 | 512 | table/stock | 512 | 1.200 | 2.000 | 2.000 | 100.0% | "
        f"{100 * share:.1f}% |" in md
    )
    assert "| llama-8b q4_K_M | tg128 | 512 | table/stock | 1 | 0.950 | 1.000 | 1.000 |" in md
    assert (
        f"| MUL_MAT weight q8_0xf32 N=576 K=576 B=1 | 1 | {100 * 100 / total:.1f}% | est_us | 100 | – "
        "| not measured |" in md
    )
    assert (
        "| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 (fused) | 1 | "
        f"{100 * 50 / total:.1f}% | est_us | 100 | – | fused: not tunable |" in md
    )
    assert (
        f"| MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 | 512 | {100 * b512 / total:.1f}% | measured stock "
        "| 10 |" in md
    )
    assert "| cublas | 2.000 | measured |" in md  # the table's route, its ratio and where it comes from

    # census shares by role and by type
    assert "| attn_q | 800.0 | 72.7% |" in md
    assert "| ffn_down | 150.0 | 13.6% |" in md
    assert "| q4_K | 850.0 | 77.3% |" in md
    assert "| q8_0 | 100.0 | 9.1% |" in md

    # every referenced plot exists and is a real PNG of a real size
    links = [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]
    assert len(links) == len(set(links)) == 2 + 2 + 1 + 1 + 3  # 2 shapes, 2 types, A/B, gain, 3 census
    files = sorted(p.name for p in (out / "plots").iterdir())
    assert sorted(Path(link).name for link in links) == files
    for link in links:
        data = (out / link).read_bytes()
        w, h = png_size(data)
        assert w >= 400 and h >= 200 and len(data) > 10_000, link
    assert "time-mul_mat-weight-q4_k-f32-n4096-k4096-b1.png" in files


def bootstrap_median_ci(xs: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """The definition: percentile bootstrap of the median, pairs drawn with numpy's PCG64(seed)."""
    r = np.asarray(xs)
    idx = np.random.Generator(np.random.PCG64(seed)).integers(0, len(r), size=(resamples, len(r)))
    boots = sorted(float(np.median(r[i])) for i in idx)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(lo), float(hi)


def test_deterministic_and_stale_plots(inputs: dict[str, Path], tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_report(full_args(inputs, a)).exit_code == 0
    assert run_report(full_args(inputs, b)).exit_code == 0
    assert (a / "REPORT.md").read_bytes() == (b / "REPORT.md").read_bytes()
    for png in (a / "plots").iterdir():
        assert png.read_bytes() == (b / "plots" / png.name).read_bytes(), png.name

    # a later report with fewer shapes replaces stale plots and leaves other files alone
    (a / "table.json").write_text("{}")
    only_q6 = [r for r in tuning_rows() if r["src0_type"] == "q6_K"]
    small = tmp_path / "q6.parquet"
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, only_q6), small, fileio.base_metadata(schema.TUNING_SCHEMA)
    )
    result = run_report(["--tuning", str(small), "-o", str(a)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (a / "plots").iterdir()) == [
        "speedup-mul_mat-weight-q6_k-f32.png",
        "time-mul_mat-weight-q6_k-f32-n4096-k14336-b1.png",
    ]
    assert (a / "table.json").read_text() == "{}"
    md = (a / "REPORT.md").read_text()
    assert "## Census weights" not in md and "## End-to-end A/B" not in md and "Table rules" not in md
    # without a table the default decision parameters apply: q6_K M=8 mmq 1.1x passes
    assert "| 8 | mmq | 5 | 5 |" in md and "| 1.100 | [1.100, 1.100] | faster | chosen |" in md
    assert "### Candidates slower than stock beyond noise\n\nNone." in md


def test_notes_and_reference_rows(inputs: dict[str, Path], tmp_path: Path) -> None:
    ref = [
        {**trow(Q4, 8, "mmq", 0, "ok", 1.5), "source": "reference"},
        {**trow(Q4, 8, "mmvq", 0, "ok", 1.0), "source": "reference"},
        {**trow(Q4, 1, "mmq", 0, "ok", 0.5), "source": "reference"},
    ]
    path = tmp_path / "ref.parquet"
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, ref), path, fileio.base_metadata(schema.TUNING_SCHEMA)
    )
    out = tmp_path / "out"
    refused = CliRunner().invoke(main, ["report", "--tuning", str(path), "-o", str(out)])
    assert refused.exit_code == 2
    assert f"{path}: source:" in refused.output and "--reference-margin" in refused.output
    assert not out.exists()

    notes = tmp_path / "notes.md"
    notes.write_text("pp512 gains less than predicted: first-use costs in short runs.\n")
    args = ["--tuning", str(path), "--reference-margin", "0.1", "--notes", str(notes), "-o", str(out)]
    result = run_report(args)
    assert result.exit_code == 0, result.output
    md = (out / "REPORT.md").read_text()
    assert "## Notes\n\npp512 gains less than predicted: first-use costs in short runs.\n" in md
    assert "reference margin 0.1" in md
    assert "| 1.500 | n/a | reference (no CI) | chosen |" in md
    # one sample, ratio 0.5 < 1/(1 + margin): slower beyond the declared margin
    assert "| 1 | mmq | 1 | 1 |" in md and "| 0.500 | n/a | slower |" in md


REFERENCE_TSV = Path(__file__).resolve().parent.parent / "samples" / "reference" / "h200-mul-mat-routes.tsv"
SAMPLE_TRACE = Path(__file__).resolve().parent.parent / "samples" / "trace-reference-shapes.jsonl"


def test_reference_pipeline(tmp_path: Path) -> None:
    """The real reference timings through import-reference, codegen and the report, with the census of
    the committed sample trace: rules are drawn where the table covers them, no table rule loses, and a
    reference sample shows up verbatim."""
    runner = CliRunner()
    tuning, census, table_dir, out = (
        tmp_path / "ref.parquet",
        tmp_path / "census.parquet",
        tmp_path / "table",
        tmp_path / "out",
    )
    steps = [
        ["tune", "import-reference", str(REFERENCE_TSV), "--sm-count", "132", "-o", str(tuning)],
        ["codegen", str(tuning), "--reference-margin", "0.1", "-o", str(table_dir)],
        ["census", "ingest", str(SAMPLE_TRACE), "-o", str(census)],
        [
            "report",
            "--tuning",
            str(tuning),
            "--census",
            str(census),
            "--table",
            str(table_dir / "table.json"),
        ],
    ]
    for args in steps:
        if args[0] == "report":
            args = [*args, "-o", str(out)]
        result = runner.invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
    md = (out / "REPORT.md").read_text()
    assert "reference margin 0.1" in md
    assert "### Table rules slower than stock beyond noise at a measured point\n\nNone." in md

    table = json.loads((table_dir / "table.json").read_text())
    assert table["rules"]
    for r in table["rules"]:
        if r["N"] == 0:
            continue
        label = f"#### MUL_MAT weight {r['src0_type']}x{r['src1_type']} N={r['N']} K={r['K']} B={r['B']}"
        section = md[md.index(label) :]
        section = section[: section.index("\n| M |")]
        assert f"M {r['M_lo']}–{r['M_hi']} → {r['route']}" in section, label

    # test-backend-ops m=1024 n=512 k=4096 is N=1024, M=512, K=4096; stock is mmq above M=8
    samples = {}
    for line in REFERENCE_TSV.read_text().splitlines():
        f = line.split("\t")
        if len(f) == 7 and not line.startswith("#") and f[0] != "type":
            samples[(f[0], int(f[1]), int(f[2]), int(f[3]), f[4])] = float(f[6])
    cublas, mmq = samples[("q4_K", 1024, 512, 4096, "cublas")], samples[("q4_K", 1024, 512, 4096, "mmq")]
    section = md[md.index("#### MUL_MAT weight q4_Kxf32 N=1024 K=4096 B=1") :]
    assert (
        f"| 512 | cublas | 1 | 1 | {cublas:.2f} | {cublas:.2f}–{cublas:.2f} | {cublas:.2f}–{cublas:.2f} | "
        f"{mmq / cublas:.3f} | n/a | reference (no CI) | chosen"
    ) in section
    shapes = {(t, N, K) for t, N, _M, K, _route in samples}
    assert len(list((out / "plots").glob("time-*.png"))) == len(shapes)
