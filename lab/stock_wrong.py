"""Cases of a tune journal where stock's own run failed the numerics check, trial by trial.

Stock (the anchor, ``GGML_CUDA_DISPATCH`` off) is checked against the CPU backend in every trial like
every candidate. A stock that is wrong in some trials and right in others is a state of the harness or
the GPU, not of the kernel: this lists those cases, what else was wrong in the same trials, and the
anchor's time in wrong and right trials.

    python lab/stock_wrong.py evidence/h200-2026-12-02-s10/configs/tuning.journal.jsonl.gz

Markdown on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("journal", type=Path)
    a = ap.parse_args(argv)
    opener = gzip.open if a.journal.suffix == ".gz" else open
    print(f"# Stock wrong against the CPU backend: {a.journal}\n")
    print("| case | GPU | stock wrong in trials | NMSE | anchor us wrong / right | also wrong there |")
    print("|---|---|---|---|---|---|")
    n = 0
    with opener(a.journal, "rt") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") != "case":
                continue
            stock = [r for r in rec["trials"] if r["route"] == "stock"]
            bad = sorted(r["trial"] for r in stock if r["status"] == "wrong")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
