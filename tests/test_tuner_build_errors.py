"""``tune build`` and ``tune run`` report a harness that cannot be built in the form every other error
has: ``ggml-dispatch: error: path: message`` on one line (exit 1: the input is fine, the build failed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import refused, run


def test_not_a_tree_is_one_error_line_naming_the_tree(tmp_path: Path) -> None:
    line = refused(run("tune", "build", "--llama-cpp", tmp_path), code=1)
    assert line == f"ggml-dispatch: error: {tmp_path}: not a llama.cpp tree (no ggml/include/ggml.h)"


def test_a_build_folder_without_libraries_names_the_folder(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "ggml" / "include").mkdir(parents=True)
    (tree / "ggml" / "include" / "ggml.h").write_text("/* empty */\n")
    build = tmp_path / "build"
    build.mkdir()
    line = refused(run("tune", "build", "--llama-cpp", tree, "--build-dir", build), code=1)
    assert line.startswith(f"ggml-dispatch: error: {build}: no libggml-base.so")


def test_missing_cmake_names_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "tree"
    (tree / "ggml" / "include").mkdir(parents=True)
    (tree / "ggml" / "include" / "ggml.h").write_text("/* empty */\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no cmake on PATH
    line = refused(run("tune", "build", "--llama-cpp", tree), code=1)
    assert line == f"ggml-dispatch: error: {tree}: cannot build the harness: cmake is not on PATH"


def test_every_harness_source_is_in_its_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the hash keys the harness cache and names the harness version in every tuning row: an op file left
    # out of it (flash_attn_ext.cpp, mul_mat_id.cpp were) lets a stale binary measure after a change
    import shutil

    from ggml_dispatch.tuner import build

    copy = tmp_path / "harness"
    shutil.copytree(build.HARNESS_DIR, copy)
    monkeypatch.setattr(build, "HARNESS_DIR", copy)
    names = build.harness_sources()
    ops = {"flash_attn_ext.cpp", "mul_mat_id.cpp", "mul_mat.cpp"}
    assert ops | {"bench.cpp", "CMakeLists.txt"} <= set(names)
    for name in names:
        before = build.harness_source_hash()
        (copy / name).write_bytes((copy / name).read_bytes() + b"\n// changed\n")
        assert build.harness_source_hash() != before, name
