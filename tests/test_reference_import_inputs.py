"""``tune import-reference`` on files that are not a reference TSV (random bytes, a Parquet file, a
folder, an empty file) and on numbers that do not fit a tuning column: one message naming the file
(and line and field), exit 2, no traceback, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_codegen_support import REPO, trials, write_tuning

from ggml_dispatch.artifacts import tuning as tuning_artifact
from ggml_dispatch.cli import main

HEAD = "# NVIDIA H200 (cc 9.0, driver 580.159.04, CUDA 13.0), llama.cpp 0c1e57098bba (x).\n"
COLS = "type\tm\tn\tk\troute\truns\tus_per_run\n"
WHAT = "expected a reference TSV (test-backend-ops perf timings)"


def run(tsv: Path, out: Path) -> Result:
    args = ["tune", "import-reference", str(tsv), "--sm-count", "132", "-o", str(out)]
    return CliRunner().invoke(main, args)


def refused(res: Result, out: Path) -> str:
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("ggml-dispatch: error: ")]
    assert len(lines) == 1, res.stderr
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    return lines[0].removeprefix("ggml-dispatch: error: ")


def test_random_bytes(tmp_path: Path) -> None:
    tsv = tmp_path / "random.tsv"
    tsv.write_bytes(b"\xc3" + os.urandom(4096))  # a lone UTF-8 lead byte, then noise
    msg = refused(run(tsv, tmp_path / "o.parquet"), tmp_path / "o.parquet")
    assert msg.startswith(f"{tsv}: ") and WHAT in msg
    assert "binary file" in msg or "not UTF-8 text" in msg


def test_a_parquet_file(tmp_path: Path) -> None:
    tsv = write_tuning(trials(speed={"mmq": 1.0}, M=1), tmp_path / "tuning.parquet")
    msg = refused(run(tsv, tmp_path / "o.parquet"), tmp_path / "o.parquet")
    assert msg == f"{tsv}: a Parquet file, {WHAT}"


@pytest.mark.parametrize(("make", "expect"), [("folder", "is a folder"), ("empty", "empty file")])
def test_a_folder_or_an_empty_file(make: str, expect: str, tmp_path: Path) -> None:
    tsv = tmp_path / "ref.tsv"
    if make == "folder":
        tsv.mkdir()
    else:
        tsv.write_bytes(b"")
    msg = refused(run(tsv, tmp_path / "o.parquet"), tmp_path / "o.parquet")
    assert msg.startswith(f"{tsv}: {expect}")


@pytest.mark.parametrize("col", ["m", "n", "k", "runs"])
def test_a_23_digit_integer(col: str, tmp_path: Path) -> None:
    cells = {"type": "q4_K", "m": "1", "n": "1", "k": "256", "route": "mmq", "runs": "1", "us_per_run": "1.0"}
    cells[col] = "12345678901234567890123"
    tsv = tmp_path / "big.tsv"
    tsv.write_text(HEAD + COLS + "\t".join(cells.values()) + "\n")
    msg = refused(run(tsv, tmp_path / "o.parquet"), tmp_path / "o.parquet")
    assert msg == f"{tsv}:3: {col}: must be an integer in [1, 2^62], got 12345678901234567890123"


def test_the_largest_allowed_integer_converts(tmp_path: Path) -> None:
    tsv = tmp_path / "edge.tsv"
    tsv.write_text(HEAD + COLS + f"q4_K\t1\t1\t256\tmmq\t{1 << 62}\t1.0\n")
    out = tmp_path / "o.parquet"
    res = run(tsv, out)
    assert res.exit_code == 0, res.output
    assert tuning_artifact.read(out).table.column("replays").to_pylist() == [1 << 62]


def test_a_short_commit_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    """The real reference TSV with another abbreviated commit: only a prefix of the pinned commit is
    expanded, and any other short hash names no tree exactly, so no tuning file is written from it (a
    reader would refuse its upstream_commit column)."""
    real = REPO / "samples" / "reference" / "h200-mul-mat-routes.tsv"
    text = real.read_text()
    assert "llama.cpp 0c1e57098bba" in text.splitlines()[0]
    tsv = tmp_path / "ref.tsv"
    tsv.write_text(text.replace("llama.cpp 0c1e57098bba", "llama.cpp deadbeef1234", 1))
    out = tmp_path / "o.parquet"
    msg = refused(run(tsv, out), out)
    assert msg == (
        f"{tsv}: llama.cpp commit: 'deadbeef1234' is not an upstream id (a 40-hex commit, a build number "
        "like b11549 or a registry version like llama-cpp-python==0.3.36); write the full commit"
    )
