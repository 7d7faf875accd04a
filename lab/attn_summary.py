"""Summary of lab/attn.sh's A/B folder: <kv>.<arm>.jsonl llama-bench JSON Lines per KV type and arm.

Prints one Markdown table per KV type: test (named with its depth, ``tg32@d16384``), stock t/s (mean
and standard deviation of llama-bench's repetitions), and each forced kernel's t/s ratio to stock. A
missing stock file or a test stock lacks is an error (exit 1); nothing is filled in.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ARMS = ("stock", "fa_vec", "fa_mma", "fa_tile")


def test_name(rec: dict[str, object]) -> str:
    n_prompt, n_gen, depth = int(rec["n_prompt"]), int(rec["n_gen"]), int(rec["n_depth"])  # type: ignore[call-overload]
    base = f"tg{n_gen}" if n_gen > 0 else f"pp{n_prompt}"
    return f"{base}@d{depth}" if depth else base


def read(folder: Path) -> dict[str, dict[str, dict[str, tuple[float, float]]]]:
    """kv -> arm -> test -> (avg t/s, stddev)."""
    out: dict[str, dict[str, dict[str, tuple[float, float]]]] = defaultdict(lambda: defaultdict(dict))
    for f in sorted(folder.glob("*.jsonl")):
        kv, arm = f.name.split(".")[0], f.name.split(".")[1]
        if arm not in ARMS:
            continue
        for ln in f.read_text().splitlines():
            if ln.startswith("{"):
                rec = json.loads(ln)
                out[kv][arm][test_name(rec)] = (float(rec["avg_ts"]), float(rec["stddev_ts"]))
    return out


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    data = read(folder)
    if not data:
        print(f"{folder}: no <kv>.<arm>.jsonl files", file=sys.stderr)
        return 1
    rc = 0
    for kv, arms in sorted(data.items()):
        stock = arms.get("stock")
        if not stock:
            print(f"{folder}: no stock arm for KV {kv}", file=sys.stderr)
            rc = 1
            continue
        present = [a for a in ARMS[1:] if a in arms]
        print(f"\n### KV cache {kv}\n")
        print("| test | stock t/s | " + " | ".join(f"{a}/stock" for a in present) + " |")
        print("|---|---|" + "---|" * len(present))
        for test, (ts, sd) in sorted(stock.items(), key=lambda kv_: (kv_[0].split("@")[-1], kv_[0])):
            cells = []
            for a in present:
                got = arms[a].get(test)
                cells.append(f"{got[0] / ts:.3f}" if got else "missing")
                rc = rc if got else 1
            print(f"| {test} | {ts:.2f} ± {sd:.2f} | " + " | ".join(cells) + " |")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
