"""Summary of lab/attn.sh PART=configs: the FlashAttention configurations timed per attention point.

Reads a tuning file (`tune run --configs all` on an attention census) and prints one Markdown row per
point (attention key and Q columns M): stock's median time, how many configurations ran eligible, the
fastest kernel's plain route, the fastest configuration and its median paired ratio stock/config
(anchor_us / us of the same trial). A point where every candidate, stock's own kernel among them, was
wrong or failed is listed as untunable (the check refuses the tree's own kernels there, or the case
cannot be built): the table keeps stock there. Exit 1, after printing, when a configuration was wrong or
failed at a point where another candidate was ok, or when no configuration row is ok at all: a number is
never filled in.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from statistics import median


def main(argv: list[str]) -> int:
    from ggml_dispatch.errors import InputError
    from ggml_dispatch.tuner import results

    if len(argv) != 1:
        print("usage: python lab/attn_configs_summary.py TUNING.parquet", file=sys.stderr)
        return 2
    try:
        df = results.read_tuning(Path(argv[0]))[0].to_pandas()
    except InputError as e:
        print(f"attn_configs_summary: {e}", file=sys.stderr)
        return 2
    fa = df[df["op"] == "FLASH_ATTN_EXT"]
    if fa.empty:
        print("no FLASH_ATTN_EXT rows")
        return 1
    bad = fa[(fa["status"] == "wrong") | fa["status"].str.startswith("failed")]
    ok = fa[fa["status"] == "ok"]
    print("| point | M | stock us | eligible configs | best plain route (x stock) | best config (x stock) |")
    print("|---|---|---|---|---|---|")
    keys = ["k_type", "v_type", "D_K", "gqa", "kv", "N", "M"]
    for point, rows in ok.groupby(keys, sort=True):
        k_type, v_type, d_k, gqa, kv, n_kv, m = point
        ratio: dict[str, list[float]] = defaultdict(list)
        for r in rows.itertuples():
            ratio[str(r.config)].append(float(r.anchor_us) / float(r.us))
        med = {c: median(v) for c, v in ratio.items()}
        plain = {c: v for c, v in med.items() if "/" not in c}
        best = max(med, key=lambda c: med[c])
        best_plain = max(plain, key=lambda c: plain[c]) if plain else "-"
        plain_text = f"{best_plain} ({plain[best_plain]:.3f})" if plain else "-"
        print(
            f"| {k_type}/{v_type} D{d_k} gqa{gqa} kv{kv} n_kv{n_kv} | {m} | {median(rows['anchor_us']):.1f} |"
            f" {len(med)} | {plain_text} | {best} ({med[best]:.3f}) |"
        )
    ok_points = set(ok.groupby(keys).groups)
    at_ok = [tuple(r) in ok_points for r in bad[keys].itertuples(index=False)]
    dead = bad[[not x for x in at_ok]]
    if not dead.empty:
        print(f"\n{dead.groupby(keys).ngroups} points untunable (every candidate wrong or failed):")
        for point, rows in dead.groupby(keys, sort=True):
            k_type, v_type, d_k, gqa, kv, n_kv, m = point
            nmse = rows["nmse"].dropna()
            what = f"wrong, NMSE {nmse.min():.3g}-{nmse.max():.3g}" if len(nmse) else "failed"
            status = rows["status"].iloc[0]
            point_text = f"{k_type}/{v_type} D{d_k} gqa{gqa} kv{kv} n_kv{n_kv} M {m}"
            print(f"- {point_text}: {len(rows)} rows {what} ({status[:80]})")
    bad = bad[at_ok]
    if not bad.empty:
        print(f"\n{len(bad)} rows wrong or failed at points where other candidates were ok:")
        for (cfg, status), n in bad.groupby(["config", "status"]).size().items():
            print(f"- {cfg}: {status} x{n}")
        return 1
    if ok.empty:
        print("no ok configuration rows")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
