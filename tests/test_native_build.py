"""Native builds of a pinned tree with the hook installed (no GPU needed).

* ``nvcc -c`` for sm_90 of the patched ``ggml-cuda.cu`` and of ``ggml-dispatch.cu`` (no table and a
  one-rule table), with the flags of llama.cpp's own CUDA build; the hook's symbols resolve.
* The eligibility check held against the tree's own ``ggml_cuda_should_use_*`` (taken verbatim out of
  mmvf.cu / mmf.cu / mmvq.cu / mmq.cu) on a grid of shapes, types and cc values, for a build of every
  arch and for an sm_90-only build; a check with one hard limit removed is caught.
* A CPU-only ggml build (``add_subdirectory(<tree>/ggml)``, ``-DGGML_NATIVE=OFF``) with the hook installed
  builds and runs a MUL_MAT probe, with the installed C headers compiled as C11.

Each build happens once per module (temporary folders); the pinned tree itself is never modified.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from codegen import install as inst
from ggml_dispatch import fetch

pytestmark = pytest.mark.slow

NATIVE_TESTS = Path(__file__).parent / "native"
CUDA = Path("ggml/src/ggml-cuda")
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")

# The host/device flags llama.cpp's CMake uses for ggml-cuda (GGML_CUDA_GRAPHS on, as llama.cpp builds it).
NVCC_FLAGS = [
    "-forward-unknown-to-host-compiler",
    "-DGGML_BACKEND_BUILD",
    "-DGGML_BACKEND_SHARED",
    "-DGGML_CUDA_USE_GRAPHS",
    "-DGGML_SCHED_MAX_COPIES=4",
    "-DGGML_SHARED",
    "-D_GNU_SOURCE",
    "-D_XOPEN_SOURCE=600",
    "-O3",
    "-DNDEBUG",
    "--generate-code=arch=compute_90,code=[compute_90,sm_90]",
    "-Xcompiler=-fPIC",
    "-use_fast_math",
    "-extended-lambda",
    "-Xcompiler=-Wmissing-declarations,-Wmissing-noreturn,-Wall,-Wextra,-Wcast-qual,-Wno-unused-function,"
    "-Wno-array-bounds,-Wextra-semi",
    "-std=c++17",
    "-x",
    "cu",
]

# Functions taken verbatim out of the tree (file -> name patterns): the tree's own hard+soft checks.
TREE_FUNCTIONS = {
    "mmvf.cu": [r"ggml_cuda_should_use_mmvf"],
    "mmf.cu": [r"mmf_get_rows_per_block", r"ggml_cuda_should_use_mmf"],
    "mmvq.cu": [
        r"get_mmvq_mmid_max_batch_(?:pascal_older|turing_plus|gcn|cdna|rdna\w+)",
        r"get_mmvq_mmid_max_batch",
        r"ggml_cuda_should_use_mmvq",
    ],
    "mmq.cu": [r"ggml_cuda_should_use_mmq"],
}


def extract_functions(src: str, name_pattern: str) -> list[str]:
    """Top-level function definitions whose name matches ``name_pattern`` (not declarations, not calls)."""
    found = []
    for m in re.finditer(r"^(?![ \t#/])[^\n;{}]*?\b(" + name_pattern + r")\s*\(", src, re.M):
        depth, j = 0, m.end() - 1
        while True:
            depth += {"(": 1, ")": -1}.get(src[j], 0)
            if depth == 0:
                break
            j += 1
        k = j + 1
        while src[k] in " \t\n":
            k += 1
        if src[k] != "{":
            continue
        depth, e = 0, k
        while True:
            depth += {"{": 1, "}": -1}.get(src[e], 0)
            if depth == 0:
                break
            e += 1
        found.append(src[m.start() : e + 1])
    return found


def tree_should_use_source(cuda_dir: Path) -> str:
    parts = []
    for fname, patterns in TREE_FUNCTIONS.items():
        src = (cuda_dir / fname).read_text()
        for pat in patterns:
            funcs = extract_functions(src, pat)
            assert funcs, f"{fname}: no definition of {pat}"
            parts += [f"// {fname} (verbatim)\n{f}\n" for f in funcs]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pinned = fetch.llama_cpp_dir()
    tree = tmp_path_factory.mktemp("tree") / "llama.cpp"
    tree.mkdir()
    shutil.copytree(pinned / "ggml", tree / "ggml", symlinks=True)
    shutil.copy2(pinned / "UPSTREAM_COMMIT", tree / "UPSTREAM_COMMIT")
    inst.install(tree)
    return tree


@pytest.fixture(scope="module")
def cublas_include() -> Path:
    return fetch.cublas_headers()


def _hook_warnings(stderr: str) -> list[str]:
    """Compiler warnings located in the hook's files (CUDA's own headers may warn; not our business)."""
    return [ln for ln in stderr.splitlines() if "warning" in ln and "dispatch" in ln.split("warning")[0]]


def _nvcc(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    return subprocess.run([NVCC, *args], cwd=cwd, capture_output=True, text=True)


def _includes(tree: Path, cublas: Path) -> list[str]:
    return [f"-I{tree / 'ggml/src'}", f"-I{tree / 'ggml/include'}", f"-I{cublas}"]


@pytest.fixture(scope="module")
def cuda_objects(
    patched_tree: Path, cublas_include: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, subprocess.CompletedProcess[str]]:
    """nvcc -c of the patched ggml-cuda.cu and of ggml-dispatch.cu, in parallel."""
    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    out = tmp_path_factory.mktemp("objs")
    inc = _includes(patched_tree, cublas_include)
    jobs = {
        "ggml-cuda": [
            *NVCC_FLAGS,
            *inc,
            "-c",
            str(patched_tree / CUDA / "ggml-cuda.cu"),
            "-o",
            "ggml-cuda.o",
        ],
        "ggml-dispatch": [
            *NVCC_FLAGS,
            *inc,
            "-c",
            str(patched_tree / CUDA / "ggml-dispatch.cu"),
            "-o",
            "ggml-dispatch.o",
        ],
    }
    with ThreadPoolExecutor(2) as ex:
        futures = {k: ex.submit(_nvcc, v, out) for k, v in jobs.items()}
        results = {k: f.result() for k, f in futures.items()}
    results["dir"] = subprocess.CompletedProcess([], 0, str(out), "")
    return results


@needs_nvcc
def test_nvcc_compiles_patched_ggml_cuda_for_sm90(
    cuda_objects: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    res = cuda_objects["ggml-cuda"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []


@needs_nvcc
def test_nvcc_compiles_dispatch_source_without_warnings(
    cuda_objects: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    res = cuda_objects["ggml-dispatch"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []


@needs_nvcc
def test_hook_symbols_resolve(cuda_objects: dict[str, subprocess.CompletedProcess[str]]) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    objs = Path(cuda_objects["dir"].stdout)
    for k in ("ggml-cuda", "ggml-dispatch"):
        assert cuda_objects[k].returncode == 0, cuda_objects[k].stderr[-2000:]

    def symbols(obj: str, kind: str) -> set[str]:
        out = subprocess.run([nm, "-C", str(objs / obj)], capture_output=True, text=True, check=True).stdout
        found = (re.match(r"^\s*[0-9a-fA-F]*\s+([A-Za-z])\s+(.*)$", ln) for ln in out.splitlines())
        return {m.group(2) for m in found if m and m.group(1) == kind and "dispatch" in m.group(2)}

    needed = symbols("ggml-cuda.o", "U")
    defined = symbols("ggml-dispatch.o", "T") | symbols("ggml-dispatch.o", "B")
    assert any("ggml_cuda_dispatch_select_mul_mat" in s for s in needed)
    assert any("ggml_backend_cuda_dispatch_get_counts" in s for s in needed)
    assert needed <= defined, needed - defined


@needs_nvcc
def test_nvcc_compiles_dispatch_source_with_a_table(
    patched_tree: Path, cublas_include: Path, tmp_path: Path
) -> None:
    pytest.importorskip("codegen.render")
    from codegen import table

    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = (patched_tree / "UPSTREAM_COMMIT").read_text().strip()
    t["provenance"] = {"source": "measured"}
    t["rules"] = [
        {
            "op": "MUL_MAT",
            "layout": "weight",
            "src0_type": "q4_K",
            "src1_type": "f32",
            "N": 4096,
            "K": 4096,
            "B": 1,
        }
        | {"M_lo": 256, "M_hi": 2048, "route": "cublas"},
        {"op": "MUL_MAT", "layout": "weight", "src0_type": "q4_K", "src1_type": "f32", "N": 0, "K": 0, "B": 1}
        | {"M_lo": 9, "M_hi": 64, "route": "mmq"},
    ]
    tree = tmp_path / "llama.cpp"
    (tree / CUDA).mkdir(parents=True)
    for p in (patched_tree / CUDA).iterdir():
        if p.name.startswith("ggml-dispatch") or p.name in ("ggml-cuda.cu", "mmq.cu"):
            shutil.copy2(p, tree / CUDA / p.name)
    shutil.copy2(patched_tree / "UPSTREAM_COMMIT", tree / "UPSTREAM_COMMIT")
    (tmp_path / "table.json").write_text(table.dumps(t))
    plan = inst.install(tree, table_path=tmp_path / "table.json")
    assert str(CUDA / inst.TABLE_HEADER) in plan.writes
    header = (tree / CUDA / inst.TABLE_HEADER).read_text()
    assert "#define GGML_DISPATCH_TABLE_RULE_COUNT 2" in header
    # compile against the full patched tree, with this table header in front of the no-table one
    res = _nvcc(
        [
            *NVCC_FLAGS,
            f"-I{tree / CUDA}",
            *_includes(patched_tree, cublas_include),
            "-c",
            str(patched_tree / CUDA / "ggml-dispatch.cu"),
            "-o",
            "d.o",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []


# --------------------------------------------------------------------------------------------
# CPU-only ggml build with the hook installed


@pytest.fixture(scope="module")
def cpu_build(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed on this machine")
    build = tmp_path_factory.mktemp("cpu-build")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = subprocess.run(
        [
            cmake,
            "-S",
            str(NATIVE_TESTS / "cpu_probe"),
            "-B",
            str(build),
            *gen,
            f"-DLLAMA_CPP_DIR={patched_tree}",
            "-DGGML_NATIVE=OFF",
            "-DGGML_CUDA=OFF",
            "-DGGML_BUILD_TESTS=OFF",
            "-DGGML_BUILD_EXAMPLES=OFF",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        capture_output=True,
        text=True,
    )
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    res = subprocess.run(
        [cmake, "--build", str(build), "--target", "cpu_probe", "-j", "2"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    return build


def test_cpu_only_build_with_hook_runs_mul_mat(cpu_build: Path) -> None:
    res = subprocess.run([str(cpu_build / "cpu_probe")], capture_output=True, text=True, timeout=120)
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0 and report["ok"], report
    assert report["nmse_f32"] < 1e-10 and report["nmse_q4_0"] < 5e-4
    assert report["cuda_registered"] == 0 and report["cpu_has_dispatch_procs"] == 0
    assert report["table_rules"] == 0 and report["lookup"] == 0 and report["gpu_matches"] == 0


# --------------------------------------------------------------------------------------------
# Eligibility check vs the tree's own ggml_cuda_should_use_*


def _libggml_base(build: Path) -> Path:
    libs = sorted(build.rglob("libggml-base.so")) + sorted(build.rglob("libggml-base.a"))
    if not libs:
        pytest.fail(f"no libggml-base in {build}")
    return libs[0]


def _build_grid(
    tree: Path,
    cublas: Path,
    base: Path,
    work: Path,
    arch_list: str | None,
    eligibility_dir: Path | None = None,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "grid_config.h").write_text(
        f"#define GGML_DISPATCH_TEST_ARCH_LIST {arch_list}\n" if arch_list else "/* nvcc's own arch list */\n"
    )
    (work / "tree_should_use.inc").write_text(tree_should_use_source(tree / CUDA))
    exe = work / "grid"
    first = [f"-I{eligibility_dir}"] if eligibility_dir else []
    args = [
        "-std=c++17",
        "-x",
        "cu",
        "-arch=sm_90",
        "-O1",
        *first,
        f"-I{work}",
        f"-I{tree / CUDA}",
        *_includes(tree, cublas),
        str(NATIVE_TESTS / "eligibility_grid.cu"),
        "-o",
        str(exe),
        f"-L{base.parent}",
        "-lggml-base",
        f"-Xlinker=-rpath={base.parent}",
    ]
    return exe, _nvcc(args, work)


@pytest.fixture(scope="module")
def grids(
    patched_tree: Path, cublas_include: Path, cpu_build: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    base = _libggml_base(cpu_build)
    work = tmp_path_factory.mktemp("grid")
    # a check with the 48 KiB MMQ shared-memory limit removed: the grid must catch it
    mutant = work / "mutant-include"
    mutant.mkdir()
    src = (patched_tree / CUDA / "ggml-dispatch-eligibility.cuh").read_text()
    broken = src.replace("if (dev.smpbo < 48 * 1024) {", "if (dev.smpbo < 1) {")
    assert broken != src
    (mutant / "ggml-dispatch-eligibility.cuh").write_text(broken)
    variants = {
        "all": ("700,750,800,890,900,1200", None),
        "sm90": ("900", None),
        "mutant": ("700,750,800,890,900,1200", mutant),
    }
    with ThreadPoolExecutor(2) as ex:
        futures = {
            k: ex.submit(_build_grid, patched_tree, cublas_include, base, work / k, arch, inc)
            for k, (arch, inc) in variants.items()
        }
        built = {k: f.result() for k, f in futures.items()}
    out: dict[str, dict[str, Any]] = {}
    for k, (exe, res) in built.items():
        assert res.returncode == 0, f"{k}: {res.stderr[-4000:]}"
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        out[k] = {"rc": run.returncode, **json.loads(run.stdout)}
    return out


@needs_nvcc
def test_eligibility_holds_against_tree_for_every_arch(grids: dict[str, dict[str, Any]]) -> None:
    g = grids["all"]
    assert g["arch_list"] == "700,750,800,890,900,1200"
    assert g["rc"] == 0 and g["violations"] == 0, g["messages"]
    assert g["points"] > 1_000_000
    # the grid really exercises every route and every hard limit it claims to
    for route in ("mmvf", "mmf", "mmvq", "mmq", "cublas"):
        assert g["eligible"][route] > 0, route
    for route in ("mmvf", "mmf", "mmvq", "mmq"):
        assert g["tree_yes"][route] > 0 and g["c2_checked"][route] > 0, route
    for why in ("vendor", "no_device_code", "src0_type", "batch", "align", "rows", "cols", "smem", "convert"):
        assert g["why"][why] > 0, why
    # upstream hazards (Q8_K to mmvq, strided K-quants to cuBLAS) are refused, never forced
    assert g["hazards"] > 0


@needs_nvcc
def test_eligibility_holds_for_an_sm90_only_build(grids: dict[str, dict[str, Any]]) -> None:
    g = grids["sm90"]
    assert g["arch_list"] == "900"
    assert g["rc"] == 0 and g["violations"] == 0, g["messages"]
    # cc below 900 has no device code in such a build: every route refused there
    assert g["why"]["no_device_code"] > grids["all"]["why"]["no_device_code"]


@needs_nvcc
def test_grid_catches_a_missing_hard_limit(grids: dict[str, dict[str, Any]]) -> None:
    g = grids["mutant"]
    assert g["rc"] != 0 and g["violations"] > 0
    assert any("mmq" in m and "tree no, check ok" in m for m in g["messages"])
