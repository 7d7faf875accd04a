"""MUL_MAT_ID decisions: per-bucket winners and the routing-0 rules the runtime applies. Pure.

MUL_MAT_ID tuning rows carry the routing bucket their case measured (``routing``: 1 spread, 2 skewed,
3 concentrated; registry.routing_bucket), so :func:`codegen.decide.evaluate` gives one evaluation per
(types, N, K, E, U, bucket) and M, with the project's statistic (median of paired stock/config ratios,
95% bootstrap CI, theta). The runtime cannot see a call's routing without a host sync, so it looks up
MUL_MAT_ID rules at routing 0 only; a routing-0 rule therefore applies to calls of every bucket, and it
is admitted at a point (types, N, K, E, U, M) only when

* every bucket the point can meet was measured there (a rule never applies to a bucket it was not
  measured in): all three, or, where the rows carry the experts per token (``used``), the buckets
  registry.attainable_buckets allows for M tokens on ``used`` of E experts (a decode step, M = 1, is
  always spread: its ``used`` experts are distinct), and
* the configuration does not break CUDA graphs (``registry.GRAPH_BREAKING_ROUTES``: the per-expert
  fallback, a measured candidate whose node the harness times as it runs, directly, but whose host sync
  would keep the model's whole graph from being captured), and
* the configuration is slower than stock beyond noise in no measured bucket (the no-harm check that
  the concentrated routing, all tokens on a few experts, exists for) and passes (ratio >= 1 + theta, CI
  low end > 1, enough paired trials) in at least one. Requiring a pass in every bucket would refuse
  every configuration wherever stock's own choice is already the best one bucket allows: stock mmq sizes
  its tile from all tokens, which is right when they all go to a few experts.

Among the configurations that qualify, the one with the smallest total regret over the buckets (the sum
of its median / the bucket's fastest median - 1) is taken, ties to the lower configuration code. The
buckets weigh alike, as the in-sample check (codegen.loo) sums each bucket's time; the smallest worst
regret, the first version, let the bucket where no qualifying configuration comes near the best (the
concentrated no-harm case) decide by 0.3% against 9% under spread routing. A rule covers
a run of consecutive measured M at which the same configuration is admitted, and the M between them
(like a measured MUL_MAT rule); a measured M missing a bucket it can meet, or where nothing qualifies,
breaks the run. No interpolation across M gaps, no size-class or per-type defaults for MUL_MAT_ID.

Per point and bucket the winner (lowest median) and whether it passes are kept as evidence
(:class:`BucketPoint`, table.json ``routing_buckets``); every configuration not taken is a refusal at
the routing-0 key with the bucket that refused it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pandas as pd

from ggml_dispatch import registry

Config = registry.Config

BUCKETS: Final[tuple[int, ...]] = tuple(sorted(registry.ROUTING_BUCKETS))
KIND_MEASURED: Final = "measured"


@dataclass(frozen=True)
class BucketPoint:
    """One MUL_MAT_ID point (routing-0 key, M): per measured bucket its winner, whether that winner
    passes, its ratio to stock; and the configuration the routing-0 rule takes there (None: stock)."""

    key: Any  # registry.MulMatIdKey with routing 0
    M: int
    winners: tuple[tuple[int, Config | None, bool, float | None], ...]  # (bucket, winner, passes, ratio)
    routing0: Config | None
    reason: str  # why there is no routing-0 configuration ("" when there is one)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.key.as_dict(),
            "M": self.M,
            "buckets": {
                registry.ROUTING_BUCKETS[b]: {"winner": _text(w), "passes": p, "ratio": r}
                for b, w, p, r in self.winners
            },
            "config": _text(self.routing0),
            "reason": self.reason,
        }


def _text(config: Config | None) -> str | None:
    return None if config is None else str(config)


def used_per_point(df: pd.DataFrame) -> dict[tuple[Any, int], int]:
    """(routing-0 key, M) -> experts per token, from MUL_MAT_ID tuning rows that carry ``used``."""
    if "used" not in df.columns or "E" not in df.columns:
        return {}
    rows = df[(df["op"] == registry.Op.MUL_MAT_ID.value) & df["used"].notna()]
    out: dict[tuple[Any, int], int] = {}
    fields = [f for f in registry.MulMatIdKey.fields() if f != "routing"]
    for values, g in rows.groupby([*fields, "M"], sort=False):
        d: dict[str, Any] = dict(zip([*fields, "M"], values, strict=True))
        key = registry.MulMatIdKey.of({**d, "routing": registry.ROUTING_ANY})
        out[(key, int(d["M"]))] = int(g["used"].max())
    return out


def required_buckets(key0: Any, M: int, used: Mapping[tuple[Any, int], int]) -> tuple[int, ...]:
    """The buckets a routing-0 rule at (key0, M) must have been measured in."""
    u = used.get((key0, M))
    if u is None:
        return BUCKETS
    return tuple(sorted(registry.attainable_buckets(M, u, int(key0.E))))


def _why_not(
    config: Config, by_bucket: Mapping[int, Mapping[Config, Any]], params: Any, verdict: Any, slower: Any
) -> str:
    """Empty when ``config`` is shown harmless in every measured bucket (never wrong, at least the minimum
    of paired trials where it ran, not slower than stock beyond noise) and passes in at least one."""
    if config.route in registry.GRAPH_BREAKING_ROUTES:
        return (
            "breaks CUDA graphs: its node synchronizes, so the whole graph it is in runs without capture,"
            " a cost beyond the node that the harness' per-node time does not hold"
        )
    reasons = []
    for b in sorted(by_bucket):
        name = registry.ROUTING_BUCKETS[b]
        ev = by_bucket[b].get(config)
        if ev is None:
            return f"not measured in bucket {name}"
        if ev.numerics_failed:
            return f"wrong in bucket {name}: off the CPU backend beyond the NMSE threshold"
        if not ev.reference and ev.n_ok > 0 and ev.n_paired < params.min_trials:
            # too few trials for a CI says nothing about harm (a sweep that raced against each bucket's
            # best stopped timing such configurations after one trial)
            raced = ", raced out" if ev.raced_out else ""
            n = f"{ev.n_paired} paired ok trials (< {params.min_trials})"
            return f"not shown harmless in bucket {name}: {n}{raced}"
        if slower(ev, params):
            return f"slower than stock beyond noise in bucket {name} (ratio {ev.ratio:.3f}x)"
        v = verdict(ev, params)
        if not v.passes:
            reasons.append(f"bucket {name}: {v.reason}")
    if len(reasons) == len(by_bucket):
        return "passes in no bucket (" + "; ".join(reasons) + ")"
    return ""


def _regret(by_bucket: Mapping[int, Mapping[Config, Any]], config: Config) -> float:
    """Total regret of ``config`` over the buckets: the sum of its median / the bucket's best median - 1."""
    total = 0.0
    for b in sorted(by_bucket):
        best = min(e.median_us for e in by_bucket[b].values() if e.median_us is not None)
        total += by_bucket[b][config].median_us / best - 1.0
    return total


def _point(
    key0: Any, M: int, by_bucket: Mapping[int, Mapping[Config, Any]], params: Any, required: tuple[int, ...]
) -> tuple[BucketPoint, list[Any]]:
    """One point's evidence and its refusals."""
    from ggml_dispatch.codegen import decide

    winners = []
    for b in sorted(by_bucket):
        w = decide.winner(by_bucket[b])
        ev = by_bucket[b][w] if w is not None else None
        passes = bool(ev is not None and decide.verdict(ev, params).passes)
        winners.append((b, w, passes, ev.ratio if ev is not None else None))
    configs = sorted({c for point in by_bucket.values() for c in point}, key=decide._order)
    missing = [registry.ROUTING_BUCKETS[b] for b in required if b not in by_bucket]
    if missing:
        reason = "a routing-0 rule needs every bucket the point can meet measured; not measured: " + (
            ", ".join(missing)
        )
        refused = [decide.Refusal(c, key0, M, reason, KIND_MEASURED) for c in configs]
        return BucketPoint(key0, M, tuple(winners), None, reason), refused
    why = {c: _why_not(c, by_bucket, params, decide.verdict, decide.slower_beyond_noise) for c in configs}
    good = [c for c in configs if not why[c]]
    chosen = min(good, key=lambda c: (_regret(by_bucket, c), decide._order(c))) if good else None
    refused = [
        decide.Refusal(
            c,
            key0,
            M,
            why[c] or f"qualifies, but {chosen} has the smaller total regret",
            KIND_MEASURED,
        )
        for c in configs
        if c != chosen
    ]
    reason = "" if chosen else "no configuration is harmless in every bucket and passes in one"
    return BucketPoint(key0, M, tuple(winners), chosen, reason), refused


def moe_rules(
    evals: Mapping[Any, Mapping[int, Mapping[Config, Any]]],
    params: Any,
    used: Mapping[tuple[Any, int], int] | None = None,
) -> tuple[list[Any], list[Any], list[BucketPoint]]:
    """MUL_MAT_ID evaluations (keys with routing 1..3; routing-0 keys are rows without a measured
    bucket and count as no evidence) -> routing-0 rules, refusals and per-point bucket evidence.
    ``used``: :func:`used_per_point` (without it every point needs all three buckets)."""
    from ggml_dispatch.codegen import decide  # decide calls this module

    by_point: dict[Any, dict[int, dict[int, Mapping[Config, Any]]]] = defaultdict(lambda: defaultdict(dict))
    refusals: list[Any] = []
    for key, by_m in evals.items():
        if key.op != registry.Op.MUL_MAT_ID.value:
            continue
        for M, point in by_m.items():
            if key.routing not in registry.ROUTING_BUCKETS:
                reason = "MUL_MAT_ID rows without a measured routing bucket"
                refusals += [decide.Refusal(c, key, M, reason, KIND_MEASURED) for c in point]
                continue
            by_point[registry.runtime_key(key)][M][key.routing] = point
    rules: list[Any] = []
    evidence: list[BucketPoint] = []
    for key0 in sorted(by_point, key=lambda k: k.codes()):
        labels: list[tuple[int, Config | None]] = []
        for M in sorted(by_point[key0]):
            required = required_buckets(key0, M, used or {})
            ev, refused = _point(key0, M, by_point[key0][M], params, required)
            evidence.append(ev)
            refusals += refused
            labels.append((M, ev.routing0))
        for config, run in decide._runs(labels):
            measured = sorted({b for m in run for b in by_point[key0][m]})
            ratios = {
                b: min(by_point[key0][m][b][config].ratio for m in run if b in by_point[key0][m])
                for b in measured
            }
            rules.append(
                decide.Rule(
                    key0,
                    run[0],
                    run[-1],
                    config,
                    tuple(run),
                    min(ratios.values()),
                    rule_kind=KIND_MEASURED,
                    buckets=tuple((registry.ROUTING_BUCKETS[b], ratios[b]) for b in measured),
                )
            )
    return rules, refusals, evidence
