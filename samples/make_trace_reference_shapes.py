"""Write ``samples/trace-reference-shapes.jsonl``: a route trace assembled from the shapes of
``samples/reference/h200-mul-mat-routes.tsv`` (not captured), so the demo's census and its reference
tuning rows describe the same shapes. (The trace's ``note`` names the file where it was copied from.)

Two runs on one NVIDIA H200, each a header ... footer block of ``ggml-route-trace/1``:

1. a 4-layer model with Llama-3-8B dimensions in Q4_K_M style types (the model of
   ``samples/reference/h200-e2e-crude-rule.md``): attn_q/attn_output 4096x4096 q4_K, attn_k 1024x4096
   q4_K, attn_v 1024x4096 q6_K, ffn_gate/ffn_up 14336x4096 q4_K, ffn_down 4096x14336 q6_K; workload
   pp512 + pp2048 (ubatch 512) + a 1280-token prompt (512 + 512 + 256) + tg128. At M = 1 gate and up
   run as a fused GLU group (fused = glu), as upstream's graph evaluation does.
2. a 4-layer model with 5120/17408 FFN dimensions, one weight type per layer (q8_0, q6_K, q5_K,
   q4_K: the four types the reference measured), decoding with speculative verification: M = 1 x 64,
   M = 2, 3, 4 x 32 each, M = 8 x 16, M = 16 x 8, M = 64 x 4, M = 256 x 2, M = 1024 x 2.

Stock's route is upstream's on cc 900: mmvq for M <= 8, mmq above. Run: ``python
samples/make_trace_reference_shapes.py`` (deterministic; no arguments).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ggml_dispatch import schema

OUT = Path(__file__).resolve().parent / "trace-reference-shapes.jsonl"
NOTE = "assembled from the shapes of shared/reference/h200-mul-mat-routes.tsv, not captured"
DEVICE = {
    "id": 0,
    "name": "NVIDIA H200",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "cc": 900,
    "sm_count": 132,
    "smpbo": 232448,
    "vram_mib": 143771,
}


def _header(started: str) -> dict[str, Any]:
    return {
        "kind": "header",
        "schema": schema.TRACE_SCHEMA,
        "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
        "patch_hash": None,
        "table_hash": None,
        "build": {"cuda_architectures": "90", "GGML_CUDA_GRAPHS": "ON", "GGML_CUDA_FA": "OFF"},
        "env": {},
        "devices": [DEVICE],
        "pid": 0,
        "started": started,
        "note": NOTE,
    }


def _route(
    tensor: str, src0_type: str, N: int, K: int, M: int, count: int, fused: str | None
) -> dict[str, Any]:
    t = schema.ggml_type(src0_type)
    nb1 = t.row_bytes(K)
    stock = "mmvq" if M <= 8 else "mmq"
    return {
        "kind": "route",
        "op": "MUL_MAT",
        "device": 0,
        "tensor": tensor,
        "src0_type": src0_type,
        "src1_type": "f32",
        "src0_ne": [K, N, 1, 1],
        "src0_nb": [t.type_size, nb1, nb1 * N, nb1 * N],
        "src1_ne": [K, M, 1, 1],
        "layout": "weight",
        "fused": fused,
        "route": stock,
        "stock_route": stock,
        "reason": "fused" if fused else "stock",
        "count": count,
    }


def _run(records: list[dict[str, Any]], started: str, ended: str) -> list[dict[str, Any]]:
    footer = {"kind": "footer", "records": len(records), "dropped": 0, "ended": ended}
    return [_header(started), *records, footer]


def build() -> list[dict[str, Any]]:
    llama8b = [
        ("attn_q", "q4_K", 4096, 4096),
        ("attn_k", "q4_K", 1024, 4096),
        ("attn_v", "q6_K", 1024, 4096),
        ("attn_output", "q4_K", 4096, 4096),
        ("ffn_gate", "q4_K", 14336, 4096),
        ("ffn_up", "q4_K", 14336, 4096),
        ("ffn_down", "q6_K", 4096, 14336),
    ]
    # ubatches: pp512 (1) + pp2048 at ub 512 (4) + 1280-token prompt (2 x 512 + 1 x 256); tg128: 128 x M=1
    workload8b = {512: 1 + 4 + 2, 256: 1, 1: 128}
    run1 = []
    for layer in range(4):
        for role, typ, N, K in llama8b:
            for M, count in workload8b.items():
                fused = "glu" if M == 1 and role in ("ffn_gate", "ffn_up") else None
                run1.append(_route(f"blk.{layer}.{role}.weight", typ, N, K, M, count, fused))
    ffn14b = [("ffn_gate", 17408, 5120), ("ffn_up", 17408, 5120), ("ffn_down", 5120, 17408)]
    workload14b = {1: 64, 2: 32, 3: 32, 4: 32, 8: 16, 16: 8, 64: 4, 256: 2, 1024: 2}
    run2 = []
    for layer, typ in enumerate(("q8_0", "q6_K", "q5_K", "q4_K")):
        for role, N, K in ffn14b:
            for M, count in workload14b.items():
                fused = "glu" if M == 1 and role in ("ffn_gate", "ffn_up") else None
                run2.append(_route(f"blk.{layer}.{role}.weight", typ, N, K, M, count, fused))
    return _run(run1, "2026-11-30T12:00:00+00:00", "2026-11-30T12:01:00+00:00") + _run(
        run2, "2026-11-30T12:05:00+00:00", "2026-11-30T12:06:00+00:00"
    )


def main() -> None:
    lines = [json.dumps(r, separators=(",", ":")) for r in build()]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(lines)} records")


if __name__ == "__main__":
    main()
