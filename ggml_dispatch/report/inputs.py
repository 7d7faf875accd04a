"""What a report reads: tuning, census and table files, validated, with what the provenance section says
about each. The only impure part of the report besides writing it: bad input becomes one
:class:`~ggml_dispatch.errors.InputError` naming the file (and row or field). The A/B records are read
by :mod:`report.ab`, the kernel timelines by :mod:`report.timeline`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ggml_dispatch import fileio, registry
from ggml_dispatch.artifacts import census as census_artifact
from ggml_dispatch.artifacts import table as table_artifact
from ggml_dispatch.artifacts import tuning as tuning_artifact
from ggml_dispatch.artifacts.validators import STATUS_KINDS as STATUS_KINDS
from ggml_dispatch.artifacts.validators import finite as finite
from ggml_dispatch.artifacts.validators import present as present
from ggml_dispatch.artifacts.validators import status_kind as status_kind
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as table_mod
from ggml_dispatch.report import attribution as attribution_mod
from ggml_dispatch.report import timeline

if TYPE_CHECKING:  # report.ab reads its files through InputFile, defined here
    from ggml_dispatch.report.ab import AbRecord

ShapeKey = decide.ShapeKey


@dataclass(frozen=True)
class InputFile:
    """What the provenance section says about one input file."""

    role: str
    name: str
    sha256: str
    details: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TableView:
    """A validated table.json (``codegen.table``), looked up as the runtime would on its own GPU."""

    data: Mapping[str, Any]

    @property
    def rules(self) -> list[dict[str, Any]]:
        return list(self.data["rules"])

    def route_at(self, key: ShapeKey, M: int) -> str | None:
        """The configuration the table picks for a shape key of any op (None: stock), as it was measured."""
        # MUL_MAT_ID: what runs for a call of the key's bucket is the routing-0 rule
        return table_mod.lookup_measured(
            self.data, table_mod.table_gpu(self.data), registry.runtime_key(key), M
        )

    def rules_for(self, key: ShapeKey) -> list[dict[str, Any]]:
        """The shape key's own rules, then the defaults of its type (the key's default fields 0, size-class
        defaults included) that can apply to it."""
        key = registry.runtime_key(key)  # MUL_MAT_ID: the routing-0 rules apply to every bucket
        own = [r for r in self.rules if _key_of(r) == key]
        group = key.group()
        defaults = [r for r in self.rules if _key_of(r) == group] if group != key else []
        return sorted(own, key=lambda r: int(r["M_lo"])) + sorted(defaults, key=lambda r: int(r["M_lo"]))


def _key_of(rule: Mapping[str, Any]) -> Any:
    return registry.shape_key(rule)


def is_default_rule(rule: Mapping[str, Any]) -> bool:
    return bool(registry.shape_key(rule).is_default)


@dataclass
class Inputs:
    tuning: pd.DataFrame
    files: list[InputFile]
    params: decide.Params = field(default_factory=decide.Params)
    census: list[dict[str, Any]] | None = None
    table: TableView | None = None
    ab: list[AbRecord] | None = None
    profile: timeline.Profile | None = None
    attribution: list[attribution_mod.Phase] | None = None
    notes: str | None = None


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in df.to_dict("records")]


def load_tuning(path: Path, params: decide.Params) -> tuple[pd.DataFrame, InputFile]:
    """tuning.parquet through the one tuning reader (the validators every command uses), plus the
    decision code's row checks."""
    t = tuning_artifact.read(path, allow_mixed=params.allow_mixed)
    df = t.frame()
    decide.check_rows(df, path, params)
    return df, InputFile("tuning", path.name, t.sha256, tuple(t.details()))


def load_census(path: Path) -> tuple[list[dict[str, Any]], InputFile]:
    c = census_artifact.read(path)
    return c.rows(), InputFile("census", path.name, c.sha256, tuple(c.details()))


def load_table(path: Path) -> tuple[TableView, InputFile]:
    """table.json through the one table reader (the validation codegen and install use)."""
    t = table_artifact.read(path)
    return TableView(t.data), InputFile("table", path.name, t.sha256, tuple(t.details()))


def params_from_table(table: TableView | None, reference_margin: float | None = None) -> decide.Params:
    """Decision parameters the table was made with (so verdicts match it), else the defaults."""
    base = decide.Params(reference_margin=reference_margin)
    if table is None:
        return base
    dec = table.data.get("provenance", {}).get("decision")
    if not isinstance(dec, dict):
        return base
    known = table_mod.DECISION_PARAMS
    kwargs: dict[str, Any] = {known[k]: v for k, v in dec.items() if k in known and v is not None}
    if reference_margin is not None:
        kwargs["reference_margin"] = reference_margin
    return decide.Params(**kwargs)


def attribution_file(path: Path, phases: Sequence[attribution_mod.Phase]) -> InputFile:
    """What the provenance section says about a server profile (a folder has no single hash)."""
    digest = fileio.sha256_file(path) if path.is_file() else "-"
    return InputFile("server profile", path.name, digest, (("phases", str(len(phases))),))


def profile_file(path: Path, profile: timeline.Profile) -> InputFile:
    """What the provenance section says about a profile (a folder has no single hash)."""
    digest = fileio.sha256_file(path) if path.is_file() else "-"
    return InputFile("profile", path.name, digest, (("timelines", str(len(profile.rows))),))
