"""Kernel timelines (``kernel-timeline/1``, written by ``ggml_dispatch/report/native/kernel_timeline.cpp``,
whose header
specifies the format) and the llama-bench JSON Lines record of the same process: the readers. The
report (``report.timeline``) classifies the kernels and splits each run's time."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ggml_dispatch.errors import InputError

FORMAT: Final = "# kernel-timeline/1"


@dataclass(frozen=True)
class Timeline:
    kernels: tuple[tuple[int, int, str], ...]  # (start ns, end ns, label)
    copies: tuple[tuple[int, int], ...]  # memcpy and memset intervals
    dropped: int
    copy_bytes: tuple[int, ...]  # the bytes of each of `copies`, in the same order
    kernel_graphs: tuple[int, ...] = ()  # the CUDA graph of each of `kernels` (0: launched directly)


def parse_ktl(lines: Iterable[str], path: Path, label: Callable[[str], str] = str) -> Timeline:
    """A ``.ktl`` file -> :class:`Timeline`, each kernel named by ``label(kernel name)`` (the report
    passes its classifier); incomplete files (no ``D`` line) are refused."""
    names: dict[int, str] = {}
    kernels: list[tuple[int, int, str]] = []
    copies: list[tuple[int, int]] = []
    copy_bytes: list[int] = []
    graphs: list[int] = []
    dropped: int | None = None
    lineno = 0
    for lineno, line in enumerate(lines, start=1):
        line = line.rstrip("\n")
        if lineno == 1:
            if line != FORMAT:
                raise InputError(path, f"not a kernel timeline (expected {FORMAT!r})", line=1)
            continue
        if not line:
            continue
        if dropped is not None:
            raise InputError(path, "records after the closing D line", line=lineno)
        kind, _, rest = line.partition(" ")
        try:
            if kind == "N":
                ident, _, name = rest.partition(" ")
                names[int(ident)] = name
            elif kind == "K":
                start, end, _stream, graph, ident = rest.split(" ")
                kernels.append((int(start), int(end), label(names[int(ident)])))
                graphs.append(int(graph))
            elif kind in ("C", "S"):
                start, end, _stream, size = rest.split(" ")[:4]
                copies.append((int(start), int(end)))
                copy_bytes.append(int(size))
            elif kind == "D":
                dropped = int(rest)
            else:
                raise InputError(path, f"unknown record kind {kind!r}", line=lineno)
        except (ValueError, KeyError) as e:
            raise InputError(path, f"malformed {kind} record ({e})", line=lineno) from None
    if lineno == 0:
        raise InputError(path, "empty kernel timeline")
    if dropped is None:
        raise InputError(path, "truncated: no closing D line (the process did not exit cleanly)", line=lineno)
    return Timeline(tuple(kernels), tuple(copies), dropped, tuple(copy_bytes), tuple(graphs))


@dataclass(frozen=True)
class BenchRun:
    """What llama-bench reported for the profiled process."""

    n_prompt: int
    n_gen: int
    n_ubatch: int
    reps: int
    avg_ns: float


def parse_bench(lines: Iterable[str], path: Path) -> BenchRun:
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            records.append(
                (
                    lineno,
                    BenchRun(
                        d["n_prompt"], d["n_gen"], d["n_ubatch"], len(d["samples_ns"]), float(d["avg_ns"])
                    ),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(path, f"not a llama-bench JSON Lines record ({e})", line=lineno) from None
    if len(records) != 1:
        raise InputError(path, f"expected one llama-bench test per profiled process, found {len(records)}")
    return records[0][1]
