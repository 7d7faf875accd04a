"""The paired table/stock summary of one or more ``serve_ab ab`` calls, as Markdown.

    python -m lab.serve_summary CALL1/ab-NAME-serve.jsonl [CALL2/...] [--arms stock,table]
        [--requests CALL1/requests.jsonl --requests CALL2/requests.jsonl]

Pairs are matched within a call (a file) by pair number; the calls are pooled. Each row: the median of
the per-pair table/stock ratios of tokens/s with the decision code's bootstrap 95% CI, each arm's
median tokens/s and peak VRAM. The records are read as written, without `ggml-dispatch report --ab`'s
provenance checks, so that records whose server hid the hook's start-up line (a llama-server tree that
logs ggml's INFO lines only at -lv 4) can be summarised too; the summary says how many records lack it.
With ``--requests`` (serve_ab's per-request file of each call) it adds the MTP drafts and their acceptance
per arm: the table must not change what the model computes, so the arms' acceptance must be equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggml_dispatch.codegen.decide import Params
from ggml_dispatch.report.analysis import paired_ratio


@dataclass(frozen=True)
class Row:
    mode: str
    test: str
    n: int
    ratio: float
    lo: float | None
    hi: float | None
    base_tps: float
    cand_tps: float
    base_vram: float | None
    cand_vram: float | None


class SummaryError(Exception):
    pass


def _each(paths: Sequence[Path], what: str, take: Callable[[int, dict[str, Any]], None]) -> None:
    """Hand every JSON line of the files to ``take`` (with the file's index); one SummaryError naming the
    file and line for a file that cannot be read or a line ``take`` cannot use."""
    for i, p in enumerate(paths):
        try:
            lines = p.read_text().splitlines()
        except OSError as e:
            raise SummaryError(f"{p}: {e.strerror or e}") from e
        for n, text in enumerate(lines, 1):
            if text.strip():
                try:
                    take(i, json.loads(text))
                except (ValueError, KeyError, TypeError) as e:
                    raise SummaryError(f"{p}:{n}: not {what} ({e})") from e


def read(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], int]:
    """Every record of the files, each with its call (the file's index), and how many lack a dispatch line."""
    out: list[dict[str, Any]] = []

    def take(i: int, r: dict[str, Any]) -> None:
        out.append({
            "call": i, "mode": "mtp" if "draft-mtp" in r.get("command", []) else "plain",
            "test": str(r["test"]), "arm": str(r["arm"]), "pair": int(r["pair"]), "tps": float(r["tps"]),
            "vram": r.get("peak_vram_mib"), "line": r.get("dispatch_line") or "",
        })  # fmt: skip

    _each(paths, "an A/B record", take)
    return out, sum(1 for r in out if not r["line"])


def summarise(records: Sequence[dict[str, Any]], base: str, cand: str) -> list[Row]:
    by: dict[tuple[str, str], dict[tuple[int, int, str], dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by[(r["mode"], r["test"])][(r["call"], r["pair"], r["arm"])] = r
    rows = []
    for (mode, test), recs in sorted(by.items()):
        pairs = sorted({(c, p) for c, p, a in recs if (c, p, base) in recs and (c, p, cand) in recs})
        if not pairs:
            continue
        b = [recs[(c, p, base)] for c, p in pairs]
        t = [recs[(c, p, cand)] for c, p in pairs]
        q = paired_ratio([x["tps"] for x in t], [x["tps"] for x in b], Params())
        vb = [x["vram"] for x in b if x["vram"] is not None]
        vt = [x["vram"] for x in t if x["vram"] is not None]
        rows.append(Row(
            mode, test, q.n, q.point, q.lo, q.hi, statistics.median(x["tps"] for x in b),
            statistics.median(x["tps"] for x in t), max(vb) if vb else None, max(vt) if vt else None,
        ))  # fmt: skip
    return rows


def markdown(rows: Sequence[Row], base: str, cand: str, missing_lines: int, total: int) -> str:
    def ci(r: Row) -> str:
        return f"[{r.lo:.3f}, {r.hi:.3f}]" if r.lo is not None and r.hi is not None else "-"

    def mib(v: float | None) -> str:
        return f"{v:.0f}" if v is not None else "-"

    out = [
        f"| server | test | pairs | {cand}/{base} | 95% CI | {base} t/s | {cand} t/s "
        f"| peak MiB {base} / {cand} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        flag = " (slower)" if r.hi is not None and r.hi < 1.0 else ""
        out.append(
            f"| {r.mode} | {r.test} | {r.n} | **{r.ratio:.3f}**{flag} | {ci(r)} | {r.base_tps:.1f} | "
            f"{r.cand_tps:.1f} | {mib(r.base_vram)} / {mib(r.cand_vram)} |"
        )
    if missing_lines:
        out.append(f"\n{missing_lines} of {total} records have no hook start-up line (dispatch_line empty).")
    return "\n".join(out) + "\n"


def acceptance(paths: Sequence[Path]) -> str:
    """Drafted and accepted tokens per (slots, arm) over the MTP requests of the files, as Markdown."""
    sums: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0, 0])

    def take(_: int, r: dict[str, Any]) -> None:
        if r["mode"] != "mtp":
            return
        s = sums[(int(r["slots"]), str(r["arm"]))]
        s[0] += 1
        for t in r["timings"]:
            s[1] += int(t["draft_n"])
            s[2] += int(t["draft_accepted"])

    _each(paths, "a serve_ab request record", take)
    if not sums:
        return "No MTP request in the request files.\n"
    out = ["| slots | arm | request groups | drafted | accepted | acceptance |", "|---|---|---|---|---|---|"]
    for (slots, arm), (groups, drafted, accepted) in sorted(sums.items()):
        rate = f"{accepted / drafted:.3f}" if drafted else "-"
        out.append(f"| {slots} | {arm} | {groups} | {drafted} | {accepted} | {rate} |")
    rates: dict[int, set[float]] = defaultdict(set)
    for (slots, _), (_, drafted, accepted) in sums.items():
        rates[slots].add(accepted / drafted if drafted else -1.0)
    same = all(len(v) == 1 for v in rates.values())
    out.append("\nAcceptance " + ("equal across arms." if same else "**differs between arms**."))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lab.serve_summary", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("files", nargs="+", type=Path, help="ab-NAME-serve.jsonl of each call")
    ap.add_argument("--arms", default="stock,table", help="BASE,CANDIDATE (default stock,table)")
    ap.add_argument("--requests", type=Path, action="append", default=[], help="requests.jsonl of a call")
    args = ap.parse_args(argv)
    arms = args.arms.split(",")
    if len(arms) != 2 or not all(arms):
        ap.error(f"--arms: expected BASE,CANDIDATE, got {args.arms!r}")
    try:
        records, missing = read(args.files)
    except SummaryError as e:
        print(f"serve_summary: error: {e}", file=sys.stderr)
        return 2
    rows = summarise(records, arms[0], arms[1])
    if not rows:
        print(f"serve_summary: error: no pair of arms {arms[0]} and {arms[1]} in the files", file=sys.stderr)
        return 2
    sys.stdout.write(markdown(rows, arms[0], arms[1], missing, len(records)))
    if args.requests:
        try:
            sys.stdout.write("\n" + acceptance(args.requests))
        except SummaryError as e:
            print(f"serve_summary: error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
