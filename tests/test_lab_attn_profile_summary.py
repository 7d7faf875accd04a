"""lab/attn_profile_summary.py: per-token time at depth from the difference of two profiled llama-bench
processes. The timelines are written here in the kernel-timeline format (their times need a GPU): a fill
that both processes share, then per-token attention and matmul kernels."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from lab import attn_profile_summary as summ

FA = "_Z18flash_attn_ext_f16ILi256ELi256ELi1ELi8ELb0ELb0ELb0EEvPKc"
MMVQ = "_Z13mul_mat_vec_qIL9ggml_type12ELi1ELb0ELb0ELb0EEvPKv"
REPS = 2


def process(n_gen: int, attn_us: float, mm_us: float, wall_us: float, copy_us: float = 0) -> tuple[str, str]:
    """One process: a fill (5 ms of attention, 20 ms of matmul), then per repetition a depth restore (one
    96 MiB copy, taking longer the more tokens the process generates: a one-off copy whose time differs
    between processes) and n_gen tokens back to back, each with a 4 KiB copy of copy_us."""
    lines = ["# kernel-timeline/1", f"N 0 {FA}", f"N 1 {MMVQ}"]
    t = 1_000_000
    lines += [f"K {t} {t + 5_000_000} 7 0 0", f"K {t + 5_000_000} {t + 25_000_000} 7 0 1"]
    t += 30_000_000
    for _ in range(REPS):
        restore = 1_000_000 + 10_000 * n_gen
        lines.append(f"C {t} {t + restore} 13 100663296 1")
        t += restore + 1_000
        for _ in range(n_gen):
            a, m, c = int(attn_us * 1000), int(mm_us * 1000), int(copy_us * 1000)
            lines += [f"K {t} {t + a} 7 1 0", f"K {t + a} {t + a + m} 7 1 1"]
            if c:
                lines.append(f"C {t + a + m} {t + a + m + c} 13 4096 1")
            t += int(wall_us * 1000)
    lines.append("D 0")
    avg_ns = n_gen * wall_us * 1000 + 2_000_000  # a fixed part per repetition cancels too
    bench = {"n_prompt": 0, "n_gen": n_gen, "n_ubatch": 512, "samples_ns": [avg_ns] * REPS, "avg_ns": avg_ns}
    return "\n".join(lines) + "\n", json.dumps(bench) + "\n"


def write(folder: Path, files: dict[str, tuple[str, str]]) -> Path:
    folder.mkdir()
    for stem, (ktl, jsonl) in files.items():
        (folder / f"{stem}.ktl").write_text(ktl)
        (folder / f"{stem}.jsonl").write_text(jsonl)
    return folder


def test_per_token_times_come_from_the_difference_without_the_fill(tmp_path: Path) -> None:
    files = {}
    for n in (32, 96):
        files[f"stock.tg{n}@d16384-kvq8_0"] = process(n, attn_us=80, mm_us=300, wall_us=1200)
        files[f"table.tg{n}@d16384-kvq8_0"] = process(n, attn_us=50, mm_us=300, wall_us=1170, copy_us=10)
    folder = write(tmp_path / "p", files)
    procs = summ.read(folder)
    stock = summ.per_token(
        procs[("stock", "tg @ d16384 kv q8_0", 32)], procs[("stock", "tg @ d16384 kv q8_0", 96)]
    )
    assert stock["attention"] == pytest.approx(0.080) and stock["matmul"] == pytest.approx(0.300)
    assert stock["wall"] == pytest.approx(1.2) and stock["idle"] == pytest.approx(1.2 - 0.38)
    assert stock["copy"] == 0  # the depth restores are one-offs, however long each took
    table = summ.per_token(
        procs[("table", "tg @ d16384 kv q8_0", 32)], procs[("table", "tg @ d16384 kv q8_0", 96)]
    )
    assert table["copy"] == pytest.approx(0.010) and table["idle"] == pytest.approx(1.17 - 0.35 - 0.01)
    lines = summ.summary(procs)
    table_row = next(x for x in lines if "| table |" in x)
    assert table_row.endswith(f"| {80 / 50:.3f} | {1200 / 1170:.3f} |")
    # the same from an archive; a timeline without its llama-bench output is refused
    arch = tmp_path / "p.tar.gz"
    with tarfile.open(arch, "w:gz") as tar:
        tar.add(folder, arcname=".")
    assert summ.summary(summ.read(arch)) == lines
    (folder / "stock.tg96@d16384-kvq8_0.jsonl").unlink()
    assert summ.main([str(folder)]) == 1


def test_unequal_repetitions_are_refused(tmp_path: Path) -> None:
    short, long_ = process(32, 80, 300, 1200), process(96, 80, 300, 1200)
    bad = json.loads(long_[1])
    bad["samples_ns"] = bad["samples_ns"][:1]
    folder = write(
        tmp_path / "p", {"stock.tg32@d4096": short, "stock.tg96@d4096": (long_[0], json.dumps(bad))}
    )
    procs = summ.read(folder)
    with pytest.raises(ValueError, match="same repetitions"):
        summ.per_token(procs[("stock", "tg @ d4096", 32)], procs[("stock", "tg @ d4096", 96)])
