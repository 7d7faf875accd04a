"""tune verify: the pure summary on recorded H200 trials (real measurements), the CLI plumbing without a
GPU (--recorded, --dry-run, bad input), and on the CPU backend (slow: builds the harness) a real
measuring run, which times stock only there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from ggml_dispatch import archive, registry
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.codegen import verify

REPO = Path(__file__).resolve().parent.parent
H200_DIR = archive.path("tables/cuda-sm90-nvidia-h200-routes")  # the dense-route sweep and its table
TUNING = H200_DIR / "tuning.parquet"


def _rows(src0: str, N: int, K: int) -> pd.DataFrame:
    df = pd.read_parquet(TUNING)
    return df[(df["src0_type"] == src0) & (df["N"] == N) & (df["K"] == K)]


def _table_with(rules: list[dict[str, Any]]) -> dict[str, Any]:
    base = tbl.load(H200_DIR / "table.json")
    return tbl.validate(tbl.canonicalize({**base, "rules": rules, "refused": []}))


def _rule(lo: int, hi: int, route: str) -> dict[str, Any]:
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": "q4_K",
        "src1_type": "f32",
        "N": 14336,
        "K": 4096,
        "B": 1,
        "M_lo": lo,
        "M_hi": hi,
        "route": route,
    }


def test_summary_of_the_committed_table_on_its_own_trials() -> None:
    df = _rows("q4_K", 14336, 4096)
    s = verify.summarize(df, tbl.load(H200_DIR / "table.json"))
    assert s.table_applies and len(s.points) == 14
    assert not any(p.slower_than_stock for p in s.points)
    assert s.table_over_oracle is not None and s.table_over_oracle < 1.01
    assert s.stock_over_oracle is not None and s.stock_over_oracle > 1.5


def test_summary_flags_a_table_slower_than_stock_and_one_beyond_noise_from_the_best() -> None:
    df = _rows("q4_K", 14336, 4096)
    # mmq at M = 1 (measured 0.61x stock) and stock at M = 4096 where cuBLAS is ~3x faster
    s = verify.summarize(df, _table_with([_rule(1, 1, "mmq")]))
    by_m = {p.M: p for p in s.points}
    assert by_m[1].table_route == "mmq" and by_m[1].slower_than_stock and by_m[1].beyond_noise_from_best
    assert by_m[4096].table_route is None and by_m[4096].best_route == "cublas"
    assert by_m[4096].beyond_noise_from_best and not by_m[4096].slower_than_stock
    assert by_m[8].best_route == "mmq" and by_m[8].beyond_noise_from_best  # stock where mmq is 1.45x
    t = sum(p.table_us or 0 for p in s.points)
    o = sum(p.oracle_us or 0 for p in s.points)
    assert s.table_over_oracle == pytest.approx(t / o)
    md = "\n".join(verify.format_markdown(s, "t.json"))
    assert "SLOWER THAN STOCK" in md and "Slower than stock beyond noise: 1;" in md


def test_summary_on_another_gpu_says_the_table_does_not_apply() -> None:
    df = _rows("q4_K", 14336, 4096).assign(gpu_name="NVIDIA H100 80GB HBM3")
    s = verify.summarize(df, tbl.load(H200_DIR / "table.json"))
    assert not s.table_applies and all(p.table_route is None for p in s.points)
    assert "does not apply here" in "\n".join(verify.format_markdown(s, "t"))


def test_points_from_census_m_list_and_declared_shapes() -> None:
    census = [
        {"op": "MUL_MAT", "layout": "weight", "fused": None, "src0_type": "q4_K", "src1_type": "f32",
         "M": 512, "N": 4096, "K": 4096, "B": 1, "calls": 8},
        {"op": "MUL_MAT", "layout": "weight", "fused": "glu", "src0_type": "q4_K", "src1_type": "f32",
         "M": 1, "N": 14336, "K": 4096, "B": 1, "calls": 8},
    ]  # fmt: skip
    pts = verify.verify_points(census, [], None)
    assert list(pts.values()) == [8.0] and next(iter(pts))[1] == 512
    big = verify.parse_shape("q4_K:28672x8192")
    pts = verify.verify_points(census, [big], verify.parse_m_list("5-7,384"))
    assert sorted((k.N, m) for k, m in pts) == sorted(
        [(4096, m) for m in (5, 6, 7, 384)] + [(28672, m) for m in (5, 6, 7, 384)]
    )


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["tune", "verify", *args])
    return r.exit_code, r.output


def test_cli_recorded_writes_the_summary(tmp_path: Path) -> None:
    md = tmp_path / "v.md"
    code, out = _cli(str(H200_DIR / "table.json"), "--recorded", str(TUNING), "--summary", str(md))
    assert code == 0, out
    assert "174 points; time-weighted table/oracle" in out
    assert md.read_text().startswith("# Verify ")


def test_cli_dry_run_lists_the_cases_without_a_tree() -> None:
    code, out = _cli(
        str(H200_DIR / "table.json"), "--shape", "q6_K:8192x28672", "--m", "1,8,384", "--dry-run"
    )
    assert code == 0, out
    cases = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(c["N"], c["K"], c["M"]) for c in cases] == [(8192, 28672, m) for m in (1, 8, 384)]
    assert set(cases[0]["routes"]) == {r.value for r in registry.OPS[registry.Op.MUL_MAT].routes}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "q4_K:28672", "--m", "8"], "expected TYPE:NxK"),
        (["--shape", "q9_K:8x8", "--m", "8"], "unknown ggml type"),
        (["--shape", "q4_K:8x8", "--m", "0"], "not a positive integer"),
        (["--shape", "q4_K:8x8"], "--shape needs --m"),
        ([], "no points to verify"),
    ],
)
def test_cli_bad_input_is_one_clear_error(args: list[str], message: str) -> None:
    code, out = _cli(str(H200_DIR / "table.json"), *args, "--dry-run")
    assert code == 2 and message in out and "Traceback" not in out


@pytest.mark.slow
def test_verify_measures_on_the_cpu_backend(tree: Path, harness: Path, tmp_path: Path) -> None:
    out = tmp_path / "verify.parquet"
    code, text = _cli(
        str(H200_DIR / "table.json"), "--shape", "q8_0:32x64", "--m", "3,5", "--llama-cpp", str(tree),
        "--harness", str(harness), "--trials", "2", "--l2-bytes", "100000", "-o", str(out),
        "--harness-arg=--trial-ms=2", "--harness-arg=--threads=1", "--harness-arg=--target-graph-us=200",
    )  # fmt: skip
    assert code == 0, text
    df = pd.read_parquet(out)
    assert sorted(set(df["M"])) == [3, 5] and (df["anchor_us"] > 0).all()
    assert set(df["status"]) == {"ineligible"}  # the CPU backend times stock only
    md = out.with_suffix(".md").read_text()
    assert "does not apply here" in md and "2 points" in md
