"""The FlashAttention kernel choice through the hook, without a GPU (tests/native/fattn_glue.cu).

The patched fattn.cu (the tree's stock choice, the hook's wrapper and eligibility, the tree's scratch
sizing) is compiled into a driver with the real ggml-dispatch.cu (no table, and a one-rule attention
table) and the vector-kernel instances of the default K/V pairs the driver's cases use; nodes are built
as llama.cpp builds them. Pinned: stock's choice on an H200 is unchanged by the hook (off, no table,
trace on), force:/override/table pick what they name where eligible and stock elsewhere, the scratch is
sized for the kernel that runs (f16 copies of K and V for TILE/MMA, none for VEC on q8_0), and the route
trace the hook writes is read by the census into FlashAttnKey rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_native_build import NVCC_FLAGS, _hook_warnings, _includes, _nvcc

from ggml_dispatch import fetch, registry
from hook import install as inst

pytestmark = pytest.mark.slow

NATIVE_TESTS = Path(__file__).parent / "native"
CUDA = Path("ggml/src/ggml-cuda")
NVCC = shutil.which("nvcc")

# GGML_CUDA_FA_<K>_<V> as the tree's CMake defines them for its default GGML_CUDA_FA_QUANTS
_FA_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16")
_FA_DEFAULT = {"q4_0-q4_0", "q8_0-q8_0", "f16-f16", "bf16-bf16"}
FA_DEFINES = [
    f"-DGGML_CUDA_FA_{k.upper()}_{v.upper()}={int(f'{k}-{v}' in _FA_DEFAULT)}"
    for k in _FA_TYPES
    for v in _FA_TYPES
]
VEC_INSTANCES = ("q8_0-q8_0", "f16-f16")  # the pairs the driver's cases use


def _table(commit: str) -> dict[str, Any]:
    from codegen import table

    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = commit
    t["provenance"] = {"source": "measured"}
    key = {"op": "FLASH_ATTN_EXT", "layout": "attention", "k_type": "q8_0", "v_type": "q8_0"}
    shape = {"D_K": 256, "D_V": 256, "gqa": 6, "kv": 65536}
    t["rules"] = [key | shape | {"M_lo": 1, "M_hi": 2, "route": "fa_mma"}]
    return t


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if NVCC is None or shutil.which("cmake") is None:
        pytest.skip("nvcc and cmake are needed")
    pinned = fetch.llama_cpp_dir()
    work = tmp_path_factory.mktemp("fattn")
    tree = work / "llama.cpp"
    tree.mkdir()
    shutil.copytree(pinned / "ggml", tree / "ggml", symlinks=True)
    shutil.copy2(pinned / "UPSTREAM_COMMIT", tree / "UPSTREAM_COMMIT")
    inst.install(tree)
    # the same tree with a one-rule attention table (its own copy of the hook's files)
    ttree = work / "table" / "llama.cpp"
    (ttree / CUDA).mkdir(parents=True)
    for p in (tree / CUDA).iterdir():
        if p.name.startswith("ggml-dispatch") or p.name in ("ggml-cuda.cu", "mmq.cuh", "fattn.cu"):
            shutil.copy2(p, ttree / CUDA / p.name)
    shutil.copy2(tree / "UPSTREAM_COMMIT", ttree / "UPSTREAM_COMMIT")
    from codegen import table

    (work / "table.json").write_text(table.dumps(_table((tree / "UPSTREAM_COMMIT").read_text().strip())))
    inst.install(ttree, table_path=work / "table.json")

    cub = fetch.cublas_headers()
    inc = _includes(tree, cub)
    flags = [*NVCC_FLAGS, *FA_DEFINES]
    jobs = {
        "glue": [*flags, f"-I{tree / CUDA}", *inc, "-c", str(NATIVE_TESTS / "fattn_glue.cu"), "-o", "glue.o"],
        "dispatch": [*flags, *inc, "-c", str(tree / CUDA / "ggml-dispatch.cu"), "-o", "dispatch.o"],
        "dispatch_table": [
            *[*flags, f"-I{ttree / CUDA}", f"-I{tree / CUDA}", *inc],
            *["-c", str(ttree / CUDA / "ggml-dispatch.cu"), "-o", "dispatch_table.o"],
        ],
        **{
            f"vec-{p}": [
                *[*flags, *inc, "-c"],
                *[str(tree / CUDA / "template-instances" / f"fattn-vec-instance-{p}.cu"), "-o", f"vec-{p}.o"],
            ]
            for p in VEC_INSTANCES
        },
    }
    build = work / "ggml-build"

    def ggml_base() -> subprocess.CompletedProcess[str]:
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        cfg = subprocess.run(
            [
                *["cmake", "-S", str(NATIVE_TESTS / "cpu_probe"), "-B", str(build), *gen],
                *[f"-DLLAMA_CPP_DIR={tree}", "-DGGML_NATIVE=OFF", "-DGGML_CUDA=OFF"],
                "-DCMAKE_BUILD_TYPE=Release",
            ],
            capture_output=True,
            text=True,
        )
        if cfg.returncode != 0:
            return cfg
        return subprocess.run(
            ["cmake", "--build", str(build), "--target", "ggml-base", "-j", "1"],
            capture_output=True,
            text=True,
        )

    with ThreadPoolExecutor(1) as ex:
        futures = {k: ex.submit(_nvcc, v, work) for k, v in jobs.items()}
        base = ex.submit(ggml_base)
        results = {k: f.result() for k, f in futures.items()}
        base_res = base.result()
    for k, r in results.items():
        assert r.returncode == 0, f"{k}: {r.stderr[-4000:]}"
        assert _hook_warnings(r.stderr) == [], k
    assert base_res.returncode == 0, base_res.stdout[-3000:] + base_res.stderr[-3000:]
    libs = sorted(build.rglob("libggml-base.so"))
    assert libs, "no libggml-base.so"
    libdir = libs[0].parent
    exes = {}
    for name, obj in (("no_table", "dispatch.o"), ("table", "dispatch_table.o")):
        args = [
            *["glue.o", obj, *(f"vec-{p}.o" for p in VEC_INSTANCES), "-o", f"fattn_{name}"],
            *[f"-L{libdir}", "-lggml-base", f"-Xlinker=-rpath={libdir}"],
            "-Xlinker=--wrap=cudaGetDeviceProperties",
            "-Xlinker=--wrap=cublasGetProperty",
            "-Xlinker=--no-demangle",
        ]
        link = _nvcc(args, work)
        if link.returncode != 0:
            # the tile/MMA kernel instances and the converters are never called here: each symbol the
            # link lacks gets a definition that traps (so a call would fail the test, not pass it)
            missing = sorted(set(re.findall(r"undefined reference to `([A-Za-z0-9_.$]+)'", link.stderr)))
            assert missing, link.stderr[-4000:]
            stubs = work / f"stubs_{name}.S"
            stubs.write_text(
                ".text\n" + "".join(f".globl {m}\n.type {m}, @function\n{m}:\n    ud2\n" for m in missing)
            )
            cc = subprocess.run(
                ["cc", "-c", str(stubs), "-o", f"stubs_{name}.o"], cwd=work, capture_output=True
            )
            assert cc.returncode == 0, cc.stderr
            link = _nvcc([*args, f"stubs_{name}.o"], work)
        assert link.returncode == 0, link.stderr[-4000:]
        exes[name] = work / f"fattn_{name}"
    return exes


def run(exe: Path, env: dict[str, str]) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_CUDA_", "GLUE_"))} | env
    res = subprocess.run([str(exe)], capture_output=True, text=True, env=full, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    out: dict[str, Any] = {"cases": {}, "stderr": res.stderr}
    for ln in res.stdout.splitlines():
        if ln.startswith("{"):
            obj = json.loads(ln)
            if "case" in obj:
                out["cases"][obj.pop("case")] = obj
            else:
                out.update(obj)
    return out


def f16_copies(case: dict[str, Any]) -> int:
    """Scratch beyond the output that fattn-common.cuh lays out for f16 copies of a q8_0 K and V view."""
    end = -(-case["out"] // 128) * 128 + 2 * case["k_elems"]
    return -(-end // 128) * 128 + 2 * case["k_elems"] - case["out"]


# stock on an H200 (cc 900) as the pinned fattn.cu chooses
STOCK = {
    "q8_0 D256 gqa6 M1 kv4096": "fa_vec",
    "q8_0 D256 gqa6 M2 kv49152": "fa_vec",
    "q8_0 D256 gqa6 M3 kv16384": "fa_mma",
    "f16 D256 gqa6 M1 kv16384": "fa_mma",  # GQA > 4 at head dim 256: not VEC for f16
    "f16 D128 gqa4 M1 kv4096": "fa_vec",
    "q8_0 D256 gqa6 M1 kv4000": "fa_mma",  # KV length not a multiple of 256: no VEC
    "q8_0 D256 gqa6 M512 kv16384": "fa_mma",
}


def _scratch_ok(name: str, case: dict[str, Any], size_all: bool) -> None:
    if name.startswith("f16"):
        assert case["scratch"] == 0, name  # f16 K/V are read in place by every kernel
    elif size_all or case["run"] != "fa_vec":
        assert case["scratch"] == f16_copies(case), name
    else:
        assert case["scratch"] == 0, name


def test_stock_choice_is_the_trees_with_the_hook_off_and_inactive(drivers: dict[str, Path]) -> None:
    for env in ({"GGML_CUDA_DISPATCH": "off"}, {}):
        out = run(drivers["no_table"], env)
        assert {n: c["run"] for n, c in out["cases"].items()} == STOCK
        assert all(c["stock"] == c["run"] for c in out["cases"].values())
        for name, case in out["cases"].items():
            _scratch_ok(name, case, size_all=False)


def test_forced_kernel_runs_where_eligible_and_scratch_covers_every_kernel(drivers: dict[str, Path]) -> None:
    out = run(drivers["no_table"], {"GGML_CUDA_DISPATCH": "force:fa_mma"})
    assert {c["run"] for c in out["cases"].values()} == {"fa_mma"}
    for name, case in out["cases"].items():
        _scratch_ok(name, case, size_all=True)
    assert out["counts"]["forced"] == len(STOCK) and out["counts"]["ineligible"] == 0

    vec = run(drivers["no_table"], {"GGML_CUDA_DISPATCH": "force:fa_vec"})
    runs = {n: c["run"] for n, c in vec["cases"].items()}
    # VEC's limits: KV length a multiple of 256, at most 8 Q columns
    assert runs == {n: ("fa_mma" if n.endswith(("kv4000", "M512 kv16384")) else "fa_vec") for n in STOCK}
    assert vec["counts"]["ineligible"] == 2
    for name, case in vec["cases"].items():
        _scratch_ok(name, case, size_all=True)

    # a matmul route is not asked of attention nodes: stock runs, neither forced nor ineligible
    mmq = run(drivers["no_table"], {"GGML_CUDA_DISPATCH": "force:mmq"})
    assert {n: c["run"] for n, c in mmq["cases"].items()} == STOCK
    assert mmq["counts"]["ineligible"] == 0 and mmq["counts"]["forced"] == 0


def test_override_sizes_scratch_for_every_kernel(drivers: dict[str, Path]) -> None:
    code = registry.Config(registry.Route.FA_TILE).code
    out = run(drivers["no_table"], {"GLUE_OVERRIDE": str(code)})
    assert {c["run"] for c in out["cases"].values()} == {"fa_tile"}
    for name, case in out["cases"].items():
        _scratch_ok(name, case, size_all=True)
    ran = out["counts"]["ran"]
    assert ran[registry.ROUTES[registry.Route.FA_TILE].code] == len(STOCK)


def test_table_rule_applies_to_its_key_and_sizes_scratch_exactly(drivers: dict[str, Path]) -> None:
    out = run(drivers["table"], {})
    runs = {n: c["run"] for n, c in out["cases"].items()}
    # the rule: q8_0/q8_0, D 256/256, GQA 6, KV bucket 65536 (n_kv 32769..65536), M 1..2
    assert runs == STOCK | {"q8_0 D256 gqa6 M2 kv49152": "fa_mma"}
    assert out["counts"]["table"] == 1
    for name, case in out["cases"].items():
        _scratch_ok(name, case, size_all=False)
    assert "table " in out["stderr"] and "applied on CUDA0" in out["stderr"]


def test_trace_of_attention_calls_reads_into_flash_attn_rows(
    drivers: dict[str, Path], tmp_path: Path
) -> None:
    from census import aggregate, attention, trace

    path = tmp_path / "trace.jsonl"
    run(drivers["no_table"], {"GGML_CUDA_ROUTE_TRACE": str(path)})
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    routes = [r for r in recs if r["kind"] == "route"]
    assert len(routes) == len(STOCK) and recs[-1]["kind"] == "footer"
    first = next(r for r in routes if r["attn"]["n_kv"] == 4096 and r["attn"]["k_type"] == "q8_0")
    assert first["op"] == "FLASH_ATTN_EXT" and first["tensor"] == "cache_k_l0 (view) (permuted)"
    assert first["src0_ne"] == [256, 4096, 4, 1] and first["src1_ne"] == [256, 1, 24, 1]
    assert first["src0_nb"] == [34, 34 * 8 * 4, 34 * 8, 34 * 8 * 4 * 4096]
    assert first["attn"] | {"scale": 0} == {
        "d_k": 256, "d_v": 256, "q_heads": 24, "kv_heads": 4, "q_cols": 1, "n_kv": 4096, "seqs": 1,
        "k_type": "q8_0", "v_type": "q8_0", "v_nb": [34, 34 * 8 * 4, 34 * 8, 34 * 8 * 4 * 4096],
        "mask": True, "sinks": False, "softcap": 0, "max_bias": 0, "scale": 0,
    }  # fmt: skip
    assert (first["route"], first["stock_route"], first["reason"]) == ("fa_vec", "fa_vec", "stock")

    agg = aggregate.Aggregator()
    trace.read_trace(path, agg.sink)
    rows = attention.attention_rows(agg.tallies)
    assert len(rows) == len(STOCK) and all(r["est_us"] > 0 for r in rows)
    keys = {(attention.key_of(r), r["M"]): r["stock_route"] for r in rows}
    fa = registry.FlashAttnKey("FLASH_ATTN_EXT", "attention", "q8_0", "q8_0", 256, 256, 6, 65536)
    assert keys[(fa, 2)] == "fa_vec"
    # the matmul census leaves attention records out
    matmul, report = aggregate.trace_rows(agg.tallies)
    assert matmul == [] and report.attention_calls == len(STOCK)


def test_the_trees_stock_kernel_is_always_eligible(drivers: dict[str, Path]) -> None:
    """On a grid of head dims, cache types, GQA ratios, KV lengths, Q columns and cc values (Volta to
    Hopper; this build has sm_90 code only), the kernel the tree's own choice picks passes the check."""
    g = run(drivers["no_table"], {"GLUE_GRID": "1", "GGML_CUDA_DISPATCH": "off"})["grid"]
    assert g["points"] == 5 * 9 * 4 * 5 * 4 * 7 and g["refused"] == 0, g
    assert g["none"] > 0 and g["fa_vec"] > 0 and g["fa_mma"] > 0 and g["fa_tile"] > 0, g
