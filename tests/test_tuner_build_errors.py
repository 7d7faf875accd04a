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
