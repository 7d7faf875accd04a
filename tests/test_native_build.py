"""Native builds of a pinned tree with the hook installed (no GPU needed).

* ``nvcc -c`` for sm_90 of the patched ``ggml-cuda.cu`` and of ``ggml-dispatch.cu`` (no table and a
  one-rule table), with the flags of llama.cpp's own CUDA build; the hook's symbols resolve.
* The eligibility check held against the tree's own ``ggml_cuda_should_use_*`` (taken verbatim out of
  mmvf.cu / mmf.cu / mmvq.cu / mmq.cu) on a grid of shapes, types and cc values, for a build of every
  arch and for an sm_90-only build; a check with one hard limit removed is caught.
* A CPU-only ggml build (``add_subdirectory(<tree>/ggml)``, ``-DGGML_NATIVE=OFF``) with the hook installed
  builds and runs a MUL_MAT probe, with the installed C headers compiled as C11.

Each build happens once per module (temporary folders); the hooked tree, its CPU-only build and convert.o
are made once per session for this file, tests/test_native_fattn.py and tests/test_native_volta.py
(tests/native_shared.py). The pinned tree itself is never modified.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import native_shared
import pytest

from ggml_dispatch import fetch, registry
from ggml_dispatch.hook import install as inst

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

# GGML_CUDA_FA_<K>_<V> and GGML_CUDA_FA_QUANTS as the tree's CMake (ggml_cuda_fattn_vec_instances, default
# GGML_CUDA_FA_QUANTS) adds them to every unit
_FA_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16")
_FA_DEFAULT = {"q4_0-q4_0", "q8_0-q8_0", "f16-f16", "bf16-bf16"}
FA_DEFINES = [
    f"-DGGML_CUDA_FA_{k.upper()}_{v.upper()}={int(f'{k}-{v}' in _FA_DEFAULT)}"
    for k in _FA_TYPES
    for v in _FA_TYPES
]
FA_QUANTS_DEFINE = '-DGGML_CUDA_FA_QUANTS="q4_0-q4_0,q8_0-q8_0,f16-f16,bf16-bf16"'
# one mmvq candidate pair for one type (a compile definition wins over the build header's list): the full
# default set of the hooked mmvq.cu takes minutes (docs/mmvq-configs.md)
MMVQ_ONE = ['-DGGML_DISPATCH_MMVQ_CONFIGS="8x1"', '-DGGML_DISPATCH_MMVQ_TYPES="q4_K"']


def tree_flags(tree: Path) -> list[str]:
    """NVCC_FLAGS, and the FlashAttention defines where the tree's CMake adds them to every unit."""
    fa = "ggml_cuda_fattn_vec_instances" in (tree / CUDA / "CMakeLists.txt").read_text()
    return [*NVCC_FLAGS, *FA_DEFINES, FA_QUANTS_DEFINE] if fa else list(NVCC_FLAGS)


def unit_args(tree: Path, cublas: Path, unit: str, extra: Sequence[str] = ()) -> list[str]:
    """nvcc's arguments (no -o) for one unit of ggml-cuda (``unit`` relative to it) with the tree's flags:
    the same words in every test file, so that native_shared.compiled(..., tree=) compiles it once."""
    return [*tree_flags(tree), *_includes(tree, cublas), *extra, "-c", str(tree / CUDA / unit)]


def compile_unit(
    tmp_path_factory: pytest.TempPathFactory,
    tree: Path,
    cublas: Path,
    unit: str,
    extra: Sequence[str] = (),
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """nvcc -c of one unit with unit_args, once per session for trees of the same bytes
    (tests/native_shared.py): (the object, nvcc's result)."""
    assert NVCC is not None
    output = Path(unit).with_suffix(".o").name
    return native_shared.compiled(
        tmp_path_factory, NVCC, unit_args(tree, cublas, unit, extra), output, tree=tree
    )


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
    """The pinned ggml with the hook installed (one copy per session, shared: tests/native_shared.py)."""
    return native_shared.patched_tree(tmp_path_factory)


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
    """nvcc -c of the patched ggml-cuda.cu, ggml-dispatch.cu, an mmq instance (the patched mmq.cuh) and
    convert.cu (the converters the eligibility check asks for, linked into the programs below). The first
    two with the tree's flags (tree_flags), compiled once for this file and tests/test_compat_matrix.py's
    pinned tree (ggml-dispatch.cu for tests/test_native_fattn.py too): tests/native_shared.py."""
    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    out = tmp_path_factory.mktemp("objs")
    inc = _includes(patched_tree, cublas_include)
    mmq = [
        *NVCC_FLAGS,
        *inc,
        "-c",
        str(patched_tree / CUDA / "template-instances" / "mmq-instance-q4_k.cu"),
        "-o",
        "mmq-q4_k.o",
    ]
    # convert.cu: the same command line as tests/test_native_volta.py's, compiled once for both
    convert = [*NVCC_FLAGS, *inc, "-c", str(patched_tree / CUDA / "convert.cu")]
    with ThreadPoolExecutor(2) as ex:
        shared = {
            k: ex.submit(compile_unit, tmp_path_factory, patched_tree, cublas_include, f"{k}.cu")
            for k in ("ggml-cuda", "ggml-dispatch")
        }
        own = ex.submit(_nvcc, mmq, out)
        shared["convert"] = ex.submit(
            native_shared.compiled, tmp_path_factory, str(NVCC), convert, "convert.o"
        )
        results = {"mmq-q4_k": own.result()}
        for k, f in shared.items():
            obj, results[k] = f.result()
            if results[k].returncode == 0:
                shutil.copy2(obj, out / f"{k}.o")
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
def test_nvcc_compiles_an_mmq_instance_with_the_patched_mmq_for_sm90(
    cuda_objects: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    res = cuda_objects["mmq-q4_k"]
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
    for k in ("ggml-cuda", "ggml-dispatch", "mmq-q4_k"):
        assert cuda_objects[k].returncode == 0, cuda_objects[k].stderr[-2000:]

    def symbols(obj: str, kind: str) -> set[str]:
        out = subprocess.run([nm, "-C", str(objs / obj)], capture_output=True, text=True, check=True).stdout
        found = (re.match(r"^\s*[0-9a-fA-F]*\s+([A-Za-z])\s+(.*)$", ln) for ln in out.splitlines())
        return {m.group(2) for m in found if m and m.group(1) == kind and "dispatch" in m.group(2)}

    needed = symbols("ggml-cuda.o", "U")
    defined = symbols("ggml-dispatch.o", "T") | symbols("ggml-dispatch.o", "B")
    assert any("ggml_cuda_dispatch_begin_mul_mat" in s for s in needed)
    assert any("ggml_cuda_dispatch_end_mul_mat" in s for s in needed)
    assert any("ggml_dispatch_params_current" in s for s in needed)
    # the patched mmq.cuh reads the parameters: every mmq instance needs them from ggml-dispatch.o
    mmq_needed = symbols("mmq-q4_k.o", "U")
    assert any("ggml_dispatch_params_current" in s for s in mmq_needed)
    assert mmq_needed <= defined, mmq_needed - defined
    assert any("ggml_backend_cuda_dispatch_get_counts" in s for s in needed)
    assert needed <= defined, needed - defined


def h200_table(commit: str) -> dict[str, Any]:
    from ggml_dispatch.codegen import table

    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = commit
    t["provenance"] = {"source": "measured"}
    weight = {"op": "MUL_MAT", "layout": "weight", "src1_type": "f32", "B": 1}
    t["rules"] = [
        weight | {"src0_type": "q4_K", "N": 4096, "K": 4096, "M_lo": 256, "M_hi": 2048, "route": "cublas"},
        weight | {"src0_type": "q4_K", "N": 0, "K": 0, "M_lo": 9, "M_hi": 64, "route": "mmq"},
        weight | {"src0_type": "q4_0", "N": 4096, "K": 4096, "M_lo": 2, "M_hi": 64, "route": "mmq"},
    ]
    return t


@pytest.fixture(scope="module")
def table_object(
    patched_tree: Path, cublas_include: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """ggml-dispatch.cu compiled with a rendered three-rule table (a copy of the hook's files + table)."""
    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    pytest.importorskip("ggml_dispatch.codegen.render")
    from ggml_dispatch.codegen import table

    work = tmp_path_factory.mktemp("table")
    tree = work / "llama.cpp"
    (tree / CUDA).mkdir(parents=True)
    for p in (patched_tree / CUDA).iterdir():
        if p.name.startswith("ggml-dispatch") or p.name in inst.HOOK_SPECS:
            shutil.copy2(p, tree / CUDA / p.name)
    shutil.copy2(patched_tree / "UPSTREAM_COMMIT", tree / "UPSTREAM_COMMIT")
    (work / "table.json").write_text(table.dumps(h200_table((tree / "UPSTREAM_COMMIT").read_text().strip())))
    plan = inst.install(tree, table_path=work / "table.json")
    assert set(plan.writes) == {str(CUDA / inst.TABLE_HEADER), str(CUDA / inst.MANIFEST)}
    assert "#define GGML_DISPATCH_TABLE_RULE_COUNT 3" in (tree / CUDA / inst.TABLE_HEADER).read_text()
    # the copy's own directory comes first for its includes (the table header), the tree's after
    res = _nvcc(
        [
            *tree_flags(patched_tree),  # as ggml-dispatch.o without a table (cuda_objects)
            f"-I{patched_tree / CUDA}",
            *_includes(patched_tree, cublas_include),
            "-c",
            str(tree / CUDA / "ggml-dispatch.cu"),
            "-o",
            "ggml-dispatch-table.o",
        ],
        work,
    )
    return work / "ggml-dispatch-table.o", res


@needs_nvcc
def test_nvcc_compiles_dispatch_source_with_a_table(
    table_object: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    obj, res = table_object
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []
    assert obj.is_file()


# --------------------------------------------------------------------------------------------
# CPU-only ggml build with the hook installed


@pytest.fixture(scope="module")
def cpu_build(patched_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/native/cpu_probe (CPU-only ggml, Release) on the patched tree, built with -j 2 in a folder
    shared with the test files that link its libggml-base (tests/native_shared.py)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed on this machine")
    build, cfg, res = native_shared.cpu_build(tmp_path_factory, patched_tree, "cpu_probe")
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    assert res is not None  # configured: the build ran
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
    convert_obj: Path | None = None,
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
        "-c",
        str(NATIVE_TESTS / "eligibility_grid.cu"),
        "-o",
        str(work / "grid.o"),
    ]
    res = _nvcc(args, work)
    if res.returncode != 0:
        return exe, res
    link = [
        "-arch=sm_90",
        str(work / "grid.o"),
        *([str(convert_obj)] if convert_obj else []),
        "-o",
        str(exe),
        f"-L{base.parent}",
        "-lggml-base",
        f"-Xlinker=-rpath={base.parent}",
    ]
    return exe, _nvcc(link, work)


@pytest.fixture(scope="module")
def grids(
    patched_tree: Path,
    cublas_include: Path,
    cpu_build: Path,
    cuda_objects: dict[str, subprocess.CompletedProcess[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    assert cuda_objects["convert"].returncode == 0, cuda_objects["convert"].stderr[-2000:]
    convert_obj = Path(cuda_objects["dir"].stdout) / "convert.o"
    base = _libggml_base(cpu_build)
    work = tmp_path_factory.mktemp("grid")
    # a check with the 48 KiB MMQ shared-memory limit removed: the grid must catch it
    mutant = work / "mutant-include"
    mutant.mkdir()
    src = (patched_tree / CUDA / "ggml-dispatch-eligibility.cuh").read_text()
    broken = src.replace("if (dev.smpbo < 48 * 1024) {", "if (dev.smpbo < 1) {")
    # and mmq's split allowed without the J its light side runs
    broken2 = broken.replace("if (p.mmq_split != 0 && p.mmq_J == 0) {", "if (false) {")
    # and 2j_wave allowed with stream-k (whose first launch would then need a fixup buffer)
    broken3 = broken2.replace(
        "if (p.mmq_split_wave != 0 && p.mmq_stream_k != GGML_DISPATCH_MMQ_STREAM_K_TILES) {", "if (false) {"
    )
    # and 2j_fused allowed where rows leave a partial 128-row tile (its kernels have no fallback variant)
    broken4 = broken3.replace(
        "GGML_DISPATCH_MMQ_STREAM_K_TILES && !fallback && !q4 &&",
        "GGML_DISPATCH_MMQ_STREAM_K_TILES && !q4 &&",
    )
    assert src != broken != broken2 != broken3 != broken4
    broken = broken4
    (mutant / "ggml-dispatch-eligibility.cuh").write_text(broken)
    # beside it, so that its own include of the MUL_MAT check finds the mutant
    shutil.copy2(patched_tree / CUDA / "ggml-dispatch-eligibility-id.cuh", mutant)
    variants = {
        "all": ("700,750,800,890,900,1200", None),
        "sm90": ("900", None),
        "mutant": ("700,750,800,890,900,1200", mutant),
    }
    with ThreadPoolExecutor(2) as ex:
        futures = {
            k: ex.submit(_build_grid, patched_tree, cublas_include, base, work / k, arch, inc, convert_obj)
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
    assert 0 < g["configs_eligible"] < g["configs"]
    assert g["fused_eligible"] > 0  # split=2j_fused runs somewhere in the grid (and is held to its limits)
    assert g["fit_eligible"] > 0
    assert 0 < g["sorted_eligible"] < g["points"]  # id_sorted runs where its asserts hold, and only there
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
    assert any("C6 mmq split on MUL_MAT_ID (ok, J=0)" in m for m in g["messages"])
    assert any("C6 mmq split=2j_wave on MUL_MAT_ID (ok" in m for m in g["messages"])
    assert any("C6 mmq split=2j_fused on MUL_MAT_ID (ok" in m for m in g["messages"])


# --------------------------------------------------------------------------------------------
# The real ggml-dispatch.cu driven without a GPU (tests/native/glue_driver.cu)

GLUE_EXTRA_FUNCTIONS = {"fwht.cu": [r"ggml_cuda_op_mul_mat_use_fwht"]}


@pytest.fixture(scope="module")
def glue(
    patched_tree: Path,
    cublas_include: Path,
    cpu_build: Path,
    cuda_objects: dict[str, subprocess.CompletedProcess[str]],
    table_object: tuple[Path, subprocess.CompletedProcess[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Two driver programs: with the hook's no-table object and with the three-rule table object."""
    assert cuda_objects["ggml-dispatch"].returncode == 0, cuda_objects["ggml-dispatch"].stderr[-2000:]
    assert table_object[1].returncode == 0, table_object[1].stderr[-2000:]
    work = tmp_path_factory.mktemp("glue")
    inc = tree_should_use_source(patched_tree / CUDA)
    for fname, patterns in GLUE_EXTRA_FUNCTIONS.items():
        src = (patched_tree / CUDA / fname).read_text()
        for pat in patterns:
            funcs = extract_functions(src, pat)
            assert funcs, f"{fname}: no definition of {pat}"
            inc += "".join(f"\n// {fname} (verbatim)\n{f}\n" for f in funcs)
    (work / "tree_should_use.inc").write_text(inc)
    res = _nvcc(
        [
            *NVCC_FLAGS,
            f"-I{work}",
            f"-I{patched_tree / CUDA}",
            *_includes(patched_tree, cublas_include),
            "-c",
            str(NATIVE_TESTS / "glue_driver.cu"),
            "-o",
            "glue_driver.o",
        ],
        work,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    libdir = _libggml_base(cpu_build).parent
    objs = Path(cuda_objects["dir"].stdout)
    exes = {}
    for name, obj in (("no_table", objs / "ggml-dispatch.o"), ("table", table_object[0])):
        exe = work / f"glue_{name}"
        link = _nvcc(
            [
                "glue_driver.o",
                str(obj),
                str(objs / "convert.o"),
                "-o",
                str(exe),
                f"-L{libdir}",
                "-lggml",
                "-lggml-base",
                "-lggml-cpu",
                "-Xlinker=--wrap=cudaGetDeviceProperties",
                "-Xlinker=--wrap=cublasGetProperty",
                f"-Xlinker=-rpath={libdir}",
            ],
            work,
        )
        assert link.returncode == 0, link.stderr[-4000:]
        exes[name] = exe
    return exes


def run_glue(exe: Path, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_CUDA_", "GLUE_"))} | env
    res = subprocess.run([str(exe)], capture_output=True, text=True, env=full, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    lines = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    out: dict[str, Any] = {"cases": {}}
    for obj in lines:
        if "case" in obj:
            out["cases"][obj["case"]] = obj["run"]
        else:
            out.update(obj)
    return out, res.stderr


STOCK = {
    "q4_0 M=8": "mmvq",
    "q4_0 M=512": "mmq",
    "f16 M=8": "mmf",
    "f16 M=1": "mmvf",
    "f32 N=1 M=100": "mmvf_t",
}


@needs_nvcc
def test_the_split_wave_grid_is_whole_tiles_per_block_within_two_blocks_per_sm(
    glue: dict[str, Path],
) -> None:
    out, _ = run_glue(glue["no_table"], {})
    got = {(n, sm): b for n, sm, b in out["wave_blocks"]}
    # qwen3moe-a3b: gate/up 6 row tiles x 2 column tiles x 128 experts, down 16 x 2 x 128
    assert got[(1536, 132)] == 256 and got[(4096, 132)] == 256
    assert got[(200, 132)] == 200  # fewer tiles than two per SM: one block each
    assert got[(1031, 132)] == 1031  # prime: no divisor near one wave, one block per tile
    assert got[(411, 132)] == 137  # 3 x 137: the largest divisor within 264
    for (n, sm), b in got.items():
        assert n % b == 0 and (b <= 2 * sm or b == n)  # every block's range is whole tiles: no fixup


@needs_nvcc
def test_glue_default_mode_runs_stock_and_traces_it(glue: dict[str, Path], tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    out, log = run_glue(glue["no_table"], {"GGML_CUDA_ROUTE_TRACE": str(trace)})
    assert out["active"] is True
    assert set(out["cases"].values()) == {"stock"}  # nothing requested: stock runs
    assert "no dispatch table compiled in" in log and str(trace) in log
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    header, routes, footer = recs[0], recs[1:-1], recs[-1]
    assert header["kind"] == "header" and footer["kind"] == "footer" and footer["records"] == len(routes)
    assert header["devices"][0] == {
        "id": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-01020304-0506-0708-090a-0b0c0d0e0f10",
        "cc": 900,
        "sm_count": 132,
        "smpbo": 232448,
        "vram_mib": 143771,  # from cudaDeviceProp.totalGlobalMem (the tree leaves total_vram unset)
    }
    assert header["patch_hash"] == inst.patch_hash(inst.native_sources(), inst.load_specs())
    assert header["upstream_commit"] == (fetch.llama_cpp_dir() / "UPSTREAM_COMMIT").read_text().strip()
    assert header["table_hash"] is None and header["build"]["cuda_arch_list"] == "900"
    assert header["build"]["options"]["GGML_CUDA_GRAPHS"] is True
    by_tensor = {(r["tensor"], r["src1_ne"][1], r["fused"]): r for r in routes}
    assert by_tensor[("blk.0.attn_q.weight", 8, None)]["route"] == "mmvq"
    assert by_tensor[("blk.0.attn_q.weight", 512, None)]["route"] == "mmq"
    assert by_tensor[("blk.0.ffn_down.weight", 8, None)]["route"] == "mmf"
    assert by_tensor[("blk.0.ffn_down.weight", 1, None)]["route"] == "mmvf"
    assert by_tensor[("col", 100, None)]["route"] == "mmvf_t"
    att = by_tensor[("cache_k_l0 (view) (permuted)", 7, None)]
    assert (
        att["layout"] == "attention" and att["src0_ne"] == [64, 512, 3, 1] and att["src1_ne"] == [64, 7, 9, 1]
    )
    moe = [r for r in routes if r["op"] == "MUL_MAT_ID"]
    assert len(moe) == 1 and moe[0]["layout"] == "expert" and moe[0]["route"] == "mmvq"
    fused = [r for r in routes if r["fused"]]
    assert {r["tensor"] for r in fused} == {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}
    assert all(r["fused"] == "glu" and r["reason"] == "fused" and r["route"] == "mmvq" for r in fused)
    assert all(r["reason"] in ("stock", "fused") and r["route"] == r["stock_route"] for r in routes)
    # the captured node counts once at capture and once per replay (1 + 3)
    assert by_tensor[("blk.0.attn_q.weight", 8, None)]["count"] == 1 + 4
    assert out["graph_nodes"] == 4 and out["stale"] == [False, True, False]
    assert sum(r["count"] for r in routes) == sum(out["counts"]["ran"])


@pytest.mark.parametrize(
    ("mode", "forced", "ineligible"),
    [
        # the MUL_MAT_ID node (q4_0 experts, 5 tokens) runs mmq and mmvq with ids, nothing else
        (
            "force:mmq",
            {"q4_0 M=8", "q4_0 M=512", "moe q4_0 M=5"},
            {"f16 M=8", "f16 M=1", "attention f16 M=7 B=9", "f32 N=1 M=100"},
        ),
        (
            "force:mmvq",
            {"q4_0 M=8", "moe q4_0 M=5"},
            {"q4_0 M=512", "f16 M=8", "f16 M=1", "attention f16 M=7 B=9", "f32 N=1 M=100"},
        ),
        (
            "force:mmvf",
            {"f16 M=8", "f16 M=1", "attention f16 M=7 B=9"},
            {"q4_0 M=8", "q4_0 M=512", "f32 N=1 M=100", "moe q4_0 M=5"},
        ),
        (
            "force:mmf",
            {"f16 M=8", "f16 M=1", "attention f16 M=7 B=9"},
            {"q4_0 M=8", "q4_0 M=512", "f32 N=1 M=100", "moe q4_0 M=5"},
        ),
        ("force:cublas", set(STOCK) | {"attention f16 M=7 B=9"}, {"moe q4_0 M=5"}),
        (
            "override:4",
            {"q4_0 M=8", "q4_0 M=512", "moe q4_0 M=5"},
            {"f16 M=8", "f16 M=1", "attention f16 M=7 B=9", "f32 N=1 M=100"},
        ),
    ],
)
@needs_nvcc
def test_glue_forced_routes_only_where_eligible(
    glue: dict[str, Path], tmp_path: Path, mode: str, forced: set[str], ineligible: set[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    env = {"GGML_CUDA_ROUTE_TRACE": str(trace)}
    if mode.startswith("override:"):
        env["GLUE_OVERRIDE"] = mode.split(":")[1]
        route = "mmq"
    else:
        env["GGML_CUDA_DISPATCH"] = mode
        route = mode.split(":")[1]
    out, log = run_glue(glue["no_table"], env)
    assert {c for c, r in out["cases"].items() if r != "stock"} == forced
    assert all(out["cases"][c] == route for c in forced)
    routes = [json.loads(ln) for ln in trace.read_text().splitlines()][1:-1]
    mm = [r for r in routes if r["op"] in ("MUL_MAT", "MUL_MAT_ID") and not r["fused"]]
    refused = [r for r in mm if r["reason"].startswith("ineligible:")]
    moe = [r for r in mm if r["op"] == "MUL_MAT_ID"]
    assert len(moe) == 1 and moe[0]["layout"] == "expert" and moe[0]["stock_route"] == "mmvq"
    if mode == "force:cublas":  # cuBLAS serves no MUL_MAT_ID node
        assert moe[0]["reason"] == "ineligible:op" and moe[0]["route"] == "mmvq"
    # every refused node ran its stock route; every forced node ran the forced route
    assert all(r["route"] == r["stock_route"] for r in refused)
    assert all(r["route"] == route for r in mm if r["reason"] == "forced")
    assert len({(r["tensor"], r["src1_ne"][1]) for r in refused}) == len(ineligible)
    counts = out["counts"]
    assert counts["ineligible"] == sum(r["count"] for r in refused) and counts["table"] == 0
    assert counts["forced"] == sum(r["count"] for r in mm if r["reason"] == "forced")
    if mode.startswith("force:"):
        assert f"GGML_CUDA_DISPATCH={mode}" in log


@needs_nvcc
def test_glue_forced_configuration_with_parameters_runs_and_is_traced(
    glue: dict[str, Path], tmp_path: Path
) -> None:
    """force:<config> with parameters (any order) runs the route wherever route and values are eligible;
    the trace records the configuration that ran in canonical form."""
    trace = tmp_path / "trace.jsonl"
    env = {"GGML_CUDA_ROUTE_TRACE": str(trace), "GGML_CUDA_DISPATCH": "force:cublas/compute=f16,out=f32"}
    out, log = run_glue(glue["no_table"], env)
    assert "GGML_CUDA_DISPATCH=force:cublas/out=f32,compute=f16" in log
    assert {c for c, r in out["cases"].items() if r != "stock"} == set(STOCK) | {"attention f16 M=7 B=9"}
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    assert recs[0]["dispatch"]["force_config"] == "cublas/out=f32,compute=f16"
    mm = [r for r in recs[1:-1] if r["op"] == "MUL_MAT" and not r["fused"]]
    forced = [r for r in mm if r["reason"] == "forced"]
    config = "cublas/out=f32,compute=f16"
    assert forced and all(r["route"] == "cublas" and r["config"] == config for r in forced)
    assert all(r["config"] == r["route"] for r in mm if r["reason"] != "forced")  # stock: the plain route
    assert out["counts"]["forced"] == sum(r["count"] for r in forced)


@needs_nvcc
def test_glue_an_illegal_configuration_is_ineligible_params_and_runs_stock(
    glue: dict[str, Path], tmp_path: Path
) -> None:
    """cuBLAS f16 output of an f32 GEMM has no meaning: every node is ineligible:params and runs stock."""
    trace = tmp_path / "trace.jsonl"
    env = {"GGML_CUDA_ROUTE_TRACE": str(trace), "GGML_CUDA_DISPATCH": "force:cublas/out=f16,compute=f32"}
    out, _ = run_glue(glue["no_table"], env)
    assert set(out["cases"].values()) == {"stock"}
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    mm = [r for r in recs[1:-1] if r["op"] == "MUL_MAT" and not r["fused"]]
    assert mm and all(r["reason"] == "ineligible:params" and r["route"] == r["stock_route"] for r in mm)
    moe = [r for r in recs[1:-1] if r["op"] == "MUL_MAT_ID"]  # cuBLAS serves no MUL_MAT_ID node
    assert [r["reason"] for r in moe] == ["ineligible:op"]
    assert out["counts"]["forced"] == 0
    assert out["counts"]["ineligible"] == sum(r["count"] for r in mm) + sum(r["count"] for r in moe)


@needs_nvcc
def test_glue_off_is_inactive(glue: dict[str, Path], tmp_path: Path) -> None:
    out, log = run_glue(glue["no_table"], {"GGML_CUDA_DISPATCH": "off"})
    assert out["active"] is False and set(out["cases"].values()) == {"stock"}
    assert out["counts"] == {"ran": [0] * registry.ROUTE_COUNT, "forced": 0, "table": 0, "ineligible": 0}
    assert "GGML_CUDA_DISPATCH=off" in log
    # off with a trace: observed, still stock
    trace = tmp_path / "t.jsonl"
    out, _ = run_glue(glue["no_table"], {"GGML_CUDA_DISPATCH": "off", "GGML_CUDA_ROUTE_TRACE": str(trace)})
    assert out["active"] is True and set(out["cases"].values()) == {"stock"}
    routes = [json.loads(ln) for ln in trace.read_text().splitlines()][1:-1]
    assert routes and all(r["reason"] in ("stock", "fused") for r in routes)
    assert out["stale"] == [False, False, False]  # overrides are ignored under off
    out, log = run_glue(glue["no_table"], {"GGML_CUDA_DISPATCH": "sometimes"})
    assert out["active"] is False and "running stock" in log


@needs_nvcc
def test_glue_table_applies_only_on_its_gpu(glue: dict[str, Path], tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    out, log = run_glue(glue["table"], {"GGML_CUDA_ROUTE_TRACE": str(trace)})
    # rule: q4_0, N = K = 4096, M 2..64 -> mmq; M = 512 is outside it
    assert out["cases"]["q4_0 M=8"] == "mmq" and out["cases"]["q4_0 M=512"] == "stock"
    assert "applied on CUDA0" in log and "3 rules" in log
    assert "[I] ggml_cuda_dispatch: table " in log  # the normal start-up line: INFO
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    assert recs[0]["table_hash"] and recs[0]["dispatch"]["table_applied"] == [True]
    table_rows = [r for r in recs[1:-1] if r["reason"] == "table"]
    assert {(r["tensor"], r["src1_ne"][1], r["route"], r["stock_route"]) for r in table_rows} == {
        ("blk.0.attn_q.weight", 8, "mmq", "mmvq")
    }
    assert out["counts"]["table"] == 1 + 4  # the captured node and its 3 replays count too

    out, log = run_glue(glue["table"], {"GLUE_GPU_NAME": "NVIDIA H100 80GB HBM3"})
    assert set(out["cases"].values()) == {"stock"}
    assert "refused on CUDA0" in log and "GPU mismatch" in log
    # a refused table is a warning: llama-server shows ggml's INFO lines only at -lv 4
    assert "[W] ggml_cuda_dispatch: table " in log
    out, _ = run_glue(glue["table"], {"GGML_CUDA_DISPATCH": "off"})
    assert set(out["cases"].values()) == {"stock"}
    out, log = run_glue(glue["table"], {"GGML_CUDA_DISPATCH": "tabel"})  # a value not understood: a warning
    assert set(out["cases"].values()) == {"stock"}
    assert "[W] ggml_cuda_dispatch: GGML_CUDA_DISPATCH=tabel is not one of table, off" in log


@needs_nvcc
def test_glue_graph_update_errors_instantiate_again_only_where_the_dispatch_decides(
    glue: dict[str, Path],
) -> None:
    """An error from cudaGraphExecUpdate other than the update failure (the H200 harness met one under cuBLAS
    configurations): where a table applies, a configuration is forced or an override was set, the graph is
    instantiated again, with a warning naming the error; stock keeps ggml's assert."""
    cases = {
        "table": (glue["table"], {}),
        "forced": (glue["no_table"], {"GGML_CUDA_DISPATCH": "force:cublas"}),
        "override": (glue["no_table"], {"GLUE_OVERRIDE": "4"}),
    }
    for name, (exe, env) in cases.items():
        out, log = run_glue(exe, env)
        assert out["graph_update"] == {"not_supported": True, "invalid_value": True, "success": False}, name
        assert (
            "cudaGraphExecUpdate returned cudaErrorNotSupported" in log
            and "instantiating the graph again" in log
        )
    for name, (exe, env) in {
        "no table": (glue["no_table"], {}),
        "off": (glue["table"], {"GGML_CUDA_DISPATCH": "off"}),
        "another GPU": (glue["table"], {"GLUE_GPU_NAME": "NVIDIA H100 80GB HBM3"}),
    }.items():
        out, log = run_glue(exe, env)
        assert out["graph_update"] == {"not_supported": False, "invalid_value": False, "success": False}, name
        assert "cudaGraphExecUpdate returned" not in log


@needs_nvcc
def test_glue_trace_is_accepted_by_census_ingest(glue: dict[str, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ggml_dispatch.cli import main

    trace = tmp_path / "trace.jsonl"
    run_glue(glue["table"], {"GGML_CUDA_ROUTE_TRACE": str(trace)})
    res = CliRunner().invoke(main, ["census", "ingest", str(trace), "-o", str(tmp_path / "c.parquet")])
    assert res.exit_code == 0, res.output
