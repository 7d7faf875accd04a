"""Atomic outputs (temporary name, then rename), hashing, and Parquet with key-value metadata."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ggml_dispatch import schema


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600; outputs get the permissions an ordinary open() would give them
    umask = os.umask(0)
    os.umask(umask)
    tmp_path.chmod(0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def base_metadata(schema_name: str, **extra: Any) -> dict[str, str]:
    """Provenance common to every Parquet file: schema, tool version, creation time, plus extras.

    Values that are not strings are stored as canonical JSON.
    """
    meta: dict[str, str] = {
        schema.META_SCHEMA: schema_name,
        schema.META_TOOL_VERSION: schema.TOOL_VERSION,
        schema.META_CREATED: now_iso(),
    }
    for key, value in extra.items():
        full = key if key.startswith(schema.META_PREFIX) else schema.META_PREFIX + key
        meta[full] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return meta


def write_parquet(table: pa.Table, path: str | Path, metadata: Mapping[str, str]) -> None:
    """Write ``table`` with ``metadata`` merged into the schema's key-value metadata, atomically."""
    existing = dict(table.schema.metadata or {})
    existing.update({k.encode(): v.encode() for k, v in metadata.items()})
    table = table.replace_schema_metadata(existing)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_metadata(path: str | Path) -> dict[str, str]:
    md = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in md.items() if k.decode().startswith(schema.META_PREFIX)}
