"""The end-to-end A/B record format (JSON Lines, one record per test of one llama-bench run of one arm).

A record says what was measured (model, test, ubatch, arm, pair, tps) and, since ``ggml-dispatch-ab/1``,
where the number comes from: the full command and its GGML_* environment, the ``ggml_cuda_dispatch:``
start-up line of that very run and the table hash it names, the sha256 of the libggml-cuda that ran,
the GPU (name, uuid, driver) and a timestamp. Records written before the format had a schema key
(the first committed A/B files) are read as legacy records: same measurement fields, no provenance.

Pure functions, except :func:`read_file` / :func:`write_records` (file I/O). The report pairs the
records (``report.ab``); ``ggml-dispatch ab`` (``report.abrun``) writes them.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fileio
from ggml_dispatch.errors import InputError

SCHEMA: Final = "ggml-dispatch-ab/1"
# cached: a table chosen with a weight-cache budget (codegen --cache-budget), its own build like crude's;
# hook: a hooked build with the dispatch on and no table compiled in (what the hook itself costs)
ARMS: Final = ("stock", "table", "crude", "cached", "hook")
HOOK_ARM: Final = "hook"
# The arm that must run without any table (GGML_CUDA_DISPATCH=off or a build without a table).
STOCK_ARM: Final = "stock"
LINE_PREFIX: Final = "ggml_cuda_dispatch: "
TABLE_HASH_PREFIX_LEN: Final = 12  # what the start-up line prints of the table hash

_MEASUREMENT: Final = {
    "model": "str",
    "test": "str",
    "ubatch": "int",
    "arm": "str",
    "pair": "int",
    "tps": "number",
}
_HEX = re.compile(r"[0-9a-f]+")
# "table 0123456789ab (NVIDIA H200, cc 900, 132 SMs, 20 rules): applied on CUDA0; refused on CUDA1 (...)"
_TABLE_LINE = re.compile(r"^table ([0-9a-f]{12}) \((.*?), cc (\d+), (\d+) SMs, (\d+) rules\)(.*)$")


def kv_suffix(type_k: str, type_v: str) -> str:
    if type_k == type_v == "f16":
        return ""
    return f" kv {type_k}" if type_k == type_v else f" kv {type_k}/{type_v}"


def kv_from_command(command: Sequence[str]) -> str:
    """The KV-type suffix of a recorded llama-bench command (its -ctk/-ctv, f16 by default): what a
    record written before test names carried the cache types gets, so its tests stay apart."""
    types = {"-ctk": "f16", "-ctv": "f16"}
    for flag, value in itertools.pairwise(command):
        for long, short in (("--cache-type-k", "-ctk"), ("--cache-type-v", "-ctv")):
            if flag in (short, long):
                types[short] = value
    return kv_suffix(types["-ctk"], types["-ctv"])


@dataclass(frozen=True)
class DispatchLine:
    """What one ``ggml_cuda_dispatch:`` start-up line says applies."""

    text: str  # the line without its prefix
    mode: str  # off | force | table | none (no table compiled in) | error
    table_hash: str | None  # the 12-hex-digit prefix the line prints, when a table is compiled in
    applied: bool  # the compiled table applies on at least one device (mode table only)


def parse_dispatch_line(text: str) -> DispatchLine:
    """One start-up line (with or without its ``ggml_cuda_dispatch: `` prefix), as the hook prints it."""
    body = text.strip()
    if body.startswith(LINE_PREFIX.strip()):
        body = body[len(LINE_PREFIX.strip()) :].strip()
    head = body.split("; route trace", 1)[0].split("; cannot open route trace", 1)[0]
    if head.startswith("GGML_CUDA_DISPATCH=off"):
        return DispatchLine(body, "off", None, False)
    if head.startswith("GGML_CUDA_DISPATCH=force:"):
        return DispatchLine(body, "force", None, False)
    if head.startswith("no dispatch table compiled in"):
        return DispatchLine(body, "none", None, False)
    m = _TABLE_LINE.match(head)
    if m:
        return DispatchLine(body, "table", m.group(1), "applied on " in m.group(6))
    return DispatchLine(body, "error", None, False)


def find_dispatch_line(log: str) -> DispatchLine | None:
    """The first start-up line in a process's stderr (the hook prints one per process), or None."""
    for line in log.splitlines():
        i = line.find(LINE_PREFIX)
        if i >= 0 and "override route code" not in line:
            return parse_dispatch_line(line[i:])
    return None


@dataclass(frozen=True)
class Provenance:
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # GGML_* variables of the run, sorted
    dispatch_line: str  # the run's own start-up line (without prefix)
    table_hash: str | None  # from that line; None: no table applied
    table_applied: bool
    lib_path: str
    lib_sha256: str
    gpu_name: str
    gpu_uuid: str
    driver: str
    started: str  # ISO 8601 UTC
    build_commit: str = ""  # llama-bench's build_commit
    # peak GPU memory of the run's process (nvidia-smi per-process, else the device's rise), MiB; None:
    # not measured. vram_source says which ("process" or "device").
    peak_vram_mib: float | None = None
    vram_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.peak_vram_mib is not None:
            extra = {"peak_vram_mib": self.peak_vram_mib, "vram_source": self.vram_source}
        return {
            **extra,
            "command": list(self.command),
            "env": dict(self.env),
            "dispatch_line": self.dispatch_line,
            "table_hash": self.table_hash,
            "table_applied": self.table_applied,
            "lib": {"path": self.lib_path, "sha256": self.lib_sha256},
            "gpu": {"name": self.gpu_name, "uuid": self.gpu_uuid, "driver": self.driver},
            "started": self.started,
            "build_commit": self.build_commit,
        }


@dataclass(frozen=True)
class Record:
    model: str
    test: str
    ubatch: int
    arm: str
    pair: int
    tps: float
    samples_tps: tuple[float, ...] = ()
    provenance: Provenance | None = None  # None: a legacy record (written before ggml-dispatch-ab/1)

    @property
    def legacy(self) -> bool:
        return self.provenance is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "model": self.model,
            "test": self.test,
            "ubatch": self.ubatch,
            "arm": self.arm,
            "pair": self.pair,
            "tps": self.tps,
            "samples_tps": list(self.samples_tps),
        }
        if self.provenance is None:
            raise ValueError("a legacy record (no provenance) is never written")
        out.update(self.provenance.to_json())
        return out


def dumps(record: Record) -> str:
    return json.dumps(record.to_json(), sort_keys=True)


# --------------------------------------------------------------------------------------------
# Reader / validator


def _kind_ok(kind: str, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "str":
        return isinstance(value, str) and value != ""
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, int | float)


def _str(obj: Mapping[str, Any], name: str, path: Path, lineno: int, *, empty: bool = False) -> str:
    v = obj.get(name)
    if not isinstance(v, str) or (not empty and v == ""):
        raise InputError(
            path, f"expected a {'string' if empty else 'non-empty string'}", line=lineno, field=name
        )
    return v


def _provenance(obj: Mapping[str, Any], path: Path, lineno: int) -> Provenance:
    command = obj.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise InputError(path, "expected a non-empty list of strings", line=lineno, field="command")
    env = obj.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise InputError(path, "expected an object of strings", line=lineno, field="env")
    if any(not k.startswith("GGML_") for k in env):
        raise InputError(path, "only GGML_* variables are recorded", line=lineno, field="env")
    line = _str(obj, "dispatch_line", path, lineno)
    parsed = parse_dispatch_line(line)
    th = obj.get("table_hash")
    if th is not None and not (
        isinstance(th, str) and _HEX.fullmatch(th) and len(th) >= TABLE_HASH_PREFIX_LEN
    ):
        raise InputError(path, "expected null or a hex table hash", line=lineno, field="table_hash")
    if th != parsed.table_hash:
        raise InputError(
            path,
            f"{th!r} is not the hash the run's own start-up line names ({line!r})",
            line=lineno,
            field="table_hash",
        )
    applied = obj.get("table_applied")
    if not isinstance(applied, bool) or applied != parsed.applied:
        raise InputError(
            path, "does not match the run's own start-up line", line=lineno, field="table_applied"
        )
    lib = obj.get("lib")
    gpu = obj.get("gpu")
    if not isinstance(lib, dict):
        raise InputError(path, "expected an object {path, sha256}", line=lineno, field="lib")
    if not isinstance(gpu, dict):
        raise InputError(path, "expected an object {name, uuid, driver}", line=lineno, field="gpu")
    sha = lib.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and _HEX.fullmatch(sha)):
        raise InputError(path, "expected a sha256 (64 hex digits)", line=lineno, field="lib.sha256")
    for k in ("name", "uuid", "driver"):
        if not isinstance(gpu.get(k), str) or not gpu[k]:
            raise InputError(path, "expected a non-empty string", line=lineno, field=f"gpu.{k}")
    started = _str(obj, "started", path, lineno)
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)", started):
        raise InputError(
            path,
            "expected an ISO 8601 UTC time (YYYY-MM-DDTHH:MM:SSZ or +00:00)",
            line=lineno,
            field="started",
        )
    return Provenance(
        command=tuple(command),
        env=tuple(sorted(env.items())),
        dispatch_line=line,
        table_hash=th,
        table_applied=applied,
        lib_path=_str(lib, "path", path, lineno),
        lib_sha256=sha,
        gpu_name=gpu["name"],
        gpu_uuid=gpu["uuid"],
        driver=gpu["driver"],
        started=started,
        build_commit=str(obj.get("build_commit") or ""),
        **_vram(obj, path, lineno),
    )


VRAM_SOURCES: Final = ("process", "device")


def _vram(obj: Mapping[str, Any], path: Path, lineno: int) -> dict[str, Any]:
    peak = obj.get("peak_vram_mib")
    if peak is None:
        return {}
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not math.isfinite(peak) or peak < 0:
        raise InputError(path, "expected a non-negative number of MiB", line=lineno, field="peak_vram_mib")
    src = obj.get("vram_source")
    if src not in VRAM_SOURCES:
        raise InputError(path, f"must be one of {', '.join(VRAM_SOURCES)}", line=lineno, field="vram_source")
    return {"peak_vram_mib": float(peak), "vram_source": src}


def parse_lines(lines: Iterable[str], path: Path) -> list[tuple[int, Record]]:
    """JSON Lines -> (line number, record). Lines with ``schema`` must carry their provenance; lines
    without one are legacy records. Blank lines are skipped, unknown keys ignored."""
    out: list[tuple[int, Record]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, f"invalid JSON: {e.msg}", line=lineno) from None
        if not isinstance(obj, dict):
            raise InputError(path, "each line must be a JSON object", line=lineno)
        for name, kind in _MEASUREMENT.items():
            if name not in obj:
                raise InputError(path, "missing field", line=lineno, field=name)
            if not _kind_ok(kind, obj[name]):
                raise InputError(path, f"expected a {kind}, got {obj[name]!r}", line=lineno, field=name)
        if obj["arm"] not in ARMS:
            raise InputError(path, f"arm must be one of {', '.join(ARMS)}", line=lineno, field="arm")
        if not (math.isfinite(obj["tps"]) and obj["tps"] > 0):
            raise InputError(path, "tps must be a positive number", line=lineno, field="tps")
        if obj["ubatch"] < 1:
            raise InputError(path, "ubatch must be >= 1", line=lineno, field="ubatch")
        prov = None
        samples: tuple[float, ...] = ()
        if "schema" in obj:
            if obj["schema"] != SCHEMA:
                raise InputError(path, f"unknown schema {obj['schema']!r} (expected {SCHEMA})", line=lineno)
            prov = _provenance(obj, path, lineno)
            raw = obj.get("samples_tps", [])
            if not isinstance(raw, list) or not all(_kind_ok("number", x) and math.isfinite(x) for x in raw):
                raise InputError(path, "expected a list of numbers", line=lineno, field="samples_tps")
            samples = tuple(float(x) for x in raw)
        rec = Record(
            obj["model"],
            obj["test"],
            obj["ubatch"],
            obj["arm"],
            obj["pair"],
            float(obj["tps"]),
            samples,
            prov,
        )
        out.append((lineno, rec))
    return out


def read_file(path: Path) -> list[tuple[int, Record]]:
    if not path.is_file():
        raise InputError(path, "no such A/B file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror}") from None
    if b"\0" in data:
        raise InputError(path, "binary file (expected A/B JSON Lines)")
    return parse_lines(data.decode("utf-8", errors="replace").splitlines(), path)


def write_records(path: Path, records: Sequence[Record], *, append: bool = False) -> None:
    """Write (or append) records; a fresh file is written atomically, appends are whole lines."""
    text = "".join(dumps(r) + "\n" for r in records)
    if append and path.exists():
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
        return
    fileio.write_text_atomic(path, text)


# --------------------------------------------------------------------------------------------
# The table check report makes


@dataclass(frozen=True)
class TableCheck:
    legacy: int = 0  # records without provenance
    checked: int = 0  # records whose start-up line was held against the table
    notes: tuple[str, ...] = field(default_factory=tuple)


def check_records(
    numbered: Sequence[tuple[int, Record]], path: Path, table_hash: str | None, table_arm: str = "table"
) -> TableCheck:
    """Refuse records whose run applied another table than ``table_hash`` (the report's table): the arm
    that runs it (``table_arm``: "table", or "cached" for a table with a weight-cache budget, whose
    "table" arm is the table without the cache) must name that table and have applied it, a stock arm
    must show that no table applied, the hook arm that the dispatch was on with no table compiled in. The
    other arms run other tables by design: they must have applied one. Legacy records are counted."""
    legacy = checked = 0
    for lineno, rec in numbered:
        p = rec.provenance
        if p is None:
            legacy += 1
            continue
        if rec.arm == HOOK_ARM:
            if parse_dispatch_line(p.dispatch_line).mode != "none":
                raise InputError(
                    path,
                    f"hook arm must run a hooked build with no table compiled in ({p.dispatch_line!r})",
                    line=lineno,
                )
        elif rec.arm == STOCK_ARM:
            if p.table_applied:
                raise InputError(
                    path,
                    f"stock arm ran with table {p.table_hash} applied ({p.dispatch_line!r})",
                    line=lineno,
                )
        elif not p.table_applied:
            raise InputError(
                path, f"{rec.arm} arm ran without a table applied ({p.dispatch_line!r})", line=lineno
            )
        elif (
            rec.arm == table_arm
            and table_hash is not None
            and (p.table_hash is None or not table_hash.startswith(p.table_hash))
        ):
            raise InputError(
                path,
                f"{table_arm} arm applied table {p.table_hash}, the report's table is {table_hash[:12]}",
                line=lineno,
            )
        checked += 1
    notes = []
    if legacy:
        notes.append(
            f"{legacy} legacy record{'s' if legacy != 1 else ''} without provenance "
            "(no command, start-up line, build or GPU recorded: the applied table is not checked)"
        )
    return TableCheck(legacy, checked, tuple(notes))


def check_files(
    paths: Sequence[Path], table_hash: str | None, table_arm: str = "table"
) -> dict[Path, TableCheck]:
    return {p: check_records(read_file(p), p, table_hash, table_arm) for p in paths}
