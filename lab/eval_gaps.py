"""The timed evaluations in one process's kernel timeline (``.ktl``): how long each took on the GPU, how
much of it the GPU was busy, and how long the host took from the inputs' upload to the first kernel.

An evaluation here is a burst of GPU work (kernels and copies) with no idle gap longer than ``--split-us``
inside, whose kernel count is the most frequent one among bursts of at least ``--min-kernels`` kernels
(the test's graph; the depth fill's ubatches have other counts). A burst launched as a CUDA graph has its
kernels' graph id; one launched node by node has graph 0 (``direct``). ``lead`` is the idle time between
the burst's last copy before its first kernel (llama.cpp's input upload) and that kernel: host time only
(building, allocating and launching, or checking and launching a graph). Between a direct evaluation's
kernels, idle time is host launch time too, so ``span - busy`` compares host cost per evaluation between
arms of the same build (`lab/attn.sh PART=profile`'s ``<arm>.<test>.ktl``). Where no idle gap separates an
evaluation from the next depth fill's copies, its burst holds them too (a span of milliseconds): its lead
still holds. A decode test's tokens follow each other without such a gap: one burst per repetition.

    python lab/eval_gaps.py evidence/h200-2026-12-04-s15/attn-profile-qwen3-seed-f16-d16384.tar.gz

Prints Markdown (stdout): per timeline, each evaluation (up to ``--list`` of them; beyond that the median
over direct and over graph evaluations), with its graph, kernels, span, busy, idle and lead in µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ggml_dispatch.artifacts.timeline import Timeline, parse_ktl
from ggml_dispatch.report.timeline import union_ns

if not __package__:  # run as a script: lab/ is not a package on the path then
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab.first_use_gaps import print_per_timeline


@dataclass(frozen=True)
class Evaluation:
    graph: int  # 0: launched node by node
    kernels: int
    span_us: float
    busy_us: float
    lead_us: float | None  # None: no copy before the first kernel in the burst

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us


def evaluations(t: Timeline, split_us: float, min_kernels: int) -> list[Evaluation]:
    """The timeline's evaluations of the test's graph, in order (see the module's docstring)."""
    graphs = t.kernel_graphs or (0,) * len(t.kernels)
    # (start, end, graph or None for a copy)
    events = sorted(
        [(s, e, g) for (s, e, _), g in zip(t.kernels, graphs, strict=True)]
        + [(s, e, None) for s, e in t.copies]
    )
    bursts: list[list[tuple[int, int, int | None]]] = []
    end = None
    for ev in events:
        if end is None or ev[0] - end > split_us * 1000:
            bursts.append([])
        bursts[-1].append(ev)
        end = ev[1] if end is None else max(end, ev[1])
    counts = Counter(sum(1 for ev in b if ev[2] is not None) for b in bursts)
    sizes = [(n, c) for n, c in counts.items() if n >= min_kernels]
    if not sizes:
        return []
    size = max(sizes, key=lambda nc: (nc[1], nc[0]))[0]
    out = []
    for b in bursts:
        ks = [ev for ev in b if ev[2] is not None]
        if len(ks) != size:
            continue
        first = ks[0]
        copies_before = [ev[1] for ev in b if ev[2] is None and ev[0] < first[0]]
        lead = (first[0] - max(copies_before)) / 1000 if copies_before else None
        span = max(ev[1] for ev in b) - b[0][0]
        out.append(
            Evaluation(
                graph=first[2] or 0,
                kernels=len(ks),
                span_us=span / 1000,
                busy_us=union_ns([(ev[0], ev[1]) for ev in b]) / 1000,
                lead_us=lead,
            )
        )
    return out


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def rows(name: str, evs: list[Evaluation], listed: int) -> list[str]:
    if not evs:
        return [f"| {name} | – | no evaluation found | | | | | |"]
    if len(evs) <= listed:
        return [
            f"| {name} | {i} | {'direct' if e.graph == 0 else f'graph {e.graph}'} | {e.kernels} "
            f"| {e.span_us:.1f} | {e.busy_us:.1f} | {e.idle_us:.1f} | {_fmt(e.lead_us)} |"
            for i, e in enumerate(evs, start=1)
        ]
    out = []
    for label, group in (
        ("direct", [e for e in evs if e.graph == 0]),
        ("graph", [e for e in evs if e.graph != 0]),
    ):
        if not group:
            continue
        leads = [e.lead_us for e in group if e.lead_us is not None]
        span, busy = statistics.median(e.span_us for e in group), statistics.median(e.busy_us for e in group)
        idle, lead = statistics.median(e.idle_us for e in group), statistics.median(leads) if leads else None
        out.append(
            f"| {name} | {len(group)} × median | {label} | {group[0].kernels} "
            f"| {span:.1f} | {busy:.1f} | {idle:.1f} | {_fmt(lead)} |"
        )
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help=".ktl files, folders of them or .tar.gz archives")
    ap.add_argument(
        "--split-us", type=float, default=300.0, help="idle gap that ends a burst (default 300 µs)"
    )
    ap.add_argument(
        "--min-kernels", type=int, default=20, help="fewest kernels of a test's graph (default 20)"
    )
    ap.add_argument(
        "--list", type=int, default=6, help="list evaluations one by one up to this many (default 6)"
    )
    a = ap.parse_args(argv)
    header = [
        "| timeline | evaluation | launched | kernels | span µs | busy µs | idle µs | lead µs |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, text: str, where: Path) -> list[str]:
        t = parse_ktl(text.splitlines(), where)
        return rows(name, evaluations(t, a.split_us, a.min_kernels), a.list)

    return print_per_timeline("eval_gaps", a.paths, header, row)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
