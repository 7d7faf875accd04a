"""Model files for device runs: metadata extraction, clone and dense writer, on real GGUF files."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from ggml_dispatch import fetch
from ggml_dispatch.census import gguf_meta
from lab import models


def _tensors(path: Path) -> list[tuple[str, list[int], str]]:
    r = gguf.GGUFReader(path)
    return [(t.name, [int(x) for x in t.shape], t.tensor_type.name) for t in r.tensors]


def test_clone_has_the_real_metadata_names_types_and_shapes(smollm2_gguf: Path, tmp_path: Path) -> None:
    meta = tmp_path / "meta.gguf"
    models.extract_meta(smollm2_gguf, meta)
    assert meta.stat().st_size < 4 << 20  # small enough to travel to the GPU machine
    assert _tensors(meta) == []
    out = tmp_path / "clone.gguf"
    models.clone(meta, out, seed=1)
    assert _tensors(out) == _tensors(smollm2_gguf)
    assert out.stat().st_size == smollm2_gguf.stat().st_size
    a, b = gguf.GGUFReader(smollm2_gguf), gguf.GGUFReader(out)
    assert set(a.fields) == set(b.fields)
    for key in ("llama.embedding_length", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert a.fields[key].contents() == b.fields[key].contents()
    # weights are random but not degenerate: the q8_0 embedding dequantizes to non-constant values
    emb = next(t for t in b.tensors if t.name == "token_embd.weight")
    values = gguf.quants.dequantize(emb.data[:8], emb.tensor_type)
    assert np.std(values) > 0.001


def test_dense_writer_real_architecture_metadata(smollm2_gguf: Path, tmp_path: Path) -> None:
    dims = models.Dims("qwen3", hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, layers=2)
    out = tmp_path / "dense.gguf"
    models.write_dense(out, dims, smollm2_gguf)
    r = gguf.GGUFReader(out)
    assert r.fields["general.architecture"].contents() == "qwen3"
    assert r.fields["qwen3.attention.key_length"].contents() == 64
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 49152
    by_name = {t.name: ([int(x) for x in t.shape], t.tensor_type.name) for t in r.tensors}
    assert by_name["blk.1.attn_q.weight"] == ([256, 256], "F16")
    assert by_name["blk.1.attn_k.weight"] == ([256, 128], "F16")
    assert by_name["blk.0.ffn_down.weight"] == ([512, 256], "F16")
    assert by_name["blk.0.attn_q_norm.weight"] == ([64], "F32")
    assert by_name["output.weight"] == ([256, 49152], "F16")


def _moe_dims(layers: int = 2) -> models.Dims:
    """The preset's structure at a size a test can write: fewer experts, smaller FFN and attention."""
    base = models.PRESETS["qwen3moe-a3b"]
    return dataclasses.replace(
        base, layers=layers, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=16, expert_ffn=64
    )


def test_the_moe_preset_has_qwen3_30b_a3b_dimensions() -> None:
    d = dataclasses.replace(models.PRESETS["qwen3moe-a3b"], layers=8)
    assert (d.arch, d.hidden, d.experts, d.experts_used, d.expert_ffn) == ("qwen3moe", 2048, 128, 8, 768)
    specs = dict(models._tensor_specs(d, vocab=49152))
    assert specs["blk.7.ffn_gate_exps.weight"] == [2048, 768, 128]
    assert specs["blk.7.ffn_up_exps.weight"] == [2048, 768, 128]
    assert specs["blk.7.ffn_down_exps.weight"] == [768, 2048, 128]
    assert specs["blk.0.ffn_gate_inp.weight"] == [2048, 128]
    assert specs["blk.0.attn_q.weight"] == [2048, 32 * 128]
    assert specs["blk.0.attn_k.weight"] == [2048, 4 * 128]
    assert specs["blk.0.attn_q_norm.weight"] == [128]
    assert "blk.0.ffn_up.weight" not in specs and "blk.8.attn_q.weight" not in specs


def test_moe_writer_loads_with_gguf_and_the_pinned_tree_gguf_py(smollm2_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "qwen3moe-test-moe-L2.gguf"
    models.write_dense(out, _moe_dims(), smollm2_gguf)
    r = gguf.GGUFReader(out)
    assert r.fields["general.architecture"].contents() == "qwen3moe"
    assert r.fields["qwen3moe.expert_count"].contents() == 16
    assert r.fields["qwen3moe.expert_used_count"].contents() == 8
    assert r.fields["qwen3moe.expert_feed_forward_length"].contents() == 64
    assert r.fields["qwen3moe.block_count"].contents() == 2
    assert "moe 16x8" in r.fields["general.name"].contents()
    by_name = {t.name: ([int(x) for x in t.shape], t.tensor_type.name) for t in r.tensors}
    assert by_name["blk.1.ffn_gate_exps.weight"] == ([256, 64, 16], "F16")
    assert by_name["blk.0.ffn_down_exps.weight"] == ([64, 256, 16], "F16")
    assert by_name["blk.0.ffn_gate_inp.weight"] == ([256, 16], "F32")
    up = next(t for t in r.tensors if t.name == "blk.0.ffn_up_exps.weight")
    assert np.std(np.asarray(up.data, dtype=np.float32)) > 0.001
    # the reader of the pinned tree's gguf-py (what its convert and quantize tools read)
    tree = fetch.llama_cpp_dir()
    code = (
        "import json,sys; from gguf import GGUFReader; r=GGUFReader(sys.argv[1]);"
        "t={x.name: [int(v) for v in x.shape] for x in r.tensors};"
        "print(json.dumps({'arch': r.fields['general.architecture'].contents(),"
        "'experts': r.fields['qwen3moe.expert_count'].contents(), 'n': len(t),"
        "'down': t['blk.1.ffn_down_exps.weight']}))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        env={"PYTHONPATH": str(tree / "gguf-py"), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got == {"arch": "qwen3moe", "experts": 16, "n": len(r.tensors), "down": [64, 256, 16]}


def test_census_sees_the_moe_files_experts(smollm2_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "moe.gguf"
    models.write_dense(out, _moe_dims(), smollm2_gguf)
    m = gguf_meta.read_gguf(out)
    assert (m.expert_count, m.expert_used_count) == (16, 8)
    exps = [t for t in m.matmul_weights() if t.name.endswith("_exps.weight")]
    assert len(exps) == 6 and all(t.n_dims == 3 for t in exps)


def test_scaled_init_keeps_token_embeddings_large_and_residual_projections_small(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    """The MoE preset's default: embeddings N(0, 1), projections into the residual stream N(0, 0.02 /
    sqrt(2 L)), everything else N(0, 0.02); --init flat gives the dense models' N(0, 0.02) throughout."""
    assert models.PRESETS["qwen3moe-a3b"].init == "scaled" and models.PRESETS["llama8b"].init == "flat"
    stds = {}
    for init in models.INITS:
        out = tmp_path / f"{init}.gguf"
        models.write_dense(out, dataclasses.replace(_moe_dims(layers=2), init=init), smollm2_gguf)
        r = gguf.GGUFReader(out)
        stds[init] = {t.name: float(np.std(np.asarray(t.data, dtype=np.float32))) for t in r.tensors}
        assert ("scaled init" in r.fields["general.name"].contents()) == (init == "scaled")
    flat, scaled = stds["flat"], stds["scaled"]
    assert flat["token_embd.weight"] == pytest.approx(0.02, rel=0.05)
    assert scaled["token_embd.weight"] == pytest.approx(1.0, rel=0.05)
    for name in ("blk.1.attn_output.weight", "blk.0.ffn_down_exps.weight"):
        assert scaled[name] == pytest.approx(0.02 / 2.0, rel=0.05)  # 2 layers: 0.02 / sqrt(4)
        assert flat[name] == pytest.approx(0.02, rel=0.05)
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_gate_exps.weight", "blk.0.ffn_gate_inp.weight"):
        assert scaled[name] == pytest.approx(flat[name])
    with pytest.raises(ValueError, match="init 'wide'"):
        models.init_scale("token_embd.weight", dataclasses.replace(_moe_dims(), init="wide"))


def test_flat_weights_collapse_the_routing_and_scaled_ones_keep_it_spread() -> None:
    """The numpy replay of the preset's forward pass (lab/routing_sim.py, the weights write_dense writes):
    under flat init the second layer already sends most of 128 tokens to one expert, as the H200 trace of
    the flat model shows at ubatch 512; under scaled init every layer uses (nearly) all 128 experts."""
    from lab import routing_sim

    d = dataclasses.replace(models.PRESETS["qwen3moe-a3b"], layers=2)
    flat = routing_sim.simulate(dataclasses.replace(d, init="flat"), tokens=128)
    scaled = routing_sim.simulate(d, tokens=128)
    assert flat[1]["max"] > 0.75 * 128 and flat[1]["experts"] < 80
    assert all(r["experts"] >= 120 and r["max"] < 0.2 * 128 and r["cv"] < 0.5 for r in scaled)
