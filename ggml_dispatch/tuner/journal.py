"""The sweep journal: JSON Lines, append-only, one line per finished case, fsync'd.

Line 1 is ``{"kind": "journal", ...}`` naming the census the sweep measures (its sha256) and the
shard; every further line is ``{"kind": "case", "case": id, "status": ..., ...}``. A kill loses at
most the case in flight: a torn last line is ignored with a warning and its case runs again.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from ggml_dispatch.errors import InputError
from ggml_dispatch.fileio import now_iso

JOURNAL_SCHEMA: Final = "ggml-dispatch-tuning-journal/1"


@dataclass
class JournalContents:
    header: dict[str, Any] | None
    cases: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def done_ids(self) -> set[str]:
        return {str(c["case"]) for c in self.cases}

    def unsound_ids(self) -> set[str]:
        """Cases recorded as failed, or with a trial that failed its numerics check (status wrong) or whose
        candidate took the child down (status failed:..., the case measured again without it): what
        ``tune run --remeasure`` measures again after a fix to the harness, its reference or ggml."""
        return {
            str(c["case"])
            for c in self.cases
            if str(c.get("status", "")).startswith("failed")
            or any(
                t.get("status") == "wrong" or str(t.get("status", "")).startswith("failed")
                for t in c.get("trials") or ()
            )
        }


def _records(p: Path, lines: Sequence[str | bytes]) -> tuple[list[tuple[int, dict[str, Any]]], int | None]:
    """(line number, record) of every complete line, and the number of a torn last line (a killed run's;
    None: none). Any other line that is not a record is an InputError naming it."""
    last = max((i for i, raw in enumerate(lines, start=1) if raw.strip()), default=0)
    out: list[tuple[int, dict[str, Any]]] = []
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both
            if i == last:
                return out, i
            raise InputError(p, "not a JSON object (the journal is damaged)", line=i) from None
        if not isinstance(rec, dict) or "kind" not in rec:
            raise InputError(p, "not a journal record", line=i)
        out.append((i, rec))
    return out, None


def journal_records(path: str | Path) -> list[dict[str, Any]]:
    """Every line of a journal as written (plain or ``.gz``, the header first, repeated cases kept): what the
    lab's analyses of one sweep read. A torn last line (a killed run) is left out, as :func:`read_journal`
    leaves it; a missing file, bad gzip or any other line that is not a record is an InputError naming it."""
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such file (expected a tuning journal, .jsonl or .jsonl.gz)")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise InputError(p, f"cannot read the journal ({e.__class__.__name__}: {e})") from None
    return [rec for _, rec in _records(p, lines)[0]]


def read_journal(path: str | Path) -> JournalContents:
    """Every complete line; later records of one case replace earlier ones."""
    p = Path(path)
    out = JournalContents(header=None)
    if not p.exists():
        return out
    records, torn = _records(p, p.read_bytes().split(b"\n"))
    if torn is not None:
        out.warnings.append(f"{p}:{torn}: torn last line ignored (a killed run); its case runs again")
    by_case: dict[str, dict[str, Any]] = {}
    for i, rec in records:
        if rec["kind"] == "journal":
            if rec.get("schema") != JOURNAL_SCHEMA:
                raise InputError(
                    p, f"journal schema {rec.get('schema')!r}, expected {JOURNAL_SCHEMA}", line=i
                )
            out.header = rec
        elif rec["kind"] == "case":
            if "case" not in rec or "status" not in rec:
                raise InputError(p, "case record without 'case' or 'status'", line=i)
            by_case[str(rec["case"])] = rec
        else:
            raise InputError(p, f"unknown record kind {rec['kind']!r}", line=i)
    out.cases = list(by_case.values())
    return out


class Journal:
    """Append-only writer. ``open`` checks that an existing journal belongs to the same sweep."""

    def __init__(self, path: Path, f: IO[bytes], contents: JournalContents) -> None:
        self.path = path
        self._f = f
        self.contents = contents

    @classmethod
    def open(cls, path: str | Path, identity: dict[str, Any]) -> Journal:
        p = Path(path)
        contents = read_journal(p)
        if contents.header is not None:
            for k, v in identity.items():
                if contents.header.get(k) != v:
                    raise InputError(
                        p,
                        f"this journal belongs to another sweep ({k} = {contents.header.get(k)!r}, "
                        f"this run has {v!r}); pass another -o/--journal or delete it to start over",
                        field=k,
                    )
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and p.stat().st_size > 0 and not p.read_bytes().endswith(b"\n"):
            # drop a torn last line so the next record starts on a line of its own
            data = p.read_bytes()
            with p.open("r+b") as g:
                g.truncate(data.rfind(b"\n") + 1)
        f = p.open("ab")
        j = cls(p, f, contents)
        if contents.header is None:
            header = {"kind": "journal", "schema": JOURNAL_SCHEMA, "created": now_iso(), **identity}
            j._write(header)
            contents.header = header
        return j

    def _write(self, rec: dict[str, Any]) -> None:
        self._f.write(json.dumps(rec, sort_keys=True, allow_nan=False).encode() + b"\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def append(self, rec: dict[str, Any]) -> None:
        self._write({"kind": "case", **rec})
        self.contents.cases = [c for c in self.contents.cases if c["case"] != rec["case"]]
        self.contents.cases.append({"kind": "case", **rec})

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
