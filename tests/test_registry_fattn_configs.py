"""FlashAttention configurations in the registry, held against the pinned tree: the MMA_F16 tiles
(ncols1 x ncols2) the sweep lists are exactly the compiled instance pairs (template-instances/ file names
and their DECL_FATTN_MMA_F16_CASE lines), every legal parameter value is reachable, and the codes fit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggml_dispatch import fetch, registry

CUDA = Path("ggml/src/ggml-cuda")
# the head dims that go through switch_ncols2 with every ncols2 <= 8 (fattn.cu)
SWITCHED_D = (64, 80, 96, 112, 128, 256)


def compiled_pairs() -> dict[int, set[tuple[int, int]]]:
    """DKQ -> the (ncols1, ncols2) of its compiled MMA_F16 instances."""
    out: dict[int, set[tuple[int, int]]] = {}
    files = sorted((fetch.llama_cpp_dir() / CUDA / "template-instances").glob("fattn-mma-f16-instance-*.cu"))
    assert files, "no MMA_F16 instance files in the pinned tree"
    for f in files:
        m = re.fullmatch(r"fattn-mma-f16-instance-ncols1_(\d+)-ncols2_(\d+)\.cu", f.name)
        assert m, f.name
        pair = (int(m[1]), int(m[2]))
        decls = re.findall(r"DECL_FATTN_MMA_F16_CASE\((\d+), (\d+), (\d+), (\d+)\)", f.read_text())
        assert decls, f.name
        for d, _dv, a, b in decls:
            assert (int(a), int(b)) == pair, f"{f.name}: {d} declares {a}x{b}"
            out.setdefault(int(d), set()).add(pair)
    return out


def test_mma_tiles_of_the_sweep_are_the_compiled_instance_pairs() -> None:
    pairs = compiled_pairs()
    swept = {
        (int(dict(c.params)["ncols1"]), int(dict(c.params)["ncols2"]))
        for c in registry.route_configs(registry.Route.FA_MMA)
        if "ncols1" in dict(c.params)
    }
    for d in SWITCHED_D:
        assert pairs[d] == swept, d
    # head dim 512 has every tile but ncols2 = 1 (switch_ncols2 aborts there): the runtime refuses those
    assert pairs[512] == {p for p in swept if p[1] > 1}
    spec = registry.ROUTES[registry.Route.FA_MMA]
    for name in ("ncols1", "ncols2"):
        param = spec.param(name)
        assert param is not None
        i = 0 if name == "ncols1" else 1
        assert {str(p[i]) for p in swept} == set(param.values), name
    assert registry.fa_mma_pair_compiled(8, 4) and not registry.fa_mma_pair_compiled(64, 2)
    assert not registry.fa_mma_pair_compiled(1, 16)  # a packing of 16 only at head dims 192/576


def test_fa_sweeps_list_every_compiled_tile_with_each_switch_and_vec_blocks() -> None:
    mma = [str(c) for c in registry.route_configs("fa_mma")]
    # the kv=shadow switch alone, then 16 compiled tiles x sparse x stream-k, each without and with it
    assert mma[:2] == ["fa_mma", "fa_mma/kv=shadow"] and len(mma) == 2 + 16 * 2 * 2 * 2 == len(set(mma))
    assert "fa_mma/ncols1=8,ncols2=4,sparse=off,stream_k=on" in mma
    assert "fa_mma/ncols1=8,ncols2=4,sparse=off,stream_k=on,kv=shadow" in mma
    assert not any("ncols1=64,ncols2=2" in c for c in mma)
    vec = [str(c) for c in registry.route_configs("fa_vec")]
    blocks = [f"fa_vec/blocks={1 << i}" for i in range(9)]
    assert vec == ["fa_vec", "fa_vec/kv=shadow", *(c for b in blocks for c in (b, f"{b},kv=shadow"))]
    assert [str(c) for c in registry.route_configs("fa_tile")] == ["fa_tile", "fa_tile/kv=shadow"]


@pytest.mark.parametrize(
    "text",
    [
        "fa_mma/ncols2=4",
        "fa_mma/ncols1=16,ncols2=2",
        "fa_mma/stream_k=off",
        "fa_mma/sparse=on",
        "fa_vec/blocks=64",
    ],
)
def test_partial_configurations_round_trip_and_fit_a_code(text: str) -> None:
    c = registry.Config.parse(text)
    assert str(c) == text and registry.Config.from_code(c.code) == c
    assert 0 < c.code < 1 << 31 and c.code & registry.ROUTE_CODE_MASK == registry.ROUTES[c.route].code


def test_a_tile_no_instance_has_still_parses_and_the_runtime_refuses_it() -> None:
    # C parses what Python parses (the codes header): the pair is refused at run time (ineligible:params)
    c = registry.Config.parse("fa_mma/ncols1=64,ncols2=2")
    assert not registry.config_pairs_compiled(c.route, c.params)
    with pytest.raises(registry.ConfigError, match="not one of"):
        registry.Config.parse("fa_mma/ncols2=16")
    with pytest.raises(registry.ConfigError, match="has no parameter 'blocks'"):
        registry.Config.parse("fa_mma/blocks=2")
