# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""Models for measuring: real-dimension GGUF files with random weights and a real tokenizer.

ARCHITECTURE.md: larger real-dimension models are written with the ``gguf`` package (real architecture
metadata and shapes, random weights, a tokenizer copied from the SmolLM2 file) and quantized with the tree's
``llama-quantize``. The GPU machine cannot receive the 98 MB SmolLM2 file (its transfer limit is 64 MiB), so
``meta`` extracts the file's metadata and tensor list (a few MB) and ``clone`` rebuilds a file with the same
metadata, tensor names, types and shapes there, the weights drawn at random and quantized by ``gguf``.

Only numpy and gguf are needed (the GPU machine runs this with the pinned tree's ``gguf-py`` on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TENSOR_LIST_KEY = "ggml_dispatch.tensors"
_POOL_SIZE = 1 << 24


@dataclass(frozen=True)
class Dims:
    arch: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    # mixture of experts (0: dense): experts per layer, experts used per token, each expert's FFN size
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    # "flat": every weight N(0, 0.02). "scaled": token embeddings N(0, 1) (torch.nn.Embedding's default)
    # and the projections into the residual stream (attn_output, ffn_down, ffn_down_exps) N(0, 0.02 /
    # sqrt(2 x layers)) (GPT-2's scaled residual init), so each token's residual stream stays its own
    # through the layers as in a trained model. With "flat" the stream converges over the tokens (rank
    # collapse at random init): a router then sends almost every token to the same few experts from the
    # second layer on (traced on the H200 at ubatch 512: ~20 of 128 experts get tokens, one gets ~509 of
    # 512), which no trained, load-balanced router does.
    init: str = "flat"


PRESETS: dict[str, Dims] = {
    # Llama-3-8B dimensions (the configuration of samples/reference/h200-e2e-crude-rule.md)
    "llama8b": Dims("llama", hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, layers=32),
    # the seed workload's dense shapes: hidden 5120, FFN 17408, head dim 256, 24 query and 4 KV heads
    "qwen27b": Dims("qwen3", hidden=5120, ffn=17408, heads=24, kv_heads=4, head_dim=256, layers=64),
    # Qwen3-30B-A3B dimensions (its config.json: intermediate_size 6144, moe_intermediate_size 768)
    "qwen3moe-a3b": Dims(
        "qwen3moe",
        hidden=2048,
        ffn=6144,
        heads=32,
        kv_heads=4,
        head_dim=128,
        layers=48,
        experts=128,
        experts_used=8,
        expert_ffn=768,
        init="scaled",
    ),
}
INITS: tuple[str, ...] = ("flat", "scaled")
_RESIDUAL_OUT = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight")


def init_scale(name: str, d: Dims) -> float:
    """Factor on the N(0, 0.02) pool values for tensor ``name`` under ``d.init``."""
    if d.init == "flat":
        return 1.0
    if d.init != "scaled":
        raise ValueError(f"init {d.init!r} is not one of {', '.join(INITS)}")
    if name == "token_embd.weight":
        return 1.0 / 0.02
    if name.endswith(_RESIDUAL_OUT):
        return 1.0 / (2.0 * d.layers) ** 0.5
    return 1.0


def _gguf() -> Any:
    import gguf

    return gguf


def _random_pool(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(_POOL_SIZE, dtype=np.float32) * 0.02).astype(np.float32)


def _fill(pool: np.ndarray, n: int, offset: int) -> np.ndarray:
    """n values from the random pool, starting at offset (wrapping): cheap, non-degenerate weights."""
    start = offset % pool.size
    reps = -(-(start + n) // pool.size)
    return np.tile(pool, reps)[start : start + n] if reps > 1 else pool[start : start + n].copy()


def tensor_values(pool: np.ndarray, index: int, n: int, start: int = 0) -> np.ndarray:
    """n values of the ``index``-th tensor of ``write_dense``'s list, from its element ``start``."""
    return _fill(pool, n, offset=index * 104729 + start)


def _copy_kv(reader: Any, writer: Any, skip: tuple[str, ...]) -> None:
    gguf = _gguf()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key.startswith(skip):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), vtype)


def extract_meta(src: Path, out: Path) -> None:
    """A tensor-less GGUF with all metadata of ``src`` plus its tensor list (name, shape, type)."""
    gguf = _gguf()
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tensors = [
        {"name": t.name, "shape": [int(x) for x in t.shape], "type": t.tensor_type.name}
        for t in reader.tensors
    ]
    writer = gguf.GGUFWriter(out, arch)
    _copy_kv(reader, writer, skip=())
    writer.add_string(TENSOR_LIST_KEY, json.dumps(tensors))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()


def clone(meta: Path, out: Path, seed: int = 0) -> None:
    """Rebuild a model from ``extract_meta`` output: same metadata, names, types, shapes; random weights."""
    gguf = _gguf()
    reader = gguf.GGUFReader(meta)
    arch = reader.fields["general.architecture"].contents()
    tensors = json.loads(reader.fields[TENSOR_LIST_KEY].contents())
    writer = gguf.GGUFWriter(out, arch)
    _copy_kv(reader, writer, skip=(TENSOR_LIST_KEY,))
    pool = _random_pool(seed)
    for t in tensors:
        qtype = gguf.GGMLQuantizationType[t["type"]]
        n = int(np.prod(t["shape"]))
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = list(reversed(t["shape"]))
        byte_shape[-1] = byte_shape[-1] // block * size
        writer.add_tensor_info(t["name"], byte_shape, np.dtype(np.uint8), n // block * size, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, t in enumerate(tensors):
        qtype = gguf.GGMLQuantizationType[t["type"]]
        ne0 = t["shape"][0]
        values = _fill(pool, int(np.prod(t["shape"])), offset=i * 7919).reshape(-1, ne0)
        if qtype == gguf.GGMLQuantizationType.F32:
            data = values.astype(np.float32)
        elif qtype == gguf.GGMLQuantizationType.F16:
            data = values.astype(np.float16)
        else:
            data = gguf.quants.quantize(values, qtype)
        writer.write_tensor_data(np.ascontiguousarray(data).view(np.uint8).reshape(-1))
    writer.close()


def _tensor_specs(d: Dims, vocab: int) -> Iterator[tuple[str, list[int]]]:
    """(name, ne) for a decoder with the given dimensions, in llama.cpp's tensor naming (with experts:
    a router and the stacked gate/up/down expert tensors in place of the dense FFN)."""
    q_dim, kv_dim = d.heads * d.head_dim, d.kv_heads * d.head_dim
    yield "token_embd.weight", [d.hidden, vocab]
    for i in range(d.layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", [d.hidden]
        yield p + "attn_q.weight", [d.hidden, q_dim]
        yield p + "attn_k.weight", [d.hidden, kv_dim]
        yield p + "attn_v.weight", [d.hidden, kv_dim]
        yield p + "attn_output.weight", [q_dim, d.hidden]
        if d.arch in ("qwen3", "qwen3moe"):
            yield p + "attn_q_norm.weight", [d.head_dim]
            yield p + "attn_k_norm.weight", [d.head_dim]
        yield p + "ffn_norm.weight", [d.hidden]
        if d.experts:
            yield p + "ffn_gate_inp.weight", [d.hidden, d.experts]
            yield p + "ffn_gate_exps.weight", [d.hidden, d.expert_ffn, d.experts]
            yield p + "ffn_up_exps.weight", [d.hidden, d.expert_ffn, d.experts]
            yield p + "ffn_down_exps.weight", [d.expert_ffn, d.hidden, d.experts]
            continue
        yield p + "ffn_gate.weight", [d.hidden, d.ffn]
        yield p + "ffn_up.weight", [d.hidden, d.ffn]
        yield p + "ffn_down.weight", [d.ffn, d.hidden]
    yield "output_norm.weight", [d.hidden]
    yield "output.weight", [d.hidden, vocab]


def write_dense(out: Path, d: Dims, tokenizer_from: Path, seed: int = 0) -> None:
    """An F16 model (F32 norms and router) with real architecture metadata and the tokenizer of
    ``tokenizer_from``."""
    gguf = _gguf()
    reader = gguf.GGUFReader(tokenizer_from)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(out, d.arch)
    moe = f" moe {d.experts}x{d.experts_used} e{d.expert_ffn}" if d.experts else ""
    init = "" if d.init == "flat" else f", {d.init} init"
    writer.add_name(f"ggml-dispatch {d.arch} h{d.hidden} f{d.ffn}{moe} L{d.layers} (random weights{init})")
    writer.add_block_count(d.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(d.hidden)
    writer.add_feed_forward_length(d.ffn)
    writer.add_head_count(d.heads)
    writer.add_head_count_kv(d.kv_heads)
    writer.add_key_length(d.head_dim)
    writer.add_value_length(d.head_dim)
    writer.add_rope_dimension_count(d.head_dim)
    writer.add_rope_freq_base(500000.0 if d.arch == "llama" else 1000000.0)
    writer.add_layer_norm_rms_eps(1e-5 if d.arch == "llama" else 1e-6)
    writer.add_vocab_size(vocab)
    if d.experts:
        writer.add_expert_count(d.experts)
        writer.add_expert_used_count(d.experts_used)
        writer.add_expert_feed_forward_length(d.expert_ffn)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    specs = list(_tensor_specs(d, vocab))
    for name, ne in specs:
        dtype = np.float32 if len(ne) == 1 or name.endswith("ffn_gate_inp.weight") else np.float16
        writer.add_tensor_info(name, list(reversed(ne)), np.dtype(dtype), int(np.prod(ne)) * dtype().itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pool = _random_pool(seed)
    pool16 = pool.astype(np.float16)
    for i, (name, ne) in enumerate(specs):
        n = int(np.prod(ne))
        if len(ne) == 1:
            norm_or_weight = np.ones(n, dtype=np.float32)
        elif name.endswith("ffn_gate_inp.weight"):  # the router stays F32 (llama-quantize keeps it so)
            norm_or_weight = tensor_values(pool, i, n)
        else:
            norm_or_weight = tensor_values(pool16, i, n)
            if (f := init_scale(name, d)) != 1.0:
                norm_or_weight = (norm_or_weight.astype(np.float32) * f).astype(np.float16)
        writer.write_tensor_data(norm_or_weight)
    writer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.models", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta", help="metadata + tensor list of a GGUF, without the tensor data")
    m.add_argument("src", type=Path)
    m.add_argument("-o", "--out", type=Path, required=True)
    c = sub.add_parser("clone", help="rebuild a model from `meta` output with random weights")
    c.add_argument("meta", type=Path)
    c.add_argument("-o", "--out", type=Path, required=True)
    c.add_argument("--seed", type=int, default=0)
    w = sub.add_parser(
        "dense",
        help="an F16 model at real dimensions, dense or MoE by preset (then quantize with llama-quantize)",
    )
    w.add_argument("--preset", choices=sorted(PRESETS), required=True)
    w.add_argument("--layers", type=int, required=True)
    w.add_argument("--tokenizer-from", type=Path, required=True)
    w.add_argument("-o", "--out", type=Path, required=True)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--init", choices=INITS, help="weight scales (default: the preset's; see Dims.init)")
    args = ap.parse_args(argv)
    if args.cmd == "meta":
        extract_meta(args.src, args.out)
    elif args.cmd == "clone":
        clone(args.meta, args.out, args.seed)
    else:
        base = PRESETS[args.preset]
        dims = dataclasses.replace(base, layers=args.layers, init=args.init or base.init)
        write_dense(args.out, dims, args.tokenizer_from, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
