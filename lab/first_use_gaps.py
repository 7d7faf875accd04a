"""GPU idle gaps before kernels' first launches in one process's kernel timeline (``.ktl``).

CUDA loads a kernel when it is first launched (lazy loading), and the GPU waits meanwhile: the load shows
as an idle gap before the kernel's first launch. This script lists every gap of at least ``--min-ms``
before a kernel name's first launch in the process, and their total, per timeline given (a folder or a
``.tar.gz`` of them, e.g. ``lab/attn.sh PART=profile``'s ``attn-profile-*.tar.gz``).

    python lab/first_use_gaps.py evidence/h200-2026-12-01-s8/attn/attn-profile-llama8b.tar.gz

Prints Markdown (stdout): per timeline, the number of first launches after a gap, their total ms, and
each such gap with its kernel (the name's first 70 characters).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from ggml_dispatch.artifacts.timeline import parse_ktl
from ggml_dispatch.errors import InputError


def first_use_gaps(ktl_text: str, where: Path, min_ms: float) -> list[tuple[float, str]]:
    """(gap ms, kernel) for each kernel name's first launch that follows at least min_ms of GPU idle."""
    t = parse_ktl(ktl_text.splitlines(), where)
    busy = sorted([(s, e, n) for s, e, n in t.kernels] + [(s, e, "") for s, e in t.copies])
    seen: set[str] = set()
    out: list[tuple[float, str]] = []
    end = None
    for s, e, name in busy:
        if name and name not in seen:
            seen.add(name)
            if end is not None and (s - end) / 1e6 >= min_ms:
                out.append(((s - end) / 1e6, name))
        end = e if end is None else max(end, e)
    return out


def timeline_texts(path: Path) -> dict[str, str]:
    if path.is_dir():
        return {f.name: f.read_text() for f in sorted(path.glob("*.ktl"))}
    if path.suffix == ".ktl":
        return {path.name: path.read_text()}
    try:
        with tarfile.open(path, "r:*") as tar:
            out = {}
            for m in tar.getmembers():
                fh = tar.extractfile(m) if m.isfile() and m.name.endswith(".ktl") else None
                if fh is not None:
                    out[Path(m.name).name] = fh.read().decode()
            return dict(sorted(out.items()))
    except (OSError, tarfile.TarError) as e:
        raise InputError(path, f"not a timeline, folder of timelines or archive ({e})") from None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--min-ms", type=float, default=1.0, help="smallest gap listed (default 1 ms)")
    a = ap.parse_args(argv)
    header = [
        "| timeline | first launches after a gap | their gaps, ms | kernels (gap ms) |",
        "|---|---|---|---|",
    ]

    def row(name: str, text: str, where: Path) -> list[str]:
        gaps = first_use_gaps(text, where, a.min_ms)
        kernels = "; ".join(f"{k[:70]} ({g:.2f})" for g, k in gaps)
        return [f"| {name} | {len(gaps)} | {sum(g for g, _ in gaps):.1f} | {kernels} |"]

    return print_per_timeline("first_use_gaps", a.paths, header, row)


def print_per_timeline(
    prog: str, paths: list[Path], header: list[str], rows_of: Callable[[str, str, Path], list[str]]
) -> int:
    """Markdown rows per timeline of every path (a .ktl, a folder or a .tar.gz of them) on stdout after
    ``header``; a bad input: one line on stderr naming it, exit status 1."""
    lines = list(header)
    try:
        for path in paths:
            for name, text in timeline_texts(path).items():
                lines += rows_of(name, text, path / name)
    except InputError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
