"""Where no configuration is involved, does a configurations table decide as a route-only table does?

Issue #11's check on the `--configs all` sweep: at every MUL_MAT point of the new sweep, the route-only
table's pick (``--old``) against the configurations table's pick (``--new``), each looked up as the
runtime does (exact rule, then size class, then type default). A point is

- ``same``: both pick the same plain route (or both stock);
- ``config``: the new table picks a configuration of the route the old one picks (cublas/out=f32,...);
- ``displaced``: the new table picks a configuration of another route (a configuration beat the old route);
- ``plain differs``: the new table picks a plain route, or stock, other than the old one: the case the
  issue asks to match. Each is listed with both routes' medians in the new sweep, so a difference within
  noise shows as such.

    make archive   # the route-only table of tables/cuda-sm90-nvidia-h200-routes/ is in the archive
    python lab/route_match.py \\
        --old .cache/archive/0d289075a1fa/tables/cuda-sm90-nvidia-h200-routes/table.json \\
        --new evidence/h200-2026-12-02-s10/configs/table/table.json \\
        --tuning evidence/h200-2026-12-02-s10/configs/tuning.parquet

Markdown on stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ggml_dispatch import registry
from ggml_dispatch.codegen import table as tbl


def classify(old: str, new: str) -> str:
    if old == new:
        return "same"
    if "/" in new:
        return "config" if registry.config_route(new) == old else "displaced"
    return "plain differs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, type=Path, help="route-only table.json")
    ap.add_argument("--new", required=True, type=Path, help="configurations table.json")
    ap.add_argument("--tuning", required=True, type=Path, help="the new sweep's tuning.parquet (its points)")
    a = ap.parse_args(argv)
    old = tbl.load(a.old)
    new = tbl.load(a.new)
    gpu = tbl.table_gpu(new)
    t = pd.read_parquet(a.tuning)
    t = t[(t.op == "MUL_MAT") & (t.status == "ok")]
    med = t.groupby(["layout", "src0_type", "src1_type", "N", "K", "B", "M", "config"]).us.median()
    anchor = t.groupby(["layout", "src0_type", "src1_type", "N", "K", "B", "M"]).anchor_us.median()
    rows = []
    for (layout, t0, t1, N, K, B, M), stock_us in anchor.items():
        args = ("MUL_MAT", layout, t0, t1, int(M), int(N), int(K), int(B))
        o = tbl.lookup(old, gpu, *args) or "stock"
        n = tbl.lookup(new, gpu, *args) or "stock"

        def us(c: str, key: tuple = (layout, t0, t1, N, K, B, M), s: float = stock_us) -> float | None:
            if c == "stock":
                return float(s)
            v = med.get((*key, c))
            return None if v is None else float(v)

        rows.append(
            {
                "point": f"{t0} N={N} K={K} M={M}",
                "old": o,
                "new": n,
                "kind": classify(o, n),
                "old_us": us(o),
                "new_us": us(n),
            }
        )
    df = pd.DataFrame(rows)
    counts = df.kind.value_counts()
    print(f"# Route-only table against configurations table: {len(df)} MUL_MAT points of {a.tuning}\n")
    print(f"- old: `{a.old}`; new: `{a.new}`\n")
    print("| kind | points |\n|---|---|")
    for k in ("same", "config", "displaced", "plain differs"):
        print(f"| {k} | {int(counts.get(k, 0))} |")
    diff = df[df.kind == "plain differs"]
    if len(diff):
        print("\n## Plain-route points that differ (medians of the new sweep)\n")
        print("| point | old | new | old us | new us | new/old |\n|---|---|---|---|---|---|")
        for r in diff.itertuples():
            ratio = "" if not (r.old_us and r.new_us) else f"{r.new_us / r.old_us:.3f}"
            fmt = lambda v: "not measured" if v is None else f"{v:.1f}"  # noqa: E731
            print(f"| {r.point} | {r.old} | {r.new} | {fmt(r.old_us)} | {fmt(r.new_us)} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
