"""ggml-dispatch.cu (with the weight cache's CUDA side) compiled by nvcc for sm_90 against a table chosen
with a cache budget: cached rules, the budget define and the fallback rules the dispatch reads."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_native_build import (
    CUDA,
    NVCC,
    NVCC_FLAGS,
    _hook_warnings,
    _includes,
    _nvcc,
    cublas_include,  # noqa: F401 (fixture)
    h200_table,
    patched_tree,  # noqa: F401 (fixture)
)

from ggml_dispatch.hook import install as inst

pytestmark = pytest.mark.slow

CACHED = "cublas/out=f16,compute=f16,weight=cached"


def cached_table(commit: str) -> dict[str, object]:
    t = h200_table(commit)
    weight = {"op": "MUL_MAT", "layout": "weight", "src1_type": "f32", "B": 1, "src0_type": "q4_K"}
    rules = [r for r in t["rules"] if not (r["N"] == 4096 and r["src0_type"] == "q4_K")]  # type: ignore[index]
    rules.append(
        weight | {"N": 4096, "K": 4096, "M_lo": 128, "M_hi": 2048, "route": "cublas", "config": CACHED}
    )
    t["rules"] = rules
    nbytes = 32 * 4096 * 4096 * 2
    t["cache"] = {
        "budget_mib": 1024,
        "budget_bytes": 1024 << 20,
        "bytes": nbytes,
        "rule": "greedy",
        "tensors": [weight | {"N": 4096, "K": 4096, "tensors": 32, "bytes": nbytes, "saved_us": 1.0}],
        "fallback": [
            weight | {"N": 4096, "K": 4096, "M_lo": 256, "M_hi": 2048, "route": "cublas", "config": "cublas"}
        ],
    }
    return t


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
def test_nvcc_compiles_dispatch_source_with_a_cached_table(
    patched_tree: Path,  # noqa: F811
    cublas_include: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    from ggml_dispatch.codegen import table

    tree = tmp_path / "llama.cpp"
    (tree / CUDA).mkdir(parents=True)
    for p in (patched_tree / CUDA).iterdir():
        if p.name.startswith("ggml-dispatch") or p.name in inst.HOOK_SPECS:  # the files the hook edits
            shutil.copy2(p, tree / CUDA / p.name)
    shutil.copy2(patched_tree / "UPSTREAM_COMMIT", tree / "UPSTREAM_COMMIT")
    (tmp_path / "table.json").write_text(
        table.dumps(cached_table((tree / "UPSTREAM_COMMIT").read_text().strip()))
    )
    inst.install(tree, table_path=tmp_path / "table.json")
    header = (tree / CUDA / inst.TABLE_HEADER).read_text()
    assert f"#define GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES {1024 << 20}\n" in header
    assert "#define GGML_DISPATCH_TABLE_CACHE_FALLBACK_COUNT 1\n" in header
    res: subprocess.CompletedProcess[str] = _nvcc(
        [
            *NVCC_FLAGS,
            f"-I{patched_tree / CUDA}",
            *_includes(patched_tree, cublas_include),
            "-c",
            str(tree / CUDA / "ggml-dispatch.cu"),
            "-o",
            "ggml-dispatch-cached.o",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []
