"""End-to-end A/B records: JSON Lines of llama-bench runs, one run per line, read and validated.

A record is one run of one arm (stock, table or crude) of one (model, test, ubatch) with a pair id: runs
of the same pair id were interleaved, so arm/baseline ratios are formed per pair. Bad input is one
:class:`~ggml_dispatch.errors.InputError` naming the file, line and field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fileio
from ggml_dispatch.errors import InputError
from report.inputs import InputFile

AB_ARMS: Final = ("stock", "table", "crude")
# (arm, baseline) pairs compared per (model, test, ubatch); a table must beat the crude rule too.


@dataclass(frozen=True)
class AbRecord:
    model: str
    test: str
    ubatch: int
    arm: str
    pair: int
    tps: float
    run: str = ""  # which A/B file: runs of different files are never paired


_AB_FIELDS: Final[dict[str, str]] = {
    "model": "str",
    "test": "str",
    "ubatch": "int",
    "arm": "str",
    "pair": "int",
    "tps": "number",
}


def _ab_type_ok(kind: str, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "str":
        return isinstance(value, str) and value != ""
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, int | float)


def parse_ab_lines(lines: Iterable[str], path: Path) -> list[tuple[int, AbRecord]]:
    """JSON Lines -> (line number, record); blank lines skipped, extra keys ignored."""
    out: list[tuple[int, AbRecord]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, f"invalid JSON: {e.msg}", line=lineno) from None
        if not isinstance(obj, dict):
            raise InputError(path, "each line must be a JSON object", line=lineno)
        for name, kind in _AB_FIELDS.items():
            if name not in obj:
                raise InputError(path, "missing field", line=lineno, field=name)
            if not _ab_type_ok(kind, obj[name]):
                raise InputError(path, f"expected a {kind}, got {obj[name]!r}", line=lineno, field=name)
        if obj["arm"] not in AB_ARMS:
            raise InputError(path, f"arm must be one of {', '.join(AB_ARMS)}", line=lineno, field="arm")
        if not (math.isfinite(obj["tps"]) and obj["tps"] > 0):
            raise InputError(path, "tps must be a positive number", line=lineno, field="tps")
        if obj["ubatch"] < 1:
            raise InputError(path, "ubatch must be >= 1", line=lineno, field="ubatch")
        rec = AbRecord(obj["model"], obj["test"], obj["ubatch"], obj["arm"], obj["pair"], float(obj["tps"]))
        out.append((lineno, rec))
    return out


def load_ab(paths: Sequence[Path]) -> tuple[list[AbRecord], list[InputFile]]:
    """Each file is one interleaved run: with several files, a record's ``run`` is its file's stem and
    pairs are formed within a run only."""
    records: list[AbRecord] = []
    files: list[InputFile] = []
    seen: dict[tuple[str, str, str, int, str, int], str] = {}
    for path in paths:
        if not path.is_file():
            raise InputError(path, "no such A/B file")
        numbered = parse_ab_lines(path.read_text(encoding="utf-8", errors="replace").splitlines(), path)
        if not numbered:
            raise InputError(path, "no A/B records (empty file)")
        run = path.stem if len(paths) > 1 else ""
        for lineno, old in numbered:
            rec = dataclasses.replace(old, run=run)
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
