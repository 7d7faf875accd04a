"""Shared by the CLI tests: one real input file per kind a writing command reads, and result checks."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from click.testing import CliRunner, Result
from test_codegen_support import trials, write_tuning

from ggml_dispatch import schema
from ggml_dispatch.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "samples" / "trace-reference-shapes.jsonl"


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with its content hash (folders: 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def refused(res: Result, *needles: str, code: int = 2) -> str:
    """The command failed with ``code`` and one error line (the last) holding every needle; no traceback."""
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    # one error line, the last (a progress label may come before it)
    lines = res.stderr.strip().splitlines()
    assert [ln for ln in lines if "error" in ln.lower()] == lines[-1:], res.stderr
    for n in needles:
        assert n in lines[-1], lines[-1]
    return lines[-1]


def make_inputs(d: Path, gguf: Path) -> dict[str, Path]:
    """A trace, a GGUF (``gguf``, written by the caller), a tuning file, a census and a reference TSV."""
    trace = d / "t.jsonl"
    shutil.copy(TRACE, trace)
    tuning = write_tuning(
        [r for M in (256, 512) for r in trials(speed={"mmq": 1.0, "cublas": 2.0}, M=M, noise=0.0)],
        d / "tuning.parquet",
    )
    census = d / "census.parquet"
    res = run("census", "ingest", trace, "-o", census)
    assert res.exit_code == 0, res.output
    tsv = d / "ref.tsv"
    tsv.write_text(
        f"# NVIDIA H200 (cc 9.0, driver 580.159.04, CUDA 13.0), llama.cpp {schema.PINNED_UPSTREAM_COMMIT}\n"
        "type\tm\tn\tk\troute\truns\tus_per_run\nq4_K\t1024\t256\t4096\tmmq\t1\t1.0\n"
    )
    return {"trace": trace, "gguf": gguf, "tuning": tuning, "census": census, "tsv": tsv}
