"""Volta (sm_70, V100): the eligibility check held against the tree's own Volta rules.

tests/native/volta_rules.cu is compiled as host code with the installed nvcc (CUDA 13 cannot emit sm_70
device code, but the host side sees the compiled archs only through ggml_cuda_highest_compiled_arch,
whose list the test sets as a V100 build would have it) and linked against the tree's libggml-base. It
probes the tree's ggml_cuda_should_use_mmq / _mmf (verbatim) and the check on cc 700 and cc 900:

* MMQ on Volta without GGML_CUDA_FORCE_MMQ only below MMQ_DP4A_MAX_BATCH_SIZE (llama.cpp PR #12098),
  with it at every M; the check allows MMQ at every M either way (the batch limit is a preference);
* a V100 on a build without sm_70 code: no route at all; an sm_90 GPU on a V100-only build runs the
  sm_70 code paths (no Turing MMA, Volta MMA for F16 mmf, no F32/BF16 mmf).
* tests/native/eligibility_grid.cu (containment, hard limits, no device code, stock's own route) on
  the compiled-arch list of a V100-only build.

sm_70 device code, with a CUDA 12 toolchain from PyPI (CUDA 13 dropped Volta): no CUDA 12 wheel has an
nvcc driver (nvidia-cuda-nvcc-cu12 12.0.76 .. 12.9.86, every x86_64 wheel: bin/ptxas, libNVVM, libdevice
and headers only; no nvcc, cicc or cudafe++), so clang 19's CUDA front end (Debian clang-19, installed by
.ci/run) compiles against fetch.cuda12_root(), a CUDA 12.9 root of the nvcc, runtime and CCCL wheels, and
ptxas 12.9 assembles the SASS:

* the hooked ggml-cuda.cu, ggml-dispatch.cu and mmq-instance-q4_0.cu (the hooked mmq.cuh) compile to an
  sm_70 cubin (the CUDA ELF header says sm_70 from compute_70; the MMQ one holds the q4_0 kernels);
* ggml-cuda.cu and ggml-dispatch.cu compile for the host of that V100 build, and the hook's symbols are
  there (the cuBLAS headers are CUDA 13's: the CUDA 12 cuBLAS wheel is 500 MB for the same declarations);
* the tuner harness's CUDA part (bench.cpp's runtime queries, host C++) compiles against those headers.

50 to 90 s on 2 shared cores (slow). This is not nvcc 12.9 itself: clang defines what nvcc would
(__CUDA_ARCH_LIST__=700 in both passes, fast math as flush-to-zero and approximate transcendentals); a real
nvcc (11.8, Debian's) compiles these units for sm_70 in tests/test_native_sm70_nvcc.py.
Nothing is run on a V100 (none here).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import native_shared
import pytest

from ggml_dispatch import fetch
from tests.test_native_build import CUDA, NATIVE_TESTS, NVCC_FLAGS, _hook_warnings, tree_should_use_source

pytestmark = pytest.mark.slow

NVCC = shutil.which("nvcc")


@pytest.fixture(scope="module")
def volta(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed on this machine")
    work = tmp_path_factory.mktemp("volta")
    # the pinned ggml with the hook installed, its CPU-only build and convert.o: shared with
    # tests/test_native_build.py (and the first two with tests/test_native_fattn.py): tests/native_shared.py
    tree = native_shared.patched_tree(tmp_path_factory)
    cublas = fetch.cublas_headers()
    # only libggml-base (type traits) is needed: build that target alone
    build, cfg, res = native_shared.cpu_build(tmp_path_factory, tree, "ggml-base")
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    assert res is not None  # configured: the build ran
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    base = sorted(build.rglob("libggml-base.so"))[0]
    inc = tree_should_use_source(tree / CUDA)
    # the per-configuration eligibility asks the tree's converters whether a conversion exists
    includes = [f"-I{tree / 'ggml/src'}", f"-I{tree / 'ggml/include'}", f"-I{cublas}"]
    assert NVCC is not None
    convert_obj, conv = native_shared.compiled(
        tmp_path_factory, NVCC, [*NVCC_FLAGS, *includes, "-c", str(tree / CUDA / "convert.cu")], "convert.o"
    )
    assert conv.returncode == 0, conv.stderr[-4000:]

    def compile_run(
        name: str, arch_list: str, defines: list[str], source: str = "volta_rules.cu"
    ) -> dict[str, Any]:
        d = work / name
        d.mkdir()
        (d / "grid_config.h").write_text(f"#define GGML_DISPATCH_TEST_ARCH_LIST {arch_list}\n")
        (d / "tree_should_use.inc").write_text(inc)
        exe = d / "volta_rules"
        assert NVCC is not None
        obj = d / "volta_rules.o"
        args = [NVCC, "-std=c++17", "-x", "cu", "-arch=sm_90", "-O1", *defines, f"-I{d}", f"-I{tree / CUDA}"]
        args += [*includes, "-c", str(NATIVE_TESTS / source), "-o", str(obj)]
        built = subprocess.run(args, capture_output=True, text=True)
        assert built.returncode == 0, f"{name}: {built.stderr[-4000:]}"
        # linked apart: nvcc's -x cu would take convert.o for a source file
        args = [NVCC, "-arch=sm_90", str(obj), str(convert_obj), "-o", str(exe), f"-L{base.parent}"]
        args += ["-lggml-base", f"-Xlinker=-rpath={base.parent}"]
        linked = subprocess.run(args, capture_output=True, text=True, errors="replace")
        assert linked.returncode == 0, f"{name}: {linked.stderr[-4000:]}"
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        out: dict[str, Any] = {"rc": run.returncode, **json.loads(run.stdout)}
        return out

    variants = {
        "v100": ("700", [], "volta_rules.cu"),
        "v100_force_mmq": ("700", ["-DGGML_CUDA_FORCE_MMQ"], "volta_rules.cu"),
        "sm90": ("900", [], "volta_rules.cu"),
        "v100_grid": ("700", [], "eligibility_grid.cu"),  # C1..C5 of the grid for a V100-only build
    }
    with ThreadPoolExecutor(2) as ex:
        futures = {k: ex.submit(compile_run, k, *v) for k, v in variants.items()}
        return {k: f.result() for k, f in futures.items()}


def probes(result: dict[str, Any], cc: int, type_name: str) -> dict[int, dict[str, Any]]:
    return {p["M"]: p for p in result["probes"] if p["cc"] == cc and p["type"] == type_name}


@pytest.mark.parametrize("qtype", ["q4_0", "q4_K", "q8_0"])
def test_mmq_batch_limit_on_volta_without_force_mmq(volta: dict[str, dict[str, Any]], qtype: str) -> None:
    v = volta["v100"]
    assert v["arch_list"] == "700" and v["force_mmq"] == 0
    limit = v["mmq_dp4a_max_batch"]
    assert limit == 64
    by_m = probes(v, 700, qtype)
    assert set(by_m) >= {1, 63, 64, 65, 512}
    for m, p in by_m.items():
        assert p["highest_arch"] == 700
        assert p["tree_mmq"] == (m < limit), p  # PR #12098: cuBLAS (FP16 tensor cores) from 64 on
        assert p["check_mmq"] == "ok", p  # a preference, not a hard limit: forcing MMQ stays possible
        assert p["check_cublas"] == "ok", p
    assert by_m[512]["stock"] == "cublas" and by_m[16]["stock"] in ("mmvq", "mmq")


def test_force_mmq_build_takes_mmq_at_every_batch(volta: dict[str, dict[str, Any]]) -> None:
    f = volta["v100_force_mmq"]
    assert f["force_mmq"] == 1
    for m, p in probes(f, 700, "q4_0").items():
        assert p["tree_mmq"] is True and p["check_mmq"] == "ok", (m, p)
    assert probes(f, 700, "q4_0")[512]["stock"] == "mmq"


def test_volta_mma_for_f16_only(volta: dict[str, dict[str, Any]]) -> None:
    v = volta["v100"]
    for m, p in probes(v, 700, "f16").items():
        if m <= 16:
            assert p["check_mmf"] == "ok" and p["tree_mmf"] is True, (m, p)
    for t in ("f32", "bf16"):  # mmf needs Ampere MMA for these
        for p in probes(v, 700, t).values():
            assert p["check_mmf"] == "no_device_code" and p["tree_mmf"] is False, p


def test_newer_gpu_on_a_v100_only_build_runs_sm70_code(volta: dict[str, dict[str, Any]]) -> None:
    v = volta["v100"]
    for p in probes(v, 900, "q4_0").values():
        assert p["highest_arch"] == 700
        # no Turing MMA in sm_70 code: the dp4a MMQ with the same batch limit as a V100
        assert p["tree_mmq"] == (p["M"] < v["mmq_dp4a_max_batch"]) and p["check_mmq"] == "ok", p
    for p in probes(v, 900, "f32").values():
        assert p["check_mmf"] == "no_device_code" and p["tree_mmf"] is False, p
    for p in probes(v, 900, "f16").values():
        if p["M"] <= 16:
            assert p["check_mmf"] == "ok" and p["tree_mmf"] is True, p


def test_v100_on_a_build_without_sm70_code_gets_no_route(volta: dict[str, dict[str, Any]]) -> None:
    s = volta["sm90"]
    assert s["arch_list"] == "900"
    for t in ("q4_0", "f16", "f32"):
        for p in probes(s, 700, t).values():
            assert p["highest_arch"] == -1, p
            assert p["check_mmq"] == p["check_mmf"] == p["check_cublas"] == "no_device_code", p
    # the same build on its own GPU: Turing+ MMA, MMQ at every M (no dp4a batch limit)
    for p in probes(s, 900, "q4_0").values():
        assert p["tree_mmq"] is True and p["check_mmq"] == "ok", p


def test_eligibility_grid_holds_for_a_v100_only_build(volta: dict[str, dict[str, Any]]) -> None:
    g = volta["v100_grid"]
    assert g["arch_list"] == "700"
    assert g["rc"] == 0 and g["violations"] == 0, g["messages"]
    assert g["why"]["vendor"] > 0 and g["eligible"]["mmq"] > 0 and g["eligible"]["mmf"] > 0


# sm_70 device code: clang's CUDA front end on the CUDA 12.9 root of PyPI wheels (fetch.cuda12_root).
CLANG = os.environ.get("GGML_DISPATCH_CUDA_CLANG") or shutil.which("clang++-19")
# llama.cpp's CUDA defines and flags as clang spells them: -use_fast_math is flush-to-zero plus approximate
# transcendentals, and __CUDA_ARCH_LIST__ (which nvcc defines in both passes and ggml's arch checks read)
# is what nvcc 12.9 defines for -arch=sm_70.
CLANG_FLAGS = [
    *(f for f in NVCC_FLAGS if f.startswith("-D")),
    "-O3",
    "-fPIC",
    "-std=c++17",
    "-fcuda-flush-denormals-to-zero",
    "-fgpu-approx-transcendentals",
    "-D__CUDA_ARCH_LIST__=700",
    "-Wno-unknown-cuda-version",  # clang 19 knows CUDA up to 12.5 and treats 12.9 as that
    "-Wno-unused-command-line-argument",
    "-x",
    "cuda",
    "--cuda-gpu-arch=sm_70",
]
EM_CUDA = 190
REPO = Path(__file__).resolve().parent.parent


def cubin_arch(path: Path) -> tuple[int, int]:
    """(sm, virtual sm) of a CUDA ELF (cubin) from its header, for the ELF ABI ptxas 12 writes (v7)."""
    head = path.read_bytes()[:64]
    assert head[:4] == b"\x7fELF" and head[4] == 2, f"{path.name}: not an ELF64 file"
    (machine,) = struct.unpack_from("<H", head, 18)
    assert machine == EM_CUDA, f"{path.name}: e_machine {machine} is not EM_CUDA"
    assert head[8] == 7, f"{path.name}: CUDA ELF ABI version {head[8]} (expected 7, CUDA 12)"
    (flags,) = struct.unpack_from("<I", head, 48)
    return flags & 0xFF, (flags >> 16) & 0xFF


@pytest.fixture(scope="module")
def sm70(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """clang -c of the hooked ggml-cuda.cu, ggml-dispatch.cu (device pass for sm_70 and host pass) and
    of an MMQ instance (the hooked mmq.cuh, device pass), against the CUDA 12.9 root of PyPI wheels."""
    if CLANG is None:
        # .ci/run installs it and says loudly when it could not (no package mirror on that machine)
        pytest.skip("clang++-19 is not installed (apt-get install clang-19)")
    if platform.machine() != "x86_64":
        pytest.skip("the CUDA 12 root is made of x86_64 Linux wheels")
    root = fetch.cuda12_root()
    work = tmp_path_factory.mktemp("sm70")
    pinned = fetch.llama_cpp_dir()
    tree = native_shared.patched_tree(tmp_path_factory)  # the pinned ggml, hooked (read only)
    includes = [f"-I{tree / 'ggml/src'}", f"-I{tree / 'ggml/include'}", f"-I{fetch.cublas_headers()}"]
    sources = {
        "ggml-cuda": tree / CUDA / "ggml-cuda.cu",
        "ggml-dispatch": tree / CUDA / "ggml-dispatch.cu",
        "mmq-q4_0": tree / CUDA / "template-instances" / "mmq-instance-q4_0.cu",
    }
    jobs = [(name, "device") for name in sources] + [("ggml-cuda", "host"), ("ggml-dispatch", "host")]

    def compile_one(name: str, side: str) -> subprocess.CompletedProcess[str]:
        assert CLANG is not None
        args = [CLANG, f"--cuda-path={root}", f"--cuda-{side}-only", *CLANG_FLAGS, *includes]
        args += ["-c", str(sources[name]), "-o", str(work / f"{name}.{side}.o")]
        return subprocess.run(args, capture_output=True, text=True)

    def compile_harness() -> subprocess.CompletedProcess[str]:
        # the harness's CUDA part is host code against the CUDA runtime API (its GPU provenance)
        cxx = shutil.which("g++") or shutil.which("c++") or "c++"
        args = [cxx, "-std=c++17", "-O1", "-DTUNER_WITH_CUDART", f"-I{root / 'include'}", *includes[:2]]
        args += [f"-I{tree / CUDA}", f"-I{REPO / 'ggml_dispatch/hook/native'}", f"-I{pinned / 'vendor'}"]
        args += ["-c", str(REPO / "ggml_dispatch/tuner/harness/bench.cpp"), "-o", str(work / "bench.host.o")]
        return subprocess.run(args, capture_output=True, text=True)

    with ThreadPoolExecutor(2) as ex:
        futures = {f"{n}.{s}": ex.submit(compile_one, n, s) for n, s in jobs}
        futures["bench.host"] = ex.submit(compile_harness)
        results: dict[str, Any] = {k: f.result() for k, f in futures.items()}
    results["dir"] = work
    results["root"] = root
    return results


def test_cuda12_root_from_pypi_wheels_is_cuda_12_9(sm70: dict[str, Any]) -> None:
    root: Path = sm70["root"]
    ptxas = subprocess.run([str(root / "bin" / "ptxas"), "--version"], capture_output=True, text=True)
    assert ptxas.returncode == 0 and "release 12.9" in ptxas.stdout, ptxas.stdout + ptxas.stderr
    cuda_h = (root / "include" / "cuda.h").read_text()
    assert re.search(r"#define CUDA_VERSION 12090\b", cuda_h)


@pytest.mark.parametrize("name", ["ggml-cuda", "ggml-dispatch", "mmq-q4_0"])
def test_hooked_sources_compile_to_sm70_device_code(sm70: dict[str, Any], name: str) -> None:
    res = sm70[f"{name}.device"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []
    obj: Path = sm70["dir"] / f"{name}.device.o"
    assert cubin_arch(obj) == (70, 70)  # SASS for sm_70 from PTX for compute_70


def test_sm70_mmq_cubin_holds_the_mmq_kernels(sm70: dict[str, Any]) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    res = sm70["mmq-q4_0.device"]
    assert res.returncode == 0, res.stderr[-4000:]
    out = subprocess.run([nm, "-C", str(sm70["dir"] / "mmq-q4_0.device.o")], capture_output=True, text=True)
    kernels = {ln.split(" T ", 1)[1] for ln in out.stdout.splitlines() if " T " in ln}
    # dp4a MMQ on Volta: the q4_0 kernel for every column tile width J the tree compiles (8..128)
    assert any(k.startswith("void mul_mat_q<(ggml_type)2, 128,") for k in kernels), sorted(kernels)[:5]
    assert any(k.startswith("void mul_mat_q<(ggml_type)2, 8,") for k in kernels), sorted(kernels)[:5]


@pytest.mark.parametrize("name", ["ggml-cuda", "ggml-dispatch"])
def test_hooked_sources_compile_for_the_host_of_a_v100_build(sm70: dict[str, Any], name: str) -> None:
    res = sm70[f"{name}.host"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-C", str(sm70["dir"] / f"{name}.host.o")], capture_output=True, text=True)
    kind = "U" if name == "ggml-cuda" else "T"
    assert re.search(rf"^\s*[0-9a-f]*\s+{kind} ggml_cuda_dispatch_begin_mul_mat", out.stdout, re.M)


def test_harness_cuda_runtime_queries_compile_against_cuda12_headers(sm70: dict[str, Any]) -> None:
    res = sm70["bench.host"]
    assert res.returncode == 0, res.stderr[-4000:]
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, str(sm70["dir"] / "bench.host.o")], capture_output=True, text=True).stdout
    needed = {ln.split()[-1] for ln in out.splitlines() if ln.strip().startswith("U cuda")}
    # CUDA 12's headers map cudaGetDeviceProperties to its _v2 entry point
    assert {"cudaGetDeviceProperties_v2", "cudaRuntimeGetVersion", "cudaDriverGetVersion"} <= needed, needed
