"""The one set of checks every pipeline file passes before a command uses it.

In the spirit of PyTorch TunableOp's results file, whose validator lines (versions, device) must match
before any result is used: a file carries its schema version and provenance (GPU identity, upstream
commit, patch hash, tool and harness versions) and is refused, with one message naming the file and
the field, when any of it is missing, of the wrong type or not an allowed value. Every command reads
a file through these functions, so a file is accepted or refused alike everywhere.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from ggml_dispatch import schema
from ggml_dispatch.errors import InputError

ARROW_TYPES: Final[dict[str, pa.DataType]] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}


def arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    """The canonical Arrow schema of a column spec (``schema.CENSUS_COLUMNS`` / ``TUNING_COLUMNS``)."""
    return pa.schema([pa.field(name, ARROW_TYPES[kind]) for name, kind in columns.items()])


# --------------------------------------------------------------------------------------------
# Files


def check_regular_file(path: Path, what: str) -> None:
    """A path that names an existing, non-empty regular file; else one error saying which it is not."""
    if not path.exists():
        raise InputError(path, f"no such file (expected {what})")
    if path.is_dir():
        raise InputError(path, f"is a folder (expected {what})")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    if size == 0:
        raise InputError(path, f"empty file (expected {what})")


def decode_text(data: bytes, origin: str | Path, what: str) -> str:
    """Bytes that must be UTF-8 text: Parquet or gzip magic, a NUL byte or invalid UTF-8 says the file
    is not text."""
    if not data.strip():
        raise InputError(origin, f"empty file (expected {what})")
    if data.startswith(b"PAR1"):
        raise InputError(origin, f"a Parquet file, expected {what}")
    if data.startswith(b"\x1f\x8b"):
        raise InputError(origin, f"a gzip file, expected {what}")
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(origin, f"a binary file (NUL byte at offset {nul}), expected {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(origin, f"not UTF-8 text (byte {e.start}), expected {what}") from None


def read_text(path: str | Path, what: str) -> str:
    p = Path(path)
    check_regular_file(p, what)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(p, f"cannot read: {e.strerror or e}") from None
    return decode_text(data, p, what)


# Deeper than any file this tool writes (a table.json nests 5 levels) and far below where Python's
# decoder recurses out of stack: a file nested deeper is refused at its line, before it is decoded.
MAX_JSON_DEPTH: Final = 64
# What the depth scan looks at: strings (skipped whole, so a bracket inside one does not count),
# brackets, and the bare NaN/Infinity Python's decoder takes but JSON has not.
_JSON_TOKEN: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|-?(?:NaN|Infinity)')


class _DuplicateKey(dict[str, Any]):
    """An object in which ``key`` came twice (found by the walk that names where)."""

    key: str


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _find_duplicate(value: Any, where: str) -> str | None:
    """The path of the first key given twice in one object, in document order."""
    if isinstance(value, _DuplicateKey):
        return f"{where}.{value.key}" if where else value.key
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _find_duplicate(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else k)
        if found is not None:
            return found
    return None


def loads_json(text: str, origin: str | Path | None) -> Any:
    """One strict JSON value: no NaN or Infinity, no key twice in one object, nested at most
    :data:`MAX_JSON_DEPTH` deep; else one :class:`InputError` naming the line (or the key's path)."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise InputError(
                    origin,
                    f"not JSON this tool reads: nested deeper than {MAX_JSON_DEPTH} levels",
                    line=_line(text, m.start()),
                )
        elif tok in ("]", "}"):
            depth -= 1
        elif tok[0] != '"':
            raise InputError(
                origin, f"not JSON: {tok.lstrip('-')} is not a JSON number", line=_line(text, m.start())
            )
    twice = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal twice
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                twice = True
                dup = _DuplicateKey(out)
                dup.key = k
                return dup
            out[k] = v
        return out

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise InputError(origin, f"not JSON: {e.msg}", line=e.lineno) from None
    except RecursionError:  # the scan above bounds the depth; kept so that no input reaches a traceback
        raise InputError(origin, "not JSON this tool reads: nested too deep") from None
    except ValueError as e:  # e.g. an integer literal longer than Python's digit limit
        raise InputError(origin, f"not JSON this tool reads: {str(e).splitlines()[0]}") from None
    if twice:
        raise InputError(origin, "key given twice in one JSON object", field=_find_duplicate(value, ""))
    return value


def _type_ok(kind: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True  # a column of nulls only; the row checks decide whether nulls are allowed there
    if kind == "string":
        return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t))
    if kind == "int64":
        return bool(pa.types.is_integer(t))
    if kind == "float64":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "bool":
        return bool(pa.types.is_boolean(t))
    raise AssertionError(kind)  # pragma: no cover - the column specs are fixed


def read_parquet(
    path: str | Path, schema_name: str, columns: Mapping[str, str], what: str
) -> tuple[pa.Table, dict[str, str]]:
    """A ggml-dispatch Parquet file: schema key, required columns and their types, at least one row.

    Returns the table with exactly ``columns``, cast to their canonical types, and the file's
    ``ggml_dispatch.*`` key-value metadata (undecoded strings)."""
    p = Path(path)
    check_regular_file(p, f"a {what} Parquet file")
    try:
        table = pq.ParquetFile(p).read()
    except (pa.ArrowException, OSError) as e:
        raise InputError(p, f"not a readable Parquet file: {e}") from None
    meta: dict[str, str] = {}
    for k, v in (table.schema.metadata or {}).items():
        key = k.decode("utf-8", "replace")
        if key.startswith(schema.META_PREFIX):
            meta[key] = v.decode("utf-8", "replace")
    got = meta.get(schema.META_SCHEMA)
    if got is None:
        raise InputError(
            p,
            f"no '{schema.META_SCHEMA}' key-value metadata: not a {what} file written by ggml-dispatch",
            field=schema.META_SCHEMA,
        )
    if got != schema_name:
        raise InputError(
            p, f"not a {what} file: its schema is {got!r}, expected {schema_name!r}", field=schema.META_SCHEMA
        )
    if not meta.get(schema.META_TOOL_VERSION):
        raise InputError(
            p, f"no tool version: not a {what} file written by ggml-dispatch", field=schema.META_TOOL_VERSION
        )
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(p, f"missing column(s) {', '.join(missing)}", field=missing[0])
    for col, kind in columns.items():
        t = table.schema.field(col).type
        if not _type_ok(kind, t):
            raise InputError(p, f"column has type {t}, expected {kind}", field=col)
    if table.num_rows == 0:
        raise InputError(p, f"no rows: an empty {what} file")
    return cast_columns(table, columns, p), meta


def cast_columns(table: pa.Table, columns: Mapping[str, str], path: str | Path) -> pa.Table:
    """Exactly ``columns``, in order, each cast to its canonical type (an int64 column may be stored
    as int32, a float64 one as integers)."""
    arrays = []
    for name, kind in columns.items():
        try:
            arrays.append(table.column(name).cast(ARROW_TYPES[kind]))
        except (pa.ArrowException, ValueError) as e:
            raise InputError(path, f"values do not convert to {kind}: {e}", field=name) from None
    return pa.Table.from_arrays(arrays, schema=arrow_schema(columns))


def decode_meta(raw: Mapping[str, str]) -> dict[str, Any]:
    """Key-value metadata with the JSON values (objects, lists) decoded; other values stay strings."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        try:
            out[k] = json.loads(v) if v[:1] in ("{", "[") else v
        except ValueError:
            out[k] = v
    return out


def meta_json(raw: Mapping[str, str], key: str, default: Any, path: str | Path) -> Any:
    """One JSON-valued metadata key; a file whose value is not JSON is refused naming the key."""
    if key not in raw:
        return default
    try:
        return json.loads(raw[key])
    except ValueError:
        raise InputError(path, "metadata value is not JSON", field=key) from None


# --------------------------------------------------------------------------------------------
# Values


def present(v: Any) -> bool:
    """Not null, not NaN, not the empty string."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def status_kind(status: Any) -> str | None:
    """``ok``/``ineligible``/``wrong``/``drifted``/``pruned``/``failed`` for a trial status; None if the
    value is not one (null, unknown, or ``failed:`` without a message)."""
    if not isinstance(status, str):
        return None
    if status in schema.TRIAL_STATUSES:
        return status
    if status.startswith(schema.FAILED_PREFIX) and len(status) > len(schema.FAILED_PREFIX):
        return "failed"
    return None


STATUS_KINDS: Final = (*(s.value for s in schema.TrialStatus), "failed")
STATUS_HELP: Final = ", ".join(s.value for s in schema.TrialStatus) + f" or {schema.FAILED_PREFIX}<msg>"


def check_gpu_name(value: Any, path: str | Path, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(path, "empty GPU name", field=field)
    if "\0" in value:
        raise InputError(path, "GPU name contains a NUL byte", field=field)
    return value


# --------------------------------------------------------------------------------------------
# Mixing rules: one file (or one set of inputs) belongs to one GPU and one upstream commit


def check_one_gpu(
    gpus: Mapping[schema.GpuId, str], path: str | Path, *, allow_mixed: bool, what: str = "rows"
) -> None:
    """``gpus``: each GPU identity (name, cc, SM count) and where it comes from (for the message)."""
    if len(gpus) > 1 and not allow_mixed:
        listed = "; ".join(
            f"{g.name} cc {g.cc} {g.sm_count} SMs ({where})" for g, where in sorted(gpus.items())
        )
        raise InputError(
            path,
            f"{what} come from {len(gpus)} GPUs ({listed}); a table belongs to one GPU "
            "(name, cc and SM count): split the inputs, or pass --allow-mixed",
            field="gpu_name",
        )


def check_one_commit(
    commits: Mapping[str, str],
    path: str | Path,
    *,
    allow_mixed: bool,
    what: str = "rows",
    line: int | None = None,
) -> None:
    """``commits``: each upstream commit and where it comes from (for the message)."""
    if len(commits) > 1 and not allow_mixed:
        listed = "; ".join(f"{c or '(none)'} ({where})" for c, where in sorted(commits.items()))
        raise InputError(
            path,
            f"{what} come from {len(commits)} upstream commits ({listed}); "
            "pass --allow-mixed to combine them",
            field="upstream_commit",
            line=line,
        )
