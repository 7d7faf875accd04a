"""Which cases a sweep measures: census rows -> harness cases. Pure.

Policy (ARCHITECTURE.md "Census", "Decision rule"):

* Only rows a table can override are tuned: MUL_MAT, not fused. Fused groups (``fused`` set) never
  reach the table's lookup; both they and MUL_MAT_ID rows are counted and reported as skipped here
  (MUL_MAT_ID rows are selected by tuner.mul_mat_id, which the sweep adds: tuner.candidates).
  The attention layout is opt-in (``layouts``): the harness builds it as a KV-cache-like view with B
  heads, but the census does not say how many KV heads are broadcast (GQA), so its timings are an
  approximation.
* Coverage is by estimated time, never by call counts: the tunable points (shape key + M, ``est_us``
  summed over the census rows that share them) are taken in decreasing ``est_us`` until their sum
  reaches ``coverage`` of the tunable total.
* A rule covers only M values between two measured neighbours that both pass, so each selected M gets
  its neighbours on the declared grid (powers of two, 1 .. 16384): the largest grid value below it
  and the smallest above it. A census M that is itself a grid value still gets both neighbours, so
  every census M sits inside a measured interval.
* ``whole_shapes``: coverage picks the shapes, and every census M of a picked shape is measured. Small
  M values (decode, speculative verify) have small roofline estimates, so point coverage alone leaves
  them unmeasured on all but the largest shapes, and a rule cannot cover them.
* Cases are ordered by their shape's total ``est_us`` (largest first), then by M, so a sweep cut
  short by ``--max-seconds`` has measured what matters most.
"""

from __future__ import annotations

import fnmatch
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import pyarrow as pa

from ggml_dispatch import registry, schema
from ggml_dispatch.errors import InputError

M_GRID: Final[tuple[int, ...]] = tuple(2**i for i in range(15))  # 1 .. 16384
# the matmul routes (the FLASH_ATTN_EXT kernels serve no matmul case)
_MATMUL_OPS: Final = {registry.Op.MUL_MAT, registry.Op.MUL_MAT_ID}
ALL_ROUTES: Final[tuple[str, ...]] = tuple(
    r.value for r in schema.Route if _MATMUL_OPS & set(registry.ROUTES[r].ops)
)
CONFIG_MODES: Final = ("all", "routes", "cache")


def candidate_configs(routes: Sequence[str], mode: str = "all") -> tuple[str, ...]:
    """The candidates of a point: ``routes`` = the plain routes; ``all`` = every configuration of each
    route (registry.route_configs: the plain route, then every combination of its parameter values);
    ``cache`` = the plain routes plus cuBLAS in f16 compute, each output type, per call and from the
    cached weight copy (what the weight cache's decision needs, at a fraction of ``all``'s cost)."""
    if mode == "routes":
        return tuple(routes)
    if mode == "cache":
        extra = [
            str(c)
            for c in registry.route_configs(registry.Route.CUBLAS)
            if dict(c.params).get("compute") == "f16"
        ]
        return tuple(routes) + (tuple(extra) if registry.Route.CUBLAS.value in routes else ())
    if mode != "all":
        raise ValueError(f"configs mode {mode!r} is not one of {', '.join(CONFIG_MODES)}")
    return tuple(str(c) for r in routes for c in registry.route_configs(r))


class CompiledMmvq(Protocol):
    """Which mmvq candidate instances a build compiles (registry.MmvqBuild)."""

    def compiled(self, src0_type: str, pair: tuple[int, int], regs: int = 0) -> bool: ...


class Wanted(Protocol):
    """What a sweep asks of the candidate generators (tuner.run.SweepSettings): the candidates
    (configurations), trials and numerics threshold per case, the share of the census' est_us to cover,
    and the op-specific choices (MUL_MAT: layouts, whole shapes; MUL_MAT_ID: routing kinds)."""

    @property
    def routes(self) -> tuple[str, ...]: ...
    @property
    def trials(self) -> int: ...
    @property
    def nmse_max(self) -> float: ...
    @property
    def coverage(self) -> float: ...
    @property
    def layouts(self) -> tuple[str, ...]: ...
    @property
    def whole_shapes(self) -> bool: ...
    @property
    def routing_kinds(self) -> tuple[str, ...]: ...


def configs_at(
    configs: Sequence[str], M: int, src0_type: str, mmvq: CompiledMmvq | None = None
) -> tuple[str, ...]:
    """The MUL_MAT candidates of one point: the decode launch shapes (mmvq's nwarps x rows, mmvf's block)
    only where the vector kernels run, M <= registry.MMVQ_MAX_COLS (beyond it they are ineligible, and the
    harness would spend an eligibility run on each), and an mmvq pair only where the build compiled it for
    the weight type (``mmvq``: the tree's install; None: every candidate)."""
    out = []
    for text in configs:
        c = registry.Config.parse(text)
        if c.route in (registry.Route.MMVQ, registry.Route.MMVF) and c.params:
            if M > registry.MMVQ_MAX_COLS:
                continue
            values = dict(c.params)
            pair = registry.mmvq_params_pair(values) if c.route is registry.Route.MMVQ else None
            regs = registry.mmvq_params_regs(values)
            if pair is not None and mmvq is not None and not mmvq.compiled(src0_type, pair, regs):
                continue
        out.append(text)
    return tuple(out)


def mul_mat_configs(configs: Sequence[str]) -> tuple[str, ...]:
    """The MUL_MAT candidates among ``configs``: not a MUL_MAT_ID-only route (id_sorted) or parameter
    (mmq's split)."""
    return tuple(c for c in configs if registry.route_allowed(registry.Op.MUL_MAT, c))


def only_configs(configs: Sequence[str], patterns: Sequence[str]) -> tuple[str, ...]:
    """The candidates whose text matches one of the shell-style ``patterns`` (all of them without any):
    a focused sweep, e.g. ``*split=2j_fused`` (stock always runs beside them). ValueError names a
    pattern that matches no candidate."""
    if not patterns:
        return tuple(configs)
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(c, pat) for c in configs):
            raise ValueError(f"{pat!r} matches no candidate configuration")
    return tuple(c for c in configs if any(fnmatch.fnmatchcase(c, pat) for pat in patterns))


TUNABLE_LAYOUTS: Final = frozenset({schema.Layout.WEIGHT.value, schema.Layout.ATTENTION.value})
DEFAULT_LAYOUTS: Final[tuple[str, ...]] = (schema.Layout.WEIGHT.value,)
DEFAULT_TRIALS: Final = 7
DEFAULT_NMSE_MAX: Final = 5e-4  # test-backend-ops' threshold for MUL_MAT

# census columns the selection reads
NEEDED_COLUMNS: Final = ("op", "layout", "fused", "src0_type", "src1_type", "M", "N", "K", "B", "est_us")


ShapeKey = schema.ShapeKey


@dataclass(frozen=True)
class Case:
    shape: ShapeKey
    M: int
    est_us: float  # census time at this point (0 for a neighbour the census does not have)
    census: bool  # M came from the census (else: a grid neighbour)
    routes: tuple[str, ...] = ALL_ROUTES
    trials: int = DEFAULT_TRIALS
    nmse_max: float = DEFAULT_NMSE_MAX

    @property
    def id(self) -> str:
        return f"{self.shape.id()}:M{self.M}"

    def spec(self) -> dict[str, Any]:
        """The harness case object (interface 5)."""
        return {
            "case": self.id,
            "op": self.shape.op,
            "layout": self.shape.layout,
            "src0_type": self.shape.src0_type,
            "src1_type": self.shape.src1_type,
            "M": self.M,
            "N": self.shape.N,
            "K": self.shape.K,
            "B": self.shape.B,
            "routes": list(self.routes),
            "trials": self.trials,
            "nmse_max": self.nmse_max,
        }


@dataclass
class Selection:
    cases: list[Case]
    total_est_us: float  # every census row
    tunable_est_us: float  # rows a table can override
    covered_est_us: float  # the selected census points
    skipped: dict[str, float] = field(default_factory=dict)  # reason -> est_us left out
    skipped_rows: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        n_shapes = len({c.shape for c in self.cases})
        n_census = sum(c.census for c in self.cases)
        frac = self.covered_est_us / self.tunable_est_us if self.tunable_est_us > 0 else 0.0
        frac_all = self.covered_est_us / self.total_est_us if self.total_est_us > 0 else 0.0
        moe = [c for c in self.cases if getattr(c, "routing_kind", None)]  # tuner.mul_mat_id cases
        n_census -= len(moe)
        n_grid = len(self.cases) - len(moe) - n_census
        parts = [
            f"{len(self.cases)} cases ({n_census} census points + {n_grid} grid neighbours"
            + (
                f" + {len(moe)} MUL_MAT_ID cases: {len({(c.shape, c.M) for c in moe})} census points x "
                f"{len({getattr(c, 'routing_kind', '') for c in moe})} routing kinds"
                if moe
                else ""
            )
            + f") over {n_shapes} shapes",
            f"covering {100 * frac:.1f}% of the tunable est_us ({100 * frac_all:.1f}% of all)",
        ]
        for reason, us in sorted(self.skipped.items()):
            share = us / self.total_est_us if self.total_est_us > 0 else 0.0
            parts.append(f"skipped {self.skipped_rows[reason]} rows {reason} ({100 * share:.1f}% of est_us)")
        return "; ".join(parts)


def grid_neighbours(M: int, grid: Sequence[int] = M_GRID) -> tuple[int | None, int | None]:
    """The largest grid value below M and the smallest above it (None where the grid ends)."""
    below = max((g for g in grid if g < M), default=None)
    above = min((g for g in grid if g > M), default=None)
    return below, above


def census_fused(v: Any) -> bool:
    """A census row's ``fused`` names a fused group (null, NaN and "" do not)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) != ""


def census_types(row: Mapping[str, Any], path: str | Path, where: str) -> None:
    """A census row's src0/src1 types are ggml types, or one clear error naming the row and field."""
    for col in ("src0_type", "src1_type"):
        if str(row[col]) not in schema.GGML_TYPES:
            raise InputError(path, f"unknown ggml type {row[col]!r}", field=f"{where}: {col}")


def census_int(v: Any, path: str | Path, where: str, name: str) -> int:
    """A census row's positive integer field, or one clear error naming the row and field."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InputError(path, f"must be a positive integer, got {v!r}", field=f"{where}: {name}") from None
    if not math.isfinite(f) or f < 1 or f != int(f):
        raise InputError(path, f"must be a positive integer, got {v!r}", field=f"{where}: {name}")
    return int(f)


def select_cases(
    rows: Iterable[dict[str, Any]],
    *,
    coverage: float = 0.95,
    routes: Sequence[str] = ALL_ROUTES,
    trials: int = DEFAULT_TRIALS,
    nmse_max: float = DEFAULT_NMSE_MAX,
    grid: Sequence[int] = M_GRID,
    layouts: Sequence[str] = DEFAULT_LAYOUTS,
    whole_shapes: bool = False,
    path: str | Path = "<census>",
    mmvq: CompiledMmvq | None = None,
) -> Selection:
    """Pick the cases to measure from census rows (dicts with at least NEEDED_COLUMNS); each case's
    candidates are :func:`configs_at` its M and weight type (``mmvq``: the build's mmvq instances)."""
    if not 0 < coverage <= 1:
        raise InputError(None, f"--coverage must be in (0, 1], got {coverage}", field="coverage")
    bad = [x for x in layouts if x not in TUNABLE_LAYOUTS]
    if bad or not layouts:
        raise InputError(
            None, f"layouts must be among {sorted(TUNABLE_LAYOUTS)}, got {list(layouts)}", field="layouts"
        )
    mul_mat_routes = mul_mat_configs(routes)
    points: dict[tuple[ShapeKey, int], float] = defaultdict(float)
    total = 0.0
    skipped: dict[str, float] = defaultdict(float)
    skipped_rows: dict[str, int] = defaultdict(int)
    for i, r in enumerate(rows):
        where = f"row {i}"
        try:
            est = float(r["est_us"])
        except (TypeError, ValueError):
            raise InputError(
                path, f"must be a number, got {r['est_us']!r}", field=f"{where}: est_us"
            ) from None
        if not math.isfinite(est) or est < 0:
            raise InputError(path, f"must be a finite number >= 0, got {est!r}", field=f"{where}: est_us")
        total += est
        if census_fused(r.get("fused")):
            skipped["fused (the table does not override fused groups)"] += est
            skipped_rows["fused (the table does not override fused groups)"] += 1
            continue
        op, layout = str(r["op"]), str(r["layout"])
        if op != schema.Op.MUL_MAT.value or layout not in TUNABLE_LAYOUTS:
            reason = f"{op}/{layout} (no tuning key for it)"
            skipped[reason] += est
            skipped_rows[reason] += 1
            continue
        if layout not in layouts:
            reason = f"{layout} layout (not asked for: --layouts)"
            skipped[reason] += est
            skipped_rows[reason] += 1
            continue
        census_types(r, path, where)
        key = ShapeKey(
            op=op,
            layout=layout,
            src0_type=str(r["src0_type"]),
            src1_type=str(r["src1_type"]),
            N=census_int(r["N"], path, where, "N"),
            K=census_int(r["K"], path, where, "K"),
            B=census_int(r["B"], path, where, "B"),
        )
        points[(key, census_int(r["M"], path, where, "M"))] += est

    tunable = sum(points.values())
    ranked = sorted(points.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))
    chosen: dict[ShapeKey, dict[int, float]] = defaultdict(dict)
    covered = 0.0
    for (key, M), est in ranked:
        if tunable > 0 and covered >= coverage * tunable:
            break
        chosen[key][M] = est
        covered += est

    if whole_shapes:
        for (key, M), est in points.items():
            if key in chosen and M not in chosen[key]:
                chosen[key][M] = est
                covered += est

    cases: list[Case] = []
    shape_order = sorted(chosen, key=lambda k: (-sum(chosen[k].values()), k))
    for key in shape_order:
        census_ms = chosen[key]
        ms: set[int] = set(census_ms)
        for M in census_ms:
            below, above = grid_neighbours(M, grid)
            ms.update(m for m in (below, above) if m is not None)
        for M in sorted(ms):
            cases.append(
                Case(
                    shape=key,
                    M=M,
                    est_us=census_ms.get(M, points.get((key, M), 0.0)),
                    census=M in census_ms,
                    routes=configs_at(mul_mat_routes, M, key.src0_type, mmvq),
                    trials=trials,
                    nmse_max=nmse_max,
                )
            )
    return Selection(
        cases=cases,
        total_est_us=total,
        tunable_est_us=tunable,
        covered_est_us=covered,
        skipped=dict(skipped),
        skipped_rows=dict(skipped_rows),
    )


def is_census(path: Path) -> bool:
    """Any file that no other census kind claims is read as a matmul census (tuner.candidates)."""
    return True


def read_census(path: Path) -> pa.Table:
    """A matmul census' rows (Arrow); one InputError for a file that is not one."""
    from ggml_dispatch.artifacts import census as census_artifact

    return census_artifact.read(path).table


def candidates(
    census: pa.Table,
    wanted: Wanted,
    prior: Selection | None,
    *,
    path: str | Path = "<census>",
    mmvq: CompiledMmvq | None = None,
) -> Selection:
    """MUL_MAT's candidate generator (registry.OPS names this module; tuner.candidates calls it): the cases
    of the matmul census' MUL_MAT points, :func:`select_cases`. The first op of its census: no ``prior``."""
    if prior is not None:
        raise ValueError("MUL_MAT's cases are the first of a matmul census: no prior selection")
    return select_cases(
        census.select(list(NEEDED_COLUMNS)).to_pylist(),
        coverage=wanted.coverage,
        routes=wanted.routes,
        trials=wanted.trials,
        nmse_max=wanted.nmse_max,
        layouts=wanted.layouts,
        whole_shapes=wanted.whole_shapes,
        path=path,
        mmvq=mmvq,
    )


def parse_shard(text: str) -> tuple[int, int]:
    """``i/n`` -> (i, n) with 0 <= i < n."""
    try:
        a, b = text.split("/")
        i, n = int(a), int(b)
    except ValueError:
        raise InputError(
            None, f"--shard must look like i/n (e.g. 0/2), got {text!r}", field="shard"
        ) from None
    if n < 1 or not 0 <= i < n:
        raise InputError(None, f"--shard {text}: need 0 <= i < n", field="shard")
    return i, n


def shard_cases(cases: Sequence[Case], shard: tuple[int, int]) -> list[Case]:
    """Shard i of n: whole shapes dealt round-robin in the selection's order (largest first), so shards
    get similar work and every shape's M neighbours are measured on the same GPU."""
    i, n = shard
    shapes = list(dict.fromkeys(c.shape for c in cases))
    mine = {s for k, s in enumerate(shapes) if k % n == i}
    return [c for c in cases if c.shape in mine]
