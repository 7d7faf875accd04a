"""Assemble ``samples/trace-smollm2.jsonl``: the route trace llama.cpp would write for SmolLM2-135M.

Not a capture. Until a patched ggml-cuda records a real one on the H200, this builds the trace from the
real SmolLM2-135M-Instruct Q4_1 GGUF's tensor list (types and shapes read from the file) and the
pinned tree's graph and stock routing rules, for a small workload:

* one 512-token prompt as one ubatch, then 16 decode steps, context 4096, f16 KV cache,
  FlashAttention off (so KQ and KQV are matmuls over KV-cache views);
* only the last token's logits are requested, so the LM head (tied: ``token_embd.weight``) runs at
  M = 1, and the last layer's FFN runs on that one row only (llama.cpp's ``inp_out_ids``);
* at M = 1, ffn_gate + ffn_up + GLU is one fused mmvq kernel (``fused: glu``);
* stock routes as ``ggml_cuda_mul_mat`` picks them on cc 900 (H200): mmvf for thin f16 at M = 1,
  mmf for f16 at M <= 16, mmvq for quantized M <= 8, mmq above, cuBLAS for f16 at M > 16.

Two flushes (after the prompt, at exit) so identical keys appear twice and must be added up.

Run: ``.venv/bin/python samples/assemble_trace.py`` (writes samples/trace-smollm2.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from census import gguf_meta
from ggml_dispatch import fetch, fileio, schema

NOTE = "assembled from the SmolLM2-135M GGUF tensor list, not captured"
PROMPT = 512
DECODE_STEPS = 16
N_CTX = 4096
KV_PAD = 256  # llama_kv_cache::get_n_kv pads the cells in use to 256
H200 = {
    "id": 0,
    "name": "NVIDIA H200",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "cc": 900,
    "sm_count": 132,
    "smpbo": 232448,
    "vram_mib": 143771,
}
CC = 900
Key = tuple[str, str, str, tuple[int, ...], tuple[int, ...], tuple[int, ...], str | None, str, str]


def _nb(type_name: str, ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    t = schema.ggml_type(type_name)
    nb1 = t.row_bytes(ne[0])
    return (t.type_size, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])


def stock_route(type_name: str, ne: tuple[int, ...], nb: tuple[int, ...], M: int) -> str:
    """ggml_cuda_mul_mat's choice on cc 900 for an f32 src1 (the pinned tree's rules, cut to this GPU)."""
    t = schema.ggml_type(type_name)
    ts = t.type_size
    aligned = nb[0] == ts and all(x % (2 * ts) == 0 for x in nb[1:])
    if not t.quantized:
        # ggml_cuda_should_use_mmvf: f16 on Ampere+ only for a thin src0 at M == 1
        small = ne[1] <= 512 or ne[2] * ne[3] == 1
        if type_name == "f16" and ne[0] % 2 == 0 and aligned and small and M == 1:
            return "mmvf"
        # ggml_cuda_should_use_mmf: f16, ne00 % 64, ne01 % 32, M <= 16
        if type_name == "f16" and ne[0] % 64 == 0 and aligned and ne[1] % 32 == 0 and M <= 16:
            return "mmf"
        return "cublas"
    return "mmvq" if M <= 8 else "mmq"  # q4_1/q8_0: MMQ with tensor cores from Turing on


def assemble(model_path: Path) -> list[dict[str, object]]:
    m = gguf_meta.read_gguf(model_path)
    if not m.tied_embeddings:
        raise SystemExit(f"{model_path}: expected tied embeddings (SmolLM2)")
    heads, kv_heads = m.head_count, m.head_count_kv
    q = m.tensors["blk.0.attn_q.weight"]
    head_dim = q.ne[1] // heads
    n_embd_gqa = head_dim * kv_heads

    def weight(name: str, M: int, fused: str | None = None) -> Key:
        t = m.tensors[name]
        return (
            "MUL_MAT",
            name,
            t.type_name,
            t.ne,
            _nb(t.type_name, t.ne),
            (t.ne[0], M, 1, 1),
            fused,
            "weight",
            "",
        )

    def attention(il: int, M: int, n_kv: int) -> list[Key]:
        # K view [head_dim, n_head_kv, n_kv] permuted (0, 2, 1, 3): ne [head_dim, n_kv, n_head_kv]
        k_ne = (head_dim, n_kv, kv_heads, 1)
        k_nb = (2, 2 * n_embd_gqa, 2 * head_dim, 2 * n_embd_gqa * N_CTX)
        # transposed V view [n_kv, n_head_kv, head_dim] permuted: ne [n_kv, head_dim, n_head_kv]
        v_ne = (n_kv, head_dim, kv_heads, 1)
        v_nb = (2, 2 * N_CTX, 2 * N_CTX * head_dim, 2 * N_CTX * n_embd_gqa)
        return [
            (
                "MUL_MAT",
                f"cache_k_l{il} (view) (permuted)",
                "f16",
                k_ne,
                k_nb,
                (head_dim, M, heads, 1),
                None,
                "attention",
                "",
            ),
            (
                "MUL_MAT",
                f"cache_v_l{il} (view) (permuted)",
                "f16",
                v_ne,
                v_nb,
                (n_kv, M, heads, 1),
                None,
                "attention",
                "",
            ),
        ]

    def forward(M: int, n_kv: int) -> list[Key]:
        keys: list[Key] = []
        for il in range(m.block_count):
            b = f"blk.{il}."
            keys += [
                weight(b + "attn_q.weight", M),
                weight(b + "attn_k.weight", M),
                weight(b + "attn_v.weight", M),
            ]
            keys += attention(il, M, n_kv)
            keys.append(weight(b + "attn_output.weight", M))
            m_ffn = 1 if il == m.block_count - 1 else M  # inp_out_ids: only the output row goes on
            fused = "glu" if m_ffn == 1 else None
            keys += [weight(b + "ffn_gate.weight", m_ffn, fused), weight(b + "ffn_up.weight", m_ffn, fused)]
            keys.append(weight(b + "ffn_down.weight", m_ffn))
        keys.append(weight("token_embd.weight", 1))  # tied LM head, last token's logits only
        return keys

    def pad(n: int) -> int:
        return max(KV_PAD, -(-n // KV_PAD) * KV_PAD)

    prompt = Counter(forward(PROMPT, pad(PROMPT)))
    decode: Counter[Key] = Counter()
    for step in range(DECODE_STEPS):
        decode.update(forward(1, pad(PROMPT + step + 1)))

    header: dict[str, object] = {
        "kind": "header",
        "schema": schema.TRACE_SCHEMA,
        "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
        "patch_hash": None,
        "table_hash": None,
        "build": {"cuda_architectures": "90", "GGML_CUDA_GRAPHS": "ON", "GGML_CUDA_FA": "OFF"},
        "env": {},
        "devices": [H200],
        "pid": 0,
        "started": "2026-11-30T00:00:00+00:00",
        "note": NOTE,
        "workload": {
            "model": model_path.name,
            "model_sha256": fileio.sha256_file(model_path),
            "prompt_tokens": PROMPT,
            "ubatch": PROMPT,
            "decode_steps": DECODE_STEPS,
            "n_ctx": N_CTX,
            "flash_attn": False,
            "kv_type": "f16",
        },
    }
    records: list[dict[str, object]] = [header]
    for flush in (prompt, decode):
        for key, count in flush.items():
            op, tensor, type_name, ne, nb, src1_ne, fused, layout, _ = key
            M = src1_ne[1]
            route = stock_route(type_name, ne, nb, M)
            records.append(
                {
                    "kind": "route",
                    "op": op,
                    "device": 0,
                    "tensor": tensor,
                    "src0_type": type_name,
                    "src1_type": "f32",
                    "src0_ne": list(ne),
                    "src0_nb": list(nb),
                    "src1_ne": list(src1_ne),
                    "layout": layout,
                    "fused": fused,
                    "route": route,
                    "stock_route": route,
                    "reason": "fused" if fused else "stock",
                    "count": count,
                }
            )
    n_route = len(records) - 1
    records.append({"kind": "footer", "records": n_route, "dropped": 0, "ended": "2026-11-30T00:00:05+00:00"})
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--gguf", type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf (default: fetched into .cache)"
    )
    ap.add_argument("-o", "--output", type=Path, default=Path(__file__).with_name("trace-smollm2.jsonl"))
    args = ap.parse_args(argv)
    model = args.gguf or fetch.smollm2_gguf()
    records = assemble(model)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    fileio.write_text_atomic(args.output, text)
    print(f"wrote {args.output}: {len(records)} records, {len(text.encode())} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
