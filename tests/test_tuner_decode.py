"""The decode candidates of a sweep (issue #51): mmvq's warps x rows and mmvf's block size are measured at the
points where the vector kernels run (M <= 8) and, for mmvq, only as the tree's install compiled them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ggml_dispatch import fetch, registry, schema
from ggml_dispatch.hook import install as inst
from ggml_dispatch.tuner import build, select

CUDA = Path("ggml/src/ggml-cuda")


def row(t: str, M: int, est: float = 100.0, N: int = 4096, K: int = 4096) -> dict[str, Any]:
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "fused": None,
        "src0_type": t,
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": K,
        "B": 1,
        "est_us": est,
    }


ALL = select.candidate_configs(select.ALL_ROUTES, "all")


def decode(routes: tuple[str, ...]) -> set[str]:
    return {c for c in routes if c.startswith(("mmvq/", "mmvf/"))}


def test_decode_shapes_get_every_launch_shape_and_larger_m_none() -> None:
    sel = select.select_cases([row("q4_K", 1), row("q4_K", 3), row("q4_K", 512)], routes=ALL, coverage=1.0)
    by_m = {c.M: c.routes for c in sel.cases}
    assert {1, 2, 3, 4, 256, 512, 1024} <= set(by_m)
    pairs = {
        f"mmvq/nwarps={w},rows={r}" + (f",regs={g}" if g else "") for w, r, g in registry.MMVQ_CANDIDATES
    }
    blocks = {f"mmvf/block={b}" for b in registry.MMVF_BLOCKS}
    for M in (1, 2, 3, 4):
        assert decode(by_m[M]) == pairs | blocks, M
        assert "mmvq" in by_m[M] and "mmq/j=64,stream_k=off" in by_m[M]
    for M in (256, 512, 1024):
        assert decode(by_m[M]) == set(), M
        assert "mmvq" in by_m[M]  # the plain route stays: its own eligibility says where it runs


def test_mmvq_pairs_follow_what_the_build_compiled() -> None:
    built = inst.MmvqBuild(((4, 1), (8, 2)), ("q4_K",), regs=())
    sel = select.select_cases([row("q4_K", 1), row("q6_K", 1)], routes=ALL, coverage=1.0, mmvq=built)
    got = {(c.shape.src0_type, c.M): {r for r in c.routes if r.startswith("mmvq/")} for c in sel.cases}
    assert got[("q4_K", 1)] == {"mmvq/nwarps=4,rows=1", "mmvq/nwarps=8,rows=2"}
    assert got[("q6_K", 1)] == set()
    capped = inst.MmvqBuild(((4, 1),), ("q4_K",), regs=(64,))  # each pair uncapped and under the cap
    sel = select.select_cases([row("q4_K", 1)], routes=ALL, coverage=1.0, mmvq=capped)
    got = {(c.shape.src0_type, c.M): {r for r in c.routes if r.startswith("mmvq/")} for c in sel.cases}
    assert got[("q4_K", 1)] == {"mmvq/nwarps=4,rows=1", "mmvq/nwarps=4,rows=1,regs=64"}
    assert all(any(r.startswith("mmvf/") for r in c.routes) for c in sel.cases if c.M <= 8)


def test_the_sweep_reads_the_trees_install(tmp_path: Path) -> None:
    pinned = fetch.llama_cpp_dir()
    tree = tmp_path / "llama.cpp"
    (tree / CUDA).mkdir(parents=True)
    for name in inst.HOOK_SPECS:
        shutil.copy2(pinned / CUDA / name, tree / CUDA / name)
    (tree / "UPSTREAM_COMMIT").write_text(schema.PINNED_UPSTREAM_COMMIT + "\n")
    assert build.tree_mmvq(tree) is None  # no hook: nothing known, nothing left out
    inst.install(tree, mmvq_configs="8x1", mmvq_types="q6_K,q4_K")
    assert build.tree_mmvq(tree) == inst.MmvqBuild(((8, 1),), ("q4_K", "q6_K"), registry.MMVQ_DEFAULT_REGS)
    inst.install(tree, mmvq_regs="none")
    assert build.tree_mmvq(tree) == inst.MmvqBuild(((8, 1),), ("q4_K", "q6_K"), ())
    inst.install(tree, features=frozenset({"core"}))  # the hook without the feature: no pair runs
    assert build.tree_mmvq(tree) == inst.MmvqBuild((), ())
