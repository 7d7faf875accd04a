"""Cases of a tune journal where stock's own run failed the numerics check, trial by trial, and how much a
candidate's time depends on the candidate that ran before it.

Stock (the anchor, ``GGML_CUDA_DISPATCH`` off) is checked against the CPU backend in every trial like
every candidate. A stock that is wrong in some trials and right in others is a state of the harness or
the GPU, not of the kernel: this lists those cases, what else was wrong in the same trials, and the
anchor's time in wrong and right trials.

The second part takes, per case and candidate, the median time after each predecessor (the run order
within a trial, from the rows' ``t_end_s``; ok and drifted rows) and reports max/min over predecessors.

    python lab/stock_wrong.py evidence/h200-2026-12-02-s10/configs/tuning.journal.jsonl.gz

Markdown on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import journal, results


def predecessor_spread(rec: dict[str, Any]) -> Iterator[tuple[float, str, dict[str, float]]]:
    """(max/min of the per-predecessor medians, candidate, {predecessor: median us}) per candidate that
    ran after more than one predecessor in this case."""
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in sorted({int(r["trial"]) for r in rec["trials"]}):
        ran = sorted(
            (
                r
                for r in rec["trials"]
                if r["trial"] == t and r.get("t_end_s") and r["status"] in ("ok", "drifted")
            ),
            key=lambda r: r["t_end_s"],
        )
        for prev, cur in itertools.pairwise(ran):
            by[cur["route"]][prev["route"]].append(float(cur["us"]))
    for route, groups in by.items():
        if len(groups) > 1:
            meds = {p: statistics.median(v) for p, v in groups.items()}
            yield max(meds.values()) / min(meds.values()), route, meds


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def print_predecessors(recs: Iterable[dict[str, Any]], top: int = 8) -> None:
    rows = [(sp, rec["case"], route, meds) for rec in recs for sp, route, meds in predecessor_spread(rec)]
    rows.sort(key=lambda r: -r[0])
    print("\n## A candidate's time after each predecessor\n")
    if not rows:
        print("No candidate ran after more than one predecessor.")
        return
    sp = [r[0] for r in rows]
    print(
        f"{len(rows)} (case, candidate) pairs ran after more than one predecessor. "
        "The max/min of their medians: "
        f"median {_quantile(sp, 0.5):.3f}, p90 {_quantile(sp, 0.9):.3f}, max {max(sp):.3f}; "
        f"{sum(x > 1.05 for x in sp)} above 1.05, {sum(x > 1.10 for x in sp)} above 1.10.\n"
    )
    print("| max/min | case | candidate | median us after each predecessor |\n|---|---|---|---|")
    for x, case, route, meds in rows[:top]:
        after = ", ".join(f"{p}: {m:.2f}" for p, m in sorted(meds.items(), key=lambda kv: kv[1]))
        print(f"| {x:.3f} | {case} | {route} | {after} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("journal", type=Path)
    a = ap.parse_args(argv)
    try:
        recs = [r for r in journal.journal_records(a.journal) if r["kind"] == "case"]
    except InputError as e:
        print(f"stock_wrong: {e}", file=sys.stderr)
        return 2
    print(f"# Stock wrong against the CPU backend: {a.journal}\n")
    print("| case | GPU | stock wrong in trials | NMSE | anchor us wrong / right | also wrong there |")
    print("|---|---|---|---|---|---|")
    n = 0
    for rec in recs:
        stock = [r for r in rec["trials"] if r["route"] == "stock"]
        bad = results.stock_wrong_trials(rec)
        if not bad:
            continue
        n += 1
        good = [r["us"] for r in stock if r["status"] == "ok" and r["us"]]
        wrong_us = [r["us"] for r in stock if r["status"] == "wrong" and r["us"]]
        also = sorted({r["route"] for r in rec["trials"] if r["status"] == "wrong"} - {"stock"})
        nmse = max(r["nmse"] for r in stock if r["status"] == "wrong")
        gpu = str(rec.get("header", {}).get("gpu_uuid", "?"))[:12]
        right = f"{statistics.median(good):.2f}" if good else "none"
        print(
            f"| {rec['case']} | {gpu} | {','.join(map(str, bad))} of {len(stock)} | {nmse:.4f} | "
            f"{statistics.median(wrong_us):.2f} / {right} | {', '.join(also) or 'none'} |"
        )
    print(f"\n{n} case(s).")
    print_predecessors(recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
