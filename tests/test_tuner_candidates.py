"""tuner.candidates: every op's description names a candidate generator the tuner resolves, and a census'
cases are its ops' generators in code order (the same cases as the per-op selections they call)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ggml_dispatch import registry
from ggml_dispatch.census import attention
from ggml_dispatch.tuner import attention as tattn
from ggml_dispatch.tuner import candidates, select
from ggml_dispatch.tuner import mul_mat_id as tmoe
from ggml_dispatch.tuner.run import SweepSettings

SETTINGS = SweepSettings(routes=select.ALL_ROUTES, trials=3, nmse_max=1e-3, coverage=1.0)


def test_every_op_has_a_candidate_generator_in_the_tuner() -> None:
    modules = {registry.Op.MUL_MAT: select, registry.Op.MUL_MAT_ID: tmoe, registry.Op.FLASH_ATTN_EXT: tattn}
    assert set(modules) == set(registry.OPS)
    for op, spec in registry.OPS.items():
        assert candidates.generator(op) is modules[op].candidates, spec.candidates
    for kind in registry.CENSUS_KINDS:  # every census kind is recognised and read by its first op's module
        reader = candidates.census_reader(kind)
        module = {registry.CENSUS_MATMUL: select, registry.CENSUS_ATTENTION: tattn}[kind]
        assert reader.is_census is module.is_census and reader.read is module.read_census


def test_a_census_kind_whose_module_cannot_read_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = registry.OPS[registry.Op.FLASH_ATTN_EXT]
    bare = dataclasses.replace(
        spec, candidates="ggml_dispatch.tuner.mul_mat_id"
    )  # has candidates(), no reader
    monkeypatch.setitem(registry.OPS, registry.Op.FLASH_ATTN_EXT, bare)
    candidates.census_reader.cache_clear()
    try:
        with pytest.raises(
            ValueError, match=r"attention census: ggml_dispatch\.tuner\.mul_mat_id has no is_census"
        ):
            candidates.census_reader(registry.CENSUS_ATTENTION)
    finally:
        candidates.census_reader.cache_clear()


@pytest.mark.parametrize(
    ("name", "message"),
    [("os.path", "not a module of ggml_dispatch.tuner"), ("ggml_dispatch.tuner.journal", "no candidates()")],
)
def test_a_generator_name_that_does_not_resolve_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, message: str
) -> None:
    spec = registry.OPS[registry.Op.FLASH_ATTN_EXT]
    monkeypatch.setitem(registry.OPS, registry.Op.FLASH_ATTN_EXT, dataclasses.replace(spec, candidates=name))
    candidates.generator.cache_clear()
    try:
        with pytest.raises(ValueError, match=message):
            candidates.generator(registry.Op.FLASH_ATTN_EXT)
    finally:
        candidates.generator.cache_clear()


def _matmul_rows() -> list[dict[str, Any]]:
    dense = {"op": "MUL_MAT", "layout": "weight", "fused": None, "src0_type": "q4_K", "src1_type": "f32"}
    moe = {"op": "MUL_MAT_ID", "layout": "expert", "fused": None, "src0_type": "q4_K", "src1_type": "f32"}
    return [
        dense | {"M": 512, "N": 4096, "K": 4096, "B": 1, "E": 1, "U": 1, "est_us": 10.0},
        dense | {"M": 1, "N": 4096, "K": 4096, "B": 1, "E": 1, "U": 1, "est_us": 3.0},
        moe | {"M": 512, "N": 2048, "K": 768, "B": 1, "E": 128, "U": 8, "est_us": 100.0},
        moe | {"M": 512, "N": 768, "K": 2048, "B": 1, "E": 128, "U": 1, "est_us": 1.0, "fused": "glu"},
    ]


def test_a_matmul_census_is_mul_mat_then_mul_mat_id(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _matmul_rows()
    table = pa.Table.from_pylist(rows)
    monkeypatch.setattr(
        candidates, "census_reader", lambda kind: candidates.CensusReader(lambda p: True, lambda p: table)
    )
    monkeypatch.setattr(candidates, "census_kind", lambda p: registry.CENSUS_MATMUL)
    sel = candidates.select(Path("c.parquet"), SETTINGS)
    base = select.select_cases(rows, coverage=1.0, routes=SETTINGS.routes, trials=3, nmse_max=1e-3)
    moe = tmoe.select_mul_mat_id(rows, coverage=1.0, routes=SETTINGS.routes, trials=3, nmse_max=1e-3)
    want = tmoe.with_mul_mat_id(base, moe)
    assert sel == want and {c.shape.op for c in sel.cases} == {"MUL_MAT", "MUL_MAT_ID"}
    # no routing kind wanted: MUL_MAT_ID adds nothing, its rows stay skipped
    sel = candidates.select(Path("c.parquet"), dataclasses.replace(SETTINGS, routing_kinds=()))
    assert sel == base


def test_an_attention_census_is_flash_attn_ext(tmp_path: Path) -> None:
    from tests.test_tuner_attention import attn_key, tally

    rows = attention.attention_rows(
        {attn_key("q8_0", 2, 16384): tally(9), attn_key("q8_0", 1, 4096): tally(9)}
    )
    path = tmp_path / "attn.parquet"
    attention.write(rows, path, {}, tmp_path / "trace.jsonl")
    assert candidates.census_kind(path) == registry.CENSUS_ATTENTION
    wanted = dataclasses.replace(SETTINGS, routes=tattn.FA_ROUTES)
    sel = candidates.select(path, wanted)
    assert sel == tattn.select_attention(tattn.read_attention_census(path), routes=tattn.FA_ROUTES, trials=3,
                                         nmse_max=1e-3)  # fmt: skip
    assert [c.shape.op for c in sel.cases] == ["FLASH_ATTN_EXT"] * 2
