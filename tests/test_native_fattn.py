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

import native_shared
import pytest
from test_native_build import FA_DEFINES, NVCC_FLAGS, _hook_warnings, _includes, _nvcc, compile_unit

from ggml_dispatch import fetch, registry
from ggml_dispatch.hook import install as inst

pytestmark = pytest.mark.slow

NATIVE_TESTS = Path(__file__).parent / "native"
CUDA = Path("ggml/src/ggml-cuda")
NVCC = shutil.which("nvcc")

VEC_INSTANCES = ("q8_0-q8_0", "f16-f16")  # the pairs the driver's cases use
# ggml_cuda_flash_attn_ext_mma_f16_case<DKQ, DV, ncols1, ncols2>(ggml_backend_cuda_context &, ggml_tensor *)
MMA_CASE = re.compile(
    r"_Z\d+ggml_cuda_flash_attn_ext_mma_f16_caseILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)EEvR25ggml_backend_cuda_contextP11ggml_tensor"
)


def _table(commit: str) -> dict[str, Any]:
    from ggml_dispatch.codegen import table

    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = commit
    t["provenance"] = {"source": "measured"}
    key = {"op": "FLASH_ATTN_EXT", "layout": "attention", "k_type": "q8_0", "v_type": "q8_0"}
    shape = {"D_K": 256, "D_V": 256, "gqa": 6, "kv": 65536}
    t["rules"] = [
        key | shape | {"M_lo": 1, "M_hi": 2, "route": "fa_mma", "config": "fa_mma/ncols1=16,ncols2=2"},
        # two more rules of the same kind, at KV buckets no case reaches: what the first-use warm-up launches
        # (one reading the KV shadow: the warm-up converts instead, so it never makes one)
        key
        | shape
        | {
            "kv": 8192,
            "M_lo": 1,
            "M_hi": 1,
            "route": "fa_mma",
            "config": "fa_mma/ncols1=1,ncols2=8,kv=shadow",
        },
        key
        | shape
        | {"kv": 32768, "M_lo": 3, "M_hi": 3, "route": "fa_mma", "config": "fa_mma/ncols1=16,ncols2=2"},
    ]
    return t


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if NVCC is None or shutil.which("cmake") is None:
        pytest.skip("nvcc and cmake are needed")
    work = tmp_path_factory.mktemp("fattn")
    # the pinned ggml with the hook installed, and its CPU-only build below: shared with
    # tests/test_native_build.py and tests/test_native_volta.py (tests/native_shared.py)
    tree = native_shared.patched_tree(tmp_path_factory)
    # the same tree with a one-rule attention table (its own copy of the hook's files)
    ttree = work / "table" / "llama.cpp"
    (ttree / CUDA).mkdir(parents=True)
    for p in (tree / CUDA).iterdir():
        if p.name.startswith("ggml-dispatch") or p.name in inst.HOOK_SPECS:
            shutil.copy2(p, ttree / CUDA / p.name)
    shutil.copy2(tree / "UPSTREAM_COMMIT", ttree / "UPSTREAM_COMMIT")
    from ggml_dispatch.codegen import table

    (work / "table.json").write_text(table.dumps(_table((tree / "UPSTREAM_COMMIT").read_text().strip())))
    inst.install(ttree, table_path=work / "table.json")

    cub = fetch.cublas_headers()
    inc = _includes(tree, cub)
    flags = [*NVCC_FLAGS, *FA_DEFINES]
    jobs = {
        "glue": [*flags, f"-I{tree / CUDA}", *inc, "-c", str(NATIVE_TESTS / "fattn_glue.cu"), "-o", "glue.o"],
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

    def ggml_base() -> tuple[Path, subprocess.CompletedProcess[str]]:
        build, cfg, res = native_shared.cpu_build(tmp_path_factory, tree, "ggml-base")
        return build, cfg if res is None else res

    with ThreadPoolExecutor(1) as ex:
        futures = {k: ex.submit(_nvcc, v, work) for k, v in jobs.items()}
        # ggml-dispatch.cu without a table, with the tree's flags (FA_DEFINES and GGML_CUDA_FA_QUANTS): one
        # compile for this file, tests/test_native_build.py and the compatibility matrix's pinned tree
        dispatch = ex.submit(compile_unit, tmp_path_factory, tree, cub, "ggml-dispatch.cu")
        base = ex.submit(ggml_base)
        results = {k: f.result() for k, f in futures.items()}
        dispatch_obj, results["dispatch"] = dispatch.result()
        build, base_res = base.result()
    for k, r in results.items():
        assert r.returncode == 0, f"{k}: {r.stderr[-4000:]}"
        assert _hook_warnings(r.stderr) == [], k
    shutil.copy2(dispatch_obj, work / "dispatch.o")
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
            # the tile kernel instances and the converters are never called here: each symbol the link
            # lacks gets a definition that traps (so a call would fail the test, not pass it); the MMA
            # instances get one that records which instance the tree's switches reached (glue_mma_case)
            missing = sorted(set(re.findall(r"undefined reference to `([A-Za-z0-9_.$]+)'", link.stderr)))
            assert missing, link.stderr[-4000:]
            mma = {m: MMA_CASE.fullmatch(m) for m in missing}
            assert any(mma.values()), "the MMA instances are not what fattn.cu calls"
            stubs = work / f"stubs_{name}.S"
            stubs.write_text(
                ".text\n"
                + "".join(f".globl {m}\n.type {m}, @function\n{m}:\n    ud2\n" for m in missing if not mma[m])
            )
            cstubs = work / f"stubs_mma_{name}.c"
            cstubs.write_text(
                "void glue_mma_case(int, int, int, int, void *, void *);\n"
                + "".join(
                    f"void {m}(void * c, void * d) {{ glue_mma_case({', '.join(g.groups())}, c, d); }}\n"
                    for m, g in mma.items()
                    if g
                )
            )
            for src, obj in ((stubs, f"stubs_{name}.o"), (cstubs, f"stubs_mma_{name}.o")):
                cc = subprocess.run(["cc", "-c", str(src), "-o", obj], cwd=work, capture_output=True)
                assert cc.returncode == 0, cc.stderr
            link = _nvcc([*args, f"stubs_{name}.o", f"stubs_mma_{name}.o"], work)
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


# the MMA_F16 instance (ncols1, ncols2) the tree's switches reach on an H200 for stock's MMA cases
STOCK_MMA = {
    "q8_0 D256 gqa6 M3 kv16384": (4, 8),  # GQA 6 packs 8 heads; 3 Q columns fit a tile of 4
    "f16 D256 gqa6 M1 kv16384": (1, 8),
    "q8_0 D256 gqa6 M1 kv4000": (8, 1),  # KV length not a multiple of 256: no GQA packing
    "q8_0 D256 gqa6 M512 kv16384": (8, 8),
}
# ... and for the other cases when fa_mma runs them with stock's tile choice
STOCK_MMA_FORCED = STOCK_MMA | {
    "q8_0 D256 gqa6 M1 kv4096": (1, 8),
    "q8_0 D256 gqa6 M2 kv49152": (2, 8),
    "f16 D128 gqa4 M1 kv4096": (2, 4),
}


def mma_pairs(out: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The instance each case's launch reached (cases that ran MMA_F16), none refused, one call each."""
    got = {}
    for name, c in out["cases"].items():
        if c["mma"] is not None:
            assert c["mma"]["calls"] == 1 and not c["mma"]["refused"] and not c["mma"]["sparse"], name
            got[name] = (c["mma"]["ncols1"], c["mma"]["ncols2"])
    return got


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
        assert mma_pairs(out) == STOCK_MMA  # the tree's tile choice, through the hooked switches
        for name, case in out["cases"].items():
            _scratch_ok(name, case, size_all=False)
        # launch_fattn's grid readers: all stock outside a configuration
        r = out["readers"]
        assert (r["blocks_stock"], r["stream_k_stock"]) == (22, False)


def test_forced_kernel_runs_where_eligible_and_scratch_covers_every_kernel(drivers: dict[str, Path]) -> None:
    out = run(drivers["no_table"], {"GGML_CUDA_DISPATCH": "force:fa_mma"})
    assert {c["run"] for c in out["cases"].values()} == {"fa_mma"}
    assert mma_pairs(out) == STOCK_MMA_FORCED  # a plain route: stock's tile inside it
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


def test_forced_tile_steers_the_switches_and_falls_back_to_stock_where_ineligible(
    drivers: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "trace.jsonl"
    out = run(
        drivers["no_table"],
        {"GGML_CUDA_DISPATCH": "force:fa_mma/ncols2=4", "GGML_CUDA_ROUTE_TRACE": str(path)},
    )
    assert {c["run"] for c in out["cases"].values()} == {"fa_mma"}
    # ncols2 = 4 where the GQA packing applies, ncols1 by the tree's rule at that packing; without the
    # packing (KV length 4000) the configuration is refused and stock's kernel and tile run
    assert mma_pairs(out) == {
        "q8_0 D256 gqa6 M1 kv4096": (2, 4),
        "q8_0 D256 gqa6 M2 kv49152": (2, 4),
        "q8_0 D256 gqa6 M3 kv16384": (4, 4),
        "f16 D256 gqa6 M1 kv16384": (2, 4),
        "f16 D128 gqa4 M1 kv4096": (2, 4),
        "q8_0 D256 gqa6 M1 kv4000": (8, 1),
        "q8_0 D256 gqa6 M512 kv16384": (16, 4),
    }
    assert out["counts"]["forced"] == 6 and out["counts"]["ineligible"] == 1
    for name, case in out["cases"].items():
        _scratch_ok(name, case, size_all=True)
    # the trace records the configuration that ran, with the tile and sparse choice the tree's switches
    # resolved (stock's kernel too): the instance each case's stub saw launched
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    by = {
        (r["attn"]["n_kv"], r["attn"]["q_cols"], r["attn"]["k_type"]): r for r in recs if r["kind"] == "route"
    }
    assert (by[(4096, 1, "q8_0")]["config"], by[(4096, 1, "q8_0")]["reason"]) == (
        "fa_mma/ncols1=2,ncols2=4,sparse=off",
        "forced",
    )
    assert (by[(4000, 1, "q8_0")]["config"], by[(4000, 1, "q8_0")]["reason"]) == (
        "fa_mma/ncols1=8,ncols2=1,sparse=off",
        "ineligible:params",
    )
    for name, (n1, n2) in mma_pairs(out).items():
        k_type, _, _, m, kv = name.split()
        params = dict(registry.Config.parse(by[(int(kv[2:]), int(m[1:]), k_type)]["config"]).params)
        assert (params["ncols1"], params["ncols2"]) == (str(n1), str(n2)), name
    assert by[(4000, 1, "q8_0")]["stock_route"] == "fa_mma"

    # a full configuration through the override API: every parameter set
    code = registry.Config.parse("fa_mma/ncols1=8,ncols2=8,sparse=off,stream_k=off").code
    ov = run(drivers["no_table"], {"GLUE_OVERRIDE": str(code)})
    assert {n: p for n, p in mma_pairs(ov).items()} == {n: (8, 8) for n in STOCK} | {
        "q8_0 D256 gqa6 M1 kv4000": (8, 1)
    }
    assert ov["counts"]["forced"] == 6 and ov["counts"]["ineligible"] == 1
    # a tile no switch launches (ncols1 x ncols2 = 128) and VEC blocks beyond the KV tiles are refused
    for cfg in ("fa_mma/ncols1=64,ncols2=2", "fa_vec/blocks=256"):
        bad = run(drivers["no_table"], {"GGML_CUDA_DISPATCH": f"force:{cfg}"})
        assert {n: c["run"] for n, c in bad["cases"].items()} == STOCK, cfg
        assert mma_pairs(bad) == STOCK_MMA, cfg
    vec = run(drivers["no_table"], {"GGML_CUDA_DISPATCH": "force:fa_vec/blocks=16"})
    # 16 blocks need 16 KV tiles of 256 (n_kv >= 3841 at head dim 256) and VEC's own limits
    assert {n for n, c in vec["cases"].items() if c["run"] == "fa_vec"} == {
        n for n in STOCK if not n.endswith(("kv4000", "M512 kv16384"))
    }


def test_launch_grid_readers_take_a_configurations_blocks_and_stream_k(drivers: dict[str, Path]) -> None:
    r = run(drivers["no_table"], {})["readers"]
    assert (r["blocks8_of16"], r["blocks8_of4"], r["refused"]) == (
        8,
        3,
        1,
    )  # 8 > 4 KV tiles: stock's, refused
    assert (r["stream_k_off"], r["stream_k_on"]) == (False, True)


def test_mma_tile_choice_mirror_is_held_against_the_trees_switches(drivers: dict[str, Path]) -> None:
    """Every fa_mma configuration on a grid of head dims, cache types, GQA ratios, KV lengths, Q columns,
    dense and sparse (n_kv_max) graphs: where the check passes, the tree's hooked switches reach the very
    instance the check's mirror predicts, with every set parameter honoured and nothing refused; stock's
    own tile (no parameters) is the mirror's too. The instances reached are compiled ones."""
    g = run(drivers["no_table"], {"GLUE_MMA_GRID": "1"})["mma_grid"]
    assert g["configs"] == 1 + 8 * 5 * 3 * 3 * 3 and g["points"] > 0  # x3: kv left out, shadow or reuse
    assert g["mismatch"] == 0 and g["refused"] == 0, g
    assert 0 < g["eligible"] < g["checked"] and g["stock"] == g["points"] and g["sparse"] > 0
    pairs = {tuple(int(x) for x in p.split("x")) for p in g["pairs"]}
    compiled = compiled_mma_pairs(fetch.llama_cpp_dir())
    assert pairs == {(n1, n2) for d, _, n1, n2 in compiled if d == 256}


def compiled_mma_pairs(tree: Path) -> set[tuple[int, int, int, int]]:
    """(DKQ, DV, ncols1, ncols2) of every compiled MMA_F16 instance, from template-instances/."""
    out = set()
    for f in (tree / CUDA / "template-instances").glob("fattn-mma-f16-instance-ncols1_*-ncols2_*.cu"):
        n1, n2 = (int(x) for x in re.findall(r"ncols\d_(\d+)", f.name))
        for d, dv, a, b in re.findall(
            r"DECL_FATTN_MMA_F16_CASE\((\d+), (\d+), (\d+), (\d+)\)", f.read_text()
        ):
            assert (int(a), int(b)) == (n1, n2), f.name
            out.add((int(d), int(dv), n1, n2))
    return out


def test_override_sizes_scratch_for_every_kernel(drivers: dict[str, Path]) -> None:
    code = registry.Config(registry.Route.FA_TILE).code
    out = run(drivers["no_table"], {"GLUE_OVERRIDE": str(code)})
    assert {c["run"] for c in out["cases"].values()} == {"fa_tile"}
    for name, case in out["cases"].items():
        _scratch_ok(name, case, size_all=True)
    ran = out["counts"]["ran"]
    assert ran[registry.ROUTES[registry.Route.FA_TILE].code] == len(STOCK)


def test_table_rule_applies_to_its_key_and_sizes_scratch_exactly(drivers: dict[str, Path]) -> None:
    out = run(drivers["table"], {"GGML_CUDA_DISPATCH_WARMUP": "off"})  # one launch per node
    runs = {n: c["run"] for n, c in out["cases"].items()}
    # the rule: q8_0/q8_0, D 256/256, GQA 6, KV bucket 65536 (n_kv 32769..65536), M 1..2
    assert runs == STOCK | {"q8_0 D256 gqa6 M2 kv49152": "fa_mma"}
    assert mma_pairs(out) == STOCK_MMA | {"q8_0 D256 gqa6 M2 kv49152": (16, 2)}  # the rule's configuration
    assert out["counts"]["table"] == 1
    for name, case in out["cases"].items():
        _scratch_ok(name, case, size_all=False)
    assert "table " in out["stderr"] and "applied on CUDA0" in out["stderr"]


def test_first_use_warm_up_launches_the_tables_other_configurations_once(drivers: dict[str, Path]) -> None:
    """CUDA loads a kernel at its first launch (milliseconds): the table's other configurations of a node's
    kind launch once before the first such node's own launch, so the kernel a deep step picks is loaded
    by then."""
    out = run(drivers["table"], {"GLUE_WARM": "1"})
    w = out["warm"]
    # on a VEC node of the kind: the MMA rules need f16 copies of K/V its scratch does not hold, so they wait
    assert w["mma_scratch"] > w["vec_scratch"]  # the allocation: the output, and for MMA the f16 copies
    assert w["vec_node"] == 0 and w["vec_launches"] == ""
    assert w["in_capture"] == 0  # a launch under capture would run in every replay
    # the first MMA node (3 Q columns at KV length 32768, a rule of 16x2): stock's instance there (4x8,
    # which a deeper node without a rule runs), the other rule's (1x8; the kv65536 rule is 16x2 too), then
    # its own; the second time only its own
    assert w["first"] == "4x8,1x8,16x2"
    assert w["again"] == "16x2"
    off = run(drivers["table"], {"GLUE_WARM": "1", "GGML_CUDA_DISPATCH_WARMUP": "off"})["warm"]
    assert off["first"] == "16x2" and off["vec_node"] == 0
    assert (
        "no first-use warm-up"
        in run(drivers["table"], {"GLUE_WARM": "1", "GGML_CUDA_DISPATCH_WARMUP": "off"})["stderr"]
    )
    # a short node (KV 256, stock VEC, no rule): the table's allocation holds the f16 copies there, so the MMA
    # configurations of the kind launch on it (1x8 and 16x2, in the header's rule order), so a deep step finds
    # them loaded; a deep VEC node's allocation stays what VEC needs
    short = run(drivers["table"], {"GLUE_WARM": "short"})["short"]
    assert short["launches"] == "1x8,16x2"
    assert short["alloc"] == short["mma_scratch"] > short["vec_scratch"]
    assert short["deep_alloc"] == short["deep_vec_scratch"]
    # fa_vec/kv=shadow on q8_0 runs VEC's f16 instance, converting where no shadow: sized for the copies
    assert short["deep_vec_shadow_scratch"] == short["deep_mma_scratch"] > short["deep_vec_scratch"]
    cold = run(drivers["table"], {"GLUE_WARM": "short", "GGML_CUDA_DISPATCH_WARMUP": "off"})["short"]
    assert cold["launches"] == "" and cold["alloc"] == cold["vec_scratch"]  # no warm-up: no copies either
    stock = run(drivers["table"], {"GLUE_WARM": "short", "GGML_CUDA_DISPATCH": "off"})["short"]
    assert stock["launches"] == "" and stock["alloc"] == stock["vec_scratch"]  # stock stays exactly stock
    # stock and forced dispatch never warm up
    forced = run(
        drivers["no_table"], {"GLUE_WARM": "1", "GGML_CUDA_DISPATCH": "force:fa_mma/ncols1=16,ncols2=2"}
    )
    assert forced["warm"]["first"] == "16x2" and forced["warm"]["again"] == "16x2"


def test_kv_reuse_reads_a_shadow_only_where_one_was_made(drivers: dict[str, Path]) -> None:
    """kv=shadow reads (and makes) the shadow; kv=reuse reads one that exists and makes one only where a
    making rule of the table can apply in the cache: with neither (here no table, and no shadow can be kept:
    the driver's cache tensors have no CUDA buffer) stock's kernel runs, not the configuration converting
    per call, which nothing measured."""
    shadow = "force:fa_mma/ncols1=4,ncols2=2,kv=shadow"
    out = run(drivers["no_table"], {"GLUE_WARM": "1", "GGML_CUDA_DISPATCH": shadow})["warm"]
    assert out["first"] == "4x2s"
    out = run(
        drivers["no_table"], {"GLUE_WARM": "1", "GGML_CUDA_DISPATCH": shadow.replace("shadow", "reuse")}
    )
    assert out["warm"]["first"] == "4x8" and out["warm"]["again"] == "4x8"  # stock's instance at 3 Q columns


def test_trace_of_attention_calls_reads_into_flash_attn_rows(
    drivers: dict[str, Path], tmp_path: Path
) -> None:
    from ggml_dispatch.census import aggregate, attention, trace

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
