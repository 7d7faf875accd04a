"""lab/moe.sh parses with bash, and its tune and table parts go through `tune run` and `codegen` (the
parts run on a GPU only)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_lab_script_parses_and_uses_the_pipeline() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    script = REPO / "lab" / "moe.sh"
    res = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    assert "gd tune run" in text and "gd codegen" in text
    # the A/B goes through `ggml-dispatch ab` with the table it must find applied
    ab = text[text.index("\nab)") :]
    assert 'ab --arm "stock=' in ab and '--expect-table "$T"' in ab and ':off"' in ab
    assert "moe_cases" not in text and "moe_decide" not in text
    calls = REPO / "lab" / "moe-calls.sh"
    res = subprocess.run([bash, "-n", str(calls)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    bad = subprocess.run(
        [bash, str(calls)], capture_output=True, text=True, env={"OUT": "/nonexistent", "PART": "9"}
    )
    assert bad.returncode == 2 and "unknown PART 9" in bad.stderr
