# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""Decisions per routing bucket from the harness' MUL_MAT_ID output (lab/moe.sh PART=tune), with the
project's decision statistic (codegen.decide: median of paired stock/config ratios, 95% bootstrap CI,
theta, the no-harm test). Each case's bucket is the one its measured routing falls in
(registry.routing_bucket on the statistics the harness reports for the case's routing). Per shape and
M: the winner that passes in each bucket, and the configuration a routing-0 rule (the one the runtime
looks up) could carry: one that passes in every bucket measured there and is slower than stock beyond
noise in none. Not yet written into table.json (codegen has no MUL_MAT_ID tuning rows).

    python -m lab.moe_decide CASES.json HARNESS.jsonl [-o decisions.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from codegen import decide
from ggml_dispatch import registry


def bucket_of(spec: Mapping[str, Any], experts: Mapping[str, Any]) -> int:
    picks = int(spec["used"]) * int(spec["M"])
    return registry.routing_bucket(picks, int(experts["nonempty"]), float(experts["cv"]), int(spec["E"]))


def decisions(
    cases: Sequence[Mapping[str, Any]], lines: Sequence[Mapping[str, Any]], params: decide.Params
) -> list[dict[str, Any]]:
    specs = {str(c["case"]): c for c in cases}
    ends = {str(x["case"]): x for x in lines if x.get("kind") == "case"}
    trials: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for x in lines:
        if x.get("kind") == "trial" and x.get("route") != "stock":
            trials[str(x["case"])].append(x)
    # (shape, M) -> bucket -> config -> evaluation
    points: dict[tuple[Any, ...], dict[int, dict[str, decide.RouteEval]]] = defaultdict(dict)
    for cid, spec in specs.items():
        end = ends.get(cid)
        if end is None or "experts" not in end or not trials.get(cid):
            continue
        b = bucket_of(spec, end["experts"])
        key = registry.MulMatIdKey(
            "MUL_MAT_ID",
            "expert",
            spec["src0_type"],
            spec["src1_type"],
            spec["N"],
            spec["K"],
            spec["E"],
            spec["U"],
            b,
        )
        df = pd.DataFrame(
            [
                {
                    "status": t["status"],
                    "route_ran": t.get("route_ran") or None,
                    "us": t.get("us"),
                    "anchor_us": t.get("anchor_us"),
                    "source": "measured",
                    "config": t["route"],
                }
                for t in trials[cid]
            ]
        )
        evals = {
            str(cfg): decide.evaluate_route(key, int(spec["M"]), str(cfg), rows, params)  # type: ignore[arg-type]
            for cfg, rows in df.groupby("config")
        }
        shape = (spec["src0_type"], spec["src1_type"], spec["N"], spec["K"], spec["E"], spec["U"], spec["M"])
        points[shape][b] = evals
    out = []
    for shape, by_bucket in sorted(points.items()):
        t0, t1, N, K, E, U, M = shape
        per_bucket = {}
        for b, evals in sorted(by_bucket.items()):
            per_bucket[registry.ROUTING_BUCKETS[b]] = {
                "winner": decide.winner(evals),
                "passing": decide.passing_route(evals, params),
                "ratio": {c: ev.ratio for c, ev in sorted(evals.items())},
            }
        everywhere = [
            c
            for c in set.intersection(*(set(ev) for ev in by_bucket.values()))
            if all(
                decide.verdict(ev[c], params).passes and not decide.slower_beyond_noise(ev[c], params)
                for ev in by_bucket.values()
            )
        ]
        best = max(
            everywhere, key=lambda c: min(ev[c].ratio or 0.0 for ev in by_bucket.values()), default=None
        )
        out.append(
            {
                "src0_type": t0,
                "src1_type": t1,
                "N": N,
                "K": K,
                "E": E,
                "U": U,
                "M": M,
                "buckets": per_bucket,
                "routing0": best,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.moe_decide", description=__doc__)
    ap.add_argument("cases", type=Path)
    ap.add_argument("harness", type=Path)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args(argv)
    cases = json.loads(args.cases.read_text())
    lines = [json.loads(x) for x in args.harness.read_text().splitlines() if x.startswith("{")]
    ds = decisions(cases, lines, decide.Params())
    for d in ds:
        shape = f"{d['src0_type']} N={d['N']} K={d['K']} E={d['E']} U={d['U']} M={d['M']}"
        parts = [f"{b}: {v['passing'] or 'stock'}" for b, v in d["buckets"].items()]
        print(f"{shape}: {'; '.join(parts)}; routing 0: {d['routing0'] or 'stock'}")
    if args.out:
        args.out.write_text(json.dumps(ds, indent=1) + "\n")
    return 0 if ds else 2


if __name__ == "__main__":
    sys.exit(main())
