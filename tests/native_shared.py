"""Native build steps that several test files need alike, done once per test session.

The hooked copy of the pinned tree, its CPU-only ggml build (the cpu_probe project: libggml-base,
libggml-cpu, the probe) and nvcc objects compiled with identical command lines are shared by the test
files that use them. Under ``pytest -n`` the first worker to ask does the step while holding a file lock
and the others wait for it and reuse its outputs (a folder beside the workers' own basetemps, as the
harness cache in conftest.py); a step that failed is done again by the next test that asks, so each
asking test sees the failure itself. Every session starts with none of it (CI's clean clone).

A compile of one tree's unit (``compiled(..., tree=)``) is keyed by the tree's content, not its folder: the
compatibility matrix's hooked copy of the pinned tree (tests/test_compat_matrix.py) holds the same bytes as
the shared hooked tree above, so its units compiled with the same flags are one compile for both.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from ggml_dispatch import fetch
from ggml_dispatch.hook import install as inst

NATIVE_TESTS = Path(__file__).parent / "native"
# a CPU-only ggml (GGML_BUILD_TESTS / _EXAMPLES are off by default under add_subdirectory: spelled out)
CPU_ONLY = ["-DGGML_NATIVE=OFF", "-DGGML_CUDA=OFF", "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF"]
CPU_ONLY += ["-DCMAKE_BUILD_TYPE=Release"]


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder for shared native steps: beside the xdist workers' basetemps (one session's
    workers share it), else in this process's basetemp."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "native-shared"
    root.mkdir(exist_ok=True)
    return root


@contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def patched_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned tree's ggml (and UPSTREAM_COMMIT) with the hook installed, no table. Read-only for its
    users: a test that installs a table copies the hook's files out first."""
    root = shared_root(tmp_path_factory)
    folder = root / "tree"
    tree = folder / "llama.cpp"
    with _locked(root, "tree"):
        if not (folder / ".ok").is_file():
            if folder.exists():
                shutil.rmtree(folder)
            pinned = fetch.llama_cpp_dir()
            tree.mkdir(parents=True)
            shutil.copytree(pinned / "ggml", tree / "ggml", symlinks=True)
            shutil.copy2(pinned / "UPSTREAM_COMMIT", tree / "UPSTREAM_COMMIT")
            inst.install(tree)
            (folder / ".ok").write_text("ok\n")
    return tree


def cpu_build(
    tmp_path_factory: pytest.TempPathFactory, tree: Path, target: str
) -> tuple[Path, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str] | None]:
    """tests/native/cpu_probe configured on ``tree`` (CPU only, Release) and ``cmake --build --target
    target -j 2`` in it: (build folder, configure result, build result or None if configuring failed).
    One build folder per tree: the second target asked for is an incremental build (ninja) of the first."""
    root = shared_root(tmp_path_factory)
    key = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]
    build = root / f"cpu-build-{key}"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    with _locked(root, build.name):
        configured = build / ".configured"
        if configured.is_file():
            cfg = subprocess.CompletedProcess[str]([], 0, *json.loads(configured.read_text(encoding="utf-8")))
        else:
            if build.exists():
                shutil.rmtree(build)
            cfg = subprocess.run(
                [
                    *["cmake", "-S", str(NATIVE_TESTS / "cpu_probe"), "-B", str(build), *gen],
                    *[f"-DLLAMA_CPP_DIR={tree}", *CPU_ONLY],
                ],
                capture_output=True,
                text=True,
            )
            if cfg.returncode != 0:
                return build, cfg, None
            configured.write_text(json.dumps([cfg.stdout, cfg.stderr]), encoding="utf-8")
        res = subprocess.run(
            ["cmake", "--build", str(build), "--target", target, "-j", "2"], capture_output=True, text=True
        )
    return build, cfg, res


_TREE_DIGESTS: dict[str, str] = {}


def tree_digest(tree: Path) -> str:
    """sha256 of a llama.cpp tree's ggml folder (each file's relative path and bytes; links as their
    targets) and its UPSTREAM_COMMIT: what a compile of one of its units can read from it. Computed once per
    process for a folder: the trees given here are not modified after their install."""
    where = str(tree.resolve())
    if where not in _TREE_DIGESTS:
        h = hashlib.sha256()
        for p in sorted((tree / "ggml").rglob("*")):
            if p.is_symlink():
                h.update(
                    b"L" + p.relative_to(tree).as_posix().encode() + b"\0" + os.readlink(p).encode() + b"\0"
                )
            elif p.is_file():
                data = p.read_bytes()
                h.update(b"F" + p.relative_to(tree).as_posix().encode() + b"\0%d\0" % len(data) + data)
        commit = tree / "UPSTREAM_COMMIT"
        h.update(b"C" + (commit.read_bytes() if commit.is_file() else b""))
        _TREE_DIGESTS[where] = h.hexdigest()
    return _TREE_DIGESTS[where]


def compiled(
    tmp_path_factory: pytest.TempPathFactory,
    compiler: str,
    args: Sequence[str],
    output: str,
    tree: Path | None = None,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``compiler *args -o <output>`` run once per session for one command line (in a folder of its own):
    (the object, the compiler's result). The result of a success is kept (stdout, stderr) and given again
    to later callers with the same command line; a failure is not kept. With ``tree`` (a llama.cpp tree
    the arguments name paths in), the command line is keyed with that folder spelled ``<tree>`` and the
    tree's content (tree_digest): a tree of the same bytes in another folder, compiled with the same
    flags, gets the first one's object and result."""
    root = shared_root(tmp_path_factory)
    words = [compiler, *args, output]
    if tree is not None:
        folder = str(tree)
        words = [*(w.replace(folder, "<tree>") for w in words), tree_digest(tree)]
    key = hashlib.sha256("\0".join(words).encode()).hexdigest()[:16]
    work = root / f"obj-{key}"
    obj = work / output
    done = work / ".result.json"
    with _locked(root, work.name):
        if done.is_file() and obj.is_file():
            out, err = json.loads(done.read_text(encoding="utf-8"))
            return obj, subprocess.CompletedProcess([compiler, *args], 0, out, err)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir()
        res = subprocess.run([compiler, *args, "-o", output], cwd=work, capture_output=True, text=True)
        if res.returncode == 0:
            done.write_text(json.dumps([res.stdout, res.stderr]), encoding="utf-8")
    return obj, res
