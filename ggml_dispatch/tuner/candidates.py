"""The sweep's cases from a census, through each op's candidate generator.

An op's description (``registry.OPS``) names the census file its rows are in (``census``) and the tuner
module whose ``candidates`` function makes its cases (``candidates``); the core never imports the tuner,
so the name is resolved here. A census is read once; each op whose rows it holds, in code order, adds its
cases to the selection of the ops before it (MUL_MAT_ID's join MUL_MAT's: one sweep, shapes ordered by
their census time). Adding an op to a census is its description plus its generator module: nothing here
or in the sweep names it.

A generator is ``candidates(census, wanted, prior, *, path, mmvq) -> Selection``: ``census`` the file's
rows (Arrow), ``wanted`` the sweep's settings (:class:`tuner.select.Wanted`), ``prior`` the selection of
the census' ops before it (None: the first), ``mmvq`` the mmvq instances the build compiles (None: any).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

import pyarrow as pa

from ggml_dispatch import registry
from ggml_dispatch.artifacts import census as census_artifact
from ggml_dispatch.tuner import attention as tattn
from ggml_dispatch.tuner.select import CompiledMmvq, Selection, Wanted

PACKAGE: Final = "ggml_dispatch.tuner"


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


@functools.cache
def generator(op: registry.Op | str) -> Generator:
    """The candidate generator ``registry.OPS`` names for ``op``: the ``candidates`` function of a tuner
    module. ValueError where the name is not a tuner module with one."""
    name = registry.OPS[registry.Op(op)].candidates
    if not name.startswith(PACKAGE + "."):
        raise ValueError(f"{op}: candidate generator {name!r} is not a module of {PACKAGE}")
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise ValueError(f"{op}: candidate generator {name!r} does not import: {e}") from None
    fn = getattr(module, "candidates", None)
    if not callable(fn):
        raise ValueError(f"{op}: {name} has no candidates() function")
    gen: Generator = fn
    return gen


def census_kind(path: Path) -> str:
    """Which census (registry.CENSUS_KINDS) a file is: an attention census by its schema, else a matmul
    census (whose reader says what is wrong with a file that is neither)."""
    return registry.CENSUS_ATTENTION if tattn.is_attention_census(path) else registry.CENSUS_MATMUL


# census kind -> its reader (the rows, Arrow; one InputError for a file that is not one)
READERS: Final[dict[str, Callable[[Path], pa.Table]]] = {
    registry.CENSUS_MATMUL: lambda p: census_artifact.read(p).table,
    registry.CENSUS_ATTENTION: tattn.read_attention_table,
}


def select(path: Path, wanted: Wanted, *, mmvq: CompiledMmvq | None = None) -> Selection:
    """The cases of the census at ``path``: every op whose rows its kind holds (registry.census_ops), in
    code order, adds its cases through its generator."""
    kind = census_kind(path)
    table = READERS[kind](path)
    selection: Selection | None = None
    for op in registry.census_ops(kind):
        selection = generator(op)(table, wanted, selection, path=path, mmvq=mmvq)
    if selection is None:  # a census kind no op's rows are in: nothing to time
        raise ValueError(f"{path}: no op's rows are in a {kind} census")
    return selection
