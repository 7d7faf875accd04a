"""Per decode token at a prefilled depth: each arm's GPU time by kernel category (lab/attn.sh PART=profile).

llama-bench fills the KV cache to the depth before every repetition, so one profiled process holds the
fills too. Two processes that differ only in the tokens they generate (tg32 and tg96 at the same depth,
KV type and repetitions; the warm-up is one token in both) differ by reps x 64 decode tokens and no fill:
the per-token time of each kernel category is that difference over reps x 64, the wall time per token the
difference of llama-bench's means over 64, and idle what the kernels and copies leave of it. Copies are
counted by size: only the copies the longer process makes more of (the per-token ones), each at its mean
time there; one-off copies (the depth restores: as many in both processes) would not cancel, since the
same transfer takes a different time in each process.

    python lab/attn_profile_summary.py attn-profile-qwen3-seed.tar.gz

Prints one Markdown table (stdout): per test and arm, ms per token of wall, attention, matmul, other
kernels, copies and idle, and the table's attention and wall time over stock's.
"""

from __future__ import annotations

import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ggml_dispatch.artifacts.timeline import BenchRun, parse_bench
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import timeline

NAME = re.compile(r"^(?:.*/)?(stock|table)\.tg(\d+)@d(\d+)(-kv[A-Za-z0-9_]+)?\.(ktl|jsonl)$")
SHORT, LONG = 32, 96


@dataclass(frozen=True)
class Process:
    ms: dict[str, float]  # category -> GPU ms over the whole process
    kernel_busy_ms: float  # union of the kernels' intervals
    copies: dict[int, tuple[int, float]]  # bytes -> (count, ms) of the copies while kernels run
    bench: BenchRun


def _process(ktl: str, jsonl: str, where: Path) -> Process:
    """The whole process's time: report.timeline's split of it, per run, times its runs."""
    tl = timeline.parse_ktl(ktl.splitlines(), where)
    b = timeline.breakdown("", "", tl, parse_bench(jsonl.splitlines(), where))
    runs = timeline.runs_in_timeline(b.bench)
    kernels = [(s, e) for s, e, _ in tl.kernels]
    copies: dict[int, tuple[int, float]] = {}
    for s, e, size in timeline.copies_in_span(tl):  # as the breakdown counts them
        n, ms = copies.get(size, (0, 0.0))
        copies[size] = (n + 1, ms + (e - s) / 1e6)
    return Process(
        {c: ms * runs for c, ms in b.ms.items()}, timeline.union_ns(kernels) / 1e6, copies, b.bench
    )


def read(path: Path) -> dict[tuple[str, str, int], Process]:
    """(arm, test without the length, generated tokens) -> the process, from a folder or a .tar.gz."""
    texts: dict[str, str] = {}
    if path.is_dir():
        texts = {f.name: f.read_text() for f in path.iterdir() if f.is_file()}
    else:
        try:
            with tarfile.open(path, "r:*") as tar:
                for m in tar.getmembers():
                    fh = tar.extractfile(m) if m.isfile() else None
                    if fh is not None:
                        texts[Path(m.name).name] = fh.read().decode()
        except (OSError, tarfile.TarError) as e:
            raise InputError(path, f"not a profile folder or archive ({e})") from None
    out: dict[tuple[str, str, int], Process] = {}
    for name in sorted(texts):
        m = NAME.match(name)
        if m is None or m.group(5) != "ktl":
            continue
        bench_name = name[: -len(".ktl")] + ".jsonl"
        if bench_name not in texts:
            raise InputError(path, f"{bench_name} is missing (each timeline needs its llama-bench output)")
        test = f"tg @ d{m.group(3)}" + (f" kv {m.group(4)[3:]}" if m.group(4) else "")
        out[(m.group(1), test, int(m.group(2)))] = _process(texts[name], texts[bench_name], path / name)
    return out


def per_token(short: Process, long: Process) -> dict[str, float]:
    """ms per decode token by category, plus wall and idle, from the two processes' difference."""
    reps = long.bench.reps
    if short.bench.reps != reps or long.bench.n_gen - short.bench.n_gen <= 0:
        raise ValueError("the two processes need the same repetitions and more tokens in the longer one")
    tokens = long.bench.n_gen - short.bench.n_gen
    out = {c: (long.ms[c] - short.ms[c]) / (reps * tokens) for c in timeline.CATEGORIES}
    extra = 0.0  # ms of the copies the longer process makes more of, each at its mean time there
    for size, (n, ms) in long.copies.items():
        more = n - short.copies.get(size, (0, 0.0))[0]
        if more > 0:
            extra += more * ms / n
    out["copy"] = extra / (reps * tokens)
    wall = (long.bench.avg_ns - short.bench.avg_ns) / 1e6 / tokens
    busy = (long.kernel_busy_ms - short.kernel_busy_ms) / (reps * tokens) + out["copy"]
    out["wall"] = wall
    out["idle"] = wall - busy
    out["matmul"] = sum(out[c] for c in timeline.MATMUL_CATEGORIES)
    return out


def summary(procs: dict[tuple[str, str, int], Process]) -> list[str]:
    lines = [
        "| test | arm | wall | attention | matmul | other | copy | idle "
        "| table/stock attention | table/stock wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    tests = sorted({t for _, t, _ in procs})
    for test in tests:
        rows = {}
        for arm in ("stock", "table"):
            s, lg = procs.get((arm, test, SHORT)), procs.get((arm, test, LONG))
            if s is None or lg is None:
                continue
            rows[arm] = per_token(s, lg)
        for arm, r in rows.items():
            ratio = ["", ""]
            if arm == "table" and "stock" in rows:
                st = rows["stock"]
                ratio = [f"{st['attention'] / r['attention']:.3f}", f"{st['wall'] / r['wall']:.3f}"]
            cells = [f"{r[c]:.4f}" for c in ("wall", "attention", "matmul", "other", "copy", "idle")]
            lines.append("| " + " | ".join([test, arm, *cells, *ratio]) + " |")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python lab/attn_profile_summary.py PROFILE(.tar.gz|dir)", file=sys.stderr)
        return 2
    try:
        procs = read(Path(argv[0]))
        lines = summary(procs)
    except (InputError, ValueError) as e:
        print(f"attn_profile_summary: error: {e}", file=sys.stderr)
        return 1
    print("ms per decode token (the tg96 - tg32 difference of each arm's profiled processes)\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
