"""An A/B's first repetition against its later ones: what one-off costs inside the timed runs do.

llama-bench runs each test's repetitions back to back in one process, and the first repetition of a test
is the first time that test's shapes run at their depth. A kernel first launched there is loaded by CUDA
then (lazy loading: milliseconds each), so a one-off cost lands in repetition 1 and not in 2 or 3. The
A/B's `tps` is llama-bench's mean over the repetitions, one-off cost included. This script splits each
ggml-dispatch-ab/1 record's `samples_tps` into repetition 1 and the rest and pairs table against stock
within each pair, as the report pairs the means.

    python lab/ab_first_rep.py tables/cuda-sm90-nvidia-h200-attn/ab-*.jsonl
    python lab/ab_first_rep.py --each-rep table/hook AB.jsonl   # any two arms, every repetition apart

Prints one Markdown table (stdout): per model and test, the median paired table/stock ratio (95% CI) of
the means, of repetition 1 and of the later repetitions, and each arm's repetition 1 over its later ones.
With ``--each-rep ARM/BASE``: the paired ARM/BASE ratio of each repetition on its own, per test and pooled
over the tests of a kind (pp, tg). On a depth test llama-bench's repetition 1 evaluates directly (the
depth fill or restore changed the graph), repetition 2 captures a CUDA graph and repetition 3 replays it,
so the columns tell host-side costs (1, 2) from what the GPU runs (3).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from ggml_dispatch.artifacts import ab
from ggml_dispatch.codegen import decide
from ggml_dispatch.errors import InputError
from ggml_dispatch.report.analysis import Ratio, paired_ratio

Split = tuple[float, float, float]  # the mean, repetition 1, the later repetitions' mean


def _split(r: ab.Record) -> Split | None:
    s = r.samples_tps
    if len(s) < 2:
        return None
    return r.tps, s[0], statistics.fmean(s[1:])


def pairs(
    paths: Sequence[Path], base: str = "stock", arm: str = "table"
) -> dict[tuple[str, str], list[tuple[Split, Split]]]:
    """(model, test) -> (table, stock) splits of each pair in which both arms have 2+ repetitions."""
    by: dict[tuple[str, str, str, int, str], Split] = {}
    for path in paths:
        for _, r in ab.read_file(path):
            sp = _split(r)
            if sp is not None and r.arm in (base, arm):
                by[(path.name, r.model, r.test, r.pair, r.arm)] = sp
    out: dict[tuple[str, str], list[tuple[Split, Split]]] = defaultdict(list)
    for (run, model, test, pair, a), sp in sorted(by.items()):
        if a == arm and (run, model, test, pair, base) in by:
            out[(model, test)].append((sp, by[(run, model, test, pair, base)]))
    return dict(out)


def each_rep(
    paths: Sequence[Path], arm: str, base: str
) -> dict[tuple[str, str], list[tuple[tuple[float, ...], tuple[float, ...]]]]:
    """(model, test) -> (arm, base) repetition samples of each pair both arms ran with equal repetitions."""
    by: dict[tuple[str, str, str, int, str], tuple[float, ...]] = {}
    for path in paths:
        for _, r in ab.read_file(path):
            if r.arm in (arm, base) and r.samples_tps:
                by[(path.name, r.model, r.test, r.pair, r.arm)] = r.samples_tps
    out: dict[tuple[str, str], list[tuple[tuple[float, ...], tuple[float, ...]]]] = defaultdict(list)
    for (run, model, test, pair, a), s in sorted(by.items()):
        other = by.get((run, model, test, pair, base))
        if a == arm and other is not None and len(other) == len(s):
            out[(model, test)].append((s, other))
    return dict(out)


def _kind(test: str) -> str:
    return "pp512" if test.startswith("pp512") else test[:2]


def render_each_rep(
    table: dict[tuple[str, str], list[tuple[tuple[float, ...], tuple[float, ...]]]], label: str
) -> str:
    p = decide.Params()
    n = max(len(a) for ps in table.values() for a, _ in ps)
    head = " | ".join(f"rep {i + 1}" for i in range(n))
    lines = [f"| model | test | pairs | {label}: {head} |", "|---|---|---|" + "---|" * n]
    pooled: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (model, test), ps in sorted(table.items()):
        cells = []
        for i in range(n):
            a = [x[i] for x, y in ps if len(x) > i]
            b = [y[i] for x, y in ps if len(x) > i]
            cells.append(_fmt(paired_ratio(a, b, p)) if a else "–")
            pooled[(_kind(test), i)] += [x / y for x, y in zip(a, b, strict=True)]
        lines.append(f"| {model} | {test} | {len(ps)} | " + " | ".join(cells) + " |")
    lines += ["", f"Pooled over the tests of a kind (median of every pair's {label} of that repetition):", ""]
    lines += ["| kind | " + head + " |", "|---|" + "---|" * n]
    for kind in sorted({k for k, _ in pooled}):
        cells = [
            f"{statistics.median(pooled[(kind, i)]):.3f}" if pooled[(kind, i)] else "–" for i in range(n)
        ]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(r: Ratio) -> str:
    if r.lo is None or r.hi is None:
        return f"{r.point:.3f}"
    mark = " **loss**" if r.hi < 1.0 else " gain" if r.lo > 1.0 else ""
    return f"{r.point:.3f} [{r.lo:.3f}, {r.hi:.3f}]{mark}"


def render(table: dict[tuple[str, str], list[tuple[Split, Split]]]) -> str:
    p = decide.Params()
    lines = [
        "| model | test | pairs | table/stock (mean of reps, as the A/B) | repetition 1 "
        "| later repetitions | stock rep 1 / later | table rep 1 / later |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (model, test), ps in sorted(table.items()):
        t, s = [x for x, _ in ps], [y for _, y in ps]
        cols = [paired_ratio([a[i] for a in t], [b[i] for b in s], p) for i in range(3)]
        stock_first = statistics.median(b[1] / b[2] for b in s)
        table_first = statistics.median(a[1] / a[2] for a in t)
        lines.append(
            f"| {model} | {test} | {len(ps)} | {_fmt(cols[0])} | {_fmt(cols[1])} | {_fmt(cols[2])} | "
            f"{stock_first:.2f} | {table_first:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--each-rep"]:
        spec = argv[1] if len(argv) > 1 else ""
        arm, _, base = spec.partition("/")
        if arm not in ab.ARMS or base not in ab.ARMS or len(argv) < 3:
            arms = ", ".join(ab.ARMS)
            print(
                f"usage: python lab/ab_first_rep.py --each-rep ARM/BASE AB.jsonl ... (arms: {arms})",
                file=sys.stderr,
            )
            return 2
        try:
            reps = each_rep([Path(a) for a in argv[2:]], arm, base)
        except InputError as e:
            print(f"ab_first_rep: {e}", file=sys.stderr)
            return 1
        if not reps:
            print(f"ab_first_rep: no {arm}/{base} pairs in these files", file=sys.stderr)
            return 1
        sys.stdout.write(render_each_rep(reps, f"{arm}/{base}"))
        return 0
    if not argv:
        print("usage: python lab/ab_first_rep.py AB.jsonl [AB.jsonl ...]", file=sys.stderr)
        return 2
    try:
        table = pairs([Path(a) for a in argv])
    except InputError as e:
        print(f"ab_first_rep: {e}", file=sys.stderr)
        return 1
    if not table:
        print("ab_first_rep: no stock/table pairs with 2 or more repetitions in these files", file=sys.stderr)
        return 1
    sys.stdout.write(render(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
