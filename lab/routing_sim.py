# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""Which experts the qwen3moe-a3b preset's router picks, layer by layer, for random tokens: a numpy replay
of the model's forward pass in f32 with the weights `lab/models.py` writes (before Q4_K_M quantization),
for each init. It shows why the `scaled` init exists: under `flat` the residual stream converges over the
tokens and the router sends almost all of them to a few experts from the second layer on (as the H200 trace
of the flat model shows); under `scaled` every layer's routing stays spread.

    python -m lab.routing_sim --init flat --layers 8 --tokens 512

Prints one line per layer: experts with tokens, the most tokens on one expert, their mean and CV (over the
experts with tokens), and the mean norm of the residual stream. Takes ~30 s for 8 layers of 512 tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

from lab import models

VOCAB = 49152  # SmolLM2's tokenizer, which the model files carry


def _rms(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _rope(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    half = x.shape[-1] // 2
    ang = pos[:, None] * base ** (-np.arange(half) / half)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def simulate(d: models.Dims, tokens: int, seed: int = 1) -> list[dict[str, float]]:
    """Per layer: routing statistics of ``tokens`` random tokens through the model ``d`` describes."""
    pool32 = models._random_pool(0)
    pool16 = pool32.astype(np.float16).astype(np.float32)
    specs = list(models._tensor_specs(d, VOCAB))
    index = {name: (i, ne) for i, (name, ne) in enumerate(specs)}

    def weight(name: str, rows: int, start: int = 0, n: int | None = None) -> np.ndarray:
        i, ne = index[name]
        pool = pool32 if name.endswith("ffn_gate_inp.weight") else pool16
        count = int(np.prod(ne)) if n is None else n
        w = models.tensor_values(pool, i, count, start) * models.init_scale(name, d)
        return w.reshape(rows, -1)

    ids = np.random.default_rng(seed).integers(0, VOCAB, tokens)
    emb = index["token_embd.weight"][0]
    scale = models.init_scale("token_embd.weight", d)
    h = np.stack([models.tensor_values(pool16, emb, d.hidden, t * d.hidden) for t in ids]) * scale
    pos = np.arange(tokens, dtype=np.float64)
    H, KV, Dh = d.heads, d.kv_heads, d.head_dim
    mask = np.triu(np.full((tokens, tokens), -np.inf), 1)
    out = []
    n_expert = d.expert_ffn * d.hidden
    for layer in range(d.layers):
        p = f"blk.{layer}."
        x = _rms(h)
        q = _rope(_rms((x @ weight(p + "attn_q.weight", H * Dh).T).reshape(tokens, H, Dh)), pos, 1e6)
        k = _rope(_rms((x @ weight(p + "attn_k.weight", KV * Dh).T).reshape(tokens, KV, Dh)), pos, 1e6)
        v = (x @ weight(p + "attn_v.weight", KV * Dh).T).reshape(tokens, KV, Dh)
        att = np.zeros((tokens, H, Dh))
        for head in range(H):
            g = head // (H // KV)
            s = q[:, head] @ k[:, g].T / np.sqrt(Dh) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            att[:, head] = (s / s.sum(1, keepdims=True)) @ v[:, g]
        h = h + att.reshape(tokens, H * Dh) @ weight(p + "attn_output.weight", d.hidden).T
        x = _rms(h)
        logits = x @ weight(p + "ffn_gate_inp.weight", d.experts).T
        top = np.argsort(-logits, 1)[:, : d.experts_used]
        prob = np.take_along_axis(logits, top, 1)
        prob = np.exp(prob - prob.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        counts = np.bincount(top.ravel(), minlength=d.experts)
        busy = counts[counts > 0]
        out.append(
            {
                "layer": layer,
                "experts": int(busy.size),
                "max": int(busy.max()),
                "mean": float(busy.mean()),
                "cv": float(busy.std() / busy.mean()),
                "norm": float(np.linalg.norm(h, axis=1).mean()),
            }
        )
        y = np.zeros_like(h)
        for e in np.nonzero(counts)[0]:
            rows = np.nonzero((top == e).any(1))[0]
            gate = weight(p + "ffn_gate_exps.weight", d.expert_ffn, e * n_expert, n_expert)
            up = weight(p + "ffn_up_exps.weight", d.expert_ffn, e * n_expert, n_expert)
            down = weight(p + "ffn_down_exps.weight", d.hidden, e * n_expert, n_expert)
            a = x[rows] @ gate.T
            a = a / (1 + np.exp(-a)) * (x[rows] @ up.T)
            y[rows] += prob[rows][top[rows] == e][:, None] * (a @ down.T)
        h = h + y
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.routing_sim", description=__doc__)
    ap.add_argument("--init", choices=models.INITS, default="scaled")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args(argv)
    d = dataclasses.replace(models.PRESETS["qwen3moe-a3b"], layers=args.layers, init=args.init)
    for r in simulate(d, args.tokens):
        print(
            f"layer {r['layer']}: {r['experts']} experts with tokens, max {r['max']}, mean {r['mean']:.1f},"
            f" cv {r['cv']:.2f}, |h| {r['norm']:.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
