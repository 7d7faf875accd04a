"""Tensor role from the src0 name of a matmul (GGUF / llama.cpp tensor names).

Weight matmuls use the model's tensors by their GGUF names (``blk.7.attn_q.weight``). Attention matmuls
take a view of the KV cache as src0 (``cache_k_l7 (view) (permuted)``): KQ multiplies by K, KQV by V.
With tied embeddings (no ``output.weight``) the LM head multiplies by ``token_embd.weight``; that tensor is
otherwise only read by GET_ROWS, so as a matmul src0 it is always the LM head.
"""

from __future__ import annotations

import re
from typing import Final

LM_HEAD: Final = "lm_head"
ATTN_KQ: Final = "attn_kq"
ATTN_KQV: Final = "attn_kqv"
OTHER: Final = "other"

# blk.N.<role>.weight -> role, for these names (llama.cpp's LLM_TENSOR_* GGUF names).
BLOCK_ROLES: Final = frozenset(
    {
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_qkv",
        "attn_output",
        "attn_q_a",
        "attn_q_b",
        "attn_kv_a_mqa",
        "attn_kv_b",
        "attn_k_b",
        "attn_v_b",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "ffn_gate_up",
        "ffn_gate_inp",  # MoE router
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
        "ffn_gate_up_exps",
        "ffn_gate_shexp",
        "ffn_up_shexp",
        "ffn_down_shexp",
        # linear-attention / state-space layers (qwen35's gated delta net, qwen3next, mamba): their
        # projections are matmuls like any other, the recurrence itself is its own op
        "attn_gate",
        "ssm_in",
        "ssm_x",
        "ssm_dt",
        "ssm_out",
        "ssm_ba",
        "ssm_alpha",
        "ssm_beta",
        # MTP (next-token prediction) blocks: blk.N.nextn.*; the head's own lm_head copy where it has one
        "nextn.eh_proj",
        "nextn.shared_head_head",
    }
)
EXPERT_ROLES: Final = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"})
ROLES: Final = BLOCK_ROLES | {LM_HEAD, ATTN_KQ, ATTN_KQV, OTHER}

LM_HEAD_TENSOR: Final = "output.weight"
TOKEN_EMBD_TENSOR: Final = "token_embd.weight"

_BLOCK = re.compile(r"blk\.\d+\.((?:nextn\.)?[a-z0-9_]+)\.weight")
# KV-cache tensors are named cache_k_l<il> / cache_v_l<il> (llama-kv-cache.cpp, optionally with a tag
# between "cache_" and "k"); views and permutes append " (view)", " (permuted)", ...
_CACHE_K = re.compile(r"cache_(?:[a-z0-9]+_)?k_l\d+")
_CACHE_V = re.compile(r"cache_(?:[a-z0-9]+_)?v_l\d+")
# Graph-built K/V without a cache (encoders, no-cache paths): "k-<il>", "v-<il>", "k", "v".
_PLAIN_K = re.compile(r"k(?:_cur)?(?:-\d+)?")
_PLAIN_V = re.compile(r"v(?:_cur)?(?:-\d+)?")


def _base_name(tensor: str) -> str:
    """The name without the suffixes ggml appends to views: ``x (view) (permuted)`` -> ``x``."""
    base = tensor
    while base.endswith(")") and " (" in base:
        base = base[: base.rindex(" (")]
    return base


def role_of(tensor: str, layout: str) -> str:
    """Role of a matmul whose src0 is named ``tensor`` in layout class ``layout``."""
    if tensor in (LM_HEAD_TENSOR, TOKEN_EMBD_TENSOR):
        return LM_HEAD
    m = _BLOCK.fullmatch(tensor)
    if m and m.group(1) in BLOCK_ROLES:
        return m.group(1)
    base = _base_name(tensor)
    if _CACHE_K.fullmatch(base):
        return ATTN_KQ
    if _CACHE_V.fullmatch(base):
        return ATTN_KQV
    if layout == "attention":
        if _PLAIN_K.fullmatch(base):
            return ATTN_KQ
        if _PLAIN_V.fullmatch(base):
            return ATTN_KQV
    return OTHER


def is_matmul_weight(name: str, n_dims: int, tied: bool) -> bool:
    """Whether a GGUF tensor is a matmul weight a trace should show (for the "never seen" report)."""
    if name == TOKEN_EMBD_TENSOR:
        return tied
    if name == LM_HEAD_TENSOR:
        return True
    if n_dims < 2:
        return False
    m = _BLOCK.fullmatch(name)
    return bool(m and m.group(1) in BLOCK_ROLES)
