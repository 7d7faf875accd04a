# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""A Qwen3.5-27B-shaped GGUF of llama.cpp architecture ``qwen35``: random weights, real per-layer shapes.

The seed user serves Qwen3.5 27B (Unsloth "UD-Q5_K_XL"): gated-delta-net (linear attention) layers
interleaved with full-attention layers, plus one MTP (next-token prediction) block. This writes a file
the pinned tree's ``qwen35`` loader takes, with every per-layer shape of the public configuration, a
Q5_K / Q6_K / Q8_0 / F32 mix like that quantisation, fewer layers on request (``--layers``, whole
groups of the hybrid pattern, the MTP block kept) and a smaller vocabulary on request (``--vocab``:
token_embd / output only; 248320 is the real one).

    python -m lab.qwen35 write -o qwen35-27b.gguf                   # full depth, about 19 GB
    python -m lab.qwen35 write -o q35-l8.gguf --layers 8
    python -m lab.qwen35 count                                      # trunk projections (24.35 G)
    python -m lab.qwen35 check q35-l8.gguf --tree .cache/llama.cpp  # against the tree's loader

Source of the configuration
---------------------------
The text config (``text_config``) of the Hugging Face ``config.json`` of Qwen/Qwen3.5-27B
(``Qwen3_5ForConditionalGeneration``, ``model_type`` ``qwen3_5_text``). The official page could not be
read from here; its values come from public transcriptions that agree with each other, found with the
search tool:

- the config.json re-upload at https://huggingface.co/EclipseMist/hababa/blob/main/config.json
  (hidden_size 5120, intermediate_size 17408, head_dim 256, full_attention_interval 4, layer_types
  3 x linear_attention then full_attention, repeated);
- a public repository's full copy of that ``text_config`` (a transformers ``Qwen3_5Config`` built with
  it): linear_num_key_heads 16, linear_num_value_heads 48, linear_key/value_head_dim 128,
  linear_conv_kernel_dim 4, num_attention_heads 24, num_key_value_heads 4, num_hidden_layers 64,
  mtp_num_hidden_layers 1, partial_rotary_factor 0.25, rope_theta 10000000, mrope_section [11, 11, 10],
  rms_norm_eps 1e-6, max_position_embeddings 262144, vocab_size 248320, tie_word_embeddings false;
- the model card's overview (https://apxml.com/models/qwen35-27b for Qwen3.5-27B;
  https://shilu.ai/articles/qwen-hf/qwen-qwen3.6-27b for Qwen3.6-27B, same ``qwen3_5`` architecture):
  hidden 5120, 64 layers as 16 x (3 x (Gated DeltaNet -> FFN) -> 1 x (Gated Attention -> FFN)),
  DeltaNet heads 48 V / 16 QK of dim 128, attention heads 24 Q / 4 KV of dim 256, rotary dim 64,
  FFN 17408, vocabulary 248320 (padded), MTP;
- THUDM/slime ``scripts/models/qwen3.5-27B.sh`` (Megatron arguments: 24 heads, 4 query groups,
  kv-channels 256, 64 layers, hidden 5120, ffn 17408, rotary-percent 0.25, rotary-base 1e7,
  vocab 248320, norm eps 1e-6).

The mapping to GGUF keys is the pinned tree's converter (``conversion/qwen.py``: ``Qwen3NextModel``,
``_QwenMtpMixin``, ``_Qwen35MRopeMixin``): ssm.state_size = linear_key_head_dim, ssm.group_count =
linear_num_key_heads, ssm.time_step_rank = linear_num_value_heads, ssm.inner_size =
linear_value_head_dim x linear_num_value_heads, rope.dimension_count = head_dim x partial_rotary_factor,
rope.dimension_sections = mrope_section + [0], block_count = num_hidden_layers + mtp_num_hidden_layers,
nextn_predict_layers = mtp_num_hidden_layers, attention.recurrent_layers from layer_types.

=============================  ==========  ==========================================================
dimension                      value       GGUF key / where it shows
=============================  ==========  ==========================================================
hidden_size                    5120        qwen35.embedding_length
intermediate_size              17408       qwen35.feed_forward_length (ffn_gate/up/down)
num_attention_heads            24          qwen35.attention.head_count (attn_q: 2 x 24 x 256, query
                                           and output gate)
num_key_value_heads            4           qwen35.attention.head_count_kv (GQA 6)
head_dim                       256         qwen35.attention.key_length / value_length
linear_num_key_heads           16          qwen35.ssm.group_count
linear_num_value_heads         48          qwen35.ssm.time_step_rank (ssm_a, ssm_dt, alpha, beta)
linear_key/value_head_dim      128         qwen35.ssm.state_size; ssm.inner_size = 6144
linear_conv_kernel_dim         4           qwen35.ssm.conv_kernel (ssm_conv1d {4, 10240})
full_attention_interval        4           qwen35.full_attention_interval; layer i is full
                                           attention iff (i + 1) % 4 == 0 (16 of 64)
num_hidden_layers              64          qwen35.block_count = 64 + 1 (the MTP block is blk.64)
mtp_num_hidden_layers          1           qwen35.nextn_predict_layers
vocab_size                     248320      token_embd / output {5120, 248320}
rope_theta                     1e7         qwen35.rope.freq_base
partial_rotary_factor          0.25        qwen35.rope.dimension_count = 64
mrope_section                  11,11,10    qwen35.rope.dimension_sections = [11, 11, 10, 0]
rms_norm_eps                   1e-6        qwen35.attention.layer_norm_rms_epsilon
max_position_embeddings        262144      qwen35.context_length
=============================  ==========  ==========================================================

Trunk projections (``count``): every matrix multiplied in the 64 blocks (no token_embd, output or MTP):
64 x FFN 3 x 5120 x 17408, 16 full-attention layers' q (5120 x 12288), k, v (5120 x 1024) and output
(6144 x 5120), 48 DeltaNet layers' attn_qkv (5120 x 10240), attn_gate (5120 x 6144), ssm_alpha and
ssm_beta (5120 x 48) and ssm_out (6144 x 5120): 24,350,556,160 = 24.35 G. The 2-D ssm_conv1d kernels
(48 x 4 x 10240 = 1.97 M, a convolution, not a projection) are left out; with them and the 1-D norms
the 64 blocks hold 24.353 G, the "repeating layers ... 24.353 B parameters" that llama.cpp prints for
the real Qwen3.5-27B GGUFs (e.g. huggingface.co/sokann/Qwen3.5-27B-GGUF-4.165bpw).

Type mix (an assumption)
------------------------
The per-tensor types of Unsloth's Qwen3.5-27B-UD-Q5_K_XL file were not available here. What is known:
Unsloth keeps ssm_out and the attention tensors of these hybrid models above the bulk
(unsloth.ai/docs/models/qwen3.5/gguf-benchmarks), their UD-Q4_K_XL / UD-Q5_K_XL files have
ssm_alpha / ssm_beta / ssm_out at Q8_0 (hugingapi.com/steampunque/Qwen3.5-27B-MP-GGUF/discussions/1),
and the pinned tree's own Q5_K_M already gives attn_qkv Q6_K, and attn_v / ffn_down Q6_K in a third
of the layers (src/llama-quant.cpp). The mix written (``TYPE_MIX``), uniform over the layers:

- Q5_K (the bulk): ffn_gate, ffn_up, attn_q, attn_k, attn_gate;
- Q6_K: ffn_down, attn_qkv, attn_output, token_embd, nextn.eh_proj;
- Q8_0: attn_v, ssm_out, ssm_alpha, ssm_beta, output;
- F32: every 1-D tensor (norms, ssm_a, ssm_dt.bias, ssm_norm) and ssm_conv1d (ggml's SSM_CONV reads
  its kernel as F32; llama-quantize never quantizes it).

Weights are real blocks of their type: a pool of N(0, 0.02) values is quantized once per type (Q8_0 by
the ``gguf`` package, Q5_K / Q6_K by this module's encoders, which ``gguf``'s dequantizers read back)
and each tensor is that pool's blocks from its own offset. Norm weights are 1 (the converter stores
Qwen3.5's 1 + w norms so), ssm_a = -U(1, 16) (-exp(A_log)), ssm_dt.bias = log(expm1(dt)) with dt
log-uniform in [0.001, 0.1] (Mamba's initialisation), ssm_conv1d U(-0.5, 0.5) (a depthwise conv's
default bound, 1 / sqrt(4)). The tokenizer is ``none`` with ``qwen35.vocab_size`` (llama.cpp adds dummy
tokens): llama-bench needs only the count, and a 248320-entry token list would take the ``gguf`` reader
seconds per read. ``--tokenizer spm`` writes a synthetic SPM vocabulary instead (``synthetic_vocab``):
llama-server needs one, and the lab's server runs send token ids.

Checking against the loader
---------------------------
No llama.cpp build is needed (CI has 2 cores): ``loader_tensors`` parses the tree's
``src/models/qwen35.cpp`` (``load_arch_tensors``: which tensor, which shape expression, required or
not, for the global, full-attention, DeltaNet and MTP scopes), ``llama_model_base::create_tensor_qkv``
(its unfused path, as the converter writes) and ``src/llama-arch.cpp`` (tensor and key names);
``check`` derives the hyperparameters from a file's keys as ``load_hparams`` does (recurrent layers from
``attention.recurrent_layers`` or the interval) and reports every required tensor missing, tensor the
loader would not create, or shape that differs. Outside CI, files this module writes load in a CPU
build of the pinned tree's libllama (``load_mtp`` and ``check_tensors`` on, which validates every
block) and decode to finite logits; an MTP context builds on them too.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ARCH = "qwen35"
QK_K = 256
_POOL_VALUES = 1 << 20


@dataclass(frozen=True)
class Qwen35:
    """Qwen3.5-27B's text configuration (see the module docstring for the source)."""

    hidden: int = 5120
    ffn: int = 17408
    heads: int = 24
    kv_heads: int = 4
    head_dim: int = 256
    layers: int = 64
    linear_key_heads: int = 16
    linear_value_heads: int = 48
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    conv_kernel: int = 4
    full_attention_interval: int = 4
    mtp_layers: int = 1
    vocab: int = 248320
    context: int = 262144
    rope_theta: float = 10000000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, int, int] = (11, 11, 10)
    rms_eps: float = 1e-6
    tokenizer: str = "none"  # "none" (a count only) or "spm" (a synthetic vocabulary a server can run)

    @property
    def key_dim(self) -> int:
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def block_count(self) -> int:
        return self.layers + self.mtp_layers

    def is_recurrent(self, il: int) -> bool:
        """DeltaNet layer (else full attention); the MTP block is full attention."""
        return il < self.layers and (il + 1) % self.full_attention_interval != 0

    def validate(self) -> None:
        """Raise ValueError for a configuration this module does not write."""
        full = Qwen35()
        if not (1 <= self.layers <= full.layers and self.layers % self.full_attention_interval == 0):
            raise ValueError(
                f"--layers must be a multiple of {self.full_attention_interval} (whole groups of 3 DeltaNet "
                f"+ 1 full-attention layer) from {self.full_attention_interval} to {full.layers}, "
                f"not {self.layers}"
            )
        if not 1 <= self.vocab <= full.vocab:
            raise ValueError(f"--vocab must be from 1 to {full.vocab} (Qwen3.5's), not {self.vocab}")
        if self.tokenizer not in ("none", "spm"):
            raise ValueError(f"tokenizer must be none or spm, not {self.tokenizer!r}")
        if self.tokenizer == "spm" and self.vocab <= SPM_FIRST_WORD:
            raise ValueError(f"--tokenizer spm needs --vocab above {SPM_FIRST_WORD}, not {self.vocab}")
        if self.mtp_layers != 1:
            raise ValueError(f"the pinned tree's qwen35 MTP graph takes 1 MTP block, not {self.mtp_layers}")
        if self.linear_key_head_dim != self.linear_value_head_dim:
            raise ValueError("the qwen35 loader takes one DeltaNet head dim (ssm.state_size) for K and V")
        rope_sections = sum(self.mrope_section)
        if 2 * rope_sections != self.rope_dim:
            raise ValueError(f"mrope_section {self.mrope_section} does not cover rope dim {self.rope_dim}")
        for name in ("hidden", "ffn", "value_dim"):
            if getattr(self, name) % QK_K:
                raise ValueError(f"{name} {getattr(self, name)} is not a multiple of {QK_K} (K-quant rows)")


# type by tensor role (the name without "blk.N."); everything else is F32
TYPE_MIX: dict[str, str] = {
    "token_embd.weight": "Q6_K",
    "output.weight": "Q8_0",
    "attn_q.weight": "Q5_K",
    "attn_k.weight": "Q5_K",
    "attn_v.weight": "Q8_0",
    "attn_output.weight": "Q6_K",
    "attn_qkv.weight": "Q6_K",
    "attn_gate.weight": "Q5_K",
    "ssm_alpha.weight": "Q8_0",
    "ssm_beta.weight": "Q8_0",
    "ssm_out.weight": "Q8_0",
    "ffn_gate.weight": "Q5_K",
    "ffn_up.weight": "Q5_K",
    "ffn_down.weight": "Q6_K",
    "nextn.eh_proj.weight": "Q6_K",
}
# matrices that are not multiplied (ssm_conv1d is SSM_CONV's kernel)
_NOT_PROJECTIONS = ("ssm_conv1d.weight",)


def role(name: str) -> str:
    return re.sub(r"^blk\.\d+\.", "", name)


def tensor_type(name: str) -> str:
    return TYPE_MIX.get(role(name), "F32")


@dataclass(frozen=True)
class Spec:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    type: str


def tensor_specs(d: Qwen35) -> list[Spec]:
    """Every tensor of the file, in llama.cpp's names and ggml's dimension order."""
    out: list[tuple[str, tuple[int, ...]]] = []
    h, q_dim, kv_dim = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim

    def attention(p: str) -> None:
        out.extend(
            [
                (p + "attn_q.weight", (h, 2 * q_dim)),  # query and its output gate, interleaved per head
                (p + "attn_k.weight", (h, kv_dim)),
                (p + "attn_v.weight", (h, kv_dim)),
                (p + "attn_output.weight", (q_dim, h)),
                (p + "attn_q_norm.weight", (d.head_dim,)),
                (p + "attn_k_norm.weight", (d.head_dim,)),
            ]
        )

    def ffn(p: str) -> None:
        out.extend(
            [
                (p + "ffn_gate.weight", (h, d.ffn)),
                (p + "ffn_up.weight", (h, d.ffn)),
                (p + "ffn_down.weight", (d.ffn, h)),
            ]
        )

    out.append(("token_embd.weight", (h, d.vocab)))
    for il in range(d.layers):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (h,)), (p + "post_attention_norm.weight", (h,))]
        if d.is_recurrent(il):
            v_heads = d.linear_value_heads
            out += [
                (p + "attn_qkv.weight", (h, d.conv_dim)),
                (p + "attn_gate.weight", (h, d.value_dim)),
                (p + "ssm_conv1d.weight", (d.conv_kernel, d.conv_dim)),
                (p + "ssm_dt.bias", (v_heads,)),
                (p + "ssm_a", (v_heads,)),
                (p + "ssm_beta.weight", (h, v_heads)),
                (p + "ssm_alpha.weight", (h, v_heads)),
                (p + "ssm_norm.weight", (d.linear_value_head_dim,)),
                (p + "ssm_out.weight", (d.value_dim, h)),
            ]
        else:
            attention(p)
        ffn(p)
    for il in range(d.layers, d.block_count):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (h,)), (p + "post_attention_norm.weight", (h,))]
        attention(p)
        ffn(p)
        out += [
            (p + "nextn.eh_proj.weight", (2 * h, h)),
            (p + "nextn.enorm.weight", (h,)),
            (p + "nextn.hnorm.weight", (h,)),
            (p + "nextn.shared_head_norm.weight", (h,)),
        ]
    out += [("output_norm.weight", (h,)), ("output.weight", (h, d.vocab))]
    return [Spec(name, ne, tensor_type(name)) for name, ne in out]


def metadata(d: Qwen35) -> dict[str, Any]:
    """GGUF keys (besides general.architecture) the way the pinned tree's converter writes them."""
    a = ARCH
    return {
        "general.name": f"ggml-dispatch qwen35 Qwen3.5-27B shapes L{d.layers}+MTP (random weights)",
        f"{a}.context_length": d.context,
        f"{a}.embedding_length": d.hidden,
        f"{a}.block_count": d.block_count,
        f"{a}.nextn_predict_layers": d.mtp_layers,
        f"{a}.feed_forward_length": d.ffn,
        f"{a}.attention.head_count": d.heads,
        f"{a}.attention.head_count_kv": d.kv_heads,
        f"{a}.attention.key_length": d.head_dim,
        f"{a}.attention.value_length": d.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": d.rms_eps,
        f"{a}.attention.recurrent_layers": [d.is_recurrent(i) for i in range(d.block_count)],
        f"{a}.full_attention_interval": d.full_attention_interval,
        f"{a}.rope.dimension_count": d.rope_dim,
        f"{a}.rope.dimension_sections": [*d.mrope_section, 0],
        f"{a}.rope.freq_base": d.rope_theta,
        f"{a}.ssm.conv_kernel": d.conv_kernel,
        f"{a}.ssm.state_size": d.linear_key_head_dim,
        f"{a}.ssm.group_count": d.linear_key_heads,
        f"{a}.ssm.time_step_rank": d.linear_value_heads,
        f"{a}.ssm.inner_size": d.value_dim,
        f"{a}.vocab_size": d.vocab,
        **(synthetic_vocab(d.vocab) if d.tokenizer == "spm" else {"tokenizer.ggml.model": "none"}),
    }


# llama.cpp's token types (llama_token_type) and the SPM vocabulary's fixed ids.
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_BYTE = 1, 2, 3, 6
SPM_FIRST_WORD = 3 + 256  # <unk>, <s>, </s>, then the 256 byte tokens


def synthetic_vocab(n: int) -> dict[str, Any]:
    """An SPM ("llama") vocabulary of ``n`` tokens: <unk> <s> </s>, the 256 byte-fallback tokens, then
    ``▁w<i>`` words. llama-server tokenizes and detokenizes through the vocabulary, which a file with
    ``tokenizer.ggml.model = none`` lacks (every vocab call asserts); requests send token ids, so the
    words need no merges, and every id in [SPM_FIRST_WORD, n) is an ordinary token a prompt can hold."""
    if n < SPM_FIRST_WORD + 1:
        raise ValueError(f"an SPM vocabulary needs more than {SPM_FIRST_WORD} tokens, not {n}")
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [f"\u2581w{i}" for i in range(n - len(tokens))]
    types = [_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_CONTROL] + [_TOKEN_BYTE] * 256
    types += [_TOKEN_NORMAL] * (n - len(types))
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * n,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
    }


def trunk_projections(d: Qwen35) -> dict[str, int]:
    """Weights of the 2-D matrices the 64 (or ``d.layers``) blocks multiply, per role: no token_embd,
    output, MTP block or ssm_conv1d."""
    counts: dict[str, int] = {}
    for s in tensor_specs(d):
        m = re.match(r"blk\.(\d+)\.", s.name)
        if m is None or int(m.group(1)) >= d.layers or len(s.ne) != 2 or role(s.name) in _NOT_PROJECTIONS:
            continue
        counts[role(s.name)] = counts.get(role(s.name), 0) + s.ne[0] * s.ne[1]
    return counts


# --- weights -------------------------------------------------------------------------------------


def _gguf() -> Any:
    import gguf

    return gguf


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(x.shape[0], 2)


def _nearest(x: np.ndarray) -> np.ndarray:
    # ggml's nearest_int rounds half away from zero; np.rint rounds half to even (either is a valid block)
    q: np.ndarray = np.rint(x).astype(np.int32)
    return q


def encode_q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K blocks of ``x`` (n x 256 float32): uint8 (n, 210) in ggml's block_q6_K layout (ql, qh,
    scales, d). One scale per 16 values; not ggml's search for the best scales, but real blocks."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(axis=2) / 31.0  # q in [-31, 31] of [-32, 31]
    d = (scale.max(axis=1) / 127.0).astype(np.float16)
    dd = d.astype(np.float32)[:, None]
    sc = np.clip(_nearest(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), 0, 127)
    step = (dd * sc)[:, :, None]
    q = np.clip(_nearest(np.divide(sub, step, out=np.zeros_like(sub), where=step > 0)), -32, 31) + 32
    q = q.reshape(n, 2, 4, 32).astype(np.uint8)  # [half, quarter, l]: value half*128 + quarter*32 + l
    ql = np.concatenate(
        [(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4), (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)],
        axis=2,
    ).reshape(n, 128)
    qh = (
        (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    ).reshape(n, 64)
    blocks: np.ndarray = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)
    return blocks


def encode_q5_k(x: np.ndarray) -> np.ndarray:
    """Q5_K blocks of ``x`` (n x 256 float32): uint8 (n, 176) in ggml's block_q5_K layout (d, dmin,
    scales, qh, qs). Eight sub-blocks of 32, each with a 6-bit scale and min."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0.0)
    scale = (sub.max(axis=2) - lo) / 31.0
    d = (scale.max(axis=1) / 63.0).astype(np.float16)
    dmin = ((-lo).max(axis=1) / 63.0).astype(np.float16)
    dd, dm = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(_nearest(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), 0, 63)
    mn = np.clip(_nearest(np.divide(-lo, dm, out=np.zeros_like(lo), where=dm > 0)), 0, 63)
    step = (dd * sc)[:, :, None]
    shifted = sub + (dm * mn)[:, :, None]
    q = np.clip(_nearest(np.divide(shifted, step, out=np.zeros_like(sub), where=step > 0)), 0, 31)
    q = q.astype(np.uint8).reshape(
        n, 4, 2, 32
    )  # [pair, first/second of the pair, l]: value pair*64 + k*32 + l
    qs = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(n, 128)
    qh = np.zeros((n, 32), dtype=np.uint8)
    for pair in range(4):
        qh |= ((q[:, pair, 0] >> 4) << (2 * pair)) | ((q[:, pair, 1] >> 4) << (2 * pair + 1))
    sc8, mn8 = sc.astype(np.uint8), mn.astype(np.uint8)
    scales = np.concatenate(
        [
            (sc8[:, :4] & 63) | ((sc8[:, 4:] >> 4) << 6),
            (mn8[:, :4] & 63) | ((mn8[:, 4:] >> 4) << 6),
            (sc8[:, 4:] & 0xF) | ((mn8[:, 4:] & 0xF) << 4),
        ],
        axis=1,
    )
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qh, qs], axis=1)


def block_pool(type_name: str, seed: int) -> np.ndarray:
    """Blocks of N(0, 0.02) values quantized to ``type_name``: uint8 (blocks, bytes per block)."""
    gguf = _gguf()
    qtype = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    values = np.random.default_rng(seed).standard_normal(_POOL_VALUES, dtype=np.float32) * np.float32(0.02)
    if type_name == "Q5_K":
        blocks = encode_q5_k(values.reshape(-1, QK_K))
    elif type_name == "Q6_K":
        blocks = encode_q6_k(values.reshape(-1, QK_K))
    else:
        blocks = np.asarray(gguf.quants.quantize(values.reshape(-1, block), qtype)).reshape(-1, size)
    assert blocks.shape[1] == size, (type_name, blocks.shape)
    return blocks


def _f32_values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    r = role(name)
    if r == "ssm_a":
        return -rng.uniform(1.0, 16.0, n).astype(np.float32)
    if r == "ssm_dt.bias":
        dt = np.exp(rng.uniform(np.log(0.001), np.log(0.1), n))
        return np.log(np.expm1(dt)).astype(np.float32)
    if r == "ssm_conv1d.weight":
        return rng.uniform(-0.5, 0.5, n).astype(np.float32)
    return np.ones(n, dtype=np.float32)


def tensor_bytes(spec: Spec, pool: np.ndarray | None, index: int, rng: np.random.Generator) -> np.ndarray:
    """The data of the ``index``-th tensor: F32 values, or the pool's blocks from an offset of its own."""
    n = int(np.prod(spec.ne))
    if spec.type == "F32":
        return _f32_values(spec.name, n, rng)
    assert pool is not None
    gguf = _gguf()
    block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[spec.type]]
    n_blocks = n // block
    start = (index * 7919) % pool.shape[0]
    data: np.ndarray = np.take(pool, np.arange(start, start + n_blocks) % pool.shape[0], axis=0)
    return data.reshape(-1)


def _add_key(writer: Any, key: str, value: Any) -> None:
    gguf = _gguf()
    t = gguf.GGUFValueType
    if isinstance(value, list):
        first = value[0]
        sub = (
            t.BOOL
            if isinstance(first, bool)
            else t.STRING
            if isinstance(first, str)
            else t.FLOAT32
            if isinstance(first, float)
            else t.INT32
        )
        writer.add_key_value(key, value, t.ARRAY, sub_type=sub)
    elif isinstance(value, bool):
        writer.add_key_value(key, value, t.BOOL)
    elif isinstance(value, str):
        writer.add_key_value(key, value, t.STRING)
    elif isinstance(value, float):
        writer.add_key_value(key, value, t.FLOAT32)
    else:
        writer.add_key_value(key, value, t.UINT32)


def write(out: Path, d: Qwen35, seed: int = 0) -> None:
    """The GGUF of ``d`` with random weights (see the module docstring)."""
    d.validate()
    gguf = _gguf()
    specs = tensor_specs(d)
    writer = gguf.GGUFWriter(out, ARCH)
    for key, value in metadata(d).items():
        _add_key(writer, key, value)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q5_K_M)
    for s in specs:
        qtype = gguf.GGMLQuantizationType[s.type]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = list(reversed(s.ne))
        byte_shape[-1] = byte_shape[-1] // block * size
        nbytes = int(np.prod(s.ne)) // block * size
        writer.add_tensor_info(s.name, byte_shape, np.dtype(np.uint8), nbytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pools = {t: block_pool(t, seed + i) for i, t in enumerate(sorted({s.type for s in specs} - {"F32"}))}
    rng = np.random.default_rng(seed)
    for i, s in enumerate(specs):
        data = tensor_bytes(s, pools.get(s.type), i, rng)
        writer.write_tensor_data(np.ascontiguousarray(data).view(np.uint8))
    writer.close()


# --- the tree's loader ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderTensor:
    """One ``create_tensor`` of the qwen35 loader: name pattern ("blk.%d." for layers), shape expression
    (C++, in the loader's local names), required or not, and the scope it is created in: ``global``,
    ``trunk`` (every one of the n_layer blocks), ``attn`` / ``recr`` (full-attention / DeltaNet blocks),
    ``mtp`` (the nextn blocks)."""

    name: str
    dims: tuple[str, ...]
    required: bool
    scope: str


_CREATE = re.compile(
    r'create_tensor\(\s*tn\(\s*(LLM_TENSOR_\w+)\s*(?:,\s*"([^"]*)")?\s*(?:,\s*(?:il|bid))?\s*\)\s*,'
    r"\s*\{([^}]*)\}\s*,\s*([^)]*?)\s*\)"
)
_CREATE_QKV = re.compile(r"create_tensor_qkv\(\s*layer\s*,\s*il\s*,([^;]*)\)\s*;")


def _table(source: str, prefix: str) -> dict[str, str]:
    names: dict[str, str] = {}
    for enum, text in re.findall(r"\{\s*(" + prefix + r'\w+)\s*,\s*"([^"]+)"\s*\}', source):
        names.setdefault(enum, text)  # a std::map built from a list keeps the first of a duplicated key
    return names


def _function_body(source: str, signature: str) -> str:
    start = source.index(signature)
    open_at = source.index("{", start)
    depth = 0
    for i in range(open_at, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[open_at + 1 : i]
    raise ValueError(f"unbalanced braces after {signature!r}")


def _required(flags: str) -> bool:
    return "TENSOR_NOT_REQUIRED" not in flags


def _qkv_expansion(model_cpp: str) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(enum, suffix, dims, flags) of create_tensor_qkv's unfused path, in its parameter names."""
    body = _function_body(model_cpp, "void llama_model_base::create_tensor_qkv(")
    body = body[body.index("return;") :]  # past the TENSOR_SKIP branch
    return [
        (enum, suffix, tuple(x.strip() for x in dims.split(",")), flags)
        for enum, suffix, dims, flags in _CREATE.findall(body)
    ]


def _qwen35_cpp(tree: Path) -> str:
    return (tree / "src" / "models" / "qwen35.cpp").read_text()


def loader_tensors(tree: Path) -> list[LoaderTensor]:
    """The tensors the pinned tree's qwen35 loader creates, parsed from its source."""
    names = _table((tree / "src" / "llama-arch.cpp").read_text(), "LLM_TENSOR_")
    qkv = _qkv_expansion((tree / "src" / "llama-model.cpp").read_text())
    body = _function_body(_qwen35_cpp(tree), "llama_model_qwen35::load_arch_tensors(")
    out: list[LoaderTensor] = []
    scope, depth, branch_depth = "global", 0, -1
    for line in body.splitlines():
        if "auto load_block_trunk" in line:
            scope = "trunk"
        elif "auto load_block_mtp" in line:
            scope = "mtp"
        elif "if (!hparams.is_recr(il))" in line:
            scope, branch_depth = "attn", depth
        elif scope == "attn" and re.match(r"\s*\}\s*else\s*\{", line) and depth == branch_depth + 1:
            scope = "recr"
        for enum, suffix, dims, flags in _CREATE.findall(line):
            if "TENSOR_DUPLICATED" in flags:
                continue  # output's fallback to token_embd
            name = names[enum] + (f".{suffix}" if suffix else "")
            out.append(LoaderTensor(name, tuple(x.strip() for x in dims.split(",")), _required(flags), scope))
        for args in _CREATE_QKV.findall(line):
            n_embd, q, k, v, flags = (x.strip() for x in args.split(","))
            params = {"n_embd_": n_embd, "n_embd_q_": q, "n_embd_k_": k, "n_embd_v_": v}
            params["n_embd_qkv"] = f"({q}) + ({k}) + ({v})"
            for enum, suffix, dims, qkv_flags in qkv:
                shape = tuple(params.get(x, x) for x in dims)
                req = _required(flags if qkv_flags == "flags" else qkv_flags)
                out.append(LoaderTensor(names[enum] + f".{suffix}", shape, req, scope))
        depth += line.count("{") - line.count("}")
        if scope in ("attn", "recr") and depth <= branch_depth:
            scope = "trunk"
    # create_tensor_qkv names the Q/K/V biases on both of its paths
    first: dict[tuple[str, str], LoaderTensor] = {}
    for t in out:
        first.setdefault((t.name, t.scope), t)
    return list(first.values())


def loader_keys(tree: Path) -> dict[str, bool]:
    """GGUF keys the qwen35 hparams loader reads: key -> required."""
    names = _table((tree / "src" / "llama-arch.cpp").read_text(), "LLM_KV_")
    body = _function_body(_qwen35_cpp(tree), "llama_model_qwen35::load_arch_hparams(")
    keys: dict[str, bool] = {}
    for enum, args in re.findall(r"ml\.get_key(?:_or_arr)?\(\s*(LLM_KV_\w+)\s*,([^()]*)\)", body):
        keys[names[enum].replace("%s", ARCH)] = args.replace(" ", "").split(",")[-1] != "false"
    # read by llama_model_base::load_hparams for every architecture, required there
    for enum in ("LLM_KV_CONTEXT_LENGTH", "LLM_KV_EMBEDDING_LENGTH", "LLM_KV_BLOCK_COUNT"):
        keys[names[enum].replace("%s", ARCH)] = True
    return keys


def _scalar(kv: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = kv.get(key, default)
    if value is None or isinstance(value, list):
        raise ValueError(f"{key}: {'missing' if value is None else 'an array'} (a scalar is expected here)")
    return int(value)


_SSM_GDN = ("state_size", "group_count", "time_step_rank")


def _hparams(kv: Mapping[str, Any]) -> tuple[dict[str, int], list[bool], int]:
    """The loader's local names for one file's keys, its recurrent-layer flags and n_layer."""
    a = ARCH
    n_embd = _scalar(kv, f"{a}.embedding_length")
    n_layer_all = _scalar(kv, f"{a}.block_count")
    n_layer = n_layer_all - _scalar(kv, f"{a}.nextn_predict_layers", 0)
    n_head = _scalar(kv, f"{a}.attention.head_count")
    n_head_kv = _scalar(kv, f"{a}.attention.head_count_kv", n_head)
    head_k = _scalar(kv, f"{a}.attention.key_length", n_embd // n_head)
    head_v = _scalar(kv, f"{a}.attention.value_length", n_embd // n_head)
    if kv.get("tokenizer.ggml.model") in ("none", "no_vocab"):
        n_vocab = _scalar(kv, f"{a}.vocab_size", 0)
    else:
        n_vocab = len(kv.get("tokenizer.ggml.tokens", []))
    recr = kv.get(f"{a}.attention.recurrent_layers")
    if recr is not None:
        if len(recr) != n_layer_all:
            raise ValueError(
                f"{a}.attention.recurrent_layers: {len(recr)} entries, block_count {n_layer_all}"
            )
        flags = [bool(x) for x in recr]
    else:
        interval = _scalar(kv, f"{a}.full_attention_interval", 4)
        flags = [i < n_layer and (i + 1) % interval != 0 for i in range(n_layer_all)]
    state, groups, v_heads = (_scalar(kv, f"{a}.ssm.{k}") for k in _SSM_GDN)
    names = {
        "n_embd": n_embd,
        "n_vocab": n_vocab,
        "n_ff": _scalar(kv, f"{a}.feed_forward_length"),
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "n_embd_head_k": head_k,
        "n_embd_head_v": head_v,
        "n_embd_k_gqa": head_k * n_head_kv,
        "n_embd_v_gqa": head_v * n_head_kv,
        "head_k_dim": state,
        "head_v_dim": state,
        "n_k_heads": groups,
        "n_v_heads": v_heads,
        "key_dim": state * groups,
        "value_dim": state * v_heads,
        "conv_dim": 2 * state * groups + state * v_heads,
        "hparams.ssm_d_conv": _scalar(kv, f"{a}.ssm.conv_kernel"),
        "hparams.ssm_dt_rank": v_heads,
        "hparams.ssm_d_state": state,
        "hparams.ssm_n_group": groups,
        "hparams.ssm_d_inner": _scalar(kv, f"{a}.ssm.inner_size"),
    }
    return names, flags, n_layer


def _eval_dim(expr: str, names: Mapping[str, int]) -> int:
    tokens = re.findall(r"[A-Za-z_][\w.]*|\d+|[-+*/()]", expr)
    if "".join(tokens) != expr.replace(" ", ""):
        raise ValueError(f"cannot read the shape expression {expr!r}")
    py = []
    for t in tokens:
        if t[0].isalpha() or t[0] == "_":
            if t not in names:
                raise ValueError(f"shape expression {expr!r}: {t} is not a known hyperparameter")
            py.append(str(names[t]))
        else:
            py.append("//" if t == "/" else t)
    return int(eval("".join(py), {"__builtins__": {}}))  # digits and operators only


def check(
    kv: Mapping[str, Any],
    tensors: Mapping[str, tuple[int, ...]],
    loader: Sequence[LoaderTensor],
    keys: Mapping[str, bool],
) -> list[str]:
    """Problems the tree's qwen35 loader would have with a file of these keys and tensors (name -> ne):
    required keys missing, required tensors missing, tensors it would not create, shapes that differ."""
    problems = [f"key {k} is missing" for k, req in keys.items() if req and k not in kv]
    if problems:
        return problems
    try:
        names, recurrent, n_layer = _hparams(kv)
    except ValueError as e:
        return [str(e)]
    expected: dict[str, tuple[tuple[int, ...], bool]] = {}
    for il in range(len(recurrent)):
        scopes = {"mtp"} if il >= n_layer else {"trunk", "recr" if recurrent[il] else "attn"}
        for t in loader:
            if t.scope in scopes:
                expected[t.name % il] = (tuple(_eval_dim(x, names) for x in t.dims), t.required)
    for t in loader:
        if t.scope == "global":
            expected[t.name] = (tuple(_eval_dim(x, names) for x in t.dims), t.required)
    for name, (ne, required) in expected.items():
        if name not in tensors:
            if required:
                problems.append(f"{name}: required, missing")
        elif tuple(tensors[name]) != ne:
            problems.append(f"{name}: ne {list(tensors[name])}, the loader wants {list(ne)}")
    problems += [f"{name}: the loader does not create it" for name in tensors if name not in expected]
    return problems


def read(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]], dict[str, str]]:
    """A GGUF's keys, tensor shapes (ggml order) and type names."""
    gguf = _gguf()
    r = gguf.GGUFReader(path)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    return kv, shapes, {t.name: t.tensor_type.name for t in r.tensors}


def check_file(path: Path, tree: Path) -> list[str]:
    kv, shapes, _ = read(path)
    if kv.get("general.architecture") != ARCH:
        return [f"general.architecture is {kv.get('general.architecture')!r}, not {ARCH!r}"]
    return check(kv, shapes, loader_tensors(tree), loader_keys(tree))


def specs_as_file(d: Qwen35) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """What ``read`` would return for the file of ``d``, without writing it."""
    return {"general.architecture": ARCH, **metadata(d)}, {s.name: s.ne for s in tensor_specs(d)}


# --- command line ----------------------------------------------------------------------------------


def _iter_count_lines(d: Qwen35) -> Iterator[str]:
    counts = trunk_projections(d)
    for r, n in sorted(counts.items(), key=lambda x: -x[1]):
        yield f"{r:24s} {n:>16,d}"
    total = sum(counts.values())
    yield f"{'total':24s} {total:>16,d}  ({total / 1e9:.2f} G, {d.layers} blocks)"


def _default_tree() -> Path | None:
    try:
        from ggml_dispatch import fetch
    except ImportError:
        return None
    return Path(fetch.llama_cpp_dir())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.qwen35", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    full = Qwen35()
    w = sub.add_parser("write", help="the GGUF with random weights")
    w.add_argument("-o", "--out", type=Path, required=True)
    w.add_argument("--layers", type=int, default=full.layers, help="trunk layers, a multiple of 4 (64)")
    w.add_argument("--vocab", type=int, default=full.vocab, help="token_embd / output rows (default 248320)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument(
        "--tokenizer",
        choices=("none", "spm"),
        default="none",
        help="none: the vocabulary size only (llama-bench); spm: a synthetic vocabulary (llama-server)",
    )
    c = sub.add_parser("count", help="the trunk projections' weights (no file written)")
    c.add_argument("--layers", type=int, default=full.layers)
    k = sub.add_parser("check", help="a GGUF against the tree's qwen35 loader (parsed from its source)")
    k.add_argument("gguf", type=Path)
    k.add_argument("--tree", type=Path, help="the llama.cpp tree (default: the pinned one, fetched)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "write":
            d = dataclasses.replace(full, layers=args.layers, vocab=args.vocab, tokenizer=args.tokenizer)
            d.validate()
            if not args.out.parent.is_dir():
                raise ValueError(f"the folder of {args.out} does not exist")
            write(args.out, d, args.seed)
            print(args.out)
        elif args.cmd == "count":
            d = dataclasses.replace(full, layers=args.layers)
            d.validate()
            print("\n".join(_iter_count_lines(d)))
        else:
            tree = args.tree or _default_tree()
            if tree is None or not (tree / "src" / "models" / "qwen35.cpp").is_file():
                raise ValueError(f"no llama.cpp tree with src/models/qwen35.cpp at {tree} (pass --tree)")
            if not args.gguf.is_file():
                raise ValueError(f"{args.gguf} is not a file")
            problems = check_file(args.gguf, tree)
            for p in problems:
                print(p)
            print(f"{args.gguf}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
            return 1 if problems else 0
    except ValueError as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
