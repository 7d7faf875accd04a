"""Column checks over a whole Arrow table at once (a census may have a million rows): each finds the
first bad row and names it ``path: row i: column: message``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ggml_dispatch.errors import InputError


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first true value of a boolean mask (nulls count as false)."""
    filled = pc.fill_null(mask, False)
    i = pc.index(filled, True).as_py()
    return None if i is None or i < 0 else int(i)


def _fail(table: pa.Table, path: str | Path, i: int, col: str, message: str) -> None:
    value = table.column(col)[i].as_py()
    raise InputError(path, message.format(value=value), field=f"row {i}: {col}")


def not_null(table: pa.Table, cols: Iterable[str], path: str | Path) -> None:
    for col in cols:
        i = _first(pc.is_null(table.column(col)))
        if i is not None:
            _fail(table, path, i, col, "null in a required column (got {value!r})")


def one_of(table: pa.Table, col: str, allowed: Iterable[str], path: str | Path, what: str) -> None:
    values = pa.array(sorted(allowed), pa.string())
    i = _first(pc.invert(pc.is_in(table.column(col), value_set=values)))
    if i is not None:
        _fail(table, path, i, col, f"unknown {what} {{value!r}}")


def positive_ints(table: pa.Table, cols: Iterable[str], path: str | Path) -> None:
    for col in cols:
        c = table.column(col)
        i = _first(pc.or_kleene(pc.is_null(c), pc.less(c, 1)))
        if i is not None:
            _fail(table, path, i, col, "must be a positive integer, got {value!r}")


def non_negative_ints(table: pa.Table, cols: Iterable[str], path: str | Path) -> None:
    for col in cols:
        c = table.column(col)
        i = _first(pc.or_kleene(pc.is_null(c), pc.less(c, 0)))
        if i is not None:
            _fail(table, path, i, col, "must be an integer >= 0, got {value!r}")


def finite_at_least(
    table: pa.Table,
    col: str,
    path: str | Path,
    *,
    minimum: float,
    strict: bool,
    message: str,
    where: pa.ChunkedArray | pa.Array | None = None,
    nullable: bool = False,
) -> None:
    """Values must be finite and > (``strict``) or >= ``minimum``; only rows where ``where`` is true are
    checked; a null passes only when ``nullable``. ``message`` may use ``{value!r}``."""
    c = table.column(col)
    bad_value = pc.or_kleene(
        pc.invert(pc.is_finite(c)), pc.less_equal(c, minimum) if strict else pc.less(c, minimum)
    )
    bad = pc.fill_null(bad_value, not nullable)
    if where is not None:
        bad = pc.and_kleene(bad, pc.fill_null(where, False))
    i = _first(bad)
    if i is not None:
        _fail(table, path, i, col, message)
