"""An A/B's paired ratio split by which arm ran first within each pair.

`ggml-dispatch ab` rotates the arms' order from pair to pair, so an effect one process leaves on the next
(the GPU's temperature and clocks after a long depth fill, say) lands on both arms alike over the pairs
and the pooled ratio stays fair. This script shows whether such an effect is there at all: per model and
test, the paired ARM/BASE ratio of the pairs in which ARM started before BASE, of the pairs in which it
started after, and of all of them (medians with the decision code's 95% bootstrap CI). The order comes
from each record's provenance `started` time.

    python lab/ab_order.py evidence/h200-2026-12-04-s18/ab-qwen3-seed-f16-hook.jsonl
    python lab/ab_order.py --arms table/hook --test "pp3 @ d49152" AB.jsonl ...

Prints one Markdown table (stdout). Several files pool their pairs (a pair is a file's pair number).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from ggml_dispatch.artifacts import ab
from ggml_dispatch.codegen import decide
from ggml_dispatch.errors import InputError
from ggml_dispatch.report.analysis import Ratio, paired_ratio

# (model, test) -> (arm tps, base tps, arm started first) of each pair both arms ran
Pairs = dict[tuple[str, str], list[tuple[float, float, bool]]]


def ordered_pairs(paths: Sequence[Path], arm: str = "table", base: str = "stock") -> Pairs:
    by: dict[tuple[str, str, str, int, str], tuple[float, str]] = {}
    for path in paths:
        for lineno, r in ab.read_file(path):
            if r.arm not in (arm, base):
                continue
            if r.provenance is None:
                raise InputError(path, "a legacy record: no provenance start time to order by", line=lineno)
            by[(str(path), r.model, r.test, r.pair, r.arm)] = (r.tps, r.provenance.started)
    out: Pairs = defaultdict(list)
    for (run, model, test, pair, a), (tps, started) in sorted(by.items()):
        other = by.get((run, model, test, pair, base))
        if a == arm and other is not None:
            out[(model, test)].append((tps, other[0], started < other[1]))
    return dict(out)


def split(ps: Sequence[tuple[float, float, bool]], params: decide.Params) -> tuple[Ratio, Ratio, Ratio]:
    """(ARM first, ARM after, all) paired ratios."""

    def ratio(sel: Sequence[tuple[float, float, bool]]) -> Ratio:
        return paired_ratio([a for a, _, _ in sel], [b for _, b, _ in sel], params)

    return ratio([p for p in ps if p[2]]), ratio([p for p in ps if not p[2]]), ratio(ps)


def _fmt(r: Ratio) -> str:
    if r.n == 0:
        return "–"
    if r.lo is None or r.hi is None:
        return f"{r.point:.3f} ({r.n})"
    mark = " **loss**" if r.hi < 1.0 else " gain" if r.lo > 1.0 else ""
    return f"{r.point:.3f} [{r.lo:.3f}, {r.hi:.3f}] ({r.n}){mark}"


def render(pairs: Pairs, arm: str, base: str) -> str:
    p = decide.Params()
    lines = [
        f"| model | test | {arm} first | {arm} after {base} | all pairs |",
        "|---|---|---|---|---|",
    ]
    for (model, test), ps in sorted(pairs.items()):
        first, after, every = split(ps, p)
        lines.append(f"| {model} | {test} | {_fmt(first)} | {_fmt(after)} | {_fmt(every)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python lab/ab_order.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="ggml-dispatch-ab/1 JSONL files")
    ap.add_argument("--arms", default="table/stock", help="ARM/BASE (default table/stock)")
    ap.add_argument("--test", action="append", default=[], help="only this test (repeatable)")
    a = ap.parse_args(argv)
    arm, _, base = a.arms.partition("/")
    if arm not in ab.ARMS or base not in ab.ARMS or arm == base:
        print(f"ab_order: --arms {a.arms!r}: expected ARM/BASE, two of {', '.join(ab.ARMS)}", file=sys.stderr)
        return 2
    try:
        pairs = ordered_pairs(a.files, arm, base)
    except InputError as e:
        print(f"ab_order: {e}", file=sys.stderr)
        return 1
    if a.test:
        pairs = {k: v for k, v in pairs.items() if k[1] in a.test}
    if not pairs:
        print(f"ab_order: no {arm}/{base} pairs in these files", file=sys.stderr)
        return 1
    sys.stdout.write(render(pairs, arm, base))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
