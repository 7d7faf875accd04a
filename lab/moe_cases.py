# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""MUL_MAT_ID harness cases from a census: every MUL_MAT_ID shape of the census (types, N, K, E, U, M)
under each routing kind the harness draws (uniform top-k, skewed, all tokens on a few experts) with
every MUL_MAT_ID configuration of the registry as a candidate: mmvq (the harness refuses it above its
token limit), mmq plain and at every J x stream-k, mmf (refused for quantized experts), mmvf. The
per-expert fallback is no candidate: it synchronizes the stream, so it cannot run inside the captured
graphs the harness times (stock takes it where nothing else is eligible, and graphs are then off).

    python -m lab.moe_cases CENSUS -o cases.json [--routing uniform,skewed,few] [--trials 5] [--top 12]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ggml_dispatch import registry
from ggml_dispatch.artifacts import census as census_file

ROUTINGS: dict[str, dict[str, Any]] = {
    "uniform": {"kind": "uniform"},
    "skewed": {"kind": "skewed", "s": 1.2},
    "few": {"kind": "few"},  # the experts default to `used`: every token on the same experts
}


def candidates() -> list[str]:
    """Every configuration of the routes that serve MUL_MAT_ID (registry order)."""
    out: list[str] = []
    for route in registry.OPS[registry.Op.MUL_MAT_ID].routes:
        out += [str(c) for c in registry.route_configs(route)]
    return out


def cases_of(
    rows: list[dict[str, Any]], n_used: int, routings: list[str], trials: int, top: int
) -> list[dict[str, Any]]:
    """One case per (MUL_MAT_ID shape, routing), the shapes by est_us (largest first), at most ``top``."""
    shapes: dict[tuple[Any, ...], float] = {}
    for r in rows:
        if r["op"] != registry.Op.MUL_MAT_ID:
            continue
        k = (r["src0_type"], r["src1_type"], r["M"], r["N"], r["K"], r["E"], r["U"])
        shapes[k] = shapes.get(k, 0.0) + float(r["est_us"])
    ranked = sorted(shapes, key=lambda k: (-shapes[k], k))[:top]
    cands = candidates()
    out: list[dict[str, Any]] = []
    for t0, t1, M, N, K, E, U in ranked:
        used = U if U > 1 else n_used
        for name in routings:
            out.append(
                {
                    "case": f"MUL_MAT_ID:expert:{t0}:{t1}:N{N}:K{K}:E{E}:U{U}:M{M}:{name}",
                    "op": "MUL_MAT_ID",
                    "layout": "expert",
                    "src0_type": t0,
                    "src1_type": t1,
                    "M": M,
                    "N": N,
                    "K": K,
                    "E": E,
                    "U": U,
                    "used": used,
                    "routing": ROUTINGS[name],
                    "routes": cands,
                    "trials": trials,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.moe_cases", description=__doc__)
    ap.add_argument("census", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--routing", default="uniform,skewed,few")
    ap.add_argument("--used", type=int, default=8, help="experts per token of the gate/up nodes (U = 1)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    routings = [r for r in args.routing.split(",") if r]
    bad = [r for r in routings if r not in ROUTINGS]
    if bad:
        print(f"unknown routing {bad[0]!r} (known: {', '.join(ROUTINGS)})", file=sys.stderr)
        return 2
    rows = census_file.read(args.census).rows()
    cases = cases_of(rows, args.used, routings, args.trials, args.top)
    if not cases:
        print(f"{args.census}: no MUL_MAT_ID rows", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(cases, indent=1) + "\n")
    print(f"{args.out}: {len(cases)} cases x {len(cases[0]['routes'])} candidates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
