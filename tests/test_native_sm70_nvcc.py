"""sm_70 (V100) device code with a real nvcc: CUDA 11.8, Debian 12's nvidia-cuda-toolkit (non-free).

CUDA 13's nvcc refuses sm_70 and PyPI's CUDA 12 wheels hold no nvcc driver (tests/test_native_volta.py
compiles sm_70 with clang 19 instead). Debian 12 packages nvcc 11.8 with its tools split: nvcc and cicc in
/usr/lib/nvidia-cuda-toolkit/bin, ptxas, fatbinary, cudafe++, nvlink and cuobjdump in /usr/bin, the headers
in /usr/include (cuBLAS's included), and a g++ wrapper there that runs g++-11 (nvcc 11.8 takes gcc <= 11;
the package depends on g++-11, so no -allow-unsupported-compiler). nvcc finds the tools on PATH: /usr/bin
must come before a CUDA 13 in /usr/local/bin, whose ptxas answers "Value 'sm_70' is not defined for
option 'gpu-name'". GGML_DISPATCH_NVCC11 names another CUDA 11 nvcc; its ptxas is looked for beside it.

The hooked pinned tree's ggml-cuda.cu, ggml-dispatch.cu, fattn.cu and mmq.cu (the units
tests/test_compat_matrix.py compiles for sm_90; mmq.cu includes the hooked mmq.cuh) and
mmq-instance-q4_0.cu (the hooked mmq.cuh's device code: dp4a MMQ on Volta, the split's expert filters, the
fused split) compile with llama.cpp's CUDA flags (-std=c++17, as the tree's CMake) for
compute_70/sm_70, host and device; every object carries an sm_70 cubin and no warning from the hook's
files; the MMQ one holds the q4_0 mul_mat_q kernel of every column tile width and the fused split's
kernels, and the host objects the hook's entry points. None of these units needs CUDA 12.

Cost on 2 shared cores: about 130 s of CPU for the five units (two nvcc at a time); .ci/run installs the
toolkit from .debs kept under GGML_DISPATCH_CACHE (1.6 GB, 65 packages; unpacking them takes 2-4 min).
Nothing is run on a V100 (none here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import native_shared
import pytest
from test_native_build import CUDA, FA_DEFINES, FA_QUANTS_DEFINE, NVCC_FLAGS, _hook_warnings

from ggml_dispatch import registry

pytestmark = pytest.mark.slow

DEBIAN_NVCC = Path("/usr/lib/nvidia-cuda-toolkit/bin/nvcc")
DEBIAN_TOOLS = Path("/usr/bin")
UNITS = {
    "ggml-cuda": "ggml-cuda.cu",
    "ggml-dispatch": "ggml-dispatch.cu",
    "fattn": "fattn.cu",
    "mmq": "mmq.cu",
    "mmq-q4_0": "template-instances/mmq-instance-q4_0.cu",
}
SM70 = "--generate-code=arch=compute_70,code=[compute_70,sm_70]"


def _release(tool: Path, env: dict[str, str] | None = None) -> str | None:
    """The CUDA release a tool says it is ("11.8"), None where it does not run."""
    try:
        out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, env=env, timeout=60)
    except OSError:
        return None
    m = re.search(r"release (\d+\.\d+)", out.stdout)
    return m.group(1) if out.returncode == 0 and m else None


def toolchain() -> tuple[Path, Path, dict[str, str]] | str:
    """(nvcc, the folder of its ptxas, the environment that runs them), or why there is none."""
    given = os.environ.get("GGML_DISPATCH_NVCC11")
    nvcc = Path(given) if given else DEBIAN_NVCC
    release = _release(nvcc)
    if release is None:
        return f"no CUDA 11 nvcc at {nvcc} (apt-get install nvidia-cuda-toolkit from Debian 12 non-free)"
    if not release.startswith("11."):
        return f"{nvcc} is CUDA {release}, not 11 (the last release with sm_70 code)"
    tools = nvcc.parent if (nvcc.parent / "ptxas").is_file() else DEBIAN_TOOLS
    if _release(tools / "ptxas") != release:
        return f"no ptxas {release} beside {nvcc} or in {DEBIAN_TOOLS}"
    env = dict(os.environ, PATH=f"{nvcc.parent}{os.pathsep}{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    return nvcc, tools, env


@pytest.fixture(scope="module")
def sm70_nvcc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    found = toolchain()
    if isinstance(found, str):
        # .ci/run installs it and says loudly when it could not
        pytest.skip(found)
    nvcc, tools, env = found
    tree = native_shared.patched_tree(tmp_path_factory)  # the pinned ggml, hooked (read only)
    work = tmp_path_factory.mktemp("sm70-nvcc")
    flags = [SM70 if f.startswith("--generate-code=") else f for f in NVCC_FLAGS]
    assert SM70 in flags
    cmake = (tree / CUDA / "CMakeLists.txt").read_text()
    if "ggml_cuda_fattn_vec_instances" in cmake:
        flags += [*FA_DEFINES, FA_QUANTS_DEFINE]
    includes = [f"-I{tree / 'ggml/src'}", f"-I{tree / 'ggml/include'}"]  # cuBLAS: the toolkit's own

    def compile_one(name: str) -> subprocess.CompletedProcess[str]:
        args = [
            str(nvcc),
            *flags,
            *includes,
            "-c",
            str(tree / CUDA / UNITS[name]),
            "-o",
            str(work / f"{name}.o"),
        ]
        return subprocess.run(args, capture_output=True, text=True, env=env)

    with ThreadPoolExecutor(2) as ex:
        futures = {name: ex.submit(compile_one, name) for name in UNITS}
        results: dict[str, Any] = {name: f.result() for name, f in futures.items()}
    return {"dir": work, "tools": tools, "env": env, "nvcc": nvcc, **results}


def test_the_toolchain_is_cuda_11_with_its_own_ptxas_and_a_host_gcc_11(sm70_nvcc: dict[str, Any]) -> None:
    env = sm70_nvcc["env"]
    assert _release(sm70_nvcc["nvcc"], env) == _release(sm70_nvcc["tools"] / "ptxas") == "11.8"
    dry = subprocess.run(
        [str(sm70_nvcc["nvcc"]), "--dryrun", SM70, "-x", "cu", "-c", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
        env=env,
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    # the PATH given finds CUDA 11.8's ptxas (not a newer one that refuses sm_70), the host compiler is gcc 11
    assert shutil.which("ptxas", path=env["PATH"]) == str(sm70_nvcc["tools"] / "ptxas")
    assert re.search(r"ptxas\s+-arch=sm_70", dry.stderr), dry.stderr[-2000:]
    assert "--gnu_version=11" in dry.stderr


@pytest.mark.parametrize("name", list(UNITS))
def test_hooked_units_compile_for_sm70_with_nvcc_11(sm70_nvcc: dict[str, Any], name: str) -> None:
    res = sm70_nvcc[name]
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln][:5]
    assert res.returncode == 0, f"{UNITS[name]}: {errors}\n{res.stderr[-4000:]}"
    assert _hook_warnings(res.stderr) == []
    elfs = _cuobjdump(sm70_nvcc, "--list-elf", name)
    assert re.findall(r"\.sm_(\d+)\.cubin", elfs) == ["70"], elfs


def _cuobjdump(sm70_nvcc: dict[str, Any], what: str, name: str) -> str:
    tool = sm70_nvcc["tools"] / "cuobjdump"
    if not tool.is_file():
        pytest.skip(f"no cuobjdump in {sm70_nvcc['tools']}")
    out = subprocess.run(
        [str(tool), what, str(sm70_nvcc["dir"] / f"{name}.o")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_sm70_mmq_cubin_holds_every_tile_width_and_the_fused_split(sm70_nvcc: dict[str, Any]) -> None:
    assert sm70_nvcc["mmq-q4_0"].returncode == 0
    entries = [
        ln.split()[-1]
        for ln in _cuobjdump(sm70_nvcc, "-symbols", "mmq-q4_0").splitlines()
        if "STO_ENTRY" in ln
    ]
    # mul_mat_q<GGML_TYPE_Q4_0 (2), J, ...>: the tree compiles J = 8..128 in steps of 8
    widths = {int(m.group(1)) for e in entries if (m := re.match(r"_Z9mul_mat_qIL9ggml_type2ELi(\d+)E", e))}
    assert widths == set(range(8, 129, 8)), sorted(widths)
    # the fused split (mmq.cuh.hook, ggml-dispatch-mmq-fused.cuh): one kernel per narrow width, fit, fit64
    fused = [e for e in entries if "ggml_dispatch_mul_mat_q_id_fused" in e]
    assert len(fused) == len(registry.MMQ_FUSED_J) + len(registry.MMQ_FIT_SPLITS), fused


@pytest.mark.parametrize(("name", "kind"), [("ggml-cuda", "U"), ("ggml-dispatch", "T")])
def test_the_host_objects_carry_the_hook(sm70_nvcc: dict[str, Any], name: str, kind: str) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    assert sm70_nvcc[name].returncode == 0
    out = subprocess.run([nm, "-C", str(sm70_nvcc["dir"] / f"{name}.o")], capture_output=True, text=True)
    assert re.search(rf"^\s*[0-9a-f]*\s+{kind} ggml_cuda_dispatch_begin_mul_mat", out.stdout, re.M)
