# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""The mmq split against the other MUL_MAT_ID configurations in a tuning file.

Default: per point (types, N, K, M) and routing kind, stock's median time and, as stock / time (higher is
faster), the best configuration without a split, the best of each split kind (`2j`, `2j_wave`,
`2j_fused`), and the
`2j` split with the same J and stream-k as the best plain one (`x_twin`). `--same-j KIND` instead gives,
for the points of one routing kind (`few` is the no-harm check), stock / time of each J with
stream_k=off: plain and each split kind. Every ok trial counts (a configuration the race
stopped keeps its early trials), so a ratio is indicative where its trials are few (`/n`).

    python lab/moe_split.py evidence/h200-2026-12-04-s18/moe-tuning.parquet
    python lab/moe_split.py evidence/h200-2026-12-04-s18/moe-tuning.parquet --same-j few
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

SPLITS = ("2j", "2j_wave", "2j_fused", "fit", "fit64")
SAME_J = (8, 16, 24, 32, 40, 48, 64)


def _ok(tuning: pd.DataFrame) -> pd.DataFrame:
    return tuning[(tuning["op"] == "MUL_MAT_ID") & (tuning["status"] == "ok") & tuning["us"].notna()]


def _split_kind(config: str) -> str | None:
    return next((s for s in SPLITS if config.endswith(f",split={s}")), None)


def split_table(tuning: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (typ, N, K, M, kind), d in _ok(tuning).groupby(["src0_type", "N", "K", "M", "routing_kind"]):
        med = d.groupby("config")["us"].agg(["median", "size"])
        stock = float(d["anchor_us"].median())  # stock is every trial's anchor, timed or not as a candidate
        kinds = pd.Series([_split_kind(c) for c in med.index], index=med.index)
        plain = med[kinds.isna()]
        if plain.empty:
            continue
        best_plain = plain["median"].idxmin()
        row = {
            "type": typ,
            "N": N,
            "K": K,
            "M": M,
            "routing": kind,
            "stock_us": round(stock, 1),
            "best_plain": best_plain,
            "x_plain": round(stock / plain.loc[best_plain, "median"], 3),
        }
        for s in SPLITS:
            split = med[kinds == s]
            best = split["median"].idxmin() if len(split) else None
            row[f"best_{s}"] = best
            row[f"x_{s}"] = round(stock / split.loc[best, "median"], 3) if best else None
            row[f"n_{s}"] = int(split.loc[best, "size"]) if best else 0
        twin = f"{best_plain},split=2j"
        row["x_twin"] = round(stock / med.loc[twin, "median"], 3) if twin in med.index else None
        rows.append(row)
    return pd.DataFrame(rows)


def same_j_table(tuning: pd.DataFrame, routing_kind: str) -> pd.DataFrame:
    """Per point of ``routing_kind`` and J (stream_k=off): stock / median time and the trial count of the
    plain configuration and each split kind, as ``ratio/n`` ('' where none ran)."""
    t = _ok(tuning)
    rows = []
    for (typ, N, K, M), d in t[t["routing_kind"] == routing_kind].groupby(["src0_type", "N", "K", "M"]):
        med = d.groupby("config")["us"].agg(["median", "size"])
        stock = float(d["anchor_us"].median())
        for j in SAME_J:
            row = {"type": typ, "N": N, "K": K, "M": M, "J": j}
            for name, suffix in [("plain", "")] + [(s, f",split={s}") for s in SPLITS]:
                c = f"mmq/j={j},stream_k=off{suffix}"
                row[name] = (
                    f"{stock / med.loc[c, 'median']:.3f}/{int(med.loc[c, 'size'])}" if c in med.index else ""
                )
            rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table.itertuples(index=False):
        out.append("| " + " | ".join("" if v is None or v != v else str(v) for v in r) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--same-j"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        tuning = pd.read_parquet(path)
    except (OSError, ValueError) as e:
        print(f"moe_split: {path}: {e}", file=sys.stderr)
        return 1
    missing = {"op", "status", "us", "anchor_us", "config", "routing_kind"} - set(tuning.columns)
    if missing:
        first = sorted(missing)[0]
        print(f"moe_split: {path}: not a MUL_MAT_ID tuning file (no column {first})", file=sys.stderr)
        return 1
    table = split_table(tuning) if len(argv) == 1 else same_j_table(tuning, argv[2])
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
