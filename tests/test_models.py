"""Model files for device runs: metadata extraction, clone and dense writer, on real GGUF files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

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
