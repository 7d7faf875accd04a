# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""The mmq split against the other MUL_MAT_ID configurations in a tuning file: per point (types, N, K, M)
and routing kind, stock's median time and, as stock / time (higher is faster), the best configuration
without the split, the best split, and the split with the same J and stream-k as that best one. Every ok
trial counts (a configuration the race stopped keeps its early trials), so a ratio is indicative where its
trials are few (`n`).

    python lab/moe_split.py evidence/h200-2026-12-04-s17/moe-tuning.parquet
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def split_table(tuning: pd.DataFrame) -> pd.DataFrame:
    t = tuning[(tuning["op"] == "MUL_MAT_ID") & (tuning["status"] == "ok") & tuning["us"].notna()]
    rows = []
    for (typ, N, K, M, kind), d in t.groupby(["src0_type", "N", "K", "M", "routing_kind"]):
        med = d.groupby("config")["us"].agg(["median", "size"])
        if "mmq" not in med.index:
            continue
        stock = float(d["anchor_us"].median())
        split = med[med.index.str.contains("split=")]
        plain = med[~med.index.str.contains("split=")]
        best_plain = plain["median"].idxmin()
        best_split = split["median"].idxmin() if len(split) else None
        twin = f"{best_plain},split=2j" if best_plain.startswith("mmq/") else None
        rows.append(
            {
                "type": typ,
                "N": N,
                "K": K,
                "M": M,
                "routing": kind,
                "stock_us": round(stock, 1),
                "best_plain": best_plain,
                "x_plain": round(stock / plain.loc[best_plain, "median"], 3),
                "best_split": best_split,
                "x_split": round(stock / split.loc[best_split, "median"], 3) if best_split else None,
                "n_split": int(split.loc[best_split, "size"]) if best_split else 0,
                "x_twin": round(stock / split.loc[twin, "median"], 3) if twin in split.index else None,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        tuning = pd.read_parquet(path)
    except (OSError, ValueError) as e:
        print(f"moe_split: {path}: {e}", file=sys.stderr)
        return 1
    table = split_table(tuning)
    cols = list(table.columns)
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in table.itertuples(index=False):
        print("| " + " | ".join("" if v is None or v != v else str(v) for v in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
