"""Strings read from files (GPU names, upstream commits) are printed with control characters escaped by
``codegen`` and ``install``, as ``census`` does: a newline or an ANSI escape in a file cannot forge or
hide console lines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_support import run, snapshot
from test_codegen_support import trials, write_tuning

from ggml_dispatch import fetch, schema
from ggml_dispatch.codegen import table
from ggml_dispatch.text import printable

EVIL = "NVIDIA H200\nwrote everything\x1b[2J"
CUDA = Path("ggml/src/ggml-cuda")


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert printable("a\nb\x1b[31m\u2028c\té") == "a\\x0ab\\x1b[31m\\u2028c\\x09é"
    assert printable("x" * 10, width=6) == "xxx..."


def test_codegen_escapes_the_gpu_name_of_the_tuning_file(tmp_path: Path) -> None:
    gpu = schema.GpuId(EVIL, 900, 132)
    rows = [r for M in (256, 512) for r in trials(speed={"mmq": 1.0, "cublas": 2.0}, M=M, noise=0.0, gpu=gpu)]
    tuning = write_tuning(rows, tmp_path / "tuning.parquet")
    res = run("codegen", tuning, "-o", tmp_path / "out", "--verbose")
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\nwrote everything" not in res.output
    assert "table for NVIDIA H200\\x0awrote everything\\x1b[2J (cc 900, 132 SMs)" in res.output


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The files install touches, copied out of the pinned tree (which is never modified)."""
    pinned = fetch.llama_cpp_dir()
    t = tmp_path / "llama.cpp"
    (t / CUDA).mkdir(parents=True)
    shutil.copy2(pinned / CUDA / "ggml-cuda.cu", t / CUDA / "ggml-cuda.cu")
    shutil.copy2(pinned / CUDA / "mmq.cu", t / CUDA / "mmq.cu")
    shutil.copy2(pinned / CUDA / "mmq.cuh", t / CUDA / "mmq.cuh")  # the hook edits it too
    shutil.copy2(pinned / CUDA / "fattn.cu", t / CUDA / "fattn.cu")  # and this
    shutil.copy2(pinned / CUDA / "fattn-common.cuh", t / CUDA / "fattn-common.cuh")
    shutil.copy2(pinned / CUDA / "mmvq.cu", t / CUDA / "mmvq.cu")
    shutil.copy2(pinned / CUDA / "mmvf.cu", t / CUDA / "mmvf.cu")
    (t / "UPSTREAM_COMMIT").write_text(schema.PINNED_UPSTREAM_COMMIT + "\n")
    return t


def test_install_refuses_a_table_upstream_commit_with_control_characters(tree: Path, tmp_path: Path) -> None:
    """A table's upstream_commit is an upstream id (``schema.check_upstream_id``): one that hides a
    newline and an ANSI escape is refused as the table is read, shown escaped, mismatch allowed or not."""
    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = "1" * 40 + "\nggml-dispatch hook in /tmp: 0 file(s) changed\x1b[2K"
    t["provenance"] = {"source": "measured"}
    path = tmp_path / "table.json"
    path.write_text(table.dumps(t))
    before = snapshot(tree)
    for extra in ((), ("--allow-upstream-mismatch",)):
        res = run("install", "--llama-cpp", tree, "--table", path, *extra)
        assert res.exit_code == 2, res.output
        assert "\x1b" not in res.output and "\nggml-dispatch hook in" not in res.output
        (line,) = res.stderr.splitlines()
        assert line.startswith(f"ggml-dispatch: error: {path}: upstream_commit: '{'1' * 40}\\nggml-dispatch")
        assert "is not an upstream id" in line
    assert snapshot(tree) == before
