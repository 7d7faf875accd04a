"""MUL_MAT_ID cases for the harness, selected from the MUL_MAT_ID rows of a matmul census. Pure.

A case is one census point (types, N, K, E, U, M) under one routing kind the harness draws
(ggml_dispatch/tuner/harness/mul_mat_id.cpp): ``trace`` (the routing the trace recorded: its mean number of
experts
with tokens, weighted 1/(rank+1)^s with s fitted to its CV, :func:`trace_weights`; only where the census
rows carry the trace's tokens-per-expert statistics, else skipped and counted), ``uniform`` (top-k
uniformly at random per token), ``skewed`` (experts weighted 1/(rank+1)^1.2, drawn without replacement)
and ``few`` (every token on the same ``used`` experts). The last three are chosen so that at the M of a
prefill ubatch of a model like Qwen3-30B-A3B (E = 128, 8 used) they land in the three routing buckets
(spread, skewed, concentrated); ``trace`` lands where the model's own routing does. Which bucket
a case measured is read from the harness' statistics of the routing it drew (``experts`` in its
case-end record), not assumed from the kind, and goes into the tuning rows' ``routing`` column.

Candidates: every configuration (``--configs``) of the ``--routes`` that serve MUL_MAT_ID (mmvf, mmf,
mmvq, mmq, and ``id_sorted``, the per-expert fallback; cuBLAS does not serve it). The fallback
synchronizes the stream, so its graph runs without CUDA graphs: the harness sees that in its eligibility
run (the override API's ``eager`` count) and times it further only where its node is faster than stock's
(else it is ``pruned`` with the ratio), and codegen never makes it a rule (ggml_dispatch/codegen/moe.py).

The census keeps the routing bucket a key's calls fell in as part of its rows; a case measures all
kinds at each (shape, M), so the census rows of one point are summed over their buckets. The experts
used per token (``used``, ids->ne[0]) of a gate/up row (U = 1: the token is broadcast over its experts)
is the U of the census' down rows (U = used) with the same E; a gate/up point with no such row is
skipped and counted. Census M values are measured as they are (no grid neighbours: a routing-0 rule
needs all three buckets at a point, each M costs three cases, and a rule covers only a run of measured
M).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from ggml_dispatch import options, registry
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner.select import (
    DEFAULT_NMSE_MAX,
    DEFAULT_TRIALS,
    CompiledMmvq,
    Selection,
    Wanted,
    census_fused,
    census_int,
    census_types,
)

# routing kind -> the harness' routing object (ggml_dispatch/tuner/harness/mul_mat_id.cpp)
ROUTING_KINDS: Final[dict[str, dict[str, Any]]] = {
    "trace": {"kind": "counts"},  # per case: weights from the census' statistics (trace_weights)
    "uniform": {"kind": "uniform"},
    "skewed": {"kind": "skewed", "s": 1.2},
    "few": {"kind": "few"},  # the experts default to `used`: every token on the same experts
}
TRACE_STATS: Final = ("experts_nonempty", "tokens_cv")
SKIP_NO_STATS: Final = "MUL_MAT_ID trace routing (no tokens-per-expert statistics in the census rows)"
MOE_ROUTES: Final[tuple[str, ...]] = tuple(r.value for r in registry.OPS[registry.Op.MUL_MAT_ID].routes)
CENSUS_COLUMNS: Final = ("op", "layout", "fused", "src0_type", "src1_type", "M", "N", "K", "E", "U", "est_us")
SKIP_NO_USED: Final = "MUL_MAT_ID gate/up without a down row of the same E (experts used per token unknown)"


@dataclass(frozen=True)
class MoeCase:
    shape: registry.MulMatIdKey  # routing 0: the bucket is what the case measures
    M: int
    routing_kind: str
    used: int
    est_us: float
    census: bool = True
    routes: tuple[str, ...] = MOE_ROUTES
    trials: int = DEFAULT_TRIALS
    nmse_max: float = DEFAULT_NMSE_MAX
    weights: tuple[float, ...] = ()  # routing_kind "trace": per-expert draw weights (trace_weights)

    @property
    def id(self) -> str:
        s = self.shape
        head = f"{s.op}:{s.layout}:{s.src0_type}:{s.src1_type}"
        return f"{head}:N{s.N}:K{s.K}:E{s.E}:U{s.U}:M{self.M}:{self.routing_kind}"

    def spec(self) -> dict[str, Any]:
        """The harness case object (ggml_dispatch/tuner/harness/mul_mat_id.cpp), with B = 1 for the tuning
        rows."""
        s = self.shape
        return {
            "case": self.id,
            "op": s.op,
            "layout": s.layout,
            "src0_type": s.src0_type,
            "src1_type": s.src1_type,
            "M": self.M,
            "N": s.N,
            "K": s.K,
            "B": 1,
            "E": s.E,
            "U": s.U,
            "used": self.used,
            "routing_kind": self.routing_kind,
            "routing": self._routing(),
            "routes": list(self.routes),
            "trials": self.trials,
            "nmse_max": self.nmse_max,
        }

    def _routing(self) -> dict[str, Any]:
        r = dict(ROUTING_KINDS[self.routing_kind])
        if self.routing_kind == "trace":
            r["counts"] = list(self.weights)
        return r


def _cv(weights: Sequence[float]) -> float:
    mean = sum(weights) / len(weights)
    var = sum(w * w for w in weights) / len(weights) - mean * mean
    return float(max(var, 0.0) ** 0.5 / mean)


def trace_weights(E: int, used: int, M: int, nonempty: float, cv: float) -> tuple[float, ...]:
    """Per-expert draw weights that reproduce a traced routing: ``nonempty`` experts (at least ``used``,
    at most E) weighted 1/(rank+1)^s, the others 0, with s such that the weights' CV is the traced CV less
    what drawing alone adds. M tokens x ``used`` picks on n experts give counts whose CV^2 is about the
    weights' CV^2 + n / picks (Poisson noise), so a uniform routing's traced CV (about 1/sqrt(picks/n))
    gives equal weights. Rounded to 6 digits (the case's JSON)."""
    n = max(used, min(E, round(nonempty)))
    target = max(cv * cv - n / max(M * used, 1), 0.0) ** 0.5

    def cv_at(s: float) -> float:
        return _cv([(i + 1) ** -s for i in range(n)])

    lo, hi = 0.0, 8.0  # s beyond 8: the steepest weights
    if target <= 0.0 or n == 1:
        hi = 0.0
    elif cv_at(hi) <= target:
        lo = hi
    for _ in range(60 if lo < hi else 0):  # bisection: the CV rises with s
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cv_at(mid) < target else (lo, mid)
    s = (lo + hi) / 2
    return tuple(float(f"{(i + 1) ** -s:.6g}") if i < n else 0.0 for i in range(E))


def moe_candidates(configs: Sequence[str]) -> tuple[str, ...]:
    """The configurations among ``configs`` whose route serves MUL_MAT_ID (order kept)."""
    return tuple(c for c in configs if registry.route_allowed(registry.Op.MUL_MAT_ID, c))


@dataclass
class MoeSelection:
    cases: list[MoeCase]
    est_us: float  # the MUL_MAT_ID census rows' total (fused ones included)
    covered_est_us: float
    skipped: dict[str, float]
    skipped_rows: dict[str, int]


def select_mul_mat_id(
    rows: Iterable[Mapping[str, Any]],
    *,
    coverage: float = 0.95,
    routes: Sequence[str] = MOE_ROUTES,
    routing_kinds: Sequence[str] = tuple(ROUTING_KINDS),
    trials: int = DEFAULT_TRIALS,
    nmse_max: float = DEFAULT_NMSE_MAX,
    path: str | Path = "<census>",
) -> MoeSelection:
    """The MUL_MAT_ID points to time (largest est_us first, until ``coverage`` of their est_us), each
    under every routing kind. ``routes``: configurations; those whose route does not serve MUL_MAT_ID
    are dropped."""
    bad = [k for k in routing_kinds if k not in ROUTING_KINDS]
    if bad or not routing_kinds:
        raise InputError(
            None, f"routing kinds must be among {', '.join(ROUTING_KINDS)}, got {list(routing_kinds)}"
        )
    cands = moe_candidates(routes)
    no_candidate = "MUL_MAT_ID (no candidate serves it among --routes)"
    points: dict[tuple[registry.MulMatIdKey, int], float] = defaultdict(float)
    stats: dict[tuple[registry.MulMatIdKey, int], tuple[float, float, float]] = {}  # est, nonempty, cv
    used_of_E: dict[int, int] = {}
    total = 0.0
    skipped: dict[str, float] = defaultdict(float)
    skipped_rows: dict[str, int] = defaultdict(int)
    for i, r in enumerate(rows):
        if str(r["op"]) != registry.Op.MUL_MAT_ID.value:
            continue
        where = f"row {i}"
        est = float(r["est_us"])
        total += est
        if census_fused(r.get("fused")):
            continue  # the MUL_MAT selection counts fused rows of every op
        census_types(r, path, where)
        key = registry.MulMatIdKey(
            registry.Op.MUL_MAT_ID.value,
            str(r["layout"]),
            str(r["src0_type"]),
            str(r["src1_type"]),
            census_int(r["N"], path, where, "N"),
            census_int(r["K"], path, where, "K"),
            census_int(r["E"], path, where, "E"),
            census_int(r["U"], path, where, "U"),
            registry.ROUTING_ANY,
        )
        if key.U > 1:
            used_of_E[key.E] = max(used_of_E.get(key.E, 0), key.U)
        point = (key, census_int(r["M"], path, where, "M"))
        points[point] += est
        nonempty, cv = (float("nan") if r.get(c) is None else float(r[c]) for c in TRACE_STATS)
        has_stats = nonempty == nonempty and cv == cv  # neither null nor NaN
        if has_stats and (point not in stats or est > stats[point][0]):
            stats[point] = (est, nonempty, cv)  # the point's largest census bucket
    usable: dict[tuple[registry.MulMatIdKey, int], tuple[float, int]] = {}
    for (key, M), est in points.items():
        used = key.U if key.U > 1 else used_of_E.get(key.E, 0)
        if used < 1:
            skipped[SKIP_NO_USED] += est
            skipped_rows[SKIP_NO_USED] += 1
            continue
        usable[(key, M)] = (est, used)
    if not cands:  # e.g. --routes cublas: nothing but stock would be timed
        for est, _used in usable.values():
            skipped[no_candidate] += est
            skipped_rows[no_candidate] += 1
        usable = {}
    tunable = sum(e for e, _ in usable.values())
    cases: list[MoeCase] = []
    covered = 0.0
    for (key, M), (est, used) in sorted(usable.items(), key=lambda kv: (-kv[1][0], kv[0][0], kv[0][1])):
        if cases and tunable > 0 and covered >= coverage * tunable:
            break
        covered += est
        for kind in routing_kinds:
            weights: tuple[float, ...] = ()
            if kind == "trace":
                if (key, M) not in stats:  # the point is timed under the other kinds: no est_us left out
                    skipped[SKIP_NO_STATS] += 0.0
                    skipped_rows[SKIP_NO_STATS] += 1
                    continue
                _, nonempty, cv = stats[(key, M)]
                weights = trace_weights(key.E, used, M, nonempty, cv)
            cases.append(
                MoeCase(
                    key, M, kind, used, est, routes=cands, trials=trials, nmse_max=nmse_max, weights=weights
                )
            )
    chosen = {(c.shape, c.M) for c in cases}
    left = [p for p in usable if p not in chosen]
    if left:
        skipped["MUL_MAT_ID beyond the coverage"] += sum(usable[p][0] for p in left)
        skipped_rows["MUL_MAT_ID beyond the coverage"] += len(left)
    return MoeSelection(cases, total, covered, dict(skipped), dict(skipped_rows))


def measured_bucket(spec: Mapping[str, Any], case_info: Mapping[str, Any]) -> int | None:
    """The routing bucket a MUL_MAT_ID case measured: registry.routing_bucket of the statistics of the
    routing the harness drew (its case-end ``experts``); None when the case has none (it failed)."""
    ex = case_info.get("experts")
    if not isinstance(ex, Mapping) or "nonempty" not in ex or "cv" not in ex:
        return None
    picks = int(spec["used"]) * int(spec["M"])
    return registry.routing_bucket(picks, int(ex["nonempty"]), float(ex["cv"]), int(spec["E"]))


# tuner.select's reason for the MUL_MAT_ID rows it leaves out
_OP_LAYOUT: Final = f"{registry.Op.MUL_MAT_ID.value}/{registry.Layout.EXPERT.value}"
SKIPPED_BY_SELECT: Final = f"{_OP_LAYOUT} (no tuning key for it)"


def parse_routing_kinds(text: str) -> tuple[str, ...]:
    """--routing-kinds: a comma list of ROUTING_KINDS, or ``none`` (no MUL_MAT_ID cases)."""
    if text.strip() == "none":
        return ()
    kinds = tuple(options.list_items(text))
    bad = [k for k in kinds if k not in ROUTING_KINDS]
    if bad or not kinds:
        raise ValueError(f"routing kinds must be among {', '.join(ROUTING_KINDS)} or none; got {text!r}")
    return kinds


def with_mul_mat_id(selection: Selection, moe: MoeSelection) -> Selection:
    """The MUL_MAT selection with the MUL_MAT_ID cases added: shapes ordered by their census est_us
    (largest first, so a sweep cut short has measured what matters most), the MUL_MAT_ID rows no longer
    counted as skipped by the MUL_MAT selection but by their own reasons."""
    groups: dict[Any, list[Any]] = {}
    every: list[Any] = [*selection.cases, *moe.cases]
    for c in every:
        groups.setdefault(c.shape, []).append(c)

    def weight(cases: list[Any]) -> float:
        if isinstance(cases[0], MoeCase):  # one point's est_us is on each of its routing kinds' cases
            return float(sum({c.M: c.est_us for c in cases}.values()))
        return float(sum(c.est_us for c in cases if c.census))

    order = sorted(groups, key=lambda s: -weight(groups[s]))  # stable: ties keep the selection's order
    skipped = dict(selection.skipped)
    skipped_rows = dict(selection.skipped_rows)
    moe_total = skipped.pop(SKIPPED_BY_SELECT, 0.0)
    skipped_rows.pop(SKIPPED_BY_SELECT, None)
    for reason, us in moe.skipped.items():
        skipped[reason] = skipped.get(reason, 0.0) + us
        skipped_rows[reason] = skipped_rows.get(reason, 0) + moe.skipped_rows[reason]
    return Selection(
        cases=[c for s in order for c in groups[s]],
        total_est_us=selection.total_est_us,
        tunable_est_us=selection.tunable_est_us + moe_total,
        covered_est_us=selection.covered_est_us + moe.covered_est_us,
        skipped=skipped,
        skipped_rows=skipped_rows,
    )


def candidates(
    census: pa.Table,
    wanted: Wanted,
    prior: Selection | None,
    *,
    path: str | Path = "<census>",
    mmvq: CompiledMmvq | None = None,
) -> Selection:
    """MUL_MAT_ID's candidate generator (registry.OPS names this module; tuner.candidates calls it): the
    MUL_MAT selection of the same census (``prior``) with the MUL_MAT_ID cases under each of the wanted
    routing kinds added (:func:`select_mul_mat_id`, :func:`with_mul_mat_id`); none when no kind is wanted."""
    if prior is None:
        raise ValueError("MUL_MAT_ID's cases join the MUL_MAT selection of their census: no prior selection")
    if not wanted.routing_kinds:
        return prior
    moe = select_mul_mat_id(
        census.select(
            list(CENSUS_COLUMNS) + [c for c in TRACE_STATS if c in census.column_names]
        ).to_pylist(),
        coverage=wanted.coverage,
        routes=wanted.routes,
        routing_kinds=wanted.routing_kinds,
        trials=wanted.trials,
        nmse_max=wanted.nmse_max,
        path=path,
    )
    return with_mul_mat_id(prior, moe)
