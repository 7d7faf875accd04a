"""A/B records in the report: the format lives in :mod:`ggml_dispatch.artifacts.ab` (the one reader and
writer); here the report holds every file against its table and pairs the measurements."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fileio
from ggml_dispatch.artifacts.ab import ARMS, check_files, kv_from_command, parse_lines, read_file
from ggml_dispatch.errors import InputError


def provenance_details(paths: Sequence[Path], files: Sequence[Any], table_path: Path | None) -> list[Any]:
    """Report's one call: hold every A/B file against the report's table (InputError on a mismatch) and
    return its input-file entries (report's ``InputFile``, one per path, in order) with a provenance
    detail added: how many records were checked, or a note for legacy records."""
    table_hash = None
    table_arm = "table"
    if table_path is not None:
        from ggml_dispatch.codegen import cache
        from ggml_dispatch.codegen import table as table_mod

        table = table_mod.load(table_path)
        table_hash = table_mod.table_hash(table)
        if cache.budget_bytes(table) > 0:
            table_arm = "cached"  # a table with a weight-cache budget: its "table" arm runs it without
    checks = check_files(paths, table_hash, table_arm)
    out = []
    for p, f in zip(paths, files, strict=True):
        c = checks[p]
        detail = (
            "provenance",
            "; ".join(c.notes) if c.notes else f"{c.checked} records checked against the table",
        )
        if c.notes and c.checked:
            detail = ("provenance", f"{c.checked} records checked; " + "; ".join(c.notes))
        out.append(dataclasses.replace(f, details=(*f.details, detail)))
    return out


# --------------------------------------------------------------------------------------------
# What the report pairs: the measurement fields of every record, legacy or not


AB_ARMS: Final = ARMS


@dataclass(frozen=True)
class AbRecord:
    model: str
    test: str
    ubatch: int
    arm: str
    pair: int
    tps: float
    run: str = ""  # which A/B file: runs of different files are never paired
    peak_vram_mib: float | None = None  # the run's peak GPU memory (ggml_dispatch.artifacts.ab)
    # the mean of repetitions 2.. (llama-bench's samples); None with fewer than 2. Repetition 1 is the
    # first time the test's shapes run at their depth in the process: one-off costs land there alone
    later_tps: float | None = None
    # the last repetition alone (with -r 3 and CUDA graphs: a replay, the steady state); None below 3 samples
    last_tps: float | None = None


def _record(r: Any) -> AbRecord:
    peak = r.provenance.peak_vram_mib if r.provenance is not None else None
    test = r.test
    if r.provenance is not None and " kv " not in test:
        test += kv_from_command(r.provenance.command)  # written before test names carried the KV types
    later = sum(r.samples_tps[1:]) / (len(r.samples_tps) - 1) if len(r.samples_tps) >= 2 else None
    last = r.samples_tps[-1] if len(r.samples_tps) >= 3 else None
    return AbRecord(
        r.model, test, r.ubatch, r.arm, r.pair, r.tps, peak_vram_mib=peak, later_tps=later, last_tps=last
    )


def parse_ab_lines(lines: Iterable[str], path: Path) -> list[tuple[int, AbRecord]]:
    """JSON Lines -> (line number, measurement) through the one record reader."""
    return [(n, _record(r)) for n, r in parse_lines(lines, path)]


# With pooling, file i's (from 1) pair p becomes pair i * POOL_PAIR_STRIDE + p: pairs stay within their file.
POOL_PAIR_STRIDE: Final = 1_000_000


def pair_label(pair: int) -> str:
    """A pair as reports show it: pooled files' pairs as ``<file number>.<pair>`` (file 1 first)."""
    return f"{pair // POOL_PAIR_STRIDE}.{pair % POOL_PAIR_STRIDE}" if pair >= POOL_PAIR_STRIDE else str(pair)


def load_ab(paths: Sequence[Path], *, pool: bool = False) -> tuple[list[AbRecord], list[Any]]:
    """Each file is one interleaved run: with several files, a record's ``run`` is its file's stem and
    pairs are formed within a run only. ``pool``: the files are calls of one A/B (the same table, the
    arms interleaved in each), so each workload's pairs from every file make one comparison (pairs are
    still formed within a file only); the table arm's records must all name one table hash. Returns
    the records and report's ``InputFile`` per file."""
    from ggml_dispatch.report.inputs import InputFile

    records: list[AbRecord] = []
    files: list[InputFile] = []
    seen: dict[tuple[str, str, str, int, str, int], str] = {}
    pooled_table: tuple[str, str] | None = None  # (table hash, where first seen)
    for index, path in enumerate(paths):
        raw = read_file(path)
        numbered = [(n, _record(r)) for n, r in raw]
        if not numbered:
            raise InputError(path, "no A/B records (empty file)")
        if pool:
            for lineno, r in raw:
                th = r.provenance.table_hash if r.provenance is not None else None
                if r.arm != "table" or th is None:
                    continue
                if pooled_table is None:
                    pooled_table = (th, f"{path.name}:{lineno}")
                elif th != pooled_table[0]:
                    raise InputError(
                        path,
                        f"--pool-ab: the table arm ran table {th}, another file's ran {pooled_table[0]} "
                        f"({pooled_table[1]}): A/Bs of different tables are not pooled",
                        line=lineno,
                        field="table_hash",
                    )
        run = path.stem if len(paths) > 1 and not pool else ""
        for lineno, old in numbered:
            pair = (index + 1) * POOL_PAIR_STRIDE + old.pair if pool else old.pair
            rec = dataclasses.replace(old, run=run, pair=pair)
            key = (rec.run, rec.model, rec.test, rec.ubatch, rec.arm, rec.pair)
            if key in seen:
                raise InputError(
                    path,
                    f"a second run of model {rec.model!r} {rec.test} ubatch {rec.ubatch} arm {rec.arm} "
                    f"pair {rec.pair} (the first is at {seen[key]})",
                    line=lineno,
                )
            seen[key] = f"{path.name}:{lineno}"
            records.append(rec)
        files.append(InputFile("A/B", path.name, fileio.sha256_file(path), (("runs", str(len(numbered))),)))
    return records, files
