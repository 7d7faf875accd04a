"""Tuning rows -> dispatch decisions (rules) and the list of refused candidates. Pure.

The rule of ARCHITECTURE.md ("Decision rule"), as implemented here:

* A *point* is (shape key, M), the shape key being ``schema.SHAPE_KEY`` = (op, layout, src0_type,
  src1_type, N, K, B). A *candidate* at a point is a route with at least one ``ok`` trial there; every
  other status (ineligible, wrong, drifted, failed:...) is skipped, and so is an ``ok`` trial whose
  recorded ``route_ran`` is another route.
* Pairing with stock: every trial re-measures stock as ``anchor_us``, so each ok trial of a route gives
  one paired ratio ``anchor_us / us`` (> 1: the route is faster than stock in that trial). The ratio
  statistic is the **median of the per-trial ratios**; its 95% CI is a percentile bootstrap over trials
  (pairs resampled together; 2000 resamples; a fixed seed derived from the point and route, so a
  decision never depends on which other points are in the file).
* The winner is the *contender* with the lowest median ``us``: a candidate that the tuner's race did not
  stop (status ``pruned`` in later trials: it lost a paired comparison beyond noise) and that never
  failed the numerics check at the point (``wrong`` in any trial: its output depends on state, so it is
  not trusted in the trials it passed either). It *passes* (may replace stock) when it has
  at least ``min_trials`` paired ok trials, its ratio is >= 1 + theta and the CI's lower end is > 1.
  "Slower than stock beyond noise" is the CI's upper end < 1.
* Reference rows (``source = reference``, one sample, no CI) pass only when ratio >= 1 +
  max(theta, margin), the margin being declared by the caller; they are slower beyond noise when
  ratio < 1 / (1 + margin).
* Exact rules: per shape key the measured M values (any row, any status) are sorted; a rule covers a
  maximal run of consecutive measured M values at which the same route wins and passes, and every M
  between them. M outside the outermost passing measured M stays stock; a measured M where the route
  does not pass (or was not measured) breaks the run.
* Per-type defaults (N = K = 0, "any (N, K)"): per (op, layout, src0_type, src1_type, B) with at least
  ``min_default_shapes`` measured (N, K). The grid is the M values measured at every one of those
  shapes. At each grid M the route with the smallest worst-case regret over the shapes (regret = its
  median / the shape's best median - 1) is the candidate; it is admitted only where it passes at every
  shape, and a run of grid M values extends over a gap only when the route also passes at every
  measured M of every shape inside the gap. So a default never covers a measured point where it is not
  faster than stock beyond noise, and the runtime prefers an exact (N, K) rule over a default.
* Rules that reach past the measured points (:func:`carried_rules`, on by default): ``interpolated``
  rules inside gaps between adjacent measured M from a fitted crossover (``codegen.crossover``), and
  size-class defaults for unseen (N, K) by N*K (``codegen.classes``). Every rule carries its kind:
  ``measured``, ``interpolated`` or ``default``. The full statement is ARCHITECTURE.md, "Decision rule".
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
import pandas as pd

from ggml_dispatch import registry, schema
from ggml_dispatch.artifacts import tuning as tuning_artifact
from ggml_dispatch.errors import InputError

DEFAULT_THETA: Final = 0.03
DEFAULT_RESAMPLES: Final = 2000
DEFAULT_CONFIDENCE: Final = 0.95
DEFAULT_SEED: Final = 20261130
DEFAULT_MIN_TRIALS: Final = 3
DEFAULT_MIN_DEFAULT_SHAPES: Final = 2
DEFAULT_STOCK_TOLERANCE: Final = 0.02  # a route within 2% of the anchor at a point is taken to be stock's
DEFAULT_CLASS_GAP: Final = (
    4.0  # size classes split where N*K of adjacent measured shapes differ by 4x or more
)

KIND_MEASURED: Final = "measured"
KIND_INTERPOLATED: Final = "interpolated"
KIND_DEFAULT: Final = "default"
RULE_KINDS: Final = (KIND_MEASURED, KIND_INTERPOLATED, KIND_DEFAULT)

_OPS: Final = frozenset(o.value for o in schema.Op)
_LAYOUTS: Final = frozenset(lay.value for lay in schema.Layout)
CONFIG_COLUMN: Final = "config"  # optional tuning column: the configuration timed (else its plain route)
# the typed candidate of each row (registry.Config), added once by with_configs; never written to a file
TYPED_COLUMN: Final = "_config"

Config = registry.Config


def _order(config: Config) -> tuple[int, int]:
    """Tie-break order of candidates: route code, then configuration code."""
    return config.order


def parse_config(row: Mapping[str, Any]) -> Config:
    """The candidate a tuning row measured: its ``config`` when set, else its plain ``route``, parsed
    (ConfigError if it names no configuration)."""
    c = row.get(CONFIG_COLUMN)
    if c is None or (isinstance(c, float) and math.isnan(c)):
        c = row["route"]
    return Config.parse(str(c))


def config_of(row: Mapping[str, Any]) -> Config:
    """A tuning row's candidate: the typed column :func:`with_configs` added, else parsed from the row."""
    c = row.get(TYPED_COLUMN)
    return c if isinstance(c, Config) else parse_config(row)


def _named(row: Mapping[str, Any]) -> bool:
    """Whether a row names its candidate in ``config`` (else its plain ``route`` is the candidate)."""
    given = row.get(CONFIG_COLUMN)
    return isinstance(given, str) or (given is not None and not isinstance(given, float))


def _config_field(row: Mapping[str, Any], i: int) -> str:
    """The field an error about row ``i``'s candidate names."""
    return f"row {i}: {CONFIG_COLUMN}" if _named(row) else f"row {i}: route"


def with_configs(df: pd.DataFrame, path: str | Path = "<tuning>") -> pd.DataFrame:
    """The rows with their candidates parsed once into a typed column (``TYPED_COLUMN``): where tuning
    rows enter the decision, every later step reads the ``registry.Config`` there. A frame that has
    the column already is returned as it is. InputError naming the first row whose ``config`` (else
    ``route``) names no configuration."""
    if TYPED_COLUMN in df.columns or "route" not in df.columns:  # (a missing column: the row checks say)
        return df
    cols = ["route", *([CONFIG_COLUMN] if CONFIG_COLUMN in df.columns else [])]
    parsed: dict[tuple[Any, ...], Config] = {}  # one parse per distinct spelling
    out = []
    for i, rec in enumerate(df[cols].to_dict("records")):
        row = {str(k): v for k, v in rec.items()}
        spelled = (row.get(CONFIG_COLUMN) if _named(row) else None, row["route"])
        if spelled not in parsed:
            try:
                parsed[spelled] = parse_config(row)
            except registry.ConfigError as e:
                raise InputError(path, str(e), field=_config_field(row, i)) from None
        out.append(parsed[spelled])
    return df.assign(**{TYPED_COLUMN: pd.Series(out, index=df.index, dtype=object)})


def configs(df: pd.DataFrame, path: str | Path = "<tuning>") -> pd.Series:
    """Each row's candidate (``registry.Config``), from the typed column where there is one."""
    return with_configs(df, path)[TYPED_COLUMN]


@dataclass(frozen=True)
class Params:
    theta: float = DEFAULT_THETA
    reference_margin: float | None = None
    min_trials: int = DEFAULT_MIN_TRIALS
    resamples: int = DEFAULT_RESAMPLES
    confidence: float = DEFAULT_CONFIDENCE
    seed: int = DEFAULT_SEED
    min_default_shapes: int = DEFAULT_MIN_DEFAULT_SHAPES
    allow_mixed: bool = False
    interpolate: bool = True  # rules between measured M from a fitted crossover (codegen.crossover)
    class_defaults: bool = True  # size-class defaults for unseen (N, K) (codegen.classes)
    stock_tolerance: float = DEFAULT_STOCK_TOLERANCE
    class_gap: float = DEFAULT_CLASS_GAP
    # the ops whose rows were selected for the decision (select_ops; None: every op), recorded in the table
    ops: tuple[str, ...] | None = None


ShapeKey = schema.ShapeKey  # MUL_MAT's key; every op's key class has the same interface (registry)


@dataclass(frozen=True)
class RouteEval:
    """One route at one point."""

    route: Config
    n_rows: int
    n_ok: int
    n_paired: int  # ok trials with a usable stock anchor
    statuses: tuple[tuple[str, int], ...]  # non-ok statuses and their counts
    median_us: float | None
    stock_us: float | None  # median anchor over the paired trials
    ratio: float | None  # median of per-trial stock/route ratios
    ci_low: float | None
    ci_high: float | None
    reference: bool
    is_anchor: bool = False  # reference rows: this sample is the stock anchor itself (stock's own route)
    ratios: tuple[float, ...] = ()  # the per-trial paired ratios (what the bootstraps resample)

    @property
    def raced_out(self) -> bool:
        """A racing tuner stopped timing it: slower than the point's best beyond noise, in paired trials."""
        return any(s == schema.TrialStatus.PRUNED.value for s, _ in self.statuses)

    @property
    def numerics_failed(self) -> bool:
        """Its output was off the CPU backend's beyond the declared NMSE in at least one trial here."""
        return any(s == schema.TrialStatus.WRONG.value for s, _ in self.statuses)


@dataclass(frozen=True)
class Verdict:
    passes: bool
    reason: str  # empty when it passes


@dataclass(frozen=True)
class Rule:
    key: ShapeKey
    M_lo: int
    M_hi: int
    route: Config
    measured_M: tuple[int, ...]  # measured M values the rule covers
    min_ratio: float  # smallest stock/route ratio at those points (over every shape, for defaults)
    shapes: tuple[tuple[int, int], ...] = ()  # defaults: the measured (N, K) that admitted it
    rule_kind: str | None = None  # None: measured (exact N, K) or default (N = K = 0), from the key
    between: tuple[int, int] | None = None  # interpolated: the measured M on either side of the gap
    ci_low: float | None = None  # interpolated: smallest lower end of the fitted ratio's interval
    crossover: tuple[float, float, float] | None = None  # interpolated: M at 1 + theta (point, lo, hi)
    NK: tuple[int, int] | None = None  # size-class default: N*K range [lo, hi] it applies to
    # MUL_MAT_ID (routing 0): the routing buckets it was admitted on, each with its smallest ratio there
    buckets: tuple[tuple[str, float], ...] = ()
    # family size-class default (codegen.classes.family_rules): the type of each of ``shapes``
    shape_types: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        if self.rule_kind is not None:
            return self.rule_kind
        return KIND_DEFAULT if self.key.is_default else KIND_MEASURED


@dataclass(frozen=True)
class Refusal:
    route: Config
    key: ShapeKey  # N = K = 0 for a default candidate
    M: int
    reason: str
    refusal_kind: str | None = None

    @property
    def kind(self) -> str:
        if self.refusal_kind is not None:
            return self.refusal_kind
        return KIND_DEFAULT if self.key.is_default else KIND_MEASURED


@dataclass
class Identity:
    gpu: schema.GpuId
    upstream_commit: str
    source: str  # schema.Source.MEASURED or REFERENCE
    gpus: list[tuple[schema.GpuId, int]] = field(default_factory=list)  # every GPU and its row count
    upstream_commits: list[tuple[str, int]] = field(default_factory=list)
    patch_hashes: list[str] = field(default_factory=list)
    harness_versions: list[str] = field(default_factory=list)
    drivers: list[str] = field(default_factory=list)
    cuda_versions: list[str] = field(default_factory=list)
    cublas_versions: list[str] = field(default_factory=list)

    @property
    def mixed(self) -> bool:
        return len(self.gpus) > 1 or len(self.upstream_commits) > 1


@dataclass
class Decisions:
    identity: Identity
    params: Params
    rules: list[Rule]
    refusals: list[Refusal]
    evals: dict[ShapeKey, dict[int, dict[Config, RouteEval]]]  # key -> M -> configuration -> eval
    stock_us: dict[ShapeKey, dict[int, float]]  # key -> M -> median stock time over the point's anchors
    n_rows: int
    n_ok: int
    routing_buckets: list[Any] = field(default_factory=list)  # codegen.moe.BucketPoint per MUL_MAT_ID point
    moe_used: Mapping[tuple[Any, int], int] = field(default_factory=dict)  # experts per token per point


# --------------------------------------------------------------------------------------------
# Input checks


def _check_configs(df: pd.DataFrame, path: str | Path) -> None:
    """Each row's candidate (``config``, else ``route``) is a configuration of its route that its op may
    run."""
    has_config = CONFIG_COLUMN in df.columns
    cols = ["op", "route", *([CONFIG_COLUMN] if has_config else [])]
    records: list[dict[str, Any]] = [
        {str(k): v for k, v in rec.items()} for rec in df[cols].to_dict("records")
    ]
    for i, (r, config) in enumerate(zip(records, configs(df, path), strict=True)):
        if config.route.value != r["route"]:
            raise InputError(
                path,
                f"config {str(config)!r} is not a configuration of route {r['route']!r}",
                field=_config_field(r, i),
            )
        if not registry.route_allowed(r["op"], config):
            raise InputError(path, f"route {r['route']!r} does not serve {r['op']}", field=f"row {i}: route")


def check_rows(df: pd.DataFrame, path: str | Path, params: Params) -> Identity:
    """Validate tuning rows with the tuning file's own checks (:mod:`ggml_dispatch.artifacts.tuning`),
    then the evidence rules of a decision; return the table's identity. Raises InputError naming the
    row."""
    return _checked(df, path, params)[0]


def _checked(df: pd.DataFrame, path: str | Path, params: Params) -> tuple[Identity, pd.DataFrame]:
    """:func:`check_rows`, and the rows with their typed configurations (:func:`with_configs`)."""
    table = tuning_artifact.from_frame(df, path)
    df = with_configs(df, path)
    _check_configs(df, path)
    prov = tuning_artifact.provenance(table, path, allow_mixed=params.allow_mixed)
    sources = set(prov.sources)
    if schema.Source.REFERENCE.value in sources:
        if len(sources) > 1:
            raise InputError(
                path,
                "rows mix source = reference and measured; build a table from one kind of evidence",
                field="source",
            )
        if params.reference_margin is None:
            raise InputError(
                path,
                "rows have source = reference (one sample, no confidence interval): they are accepted only "
                "with --reference-margin X, a declared fixed margin",
                field="source",
            )
    if prov.gpu.cc <= 0 or prov.gpu.sm_count <= 0:
        raise InputError(
            path,
            f"rows were measured on {prov.gpu.name or 'a backend'} without a GPU identity (cc "
            f"{prov.gpu.cc}, {prov.gpu.sm_count} SMs): a table applies only on a measured GPU",
            field="gpu_cc",
        )
    # With --allow-mixed the table is stamped with the GPU and commit that contributed most rows.
    identity = Identity(
        gpu=prov.gpu,
        upstream_commit=prov.upstream_commit,
        source=next(iter(sorted(sources))),
        gpus=list(prov.gpus),
        upstream_commits=list(prov.upstream_commits),
        patch_hashes=list(prov.patch_hashes),
        harness_versions=list(prov.harness_versions),
        drivers=list(prov.drivers),
        cuda_versions=list(prov.cuda_versions),
        cublas_versions=list(prov.cublas_versions),
    )
    return identity, df


# --------------------------------------------------------------------------------------------
# Per-point statistics


def _seed_for(base: int, key: ShapeKey, M: int, route: Config | str) -> int:
    text = f"{base}|{key.seed_text()}|{M}|{route}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def bootstrap_ci(ratios: Sequence[float], params: Params, seed: int) -> tuple[float, float]:
    """Percentile bootstrap CI of the median of paired ratios (trials resampled with replacement)."""
    r = np.asarray(ratios, dtype=np.float64)
    rng = np.random.Generator(np.random.PCG64(seed))
    idx = rng.integers(0, len(r), size=(params.resamples, len(r)))
    medians = np.median(r[idx], axis=1)
    tail = (1.0 - params.confidence) / 2.0
    lo, hi = np.quantile(medians, [tail, 1.0 - tail])
    return float(lo), float(hi)


def evaluate_route(key: ShapeKey, M: int, route: Config, rows: pd.DataFrame, params: Params) -> RouteEval:
    is_ok = rows["status"] == schema.TrialStatus.OK.value
    # an ok trial counts only if the route that really ran is the one asked for (when recorded)
    ran = rows["route_ran"]
    ran_other = is_ok & ran.notna() & (ran != route.route.value)
    ok = rows[is_ok & ~ran_other]
    statuses = Counter(str(s) for s in rows.loc[~is_ok, "status"])
    statuses.update(f"ok but {r} ran" for r in rows.loc[ran_other, "route_ran"])
    reference = bool((rows["source"] == schema.Source.REFERENCE.value).any())
    us = ok["us"].astype(float).to_numpy()
    anchor = ok["anchor_us"].astype(float).to_numpy()
    paired = np.isfinite(anchor) & (anchor > 0)
    ratios = anchor[paired] / us[paired]
    median_us = float(np.median(us)) if len(us) else None
    stock_us = float(np.median(anchor[paired])) if paired.any() else None
    ratio = float(np.median(ratios)) if len(ratios) else None
    ci_low = ci_high = None
    if not reference and len(ratios) >= 2 and params.resamples > 0:
        ci_low, ci_high = bootstrap_ci(list(ratios), params, _seed_for(params.seed, key, M, route))
    return RouteEval(
        route=route,
        n_rows=len(rows),
        n_ok=len(ok),
        n_paired=int(paired.sum()),
        statuses=tuple(sorted(statuses.items())),
        median_us=median_us,
        stock_us=stock_us,
        ratio=ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        reference=reference,
        is_anchor=reference and bool(paired.any()) and bool(np.all(anchor[paired] == us[paired])),
        ratios=tuple(float(x) for x in ratios),
    )


def required_ratio(ev: RouteEval, params: Params) -> float:
    if ev.reference:
        assert params.reference_margin is not None
        return 1.0 + max(params.theta, params.reference_margin)
    return 1.0 + params.theta


def verdict(ev: RouteEval, params: Params) -> Verdict:
    """May this route replace stock at this point (ignoring whether it is the fastest)?"""
    if ev.n_ok == 0:
        what = ", ".join(f"{s} x{n}" for s, n in ev.statuses) or "none"
        return Verdict(False, f"no ok trial ({what})")
    if ev.numerics_failed:
        n = dict(ev.statuses)[schema.TrialStatus.WRONG.value]
        return Verdict(False, f"wrong in {n} trial(s): off the CPU backend beyond the NMSE threshold")
    if ev.n_paired == 0 or ev.ratio is None:
        return Verdict(False, "no stock anchor in its ok trials")
    need = required_ratio(ev, params)
    if ev.reference:
        if ev.is_anchor:
            return Verdict(False, "stock's own route here (its sample is the stock anchor)")
        if ev.ratio < need:
            return Verdict(
                False, f"ratio {ev.ratio:.3f}x below {need:.3f}x (1 + max(theta, reference margin))"
            )
        return Verdict(True, "")
    if ev.n_paired < params.min_trials:
        return Verdict(False, f"only {ev.n_paired} paired ok trials (< {params.min_trials})")
    if ev.ratio < need:
        return Verdict(False, f"ratio {ev.ratio:.3f}x below {need:.3f}x (1 + theta)")
    assert ev.ci_low is not None
    if ev.ci_low <= 1.0:
        return Verdict(
            False,
            f"ratio {ev.ratio:.3f}x but the {params.confidence:.0%} CI low end "
            f"{ev.ci_low:.3f} is not above 1",
        )
    return Verdict(True, "")


def slower_beyond_noise(ev: RouteEval, params: Params) -> bool:
    """Is this route slower than stock beyond noise here (the no-harm rule's test)?"""
    if ev.ratio is None:
        return False
    if ev.reference:
        assert params.reference_margin is not None
        return ev.ratio < 1.0 / (1.0 + params.reference_margin)
    return ev.ci_high is not None and ev.ci_high < 1.0


def contenders(evals: Mapping[Config, RouteEval]) -> dict[Config, RouteEval]:
    """The routes that may be a point's best: those with ok trials that the race did not stop and that
    were never wrong there.

    A raced-out route lost a paired comparison beyond noise to a route timed in every trial; its median
    over its few early trials is not comparable with medians over all of them (a GPU's state drifts
    within a case), so it never wins on that median. Without a race (or if every route with ok trials
    was stopped, which a race never does) every route with ok trials that was never wrong contends."""
    timed = {r: ev for r, ev in evals.items() if ev.median_us is not None and not ev.numerics_failed}
    full = {r: ev for r, ev in timed.items() if not ev.raced_out}
    return full or timed


def winner(evals: Mapping[Config, RouteEval]) -> Config | None:
    """Lowest median among the contenders; ties go to the lower route code."""
    cands = [(ev.median_us, _order(r), r) for r, ev in contenders(evals).items()]
    return min(cands)[2] if cands else None


def passing_route(evals: Mapping[Config, RouteEval], params: Params) -> Config | None:
    w = winner(evals)
    if w is None or not verdict(evals[w], params).passes:
        return None
    return w


# --------------------------------------------------------------------------------------------
# Decisions


def evaluate(
    df: pd.DataFrame, params: Params, path: str | Path = "<tuning>"
) -> tuple[dict[ShapeKey, dict[int, dict[Config, RouteEval]]], dict[ShapeKey, dict[int, float]]]:
    """Per point and configuration statistics, plus each point's median stock time."""
    evals: dict[ShapeKey, dict[int, dict[Config, RouteEval]]] = defaultdict(dict)
    stock: dict[ShapeKey, dict[int, float]] = defaultdict(dict)
    df = with_configs(df)
    for op, op_rows in df.groupby("op", sort=True):
        key_cls = registry.key_class(str(op))
        cols = [*key_cls.fields(), "M"]
        missing = [c for c in cols if c not in op_rows.columns]
        if any(c not in key_cls.OPTIONAL_FIELDS for c in missing):
            raise InputError(path, f"{op} rows need the columns {', '.join(missing)}")
        op_rows = op_rows.assign(**{c: key_cls.OPTIONAL_FIELDS[c] for c in missing})
        # a null optional field is its default (groupby would drop the rows)
        present = [c for c in key_cls.OPTIONAL_FIELDS if c not in missing]
        op_rows = op_rows.assign(**{c: op_rows[c].fillna(key_cls.OPTIONAL_FIELDS[c]) for c in present})
        for values, point_rows in op_rows.groupby(cols, sort=True):
            # annotated as MUL_MAT's ShapeKey: every op's key class has its interface
            key = cast(ShapeKey, key_cls.of(dict(zip(cols, values, strict=True))))
            M = int(values[-1])  # type: ignore[call-overload]
            per_route: dict[Config, RouteEval] = {}
            for config, rrows in point_rows.groupby(TYPED_COLUMN, sort=True):
                assert isinstance(config, Config)
                per_route[config] = evaluate_route(key, M, config, rrows, params)
            evals[key][M] = per_route
            ok = point_rows[point_rows["status"] == schema.TrialStatus.OK.value]
            anchors = ok["anchor_us"].astype(float).to_numpy()
            anchors = anchors[np.isfinite(anchors) & (anchors > 0)]
            if len(anchors):
                stock[key][M] = float(np.median(anchors))
    return dict(evals), dict(stock)


def _point_refusals(
    key: ShapeKey, M: int, point: Mapping[Config, RouteEval], params: Params
) -> list[Refusal]:
    w = winner(point)
    chosen = passing_route(point, params)
    out = []
    for route, ev in sorted(point.items()):
        if route == chosen:
            continue
        if ev.n_ok == 0 or route == w or ev.is_anchor or ev.numerics_failed:
            reason = verdict(ev, params).reason
        elif ev.raced_out and w is not None and not point[w].raced_out:
            reason = f"stopped by the race: slower than the best beyond noise (median {ev.median_us:.2f} us)"
        else:
            wev = point[w] if w else None
            assert wev is not None and wev.median_us is not None and ev.median_us is not None
            reason = f"not the fastest: {w} {wev.median_us:.2f} us vs {ev.median_us:.2f} us"
            if ev.ratio is not None:
                reason += f" (its ratio to stock {ev.ratio:.3f}x)"
        out.append(Refusal(route, key, M, reason))
    return out


def _runs(labels: Sequence[tuple[int, Config | None]]) -> list[tuple[Config, list[int]]]:
    """Maximal runs of consecutive entries with the same non-None label."""
    runs: list[tuple[Config, list[int]]] = []
    prev: Config | None = None
    for M, label in labels:
        if label is not None and label == prev:
            runs[-1][1].append(M)
        elif label is not None:
            runs.append((label, [M]))
        prev = label
    return runs


def _exact_rules(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]], params: Params
) -> tuple[list[Rule], list[Refusal]]:
    rules: list[Rule] = []
    refusals: list[Refusal] = []
    for key in sorted(evals, key=lambda k: k.codes()):
        by_m = evals[key]
        labels = []
        for M in sorted(by_m):
            refusals.extend(_point_refusals(key, M, by_m[M], params))
            labels.append((M, passing_route(by_m[M], params)))
        for route, run in _runs(labels):
            ratios = [r for m in run if (r := by_m[m][route].ratio) is not None]
            rules.append(Rule(key, run[0], run[-1], route, tuple(run), min(ratios)))
    return rules, refusals


def _fails_somewhere(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]],
    shapes: Sequence[ShapeKey],
    route: Config,
    lo: int,
    hi: int,
    params: Params,
    *,
    inclusive: bool,
) -> str:
    """Empty when ``route`` passes at every measured M of every shape in the range, else where it does not."""
    for s in shapes:
        for m in sorted(evals[s]):
            if (lo <= m <= hi) if inclusive else (lo < m < hi):
                ev = evals[s][m].get(route)
                v = verdict(ev, params) if ev else Verdict(False, "not measured")
                if not v.passes:
                    return f"at N={s.N} K={s.K} M={m}: {v.reason}"
    return ""


def grid_labels(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]],
    group: ShapeKey,
    shapes: Sequence[ShapeKey],
    grid: Sequence[int],
    what: str,
    params: Params,
) -> tuple[list[tuple[int, Config | None]], list[Refusal]]:
    """A default's route at each grid M (None: stock) and its refusals: the min-max regret choice over
    the shapes measured at M, admitted only where it passes at every one of them; a run of one route may
    only grow over a gap where it passes at every measured point of every shape (else it restarts)."""
    labels: list[tuple[int, Config | None]] = []
    refusals: list[Refusal] = []
    for M in grid:
        at = [s for s in shapes if M in evals[s]]
        route = _min_max_regret(evals, at, M)
        why = _fails_somewhere(evals, at, route, M, M, params, inclusive=True) if route else ""
        if route is not None and why:
            refusals.append(Refusal(route, group, M, f"{what} default (min-max regret choice): {why}"))
            route = None
        if route is not None and labels and labels[-1][1] == route:
            gap = _fails_somewhere(evals, shapes, route, labels[-1][0], M, params, inclusive=False)
            if gap:
                refusals.append(
                    Refusal(route, group, M, f"{what} default cannot join M={labels[-1][0]}..{M}: {gap}")
                )
                labels.append((M, None))  # closes the previous run
                labels.append((M, route))  # and starts a new one at M
                continue
        labels.append((M, route))
    return labels, refusals


def _min_max_regret(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]], shapes: Sequence[ShapeKey], M: int
) -> Config | None:
    """The route with ok trials at every shape whose worst regret over the shapes is smallest."""
    medians: dict[ShapeKey, dict[Config, float]] = {
        s: {r: ev.median_us for r, ev in evals[s][M].items() if ev.median_us is not None} for s in shapes
    }
    routes = set.intersection(*(set(m) for m in medians.values()))
    if not routes:
        return None
    best = {s: min(m.values()) for s, m in medians.items()}
    regret = {r: max(medians[s][r] / best[s] - 1.0 for s in shapes) for r in routes}
    return min(routes, key=lambda r: (regret[r], _order(r)))


def _default_rules(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]], params: Params
) -> tuple[list[Rule], list[Refusal]]:
    groups: dict[ShapeKey, list[ShapeKey]] = defaultdict(list)
    for key in evals:
        if key.DEFAULT_FIELDS:  # an op without per-type defaults has none
            groups[key.group()].append(key)
    rules: list[Rule] = []
    refusals: list[Refusal] = []
    for group in sorted(groups, key=lambda k: k.codes()):
        shapes = sorted(groups[group], key=lambda k: k.codes())
        if len(shapes) < params.min_default_shapes:
            continue
        grid = sorted(set.intersection(*(set(evals[s]) for s in shapes)))
        labels, refused = grid_labels(evals, group, shapes, grid, "type", params)
        refusals += refused
        for route, run in _runs(labels):
            run = sorted(set(run))
            ratios = [
                r
                for s in shapes
                for m, point in evals[s].items()
                if run[0] <= m <= run[-1]
                and (ev := point.get(route)) is not None
                and (r := ev.ratio) is not None
            ]
            rules.append(
                Rule(
                    group,
                    run[0],
                    run[-1],
                    route,
                    tuple(run),
                    min(ratios),
                    shapes=tuple((s.N, s.K) for s in shapes),
                )
            )
    return rules, refusals


def carried_rules(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]],
    measured: Sequence[Rule],
    params: Params,
) -> tuple[list[Rule], list[Refusal]]:
    """The rules that reach past the measured points: interpolated gaps and size-class defaults."""
    from ggml_dispatch.codegen import classes, crossover  # they build on this module's statistics

    rules: list[Rule] = []
    refusals: list[Refusal] = []
    if params.interpolate:
        r, f = crossover.interpolated_rules(evals, measured, params)
        rules += r
        refusals += f
    if params.class_defaults:
        r, f = classes.class_rules(evals, params)
        rules += r
        refusals += f
    return rules, refusals


def rules_of(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[Config, RouteEval]]],
    params: Params,
    moe_used: Mapping[tuple[Any, int], int] | None = None,
) -> tuple[list[Rule], list[Refusal], list[Any]]:
    """Per-point statistics -> rules, refusals and (MUL_MAT_ID) per-bucket evidence, each sorted.
    ``moe_used``: experts per token of the MUL_MAT_ID points (codegen.moe.used_per_point)."""
    from ggml_dispatch.codegen import moe  # builds on this module's statistics

    # MUL_MAT_ID is decided per routing bucket into routing-0 rules (codegen.moe), never by the rules below
    expert = {k: v for k, v in evals.items() if k.op == schema.Op.MUL_MAT_ID.value}
    others = {k: v for k, v in evals.items() if k not in expert}
    exact, refused_exact = _exact_rules(others, params)
    defaults, refused_defaults = _default_rules(others, params)
    carried, refused_carried = carried_rules(others, exact, params)
    expert_rules, refused_expert, routing_buckets = moe.moe_rules(expert, params, moe_used)
    refusals = sorted(
        refused_exact + refused_defaults + refused_carried + refused_expert,
        key=lambda r: (r.key.codes(), r.M, _order(r.route), r.reason),
    )
    rules = sorted(
        exact + defaults + carried + expert_rules, key=lambda r: (r.key.codes(), r.NK or (0, 0), r.M_lo)
    )
    return rules, refusals, routing_buckets


def select_ops(df: pd.DataFrame, ops: Sequence[str] | None, path: str | Path = "<tuning>") -> pd.DataFrame:
    """The rows of the named ops (all rows when ops is None); an op the file has no row of is an error."""
    if ops is None:
        return df
    present = set(df["op"].astype(str))
    for op in ops:
        if op not in present:
            have = ", ".join(sorted(present)) or "none"
            raise InputError(path, f"no tuning rows of {op} (the file has {have})", field="--op")
    return df[df["op"].isin(list(ops))]


def count_ok(df: pd.DataFrame) -> int:
    return int((df["status"] == schema.TrialStatus.OK.value).sum())


def decide(df: pd.DataFrame, params: Params, path: str | Path = "<tuning>") -> Decisions:
    """Tuning rows (``schema.TUNING_COLUMNS``) -> rules and refusals."""
    if params.theta < 0:
        raise InputError(path, f"theta must be >= 0, got {params.theta}", field="--theta")
    if params.reference_margin is not None and not 0 < params.reference_margin < 1:
        raise InputError(
            path,
            f"reference margin must be in (0, 1), got {params.reference_margin}",
            field="--reference-margin",
        )
    identity, df = _checked(df, path, params)
    from ggml_dispatch.codegen import moe

    evals, stock = evaluate(df, params, path)
    moe_used = moe.used_per_point(df)
    rules, refusals, routing_buckets = rules_of(evals, params, moe_used)
    return Decisions(
        identity=identity,
        params=params,
        rules=rules,
        refusals=refusals,
        evals=evals,
        stock_us=stock,
        n_rows=len(df),
        n_ok=count_ok(df),
        routing_buckets=routing_buckets,
        moe_used=moe_used,
    )
