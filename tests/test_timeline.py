"""Kernel timelines (report.timeline) and the report's profile section.

The profile is the real one under tables/: CUPTI timelines of llama-bench on the H200 (llama at
Llama-3-8B dimensions, 16 layers, Q4_K_M), one process per arm (stock, table, crude) and test.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggml_dispatch import archive
from ggml_dispatch.cli import main
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import timeline

REPO = Path(__file__).resolve().parent.parent
# the dense-route sweep, its census, table and A/Bs
TABLE_DIR = archive.path("tables/cuda-sm90-nvidia-h200-routes")
PROFILE = REPO / "tables" / "cuda-sm90-nvidia-h200" / "profile.tar.xz"


@pytest.fixture(scope="module")
def profile() -> timeline.Profile:
    return timeline.load_profile(PROFILE)


def _members(names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    with tarfile.open(PROFILE) as tar:
        for m in tar.getmembers():
            name = m.name.removeprefix("./")
            if name in names:
                fh = tar.extractfile(m)
                assert fh is not None
                out[name] = fh.read().decode()
    return out


@pytest.mark.parametrize(
    ("kernel", "category"),
    [
        ("_Z9mul_mat_qIL9ggml_type12ELi128ELb0EEvPKcPKiS4_S4_PfS5_iiiiiiiiiiiiiiiii", "mmq"),
        ("_Z24mul_mat_q_stream_k_fixupIL9ggml_type12ELi64ELb0EEvPKiS2_PfPKfiiimimimi", "mmq"),
        ("_Z17quantize_mmq_q8_1IL11mmq_q8_1_ds_layout1EEvPKfPKiPvllll5uint3ii", "mmq"),
        ("_Z13mul_mat_vec_qIL9ggml_type12ELi1ELb1ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args", "mmvq"),
        ("_Z13quantize_q8_1PKfPvlllllj5uint3", "mmvq"),
        ("sm90_xmma_gemm_f16f16_f16f16_f16_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
         "execute_segment_k_off_kernel__5x_cublas", "cublas"),
        ("_Z21dequantize_block_q4_KI6__halfEvPKvPT_", "conversion"),
        ("_Z23convert_unary_cont_vec4If6__halfEvPKvPT0_l", "conversion"),
        ("_Z18flash_attn_ext_f16ILi128ELi128ELi16ELi4ELb0ELb0ELb0EEvPKcS1_S1_S1_S1_PKiPf", "attention"),
        ("_Z12rms_norm_f32ILi1024ELb1ELb0ELb0EEvPKfPfilllfS1_lll5uint3S3_S3_S3_S1_lllS3_S3_S3_S3_f", "other"),
        ("_Z9rope_normILb1ELb0EffEvPKT1_PT2_iiiiiiiiiiiPKifff14rope_corr_dimsfPKfPKlib", "other"),
    ],
)  # fmt: skip
def test_classify_real_kernel_names(kernel: str, category: str) -> None:
    assert timeline.classify(kernel) == category


def test_every_kernel_name_in_the_profile_is_classified_as_expected() -> None:
    """No ggml matmul kernel of the real runs falls into `other`."""
    names = set()
    for text in _members(("stock.512.ktl", "table.512.ktl", "stock.tg128.ktl")).values():
        names |= {line.split(" ", 2)[2] for line in text.splitlines() if line.startswith("N ")}
    others = {timeline.base_name(n) for n in names if timeline.classify(n) == "other"}
    assert others and not {o for o in others if "mul_mat" in o or "gemm" in o or "dequantize" in o}


def test_real_profile(profile: timeline.Profile) -> None:
    by = {(b.arm, b.test): b for b in profile.rows}
    assert set(by) == {
        (a, t) for a in ("stock", "table", "crude") for t in ("128", "256", "512", "2048", "tg128")
    }
    assert profile.note == "model llama8b-L16 reps 3"
    for b in profile.rows:
        assert b.dropped == 0
        assert 0 < b.busy_ms <= b.wall_ms
        assert b.bench.reps == 3
    # stock runs mmq on every prompt-size matmul; the table and the crude rule send M = 512 to cuBLAS
    assert by[("stock", "512")].ms["cublas"] == 0 and by[("stock", "512")].ms["mmq"] > 50
    for arm in ("table", "crude"):
        b = by[(arm, "512")]
        assert b.ms["mmq"] == 0 and b.ms["cublas"] > 10 and b.ms["conversion"] > 10
    # decode is mmvq in every arm, with kernels on parallel streams overlapping
    assert all(
        by[(a, "tg128")].ms["mmvq"] > 100 and by[(a, "tg128")].overlap_ms > 1 for a in ("stock", "table")
    )


def test_deltas_against_stock(profile: timeline.Profile) -> None:
    d = {(x.arm, x.test): x for x in timeline.arm_deltas(profile.rows)}
    assert ("stock", "512") not in d
    # below M = 384 the crude rule routes as stock: no matmul time saved
    assert abs(d[("crude", "128")].matmul_saved_ms) < 0.01 * 100
    assert abs(d[("crude", "128")].predicted - 1.0) < 0.005
    # the table saves matmul time at ubatch 256 and 512, and the runs got faster
    for test in ("256", "512"):
        x = d[("table", test)]
        assert x.matmul_saved_ms > 5 and x.predicted > 1.05 and x.measured > 1.03
        assert x.predicted == pytest.approx(
            {b.test: b for b in profile.rows if b.arm == "stock"}[test].wall_ms
            / ({b.test: b for b in profile.rows if b.arm == "stock"}[test].wall_ms - x.matmul_saved_ms)
        )


def test_runs_in_timeline() -> None:
    pp = timeline.BenchRun(n_prompt=2048, n_gen=0, n_ubatch=512, reps=3, avg_ns=1.0)
    tg = timeline.BenchRun(n_prompt=0, n_gen=128, n_ubatch=512, reps=3, avg_ns=1.0)
    assert timeline.runs_in_timeline(pp) == 4.0
    assert timeline.runs_in_timeline(tg) == 3.0 + 1.0 / 128


def test_busy_is_the_union_of_overlapping_intervals() -> None:
    text = "\n".join(
        [
            timeline.FORMAT,
            "N 0 _Z13mul_mat_vec_qIL9ggml_type12EEvPKv",
            "N 1 _Z12rms_norm_f32PKf",
            "K 1000 3000 7 0 0",
            "K 2000 4000 8 0 0",  # overlaps the first by 1000 ns
            "K 5000 6000 7 0 1",
            "C 5500 5600 7 64 1",  # a copy inside a kernel: busy unchanged
            "C 10 20 7 99999 1",  # before the first kernel: the model upload, not counted
            "D 0",
        ]
    )
    tl = timeline.parse_ktl(text.splitlines(), Path("x.ktl"))
    bench = timeline.BenchRun(n_prompt=8, n_gen=0, n_ubatch=8, reps=1, avg_ns=10_000.0)
    b = timeline.breakdown("stock", "8", tl, bench)
    assert b.ms["mmvq"] == pytest.approx(4000 / 2 / 1e6)
    assert b.ms["other"] == pytest.approx(1000 / 2 / 1e6)
    assert b.ms["copy"] == pytest.approx(100 / 2 / 1e6)
    assert b.busy_ms == pytest.approx(4000 / 2 / 1e6)
    assert b.overlap_ms == pytest.approx(1100 / 2 / 1e6)
    assert b.idle_ms == pytest.approx((10_000 - 2000) / 1e6)


@pytest.mark.parametrize(
    ("lines", "message", "line"),
    [
        (["# something else"], "not a kernel timeline", 1),
        ([timeline.FORMAT, "N 0 k", "K 1 2 0 0 0"], "truncated: no closing D line", 3),
        ([timeline.FORMAT, "K 1 2 0 0 5", "D 0"], "malformed K record", 2),
        ([timeline.FORMAT, "K 1 2 0", "D 0"], "malformed K record", 2),
        ([timeline.FORMAT, "X 1", "D 0"], "unknown record kind 'X'", 2),
        ([timeline.FORMAT, "D 0", "N 0 k"], "records after the closing D line", 3),
    ],
)
def test_bad_timeline(lines: list[str], message: str, line: int) -> None:
    with pytest.raises(InputError) as e:
        timeline.parse_ktl(lines, Path("p/run.ktl"))
    assert message in e.value.render() and f"run.ktl:{line}" in e.value.render()


def _archive(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_profile_needs_both_files_per_timeline(tmp_path: Path) -> None:
    got = _members(("stock.512.ktl", "stock.512.jsonl"))
    bad = _archive(tmp_path / "p.tar.gz", {"stock.512.ktl": got["stock.512.ktl"]})
    with pytest.raises(InputError, match=r"stock\.512\.jsonl is missing"):
        timeline.load_profile(bad)
    two = got["stock.512.jsonl"].strip() + "\n" + got["stock.512.jsonl"]
    bad = _archive(tmp_path / "q.tar.gz", {"stock.512.ktl": got["stock.512.ktl"], "stock.512.jsonl": two})
    with pytest.raises(InputError, match="expected one llama-bench test per profiled process, found 2"):
        timeline.load_profile(bad)
    with pytest.raises(InputError, match="no such profile"):
        timeline.load_profile(tmp_path / "missing")
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(InputError, match="not a profile archive"):
        timeline.load_profile(tmp_path / "junk.tar.gz")


def test_profile_folder_and_archive_agree(tmp_path: Path) -> None:
    got = _members(("table.256.ktl", "table.256.jsonl", "stock.256.ktl", "stock.256.jsonl"))
    folder = tmp_path / "prof"
    folder.mkdir()
    for name, text in got.items():
        (folder / name).write_text(text)
    a = timeline.load_profile(folder)
    b = timeline.load_profile(_archive(tmp_path / "p.tar.gz", got))
    assert a.rows == b.rows and len(a.rows) == 2


def test_report_profile_section(tmp_path: Path) -> None:
    out = tmp_path / "r"
    args = [
        "report",
        "--tuning",
        str(TABLE_DIR / "tuning.parquet"),
        "--profile",
        str(PROFILE),
        "-o",
        str(out),
    ]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    md = (out / "REPORT.md").read_text()
    section = md.split("## Where a step's time goes (kernel timelines)", 1)[1].split("\n## ", 1)[0]
    assert "| pp2048 ub512 | table |" in section and "| tg128 | crude |" in section
    assert "(model llama8b-L16 reps 3)" in section
    assert (out / "plots" / "profile.png").read_bytes()[:4] == b"\x89PNG"
    assert "- **profile** `profile.tar.xz` (sha256 `" in md.split("## Data provenance")[1].split("\n## ")[0]


def test_report_refuses_a_bad_profile(tmp_path: Path) -> None:
    bad = tmp_path / "prof"
    bad.mkdir()
    (bad / "stock.512.ktl").write_text(timeline.FORMAT + "\nK 1 2 0 0 0\n")
    (bad / "stock.512.jsonl").write_text(json.dumps({"n_prompt": 2048}) + "\n")
    out = tmp_path / "r"
    args = ["report", "--tuning", str(TABLE_DIR / "tuning.parquet"), "--profile", str(bad), "-o", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "stock.512.ktl:2" in res.output and "malformed K record" in res.output
    assert not out.exists()


def test_report_carries_per_op_predictions_through_the_measured_share(tmp_path: Path) -> None:
    out = tmp_path / "r"
    args = ["report", "--tuning", str(TABLE_DIR / "tuning.parquet"),
            "--census", str(TABLE_DIR / "census.parquet"), "--table", str(TABLE_DIR / "table.json"),
            "--ab", str(TABLE_DIR / "ab-run1.jsonl"), "--profile", str(PROFILE), "-o", str(out)]  # fmt: skip
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    md = (out / "REPORT.md").read_text()
    block = md.split("From per-op numbers to the run", 1)[1].split("![profile]", 1)[0]
    rows = {
        r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
        for r in block.splitlines()
        if r.startswith(("| pp", "| tg"))
    }
    assert set(rows) == {"pp2048 ub128", "pp2048 ub256", "pp2048 ub512", "pp2048 ub2048", "tg128"}
    # the A/B column is the one-file run on the profiled model (llama8b-L16), never the 4-layer one
    share, s, run, _profiled, ab = rows["pp2048 ub512"]
    f, s_ = float(share.rstrip("%")) / 100, float(s)
    assert float(run) == pytest.approx(1 / (1 - f + f / s_), abs=2e-3)
    assert s_ > 1.3 and ab.startswith("1.366 [")
    assert rows["tg128"][1] == "1.000" and rows["tg128"][2] == "1.000"


def test_depth_tests_are_profiled_under_their_a_b_names(tmp_path: Path) -> None:
    # real timelines (tg128 of stock and table) filed as lab/attn.sh's profile names them
    got = _members(("stock.tg128.ktl", "stock.tg128.jsonl", "table.tg128.ktl", "table.tg128.jsonl"))
    files = {
        f"{arm}.{test}.{ext}": got[f"{arm}.tg128.{ext}"]
        for arm in ("stock", "table")
        for test in ("tg32@d16384-kvq8_0", "pp2@d49152")
        for ext in ("ktl", "jsonl")
    }
    prof = timeline.load_profile(_archive(tmp_path / "p.tar.gz", files))
    assert [(b.arm, b.test) for b in timeline.ordered(prof.rows)] == [
        ("stock", "tg32@d16384-kvq8_0"), ("table", "tg32@d16384-kvq8_0"),
        ("stock", "pp2@d49152"), ("table", "pp2@d49152"),
    ]  # fmt: skip
    assert timeline.test_label("tg32@d16384-kvq8_0") == "tg32 @ d16384 kv q8_0"
    assert timeline.test_case("pp2@d49152") == ("pp2 @ d49152", None)
    assert [d.test for d in timeline.arm_deltas(prof.rows)] == ["tg32@d16384-kvq8_0", "pp2@d49152"]
