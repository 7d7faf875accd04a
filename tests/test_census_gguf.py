"""GGUF metadata (real files written with gguf.GGUFWriter, and the real SmolLM2), the trace join,
tensor roles, and the declared-workload census."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import MakeGguf, TraceBuilder

from ggml_dispatch import schema
from ggml_dispatch.census import aggregate, estimate, gguf_meta, roles, trace
from ggml_dispatch.census.gguf_meta import GgufModel
from ggml_dispatch.errors import InputError

HIDDEN, FFN, VOCAB = 64, 128, 256
KV = {"llama.block_count": 2, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2}


def tiny_llama(tied: bool = True, layers: int = 2) -> list[tuple[str, str, list[int]]]:
    t: list[tuple[str, str, list[int]]] = [("token_embd.weight", "q8_0", [HIDDEN, VOCAB])]
    for il in range(layers):
        b = f"blk.{il}."
        t += [
            (b + "attn_norm.weight", "f32", [HIDDEN]),
            (b + "attn_q.weight", "q8_0", [HIDDEN, HIDDEN]),
            (b + "attn_k.weight", "q8_0", [HIDDEN, HIDDEN // 2]),
            (b + "attn_v.weight", "q8_0", [HIDDEN, HIDDEN // 2]),
            (b + "attn_output.weight", "q4_1", [HIDDEN, HIDDEN]),
            (b + "ffn_norm.weight", "f32", [HIDDEN]),
            (b + "ffn_gate.weight", "q4_0", [HIDDEN, FFN]),
            (b + "ffn_up.weight", "q4_0", [HIDDEN, FFN]),
            (b + "ffn_down.weight", "f16", [FFN, HIDDEN]),
        ]
    t.append(("output_norm.weight", "f32", [HIDDEN]))
    if not tied:
        t.append(("output.weight", "f16", [HIDDEN, VOCAB]))
    return t


def routes_for(b: TraceBuilder, model: GgufModel, M: int, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out = []
    for t in model.matmul_weights():
        if t.name in skip:
            continue
        gt = schema.ggml_type(t.type_name)
        nb1 = gt.row_bytes(t.ne[0])
        out.append(
            b.route(
                M=M,
                tensor=t.name,
                src0_type=t.type_name,
                src0_ne=list(t.ne),
                src0_nb=[gt.type_size, nb1, nb1 * t.ne[1], nb1 * t.ne[1]],
                src1_ne=[t.ne[0], M, 1, 1],
                count=3,
            )
        )
    return out


def test_tensor_table_of_a_written_gguf(make_gguf: MakeGguf) -> None:
    m = gguf_meta.read_gguf(make_gguf("tiny.gguf", tiny_llama(), kv=KV))
    assert m.architecture == "llama" and m.block_count == 2 and m.head_count == 4 and m.head_count_kv == 2
    q = m.tensors["blk.0.attn_q.weight"]
    assert (q.type_name, q.ne, q.n_dims) == ("q8_0", (64, 64, 1, 1), 2)
    assert m.tensors["blk.1.ffn_down.weight"].ne == (FFN, HIDDEN, 1, 1)
    assert m.tied_embeddings and m.lm_head is not None and m.lm_head.name == "token_embd.weight"
    names = [t.name for t in m.matmul_weights()]
    assert "token_embd.weight" in names and not any("norm" in n for n in names)
    assert len(names) == 2 * 7 + 1
    untied = gguf_meta.read_gguf(make_gguf("untied.gguf", tiny_llama(tied=False), kv=KV))
    assert (
        not untied.tied_embeddings and untied.lm_head is not None and untied.lm_head.name == "output.weight"
    )
    assert "token_embd.weight" not in [t.name for t in untied.matmul_weights()]


def test_not_gguf_empty_and_truncated_files(tmp_path: Path, make_gguf: MakeGguf) -> None:
    good = make_gguf("good.gguf", tiny_llama(), kv=KV)
    cases = {
        "empty.gguf": (b"", "empty file"),
        "text.gguf": (b"hello, not a model\n", "not a GGUF file"),
        "header.gguf": (good.read_bytes()[:40], "truncated or corrupt GGUF"),
        "cut.gguf": (good.read_bytes()[: good.stat().st_size * 3 // 4], "truncated"),
        "tail.gguf": (good.read_bytes()[:-1], "truncated"),
    }
    for name, (data, needle) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(InputError, match=needle) as ei:
            gguf_meta.read_gguf(p)
        assert ei.value.path == str(p)
    with pytest.raises(InputError, match="cannot read"):
        gguf_meta.read_gguf(tmp_path / "missing.gguf")


def test_join_checks_types_and_shapes_and_reports_unseen(
    make_gguf: MakeGguf, make_trace: TraceBuilder
) -> None:
    path = make_gguf("tiny.gguf", tiny_llama(), kv=KV)
    m = gguf_meta.read_gguf(path)
    b = make_trace
    routes = routes_for(b, m, 1, skip=("blk.1.ffn_down.weight",))
    p = b.write("t.jsonl", [b.header(), *routes, b.footer()])
    agg = aggregate.Aggregator()
    trace.read_trace(p, agg.sink)
    rows, join = aggregate.trace_rows(agg.tallies, [m])
    assert join.unseen == {str(path): ["blk.1.ffn_down.weight"]}
    assert join.not_in_gguf == []
    by_tensor = {r["tensor"]: r for r in rows}
    assert by_tensor["token_embd.weight"]["role"] == "lm_head"
    assert by_tensor["blk.0.ffn_gate.weight"]["role"] == "ffn_gate"
    assert by_tensor["blk.1.attn_output.weight"]["src0_type"] == "q4_1"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"src0_type": "q4_0"}, "GGUF has q8_0 [64, 64, 1, 1], but"),
        (
            {"src0_ne": [64, 96, 1, 1], "src0_nb": [34, 68, 6528, 6528]},
            "multiplies by it as q8_0 [64, 96, 1, 1]",
        ),
    ],
)
def test_join_refuses_a_tensor_that_disagrees(
    make_gguf: MakeGguf, make_trace: TraceBuilder, override: dict[str, Any], needle: str
) -> None:
    path = make_gguf("tiny.gguf", tiny_llama(), kv=KV)
    m = gguf_meta.read_gguf(path)
    b = make_trace
    routes = routes_for(b, m, 1)
    bad = next(r for r in routes if r["tensor"] == "blk.0.attn_q.weight")
    bad.update(override)
    p = b.write("t.jsonl", [b.header(), *routes, b.footer()])
    agg = aggregate.Aggregator()
    trace.read_trace(p, agg.sink)
    with pytest.raises(InputError) as ei:
        aggregate.trace_rows(agg.tallies, [m])
    err = ei.value
    assert err.path == str(path) and err.field == "tensor 'blk.0.attn_q.weight'"
    assert needle in err.message and f"{p}:" in err.message


def test_two_models_with_the_same_tensor_names(make_gguf: MakeGguf, make_trace: TraceBuilder) -> None:
    """A speculative run traces a draft and a main model whose tensor names collide."""
    main = gguf_meta.read_gguf(make_gguf("main.gguf", tiny_llama(), kv=KV))
    draft_t = [(n, "q8_0" if t != "f32" else t, [s * 2 for s in ne]) for n, t, ne in tiny_llama(layers=1)]
    draft = gguf_meta.read_gguf(make_gguf("draft.gguf", draft_t, kv={**KV, "llama.block_count": 1}))
    b = make_trace
    p = b.write("t.jsonl", [b.header(), *routes_for(b, main, 1), *routes_for(b, draft, 1), b.footer()])
    agg = aggregate.Aggregator()
    trace.read_trace(p, agg.sink)
    rows, join = aggregate.trace_rows(agg.tallies, [main, draft])
    assert join.unseen == {} and join.not_in_gguf == []
    assert len(rows) == len(list(main.matmul_weights())) + len(list(draft.matmul_weights()))


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> GgufModel:
    return gguf_meta.read_gguf(smollm2_gguf)


def test_real_smollm2_tensor_table(smollm2: GgufModel) -> None:
    m = smollm2
    assert m.architecture == "llama" and m.block_count == 30 and m.tied_embeddings
    assert (m.head_count, m.head_count_kv) == (9, 3)
    hist = {h["type"]: h["tensors"] for h in aggregate.weight_type_histogram([m])}
    assert hist == {"q4_1": 210, "q8_0": 1}
    assert m.tensors["token_embd.weight"].ne == (576, 49152, 1, 1)
    assert m.tensors["blk.0.ffn_down.weight"].ne == (1536, 576, 1, 1)


def test_declared_census_of_real_smollm2(smollm2: GgufModel) -> None:
    m = smollm2
    spec = estimate.lookup_name("NVIDIA H200")
    assert spec is not None
    ms = [1, 2, 3, 4, 8, 512, 1024]
    rows = aggregate.declared_rows(m, ms, 1, spec)
    assert len(rows) == 210 * len(ms) + 1
    head = [r for r in rows if r["role"] == "lm_head"]
    assert len(head) == 1
    assert (head[0]["tensor"], head[0]["M"], head[0]["N"], head[0]["K"]) == (
        "token_embd.weight",
        1,
        49152,
        576,
    )
    assert head[0]["calls"] == len(ms)
    assert {r["source"] for r in rows} == {"declared"}
    assert all(r["est_us"] > 0 and r["route"] is None for r in rows)
    q = [r for r in rows if r["tensor"] == "blk.3.attn_q.weight"]
    assert sorted(r["M"] for r in q) == ms
    rows4 = aggregate.declared_rows(m, ms, 4, spec)
    assert [r["M"] for r in rows4 if r["role"] == "lm_head"] == [4]


def test_declared_census_of_an_moe_model(make_gguf: MakeGguf) -> None:
    E, U = 8, 2
    tensors = [
        ("token_embd.weight", "q8_0", [HIDDEN, VOCAB]),
        ("blk.0.attn_q.weight", "q8_0", [HIDDEN, HIDDEN]),
        ("blk.0.ffn_gate_inp.weight", "f32", [HIDDEN, E]),
        ("blk.0.ffn_gate_exps.weight", "q8_0", [HIDDEN, FFN, E]),
        ("blk.0.ffn_up_exps.weight", "q8_0", [HIDDEN, FFN, E]),
        ("blk.0.ffn_down_exps.weight", "q8_0", [FFN, HIDDEN, E]),
        ("output.weight", "q8_0", [HIDDEN, VOCAB]),
    ]
    kv = {"qwen3moe.block_count": 1, "qwen3moe.expert_count": E, "qwen3moe.expert_used_count": U}
    m = gguf_meta.read_gguf(make_gguf("moe.gguf", tensors, arch="qwen3moe", kv=kv))
    assert (m.expert_count, m.expert_used_count) == (E, U)
    spec = estimate.lookup_name("h100 pcie")
    assert spec is not None
    rows = {(r["tensor"], r["M"]): r for r in aggregate.declared_rows(m, [1, 64], 1, spec)}
    up = rows[("blk.0.ffn_up_exps.weight", 64)]
    down = rows[("blk.0.ffn_down_exps.weight", 64)]
    assert (up["op"], up["layout"], up["E"], up["U"], up["M"], up["N"], up["K"]) == (
        "MUL_MAT_ID",
        "expert",
        E,
        1,
        64,
        FFN,
        HIDDEN,
    )
    assert (down["E"], down["U"], down["N"], down["K"]) == (E, U, HIDDEN, FFN)
    router = rows[("blk.0.ffn_gate_inp.weight", 1)]
    assert (router["op"], router["role"], router["src0_type"]) == ("MUL_MAT", "ffn_gate_inp", "f32")
    assert [k for k in rows if k[0] == "output.weight"] == [("output.weight", 1)]


@pytest.mark.parametrize(
    ("name", "layout", "role"),
    [
        ("blk.0.attn_q.weight", "weight", "attn_q"),
        ("blk.31.attn_output.weight", "weight", "attn_output"),
        ("blk.2.attn_qkv.weight", "weight", "attn_qkv"),
        ("blk.7.ffn_down.weight", "weight", "ffn_down"),
        ("blk.0.attn_gate.weight", "weight", "attn_gate"),
        ("blk.0.ssm_out.weight", "weight", "ssm_out"),
        ("blk.0.ssm_beta.weight", "weight", "ssm_beta"),
        ("blk.64.nextn.eh_proj.weight", "weight", "nextn.eh_proj"),
        ("blk.64.nextn.enorm.weight", "weight", "other"),
        ("blk.0.ssm_dt.bias", "weight", "other"),
        ("blk.0.nextn.nextn.eh_proj.weight", "weight", "other"),
        ("blk.7.ffn_up_exps.weight", "expert", "ffn_up_exps"),
        ("output.weight", "weight", "lm_head"),
        ("token_embd.weight", "weight", "lm_head"),
        ("cache_k_l3 (view) (permuted)", "attention", "attn_kq"),
        ("cache_v_l3 (view) (permuted)", "attention", "attn_kqv"),
        ("cache_v_l12 (view)", "attention", "attn_kqv"),
        ("k-4", "attention", "attn_kq"),
        ("v-4 (permuted)", "attention", "attn_kqv"),
        ("k-4", "weight", "other"),
        ("blk.0.attn_norm.weight", "weight", "other"),
        ("blk.0.attn_q.weight.lora_a", "weight", "other"),
        ("self_k_rot", "weight", "other"),
        ("evil */ blk.0.attn_q.weight", "weight", "other"),
    ],
)
def test_roles(name: str, layout: str, role: str) -> None:
    assert roles.role_of(name, layout) == role
