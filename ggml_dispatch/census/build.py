"""Census rows -> the census Parquet file; reading one back. The file format and its checks are
:mod:`ggml_dispatch.artifacts.census`; this module keeps the census stage's names for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from ggml_dispatch.artifacts import census as artifact
from ggml_dispatch.artifacts.census import CENSUS_ARROW_SCHEMA, INT64_MAX, metadata, to_table, write

__all__ = ["CENSUS_ARROW_SCHEMA", "INT64_MAX", "metadata", "read", "to_table", "write"]


def read(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """A census file and its decoded metadata; an :class:`InputError` if it is not one."""
    c = artifact.read(path)
    return c.table, c.meta
