"""lab/upstream.sh, the b11549 runs of issue #48 (GPU machine only): it parses with bash, and its `ab` part
refuses to A/B a table on a GPU the table was not measured on, and wants a table at all (checked here with
no GPU: the table's GPU is then never the machine's)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "lab" / "upstream.sh"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "WORK": str(tmp_path / "work")}
    return subprocess.run(
        [bash, str(SCRIPT)], capture_output=True, text=True, env={**base, "OUT": str(tmp_path / "out"), **env}
    )


def test_the_script_parses_and_ab_goes_through_the_pipeline() -> None:
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = SCRIPT.read_text()
    ab = text[text.index("if has_part ab; then") : text.index("if has_part autotune; then")]
    assert '--arm "stock=$BUILD/bin/llama-bench:off"' in ab and '--expect-table "$TABLE"' in ab
    assert "--vram" in ab and "--allow-upstream-mismatch" in ab
    assert "autotune \\" in text and '--vram-budget "${AT_VRAM_MIB:-16384}"' in text


def test_a_table_of_another_gpu_is_not_installed(tmp_path: Path) -> None:
    table = REPO / "tables" / "cuda-sm90-nvidia-h200" / "table.json"
    res = _run(tmp_path, PARTS="ab", TABLE=str(table))
    assert res.returncode == 0, res.stderr
    assert "skip ab: " in res.stdout and "applies on NVIDIA H200" in res.stdout
    assert not (tmp_path / "out" / "ab-table.jsonl").exists()
    assert not (tmp_path / "work" / "llama.cpp").exists()  # nothing unpacked, nothing installed


def test_ab_without_a_table_says_so(tmp_path: Path) -> None:
    res = _run(tmp_path, PARTS="ab")
    assert res.returncode != 0 and "ab: set TABLE=table.json" in res.stderr
