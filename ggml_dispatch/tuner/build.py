"""Build the C++ harness (ggml_dispatch/tuner/harness) once per tree, patch and harness source; reuse it
after that.

The harness includes the hook's C interface (``ggml_dispatch/hook/native/ggml-dispatch.h``) and the codes
header
generated from the registry (``ggml-dispatch-codes.h``, the text ``ggml-dispatch install`` writes into
the tree), which the build writes into its folder's ``generated/``.

The cache key hashes what the binary depends on: the harness sources, the tree's ggml sources (or,
linking a prebuilt ggml, the identity of its shared libraries), the stamped upstream commit and
patch hash, and the CMake options. A finished build is marked with ``.ok``; a half-built folder is
rebuilt. Builds of one key are serialized with a file lock, so shards started together build once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ggml_dispatch import codes, registry, schema
from ggml_dispatch.registry import MmvqBuild

HARNESS_DIR: Final = Path(__file__).resolve().parent / "harness"
HARNESS_BIN: Final = "ggml-dispatch-harness"
NATIVE_DIR: Final = Path(__file__).resolve().parent.parent / "hook" / "native"
NATIVE_HEADER: Final = NATIVE_DIR / "ggml-dispatch.h"
GENERATED_DIR: Final = "generated"  # in the build folder: ggml-dispatch-codes.h
BUILD_STAMP: Final = Path("ggml") / "src" / "ggml-cuda" / "ggml-dispatch-build.h"

_DEFINE = re.compile(r'#define\s+(GGML_DISPATCH_[A-Z_]+)\s+"([^"]*)"')


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class TreeStamp:
    """Provenance of a llama.cpp tree: what ``ggml-dispatch install`` stamped, where it did."""

    upstream_commit: str  # 40 hex, "" if unknown
    patch_hash: str  # "" when the tree carries no installed hook
    source: str  # where the values came from


def tree_stamp(tree: Path) -> TreeStamp:
    """The installed hook's ggml-dispatch-build.h, else the tree's UPSTREAM_COMMIT file (unpatched)."""
    stamp = tree / BUILD_STAMP
    if stamp.is_file():
        defs = dict(_DEFINE.findall(stamp.read_text(encoding="utf-8", errors="replace")))
        return TreeStamp(
            upstream_commit=defs.get("GGML_DISPATCH_UPSTREAM_COMMIT", ""),
            patch_hash=defs.get("GGML_DISPATCH_PATCH_HASH", ""),
            source=str(BUILD_STAMP),
        )
    commit_file = tree / "UPSTREAM_COMMIT"
    if commit_file.is_file():
        return TreeStamp(commit_file.read_text(encoding="utf-8").strip().lower(), "", "UPSTREAM_COMMIT")
    return TreeStamp("", "", "none")


def tree_mmvq(tree: Path) -> MmvqBuild | None:
    """The mmvq candidate instances the tree's install compiles, none where the hook is in without feature
    mmvq_params (its mmvq configurations are refused at run time, ineligible:feature), or None where the
    tree has no installed hook."""
    stamp = tree / BUILD_STAMP
    if not stamp.is_file():
        return None
    text = stamp.read_text(encoding="utf-8", errors="replace")
    features = re.search(r"#define\s+GGML_DISPATCH_FEATURES\s+(\d+)u", text)
    if features is None or not int(features.group(1)) >> registry.FEATURES["mmvq_params"].bit & 1:
        return MmvqBuild((), ())
    defs = dict(_DEFINE.findall(text))
    try:
        return MmvqBuild.parse(
            defs.get("GGML_DISPATCH_MMVQ_CONFIGS"),
            defs.get("GGML_DISPATCH_MMVQ_TYPES"),
            regs=defs.get("GGML_DISPATCH_MMVQ_REGS", "none"),  # a stamp without it: no capped candidate
        )
    except ValueError:
        return None


def harness_sources() -> list[str]:
    """Every file the harness is built from: its folder's CMakeLists.txt, sources and headers (a new op
    file is in the harness' hash, and so in its cache key and version, without being listed)."""
    return sorted(
        p.name
        for p in HARNESS_DIR.iterdir()
        if p.is_file() and (p.suffix in (".cpp", ".h") or p.name == "CMakeLists.txt")
    )


def harness_source_hash() -> str:
    h = hashlib.sha256()
    for name in harness_sources():
        h.update(name.encode() + b"\0" + (HARNESS_DIR / name).read_bytes() + b"\0")
    h.update(b"native\0" + NATIVE_HEADER.read_bytes())
    h.update(b"codes\0" + codes.render_codes_header().encode())
    return h.hexdigest()


def harness_version() -> str:
    """Tool version + the hash of the harness sources: two binaries with one version measure alike."""
    return f"{schema.TOOL_VERSION}+{harness_source_hash()[:12]}"


def _hash_tree_sources(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("build"))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


def _hash_prebuilt(build_dir: Path) -> str:
    h = hashlib.sha256()
    for sub in ("bin", "lib", "ggml/src", "."):
        d = build_dir / sub
        if not d.is_dir():
            continue
        for p in sorted(d.glob("libggml*.so*")):
            st = p.stat()
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def cmake_args(
    tree: Path, *, build_dir: Path | None, cuda: bool, cuda_arch: str, generated_dir: Path | None = None
) -> list[str]:
    args = [f"-DLLAMA_CPP_DIR={tree.resolve()}", f"-DTUNER_HARNESS_VERSION={harness_version()}"]
    args += [f"-DTUNER_NATIVE_DIR={NATIVE_DIR}"]
    if generated_dir is not None:
        args.append(f"-DTUNER_GENERATED_DIR={generated_dir.resolve()}")
    if build_dir is not None:
        args.append(f"-DGGML_BUILD_DIR={build_dir.resolve()}")
    elif cuda:
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", "-DGGML_NATIVE=OFF"]
    else:
        args += ["-DGGML_NATIVE=OFF"]
    return args


def build_key(tree: Path, *, build_dir: Path | None, cuda: bool, cuda_arch: str) -> str:
    h = hashlib.sha256()
    h.update(harness_source_hash().encode())
    stamp = tree_stamp(tree)
    h.update(f"{stamp.upstream_commit}\0{stamp.patch_hash}\0".encode())
    if build_dir is not None:
        h.update(b"prebuilt\0" + _hash_prebuilt(build_dir).encode())
    else:
        h.update(b"tree\0" + _hash_tree_sources(tree / "ggml").encode())
    for a in cmake_args(tree, build_dir=build_dir, cuda=cuda, cuda_arch=cuda_arch):
        if not a.startswith(("-DLLAMA_CPP_DIR=", "-DTUNER_HARNESS_VERSION=", "-DTUNER_NATIVE_DIR=")):
            h.update(a.encode() + b"\0")
    return h.hexdigest()[:20]


def default_cache_root() -> Path:
    env = os.environ.get("GGML_DISPATCH_HARNESS_CACHE")
    if env:
        return Path(env)
    from ggml_dispatch.fetch import CACHE

    return CACHE / "tuner-harness"


def _write_codes_header(tree: Path, folder: Path) -> Path:
    """The codes header the harness compiles with: the tree's installed one (what its patched ggml-cuda
    was built with), else the registry's rendering."""
    installed = tree / BUILD_STAMP.parent / codes.CODES_HEADER
    if not installed.is_file():
        return codes.write_codes_header(folder).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / codes.CODES_HEADER).write_bytes(installed.read_bytes())
    return folder


def _run(cmd: Sequence[str], log: Path) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        ends = "\n".join(tail)
        raise BuildError(f"{log}: {cmd[0]} failed (exit {proc.returncode}); the log ends:\n{ends}")


def build_harness(
    tree: Path,
    *,
    build_dir: Path | None = None,
    cuda: bool = False,
    cuda_arch: str = "90",
    cache_root: Path | None = None,
    jobs: int | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> Path:
    """The harness binary for this tree (built if needed). Raises BuildError with the log's tail."""
    if not (tree / "ggml" / "include" / "ggml.h").is_file():
        raise BuildError(f"{tree}: not a llama.cpp tree (no ggml/include/ggml.h)")
    if build_dir is not None and not any(
        any((build_dir / d).glob("libggml-base.so*")) for d in ("bin", "lib", "ggml/src", ".")
    ):
        raise BuildError(f"{build_dir}: no libggml-base.so in bin/, lib/ or the folder (a llama.cpp build?)")
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            raise BuildError(f"{tree}: cannot build the harness: {tool} is not on PATH")
    root = cache_root or default_cache_root()
    key = build_key(tree, build_dir=build_dir, cuda=cuda, cuda_arch=cuda_arch)
    out = root / key
    binary = out / "bin" / HARNESS_BIN
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / ".ok").is_file() and binary.is_file():
            return binary
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        logfile = out / "build.log"
        generated = _write_codes_header(tree, out / GENERATED_DIR)
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        log(f"building the harness in {out} (log: {logfile})")
        _run(
            [
                "cmake",
                "-S",
                str(HARNESS_DIR),
                "-B",
                str(out),
                *gen,
                *cmake_args(
                    tree, build_dir=build_dir, cuda=cuda, cuda_arch=cuda_arch, generated_dir=generated
                ),
            ],
            logfile,
        )
        _run(
            ["cmake", "--build", str(out), "--target", HARNESS_BIN, "-j", str(jobs or os.cpu_count() or 2)],
            logfile,
        )
        if not binary.is_file():
            raise BuildError(f"{binary}: missing after the build finished (log {logfile})")
        (out / ".ok").write_text(key + "\n")
    return binary
