"""Decode launch shapes as configurations (features mmvq_params, mmvf_params): the candidate pairs are
generated once in the registry and emitted into the codes header, config strings parse and are validated,
the C side (ggml-dispatch-mmvq.h) reads the same candidates and the build's restriction of them, install
applies the hunks to the pinned mmvq.cu and mmvf.cu and writes the restriction, and a table rule for a
candidate the build lacks is dropped at install."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggml_dispatch import codes, fetch, registry, schema
from ggml_dispatch.cli import main
from ggml_dispatch.hook import install as inst

CUDA = Path("ggml/src/ggml-cuda")
CXX = shutil.which("g++") or shutil.which("c++")


@pytest.fixture(scope="module")
def pinned() -> Path:
    return fetch.llama_cpp_dir()


@pytest.fixture
def tree(pinned: Path, tmp_path: Path) -> Path:
    t = tmp_path / "llama.cpp"
    (t / CUDA).mkdir(parents=True)
    for name in inst.HOOK_SPECS:
        shutil.copy2(pinned / CUDA / name, t / CUDA / name)
    (t / "UPSTREAM_COMMIT").write_text(schema.PINNED_UPSTREAM_COMMIT + "\n")
    return t


# ---- registry -------------------------------------------------------------------------------------


def test_candidates_are_every_valid_pair_of_the_description() -> None:
    pairs = tuple((w, r) for w in (1, 2, 4, 8) for r in (1, 2, 4))
    assert pairs == registry.MMVQ_CONFIGS
    in_order = tuple(p for p in registry.MMVQ_CONFIGS if p in registry.MMVQ_DEFAULT_CONFIGS)
    assert in_order == registry.MMVQ_DEFAULT_CONFIGS
    assert set(registry.MMVQ_DEFAULT_TYPES) <= set(registry.MMVQ_TYPES)


@pytest.mark.parametrize(
    ("nwarps", "rows", "warp_size", "valid"),
    [
        (8, 4, 32, True),  # 7 x 8 x 4 x 32 floats = 28 KiB of reduction buffer
        (8, 4, 64, False),  # 56 KiB at a 64-wide warp
        (32, 1, 32, True),  # 1024 threads
        (64, 1, 32, False),  # 2048 threads
        (1, 33, 32, False),  # lane i writes row i
    ],
)
def test_pair_validity(nwarps: int, rows: int, warp_size: int, valid: bool) -> None:
    assert registry.mmvq_pair_valid(nwarps, rows, warp_size) is valid


def test_config_strings_parse_in_any_order_and_round_trip_through_codes() -> None:
    c = registry.Config.parse("mmvq/rows=2,nwarps=4")
    assert str(c) == "mmvq/nwarps=4,rows=2"
    assert registry.Config.from_code(c.code) == c
    assert registry.config_features(c) == {"mmvq_params"}
    assert registry.config_features(registry.Config.parse("mmvf/block=96")) == {"mmvf_params"}
    assert registry.mmvq_config_problem(c) is None


def test_a_sweep_times_each_candidate_pair_and_each_block_size() -> None:
    mmvq = [str(c) for c in registry.route_configs("mmvq")]
    assert mmvq[0] == "mmvq" and len(mmvq) == 1 + len(registry.MMVQ_CANDIDATES)
    assert all(registry.mmvq_config_problem(registry.Config.parse(c)) is None for c in mmvq)
    assert "mmvq/nwarps=4,rows=2,regs=64" in mmvq and "mmvq/regs=64" not in mmvq
    mmvf = [str(c) for c in registry.route_configs("mmvf")]
    assert mmvf == ["mmvf", *(f"mmvf/block={b}" for b in range(32, 257, 32))]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mmvq/nwarps=16,rows=1", "mmvq/nwarps='16' is not one of 1, 2, 4, 8"),
        ("mmvq/rows=3", "mmvq/rows='3' is not one of 1, 2, 4"),
        ("mmvf/block=48", "mmvf/block='48' is not one of 32, 64"),
    ],
)
def test_values_outside_the_description_are_refused(text: str, message: str) -> None:
    with pytest.raises(registry.ConfigError, match=re.escape(message)):
        registry.Config.parse(text)


@pytest.mark.parametrize("text", ["mmvq/nwarps=8", "mmvq/rows=1", "mmvq/regs=64", "mmvq/nwarps=8,regs=64"])
def test_half_a_pair_is_a_legal_string_that_names_no_candidate(text: str) -> None:
    c = registry.Config.parse(text)
    assert (
        registry.mmvq_config_problem(c)
        == f"{c}: mmvq's nwarps and rows are set together (e.g. mmvq/nwarps=4,rows=2)"
    )
    assert not registry.config_pairs_compiled(c.route, c.params)


def test_decode_parameters_are_mul_mat_only() -> None:
    assert registry.route_allowed("MUL_MAT", "mmvq/nwarps=4,rows=1")
    assert not registry.route_allowed("MUL_MAT_ID", "mmvq/nwarps=4,rows=1")
    assert not registry.route_allowed("MUL_MAT_ID", "mmvf/block=64")
    assert registry.route_allowed("MUL_MAT_ID", "mmvq")


def test_build_restriction_options_parse_strictly() -> None:
    assert registry.parse_mmvq_configs("8x1, 4x1,4x1") == ((4, 1), (8, 1))
    assert registry.parse_mmvq_configs("all") == registry.MMVQ_CONFIGS
    assert registry.parse_mmvq_configs("none") == ()
    for bad in ("3x1", "4x3", "4", "x1", "", "4x1,,8x1"):
        with pytest.raises(ValueError, match=r"--mmvq-configs: .* is not one of 1x1,"):
            registry.parse_mmvq_configs(bad)
    assert registry.parse_mmvq_types("q6_K,q4_K") == ("q4_K", "q6_K")
    with pytest.raises(ValueError, match="--mmvq-types: 'f16' is not a type mmvq runs"):
        registry.parse_mmvq_types("q4_K,f16")
    assert registry.parse_mmvq_regs("64,64") == (64,) and registry.parse_mmvq_regs("none") == ()
    for bad in ("32", "x", "", "64,"):
        with pytest.raises(ValueError, match=r"--mmvq-regs: .* is not one of 64"):
            registry.parse_mmvq_regs(bad)


def test_a_register_cap_asks_for_as_many_blocks_as_fit_65536_registers() -> None:
    # 64 registers: 1024 resident threads whatever the block (upstream asks for 1 block, no cap)
    assert [registry.mmvq_min_blocks(w, 64) for w in (1, 2, 4, 8)] == [32, 16, 8, 4]
    assert registry.mmvq_min_blocks(4, 0) == 1
    # each pair uncapped keeps its index; the capped ones follow
    n = len(registry.MMVQ_CONFIGS)
    assert registry.MMVQ_CANDIDATES[:n] == tuple((w, r, 0) for w, r in registry.MMVQ_CONFIGS)
    assert registry.MMVQ_CANDIDATES[n:] == tuple((w, r, 64) for w, r in registry.MMVQ_CONFIGS)
    assert (
        registry.MmvqBuild().kernels()
        == 2 * len(registry.MMVQ_DEFAULT_CONFIGS) * len(registry.MMVQ_DEFAULT_TYPES) * registry.MMVQ_MAX_COLS
    )
    # an install record of a hook without caps: its choice of pairs and types is kept, the caps default
    old = registry.MmvqBuild.from_json({"configs": "4x2", "types": "q6_K"})
    assert old == registry.MmvqBuild(((4, 2),), ("q6_K",), registry.MMVQ_DEFAULT_REGS)
    chosen = registry.MmvqBuild.from_json({"configs": "4x2", "types": "q6_K", "regs": "none"})
    assert chosen is not None and chosen.regs == () and not chosen.compiled("q6_K", (4, 2), 64)
    assert chosen.compiled("q6_K", (4, 2))


# ---- the codes header and ggml-dispatch-mmvq.h --------------------------------------------------------


def test_codes_header_emits_the_generated_candidates() -> None:
    text = codes.render_codes_header()
    listed = re.search(r"#define GGML_DISPATCH_MMVQ_CONFIG_LIST\(X\)(.*)", text)
    assert listed is not None
    found = re.findall(r"X\((\d+), (\d+), (\d+), (\d+)\)", listed.group(1))
    quads = [tuple(int(x) for x in m) for m in found]
    assert quads == [(i + 1, w, r, g) for i, (w, r, g) in enumerate(registry.MMVQ_CANDIDATES)]
    assert '#define GGML_DISPATCH_MMVQ_DEFAULT_REGS "64"' in text
    types = re.search(r"#define GGML_DISPATCH_MMVQ_TYPE_LIST\(X\)(.*)", text)
    assert types is not None
    assert re.findall(r'X\((\d+), "(\w+)"\)', types.group(1)) == [
        (str(registry.GGML_TYPES[t].id), t) for t in registry.MMVQ_TYPES
    ]
    defaults = ",".join(registry.mmvq_pair_text(p) for p in registry.MMVQ_DEFAULT_CONFIGS)
    assert f'#define GGML_DISPATCH_MMVQ_DEFAULT_CONFIGS "{defaults}"' in text


PROBE = r"""
#include "ggml-dispatch-mmvq.h"
#include <cstdio>
int main() {
    // every (type, candidate) the build compiles, as the eligibility check and the launcher ask it
    std::printf("[");
    bool first = true;
#define T(id, name) \
    for (int cfg = 1; cfg <= GGML_DISPATCH_MMVQ_CONFIG_COUNT; ++cfg) { \
        if (ggml_dispatch_mmvq_compiled(id, cfg)) { \
            std::printf("%s[\"%s\",%d,%d,%d]", first ? "" : ",", name, ggml_dispatch_mmvq_nwarps_or(cfg, 0), \
                        ggml_dispatch_mmvq_rows_or(cfg, 0), ggml_dispatch_mmvq_regs_of(cfg)); \
            first = false; \
        } \
    }
    GGML_DISPATCH_MMVQ_TYPE_LIST(T)
    std::printf("]\n");
    static_assert(ggml_dispatch_mmvq_nwarps_or(0, 7) == 7, "0 = stock");
    static_assert(ggml_dispatch_mmvq_rows_or(0, 3) == 3, "0 = stock");
    static_assert(ggml_dispatch_mmvq_compiled(12, 0), "stock is always compiled");
    static_assert(ggml_dispatch_mmvq_min_blocks(0, 32) == 1, "stock asks for one block");
    constexpr int capped_4x2 = ggml_dispatch_mmvq_index(4, 2, 64);
    constexpr int capped_8x1 = ggml_dispatch_mmvq_index(8, 1, 64);
    static_assert(ggml_dispatch_mmvq_min_blocks(capped_4x2, 32) == 8, "64 registers x 128 threads");
    static_assert(ggml_dispatch_mmvq_min_blocks(capped_8x1, 32) == 4, "64 registers x 256 threads");
    static_assert(ggml_dispatch_mmvq_min_blocks(ggml_dispatch_mmvq_index(4, 2), 32) == 1, "uncapped");
    static_assert(ggml_dispatch_mmvq_index(4, 2, 48) == 0, "48 is not a cap");
    return ggml_dispatch_config_problem(GGML_DISPATCH_ROUTE_MMVQ) == NULL ? 0 : 1;
}
"""


def _probe(tmp_path: Path, *defines: str) -> subprocess.CompletedProcess[str]:
    assert CXX is not None
    codes.write_codes_header(tmp_path)
    (tmp_path / "probe.cpp").write_text(PROBE)
    build = subprocess.run(
        [
            CXX,
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            *defines,
            f"-I{tmp_path}",
            f"-I{inst.NATIVE_DIR}",
            str(tmp_path / "probe.cpp"),
            "-o",
            str(tmp_path / "probe"),
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        return build
    return subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_the_c_side_compiles_the_registry_defaults_without_a_build_header(tmp_path: Path) -> None:
    res = _probe(tmp_path)
    assert res.returncode == 0, res.stderr
    got = {(t, w, r, g) for t, w, r, g in json.loads(res.stdout)}
    assert got == {
        (t, w, r, g)
        for t in registry.MMVQ_DEFAULT_TYPES
        for w, r in registry.MMVQ_DEFAULT_CONFIGS
        for g in (0, *registry.MMVQ_DEFAULT_REGS)
    }


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_a_compile_definition_restricts_the_instances(tmp_path: Path) -> None:
    res = _probe(
        tmp_path,
        '-DGGML_DISPATCH_MMVQ_CONFIGS="8x1;4x2"',
        '-DGGML_DISPATCH_MMVQ_TYPES="q6_K q4_K"',
        '-DGGML_DISPATCH_MMVQ_REGS="none"',
    )
    assert res.returncode == 0, res.stderr
    assert sorted(map(tuple, json.loads(res.stdout))) == [
        ("q4_K", 4, 2, 0),
        ("q4_K", 8, 1, 0),
        ("q6_K", 4, 2, 0),
        ("q6_K", 8, 1, 0),
    ]
    res = _probe(tmp_path, '-DGGML_DISPATCH_MMVQ_CONFIGS="4x2"', '-DGGML_DISPATCH_MMVQ_TYPES="q5_K"')
    assert res.returncode == 0, res.stderr
    assert sorted(map(tuple, json.loads(res.stdout))) == [("q5_K", 4, 2, 0), ("q5_K", 4, 2, 64)]
    res = _probe(tmp_path, '-DGGML_DISPATCH_MMVQ_CONFIGS="all"', '-DGGML_DISPATCH_MMVQ_TYPES="all"')
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) == len(registry.MMVQ_CANDIDATES) * len(registry.MMVQ_TYPES)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
@pytest.mark.parametrize(
    "define",
    [
        '-DGGML_DISPATCH_MMVQ_CONFIGS="4x3"',
        '-DGGML_DISPATCH_MMVQ_TYPES="q4_K,f16"',
        '-DGGML_DISPATCH_MMVQ_REGS="48"',
    ],
)
def test_a_definition_naming_no_candidate_stops_the_build(tmp_path: Path, define: str) -> None:
    res = _probe(tmp_path, define)
    assert res.returncode != 0 and "GGML_DISPATCH_MMVQ_CONFIGS: items NxR" in res.stderr


# ---- install -----------------------------------------------------------------------------------------


def _defines(tree: Path) -> dict[str, str]:
    text = (tree / CUDA / inst.BUILD_HEADER).read_text()
    return dict(re.findall(r'#define (GGML_DISPATCH_MMVQ_\w+) "([^"]*)"', text))


def test_install_applies_both_features_to_the_pinned_tree(tree: Path) -> None:
    before = {n: (tree / CUDA / n).read_text() for n in ("mmvq.cu", "mmvf.cu")}
    plan = inst.install(tree)
    record = json.loads((tree / CUDA / inst.MANIFEST).read_text())
    assert record["features"]["mmvq_params"]["status"] == "applied"
    assert record["features"]["mmvf_params"]["status"] == "applied"
    mmvq = (tree / CUDA / "mmvq.cu").read_text()
    assert "int dispatch_cfg = 0>" in mmvq and '#include "ggml-dispatch-mmvq.cuh"' in mmvq
    assert "ggml_dispatch_mmvq_launch<type>(" in mmvq
    assert "ggml_dispatch_params_current().mmvf_block" in (tree / CUDA / "mmvf.cu").read_text()
    assert (tree / CUDA / "ggml-dispatch-mmvq.h").is_file() and (
        tree / CUDA / "ggml-dispatch-mmvq.cuh"
    ).is_file()
    assert _defines(tree) == {
        "GGML_DISPATCH_MMVQ_CONFIGS": ",".join(
            registry.mmvq_pair_text(p) for p in registry.MMVQ_DEFAULT_CONFIGS
        ),
        "GGML_DISPATCH_MMVQ_TYPES": ",".join(registry.MMVQ_DEFAULT_TYPES),
        "GGML_DISPATCH_MMVQ_REGS": ",".join(map(str, registry.MMVQ_DEFAULT_REGS)),
    }
    assert "ggml_dispatch_mmvq_min_blocks(dispatch_cfg, ggml_cuda_get_physical_warp_size())" in mmvq
    assert "features core+" in plan.messages[-1]
    inst.uninstall(tree)
    assert {n: (tree / CUDA / n).read_text() for n in ("mmvq.cu", "mmvf.cu")} == before


def test_a_tree_whose_kernel_differs_skips_the_feature(tree: Path) -> None:
    p = tree / CUDA / "mmvq.cu"
    p.write_text(
        p.read_text().replace(
            "constexpr int rows_per_cuda_block = calc_rows_per_block(",
            "constexpr int rows_per_cuda_block = my_rows(",
        )
    )
    plan = inst.install(tree)
    skipped = [m for m in plan.messages if m.startswith("feature mmvq_params skipped")]
    assert len(skipped) == 1 and "mmvq_kernel_shape" in skipped[0], plan.messages
    assert "dispatch_cfg" not in p.read_text()
    record = json.loads((tree / CUDA / inst.MANIFEST).read_text())
    assert record["features"]["mmvf_params"]["status"] == "applied"


def test_the_restriction_is_written_kept_and_refused_when_bad(tree: Path) -> None:
    runner = CliRunner()
    args = ["--mmvq-configs", "8x1,4x2", "--mmvq-types", "q6_K", "--mmvq-regs", "none"]
    res = runner.invoke(main, ["install", "--llama-cpp", str(tree), *args])
    assert res.exit_code == 0, res.output
    assert _defines(tree) == {
        "GGML_DISPATCH_MMVQ_CONFIGS": "4x2,8x1",
        "GGML_DISPATCH_MMVQ_TYPES": "q6_K",
        "GGML_DISPATCH_MMVQ_REGS": "none",
    }
    res = runner.invoke(main, ["install", "--llama-cpp", str(tree)])  # a later install keeps the choice
    assert res.exit_code == 0, res.output
    assert _defines(tree)["GGML_DISPATCH_MMVQ_CONFIGS"] == "4x2,8x1"
    assert _defines(tree)["GGML_DISPATCH_MMVQ_REGS"] == "none"
    before = (tree / CUDA / inst.BUILD_HEADER).read_text()
    res = runner.invoke(main, ["install", "--llama-cpp", str(tree), "--mmvq-configs", "8x3"])
    assert res.exit_code == 2
    assert "--mmvq-configs: '8x3' is not one of" in res.output and "Traceback" not in res.output
    assert (tree / CUDA / inst.BUILD_HEADER).read_text() == before


def _table(rules: list[dict[str, Any]]) -> dict[str, Any]:
    from ggml_dispatch.codegen import table

    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = schema.PINNED_UPSTREAM_COMMIT
    t["provenance"] = {"source": "measured"}
    t["rules"] = rules
    return t


def _rule(src0: str, config: str, M: int = 1) -> dict[str, Any]:
    c = registry.Config.parse(config)
    rule: dict[str, Any] = {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": src0,
        "src1_type": "f32",
        "N": 4096,
        "K": 4096,
        "B": 1,
        "M_lo": M,
        "M_hi": M,
        "route": c.route.value,
    }
    if c.params:
        rule["config"] = str(c)
    return rule


def test_rules_for_candidates_the_build_lacks_are_dropped(tree: Path, tmp_path: Path) -> None:
    from ggml_dispatch.codegen import table

    path = tmp_path / "table.json"
    rules = [
        _rule("q4_K", "mmvq/nwarps=8,rows=1"),
        _rule("q6_K", "mmvq/nwarps=8,rows=1"),
        _rule("q4_K", "mmvq", 2),
    ]
    path.write_text(table.dumps(_table(rules)))
    plan = inst.install(tree, table_path=path, mmvq_configs="8x1", mmvq_types="q4_K")
    assert any("1 rule(s) dropped: their mmvq configuration is not compiled" in m for m in plan.messages), (
        plan.messages
    )
    record = json.loads((tree / CUDA / inst.MANIFEST).read_text())
    assert record["table_rules"] == 2


# ---- nvcc: the hooked mmvq.cu and mmvf.cu of the pinned tree for sm_90 -------------------------------------


@pytest.fixture(scope="module")
def nvcc_objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """nvcc -c of the hooked mmvq.cu with one candidate for one type (MMVQ_ONE: 8x1, q4_K; the full set
    takes minutes: see docs/mmvq-configs.md) and of the hooked mmvf.cu, for sm_90 with the tree's flags, in
    parallel: one compile each for this file and tests/test_compat_matrix.py's pinned tree
    (tests/native_shared.py)."""
    import native_shared
    from test_native_build import MMVQ_ONE, NVCC, compile_unit

    if NVCC is None:
        pytest.skip("nvcc is not installed on this machine")
    assert MMVQ_ONE == ['-DGGML_DISPATCH_MMVQ_CONFIGS="8x1"', '-DGGML_DISPATCH_MMVQ_TYPES="q4_K"']
    tree = native_shared.patched_tree(tmp_path_factory)
    cublas = fetch.cublas_headers()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        futures = {
            "mmvq": ex.submit(compile_unit, tmp_path_factory, tree, cublas, "mmvq.cu", MMVQ_ONE),
            "mmvf": ex.submit(compile_unit, tmp_path_factory, tree, cublas, "mmvf.cu"),
        }
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.slow
def test_the_hooked_mmvq_compiles_exactly_the_asked_instances_for_sm90(
    nvcc_objects: dict[str, tuple[Path, Any]],
) -> None:
    from test_native_build import _hook_warnings

    obj, res = nvcc_objects["mmvq"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []
    nm = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    # the pair uncapped and under each default register cap (GGML_DISPATCH_MMVQ_REGS left at its default)
    cfgs = [registry.MMVQ_CANDIDATES.index((8, 1, g)) + 1 for g in (0, *registry.MMVQ_DEFAULT_REGS)]
    candidates = set(
        re.findall(r"mul_mat_vec_q<\(ggml_type\)(\d+), (\d), false, false, false, ([1-9]\d*)>", nm)
    )
    q4_k = registry.GGML_TYPES["q4_K"].id
    assert candidates == {
        (str(q4_k), str(n), str(cfg)) for n in range(1, registry.MMVQ_MAX_COLS + 1) for cfg in cfgs
    }


@pytest.mark.slow
def test_the_hooked_mmvf_compiles_for_sm90(nvcc_objects: dict[str, tuple[Path, Any]]) -> None:
    from test_native_build import _hook_warnings

    _, res = nvcc_objects["mmvf"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert _hook_warnings(res.stderr) == []
