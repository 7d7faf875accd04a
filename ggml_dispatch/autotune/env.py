"""What autotune and status read about the machine: visible GPUs, the nvcc that would build, arch limits."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# CUDA 13 dropped offline compilation for Maxwell, Pascal and Volta (sm_50..sm_72).
CUDA13_MIN_ARCH: Final = 75


@dataclass(frozen=True)
class GpuInfo:
    name: str
    uuid: str
    driver: str
    cc: int | None  # as ggml encodes it (700, 900); None when nvidia-smi does not say


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """``nvidia-smi --query-gpu=name,uuid,driver_version,compute_cap --format=csv,noheader`` lines."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0] or not parts[1].startswith("GPU-"):
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)", parts[3])
        cc = int(m.group(1)) * 100 + int(m.group(2)) * 10 if m else None
        out.append(GpuInfo(parts[0], parts[1], parts[2], cc))
    return out


def visible_gpus(env: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs nvidia-smi lists (honouring CUDA_VISIBLE_DEVICES=""/-1 as none); [] without nvidia-smi."""
    e = dict(os.environ if env is None else env)
    if e.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return []
    exe = shutil.which("nvidia-smi", path=e.get("PATH"))
    if exe is None:
        return []
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name,uuid,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            env=e,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_gpu_csv(res.stdout) if res.returncode == 0 else []


def table_folder_name(gpu: GpuInfo) -> str:
    """tables/<this>: cuda-sm90-nvidia-h200."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-")
    sm = f"sm{gpu.cc // 10}" if gpu.cc else "sm"
    return f"cuda-{sm}-{slug}"


def find_nvcc(given: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The nvcc CMake would use: --nvcc, $CUDACXX, nvcc on PATH, $CUDA_HOME/bin/nvcc."""
    e = dict(os.environ if env is None else env)
    if given is not None:
        return given
    if e.get("CUDACXX"):
        return Path(e["CUDACXX"])
    found = shutil.which("nvcc", path=e.get("PATH"))
    if found:
        return Path(found)
    for home in (e.get("CUDA_HOME"), e.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return Path(home) / "bin" / "nvcc"
    return None


def parse_nvcc_version(text: str) -> tuple[int, int] | None:
    """``nvcc --version`` -> (major, minor), from its 'release 12.9' line."""
    m = re.search(r"release (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nvcc_version(nvcc: Path) -> tuple[int, int] | None:
    try:
        res = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvcc_version(res.stdout + res.stderr)


def parse_archs(cuda_arch: str) -> list[int] | None:
    """CMAKE_CUDA_ARCHITECTURES ("70", "70;90", "86-real", "90a") -> the numbers; None for native/all."""
    if cuda_arch in ("native", "all", "all-major"):
        return None
    out = []
    for part in re.split(r"[;,]", cuda_arch):
        m = re.fullmatch(r"(\d+)[a-z]?(?:-(?:real|virtual))?", part.strip())
        if not m:
            raise ValueError(f"{cuda_arch!r}: not a CUDA architecture list (e.g. 70, 90, 70;90, native)")
        out.append(int(m.group(1)))
    return out


def arch_problem(
    cuda_arch: str, version: tuple[int, int] | None, nvcc: Path | None, gpu_cc: int | None
) -> str | None:
    """Why this nvcc cannot build for these archs (a CUDA 13 nvcc for Volta), else None."""
    archs = parse_archs(cuda_arch)
    if archs is None:  # native: the visible GPU's arch
        archs = [gpu_cc // 10] if gpu_cc else []
    old = sorted(a for a in archs if a < CUDA13_MIN_ARCH)
    if not old:
        return None
    if nvcc is None:
        return f"sm_{old[0]} needs a CUDA 12 toolkit and no nvcc was found (--cuda-home .../cuda-12.9)"
    if version is None:
        return None  # unknown version: let CMake decide
    if version[0] >= 13:
        return (
            f"{nvcc} is CUDA {version[0]}.{version[1]}, which cannot target sm_{old[0]} (CUDA 13 dropped "
            f"Volta and older); build with a CUDA 12 toolkit: --cuda-home /usr/local/cuda-12.9"
        )
    return None
