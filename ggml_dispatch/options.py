"""Click parameter types for every numeric option: finite floats and integers with both ends bounded.

``click.FloatRange`` accepts ``nan`` (every comparison with it is false) and ``inf``, and
``click.IntRange(min=1)`` accepts a 23-digit integer that later overflows an int64 column or a C int.
Every command declares its numbers with these instead, so a bad value is refused while parsing, with
the option's name, before any file is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click

INT64_MAX: Final = (1 << 63) - 1
INT64_MIN: Final = -(1 << 63)
# what the native side stores in a C int (compute capability, SM count, trial counts)
INT32_MAX: Final = (1 << 31) - 1
# token counts (M, n_kv, n_ctx, output rows): llama.cpp keeps n_ctx and n_ubatch in 32-bit integers
MAX_TOKENS: Final = INT32_MAX


class FiniteFloat(click.types.FloatParamType):
    """A float that is finite and within [min, max] (an end is excluded with ``min_open``/``max_open``)."""

    name = "float"

    def __init__(
        self,
        min: float | None = None,
        max: float | None = None,
        *,
        min_open: bool = False,
        max_open: bool = False,
    ) -> None:
        self.min = min
        self.max = max
        self.min_open = min_open
        self.max_open = max_open

    def _range(self) -> str:
        lo = "" if self.min is None else f"{self.min:g} {'<' if self.min_open else '<='} "
        hi = "" if self.max is None else f" {'<' if self.max_open else '<='} {self.max:g}"
        return f"{lo}x{hi}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value):
            v = value
        else:
            try:
                v = float(value)
            except (TypeError, ValueError, OverflowError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        lo_bad = self.min is not None and (v <= self.min if self.min_open else v < self.min)
        hi_bad = self.max is not None and (v >= self.max if self.max_open else v > self.max)
        if lo_bad or hi_bad:
            self.fail(f"{value!r} is not in the range {self._range()}", param, ctx)
        return v

    def __repr__(self) -> str:
        return f"FiniteFloat({self._range()})"


def Int(min: int | None = None, max: int = INT64_MAX) -> click.IntRange:
    """An integer within [min, max]; the upper end defaults to what an int64 column holds."""
    return click.IntRange(min=INT64_MIN if min is None else min, max=max)


def list_items(text: str) -> list[str]:
    """The items of a comma-separated option value, stripped; every command splits its lists here.

    An empty item (``1,,512``, a leading or trailing comma) or an empty value is a ValueError: a typo
    in a list is refused, not dropped while the rest is used."""
    if not text.strip():
        raise ValueError("an empty list")
    items = [p.strip() for p in text.split(",")]
    for n, item in enumerate(items, 1):
        if not item:
            raise ValueError(
                f"{text!r}: item {n} of {len(items)} is empty (a doubled, leading or trailing comma)"
            )
    return items


def int_list(text: str, what: str, param_hint: str | None = None) -> tuple[int, ...]:
    """Comma-separated integers, each in [1, 2^20], duplicates dropped in order (``16384,49152``); a
    click.BadParameter naming ``what`` otherwise."""
    try:
        items = list_items(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=param_hint) from None
    try:
        vals = tuple(int(p) for p in items)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected comma-separated integers", param_hint=param_hint
        ) from None
    if not vals or any(v < 1 or v > 1 << 20 for v in vals):
        raise click.BadParameter(
            f"{text!r}: each {what} must be between 1 and {1 << 20}", param_hint=param_hint
        )
    return tuple(dict.fromkeys(vals))


_F = TypeVar("_F", bound=Callable[..., Any])


def output_option(help: str, *, folder: bool = False, dest: str = "output") -> Callable[[_F], _F]:
    """``-o/--output``, required: a file (or with ``folder``, a folder) the command writes."""
    kind = (
        click.Path(file_okay=False, path_type=Path) if folder else click.Path(dir_okay=False, path_type=Path)
    )
    return click.option("-o", "--output", dest, required=True, type=kind, help=help)


def allow_mixed_option(help: str) -> Callable[[_F], _F]:
    """``--allow-mixed``: accept inputs that disagree on what ``help`` names."""
    return click.option("--allow-mixed", is_flag=True, help=help)
