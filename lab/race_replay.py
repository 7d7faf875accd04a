"""Replay a recorded sweep's journal under other pruning rules: what the sweep would have cost.

A prediction, not a measurement: each trial's wall time in the journal (its ``t_end_s`` stamps) is fitted
as setup (trial 0) + a cost per timed candidate + a multiple of the candidate's GPU time (us x replays),
and the fit is summed over the trials each rule would still time:

- ``tile``: the harness's tile model (race.h ``tile_dominated``): an mmq width with as many column tiles
  as a smaller eligible width is never timed;
- ``screen X``: after trial 0, a candidate more than X times the best first time is not timed again
  (race.h ``race_screened``).

    python lab/race_replay.py tables/cuda-sm90-nvidia-h200/tuning/configs.journal.jsonl.gz \\
        --baseline tables/cuda-sm90-nvidia-h200/tuning/dense-routes.journal.jsonl.gz \\
        --tuning tables/cuda-sm90-nvidia-h200/tuning/configs.parquet

With ``--tuning`` (the same sweep's Parquet file) it also decides the table from the rows each rule
would have left (the others marked pruned) and lists every rule that differs from the recorded one.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import journal

MMQ = re.compile(r"mmq/j=(\d+)(,.*)?$")


def cases(path: Path) -> Iterator[dict[str, Any]]:
    yield from (r for r in journal.journal_records(path) if r["kind"] == "case")


def timed(t: dict[str, Any]) -> bool:
    return t["status"] in ("ok", "wrong") and t.get("t_end_s") is not None


def gpu_s(trials: list[dict[str, Any]]) -> float:
    return sum((t["us"] or 0.0) * (t.get("replays") or 0) for t in trials) / 1e6


def fit(all_cases: list[dict[str, Any]]) -> np.ndarray:
    """Per trial: seconds = a * (trial 0) + b * candidates timed + c * their GPU seconds."""
    x, y = [], []
    for d in all_cases:
        by: dict[int, list[dict[str, Any]]] = {}
        for t in d["trials"]:
            if timed(t):
                by.setdefault(t["trial"], []).append(t)
        prev = 0.0
        for k in sorted(by):
            end = max(t["t_end_s"] for t in by[k])
            x.append([1.0 if k == 0 else 0.0, len(by[k]), gpu_s(by[k])])
            y.append(end - prev)
            prev = end
    coef, *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
    return np.asarray(coef)


def dominated(names: set[str], M: int) -> set[str]:
    out = set()
    for r in names:
        m = MMQ.match(r)
        if not m:
            continue
        j, rest = int(m.group(1)), m.group(2) or ""
        for r2 in names:
            m2 = MMQ.match(r2)
            if (
                m2
                and (m2.group(2) or "") == rest
                and int(m2.group(1)) < j
                and -(-M // int(m2.group(1))) == -(-M // j)
            ):
                out.add(r)
                break
    return out


def cost(d: dict[str, Any], coef: np.ndarray, tile: bool, screen: float) -> float:
    trials = d["trials"]
    M = int(d["spec"].get("M") or 1)
    eligible = {t["route"] for t in trials if t["status"] != "ineligible"}
    dom = dominated(eligible, M) if tile else set()
    first = {
        t["route"]: t["us"]
        for t in trials
        if t["status"] == "ok" and t["trial"] == 0 and t["route"] not in dom
    }
    best = min(first.values()) if first else math.inf
    out = {r for r, us in first.items() if screen > 1 and r != "stock" and us > screen * best}
    total = 0.0
    for k in sorted({t["trial"] for t in trials}):
        left = [
            t
            for t in trials
            if t["trial"] == k and timed(t) and t["route"] not in dom and not (k and t["route"] in out)
        ]
        total += coef[0] * (k == 0) + coef[1] * len(left) + coef[2] * gpu_s(left)
    return total


def screened_rows(df: pd.DataFrame, screen: float) -> pd.DataFrame:
    """The tuning rows as the tile model and the screen would have left them: what they drop, pruned."""
    out = df.copy()
    key = ["op", "layout", "src0_type", "src1_type", "N", "K", "B", "M"]
    for _, g in out.groupby(key, sort=False):
        M = int(g["M"].iloc[0])
        eligible = set(g.loc[g["status"] != "ineligible", "config"])
        dom = dominated(eligible, M)
        first = g[(g["trial"] == 0) & (g["status"] == "ok") & ~g["config"].isin(dom)]
        best = first["us"].min()
        far = set(first.loc[(first["config"] != "stock") & (first["us"] > screen * best), "config"])
        drop = g["status"].isin(["ok", "wrong"]) & (
            g["config"].isin(dom) | (g["config"].isin(far) & (g["trial"] > 0))
        )
        out.loc[g.index[drop], "status"] = "pruned"
    return out


def decision_changes(df: pd.DataFrame, screen: float) -> list[str]:
    from ggml_dispatch.codegen import decide
    from ggml_dispatch.codegen import table as tbl

    params = decide.Params()
    rules = [
        tbl.build_table(decide.decide(x, params), tuning_sha256="0" * 64)["rules"]
        for x in (df, screened_rows(df, screen))
    ]
    core = [{json.dumps(r, sort_keys=True) for r in tbl.core_rules(rs)} for rs in rules]
    return [f"only recorded: {r}" for r in sorted(core[0] - core[1])] + [
        f"only screened: {r}" for r in sorted(core[1] - core[0])
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("journal", type=Path)
    ap.add_argument(
        "--baseline", type=Path, help="a route-only sweep's journal: its wall time for the same cases"
    )
    ap.add_argument("--screen", type=float, action="append", help="screen factors to replay [1.5]")
    ap.add_argument("--tuning", type=Path, help="the sweep's tuning.parquet: decide again and compare")
    a = ap.parse_args()
    try:
        all_cases = list(cases(a.journal))
        baseline = list(cases(a.baseline)) if a.baseline else []
    except InputError as e:
        print(f"race_replay: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    coef = fit(all_cases)
    print(
        f"fit per trial: {coef[0]:.3f} s setup (trial 0) + {coef[1]:.4f} s per timed candidate "
        f"+ {coef[2]:.2f} x GPU s"
    )
    measured = sum(d["wall_s"] for d in all_cases)
    base = None
    if a.baseline:
        walls = {d["case"]: d["wall_s"] for d in baseline}
        base = sum(walls[d["case"]] for d in all_cases if d["case"] in walls)
        print(
            f"{len(all_cases)} cases: measured {measured:.0f} s; "
            f"the route-only sweep {base:.0f} s for the same cases"
        )
    rules = [("recorded rules", False, 0.0), ("tile model", True, 0.0)]
    rules += [(f"tile model + screen {x}", True, x) for x in (a.screen or [1.5])]
    for name, tile, screen in rules:
        s = sum(cost(d, coef, tile, screen) for d in all_cases)
        ratio = f" ({s / base:.2f}x the route-only sweep)" if base else ""
        print(f"{name}: predicted {s:.0f} s{ratio}")
    if a.tuning:
        df = pd.read_parquet(a.tuning)
        for x in a.screen or [1.5]:
            changes = decision_changes(df, x)
            print(f"decisions with the tile model + screen {x}: {len(changes)} rules differ")
            for c in changes:
                print(f"  {c}")


if __name__ == "__main__":
    main()
