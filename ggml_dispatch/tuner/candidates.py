"""The sweep's cases from a census, through each op's candidate generator.

An op's description (``registry.OPS``) names the census file its rows are in (``census``) and the tuner
module whose ``candidates`` function makes its cases (``candidates``); the core never imports the tuner,
so the name is resolved here. A census is read once; each op whose rows it holds, in code order, adds its
cases to the selection of the ops before it (MUL_MAT_ID's join MUL_MAT's: one sweep, shapes ordered by
their census time). Adding an op to a census is its description plus its generator module: nothing here
or in the sweep names it; an op with a census file of its own (FLASH_ATTN_EXT) also gives its module
``is_census(path)`` and ``read_census(path)``, through which that census kind is recognised and read.

A generator is ``candidates(census, wanted, prior, *, path, mmvq) -> Selection``: ``census`` the file's
rows (Arrow), ``wanted`` the sweep's settings (:class:`tuner.select.Wanted`), ``prior`` the selection of
the census' ops before it (None: the first), ``mmvq`` the mmvq instances the build compiles (None: any).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final, NamedTuple, Protocol

import pyarrow as pa

from ggml_dispatch import registry
from ggml_dispatch.tuner.select import CompiledMmvq, Selection, Wanted

PACKAGE: Final = "ggml_dispatch.tuner"


class CensusReader(NamedTuple):
    is_census: Callable[[Path], bool]  # is this file a census of the kind
    read: Callable[[Path], pa.Table]  # its rows; one InputError for a file that is not one


class Generator(Protocol):
    def __call__(
        self,
        census: pa.Table,
        wanted: Wanted,
        prior: Selection | None,
        *,
        path: str | Path = ...,
        mmvq: CompiledMmvq | None = ...,
    ) -> Selection: ...


def _module(op: registry.Op | str) -> ModuleType:
    """The tuner module ``registry.OPS`` names for ``op``. ValueError where the name is not one."""
    name = registry.OPS[registry.Op(op)].candidates
    if not name.startswith(PACKAGE + "."):
        raise ValueError(f"{op}: candidate generator {name!r} is not a module of {PACKAGE}")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ValueError(f"{op}: candidate generator {name!r} does not import: {e}") from None


@functools.cache
def generator(op: registry.Op | str) -> Generator:
    """The candidate generator ``registry.OPS`` names for ``op``: the ``candidates`` function of a tuner
    module. ValueError where the name is not a tuner module with one."""
    fn = getattr(_module(op), "candidates", None)
    if not callable(fn):
        raise ValueError(f"{op}: {registry.OPS[registry.Op(op)].candidates} has no candidates() function")
    gen: Generator = fn
    return gen


@functools.cache
def census_reader(kind: str) -> CensusReader:
    """How a census of ``kind`` (registry.CENSUS_KINDS) is recognised and read: the ``is_census`` and
    ``read_census`` functions of the generator module of its first op (the module that knows its rows),
    so a census kind of a new op needs nothing here. ValueError where that module lacks them."""
    ops = registry.census_ops(kind)
    if not ops:
        raise ValueError(f"no op's rows are in a {kind} census")
    module = _module(ops[0])
    is_census, read = getattr(module, "is_census", None), getattr(module, "read_census", None)
    if not callable(is_census) or not callable(read):
        raise ValueError(f"{kind} census: {module.__name__} has no is_census() and read_census()")
    return CensusReader(is_census, read)


def census_kind(path: Path) -> str:
    """Which census (registry.CENSUS_KINDS) a file is: the first kind after the first whose module claims
    it, else the first (the matmul census, whose reader says what is wrong with a file that is neither)."""
    first, *others = registry.CENSUS_KINDS
    return next((k for k in others if census_reader(k).is_census(path)), first)


def select(path: Path, wanted: Wanted, *, mmvq: CompiledMmvq | None = None) -> Selection:
    """The cases of the census at ``path``: every op whose rows its kind holds (registry.census_ops), in
    code order, adds its cases through its generator."""
    kind = census_kind(path)
    table = census_reader(kind).read(path)
    selection: Selection | None = None
    for op in registry.census_ops(kind):
        selection = generator(op)(table, wanted, selection, path=path, mmvq=mmvq)
    if selection is None:  # a census kind no op's rows are in: nothing to time
        raise ValueError(f"{path}: no op's rows are in a {kind} census")
    return selection
