"""Leave-one-out checks of the rules that reach past the measured points, on recorded tuning rows.

* Interpolation: for every shape and every measured M with measured neighbours on both sides, drop
  that M's rows, build the rules from the rest (that shape's rows; no class defaults), look M up, and
  compare the route with what the dropped measurements say: the measured decision there (the passing
  winner, else stock) and the oracle (the fastest measured route, stock included; a route the tuner's
  race stopped is not a contender, `decide.contenders`).
* Size classes: for every shape of a type with at least three measured shapes, drop the shape, build
  the rules from the type's other shapes, and look up each of its measured M (only defaults can answer).

* In-sample: the table of the whole file looked up at every measured point (how close the compiled
  decision is to the per-point best over every measured route and configuration).

Each prediction is scored with the dropped point's own measurements: its time over the oracle's, and
whether it is slower than stock beyond noise there (harm).

``python -m ggml_dispatch.codegen.loo tables/cuda-sm90-nvidia-h200/tuning/dense-routes.parquet``
(``--vram-budget MiB`` as the table was made: without it kv=shadow rows are left out, as codegen leaves
them out)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from ggml_dispatch import registry, schema
from ggml_dispatch.artifacts import tuning as tuning_artifact
from ggml_dispatch.codegen import decide, kv_shadow, vram
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError

ShapeKey = schema.ShapeKey


@dataclass(frozen=True)
class Held:
    check: str  # "interpolation" or "class"
    key: ShapeKey
    M: int
    predicted: str | None  # None = stock
    measured: str | None  # the measured decision at the dropped point
    oracle: str | None
    predicted_us: float | None
    oracle_us: float
    stock_us: float
    harm: bool  # predicted route slower than stock beyond noise at the dropped point
    via: str  # the kind of rule that answered, or "stock"


def _via(table: dict[str, object], key: ShapeKey, M: int, route: registry.Config | None) -> str:
    if route is None:
        return "stock"
    rules = table["rules"]
    assert isinstance(rules, list)
    key = registry.runtime_key(key)  # a MUL_MAT_ID point of any bucket: its routing-0 key
    fields = key.fields()
    for r in rules:
        if r["op"] != key.op or tbl.rule_typed_config(r).measured != route or not r["M_lo"] <= M <= r["M_hi"]:
            continue
        rule_key = registry.shape_key(r)
        if tuple(getattr(rule_key, f) for f in fields) == tuple(getattr(key, f) for f in fields) or (
            tbl.is_class(r) and r["NK_lo"] <= tbl.key_size(key) <= r["NK_hi"]
        ):
            return str(tbl.rule_kind(r))  # any op's exact key, or a size class holding it
        if rule_key.is_default and not tbl.is_class(r):
            return "type default"
    return "?"


def _score(
    check: str, key: ShapeKey, M: int, table: dict[str, object], full: decide.Decisions, params: decide.Params
) -> Held:
    gpu = full.identity.gpu
    # a MUL_MAT_ID point of any bucket gets what the runtime looks up: the routing-0 rule
    route = tbl.lookup_measured_config(table, gpu, registry.runtime_key(key), M)
    point = full.evals[key][M]
    stock_us = full.stock_us[key][M]
    medians = {r: ev.median_us for r, ev in point.items() if ev.median_us is not None}
    # the per-point best among the routes the race left standing (decide.contenders)
    best_of = {
        r: float(ev.median_us) for r, ev in decide.contenders(point).items() if ev.median_us is not None
    }
    best = min(best_of, key=lambda r: best_of[r]) if best_of else None
    oracle = best if best is not None and best_of[best] < stock_us else None
    oracle_us = min(stock_us, *best_of.values()) if best_of else stock_us
    pred_us = stock_us if route is None else medians.get(route)
    harm = route is not None and route in point and decide.slower_beyond_noise(point[route], params)
    return Held(
        check,
        key,
        M,
        _text(route),
        _text(decide.passing_route(point, params)),
        _text(oracle),
        pred_us,
        oracle_us,
        stock_us,
        harm,
        _via(table, key, M, route),
    )


def _text(config: registry.Config | None) -> str | None:
    return None if config is None else str(config)


def _table(
    evals: Mapping[ShapeKey, Mapping[int, Mapping[registry.Config, decide.RouteEval]]],
    full: decide.Decisions,
    params: decide.Params,
) -> dict[str, object]:
    """The table the decision rule builds from these per-point statistics (a point's statistics do not
    depend on the other points, so held-out sets reuse the full file's)."""
    rules, _, _ = decide.rules_of(evals, params, full.moe_used)
    d = replace(full, params=params, rules=rules, refusals=[], routing_buckets=[])
    return tbl.build_table(d, tuning_sha256="0" * 64)


def interpolation_loo(df: pd.DataFrame, params: decide.Params) -> list[Held]:
    p = replace(params, class_defaults=False)
    full = decide.decide(df, p)
    out: list[Held] = []
    for key in sorted(full.evals, key=ShapeKey.codes):
        ms = sorted(full.evals[key])
        for M in ms[1:-1]:
            if M not in full.stock_us.get(key, {}):
                continue
            held = {key: {m: v for m, v in full.evals[key].items() if m != M}}
            out.append(_score("interpolation", key, M, _table(held, full, p), full, p))
    return out


def class_loo(df: pd.DataFrame, params: decide.Params) -> list[Held]:
    full = decide.decide(df, replace(params, interpolate=False))
    groups: dict[ShapeKey, list[ShapeKey]] = {}
    for key in full.evals:
        groups.setdefault(key.group(), []).append(key)
    out: list[Held] = []
    for group in sorted(groups, key=ShapeKey.codes):
        shapes = sorted(groups[group], key=ShapeKey.codes)
        if len(shapes) < 3:
            continue
        for held in shapes:
            rest = {s: full.evals[s] for s in shapes if s != held}
            t = _table(rest, full, replace(params, interpolate=False))
            for M in sorted(full.evals[held]):
                if M in full.stock_us.get(held, {}):
                    out.append(_score("class", held, M, t, full, params))
    return out


def in_sample(df: pd.DataFrame, params: decide.Params) -> list[Held]:
    full = decide.decide(df, params)
    t = tbl.build_table(full, tuning_sha256="0" * 64)
    return [
        _score("in-sample", key, M, t, full, params)
        for key in sorted(full.evals, key=ShapeKey.codes)
        for M in sorted(full.evals[key])
        if M in full.stock_us.get(key, {})
    ]


IN_SAMPLE_SLACK = 0.02  # the table's time within 2% of the per-point best


def _point(h: Held) -> str:
    """For people: the key's types and fields (MUL_MAT: type, N, K; MUL_MAT_ID with E, U and the
    routing bucket; attention its head dims, GQA and KV bucket) and M."""
    t0, t1 = h.key.types
    types = t0 if h.key.op != schema.Op.FLASH_ATTN_EXT.value else f"{t0}/{t1}"
    skip = {"B"} if h.key.op != schema.Op.FLASH_ATTN_EXT.value else set()
    fields = " ".join(f"{f}={getattr(h.key, f)}" for f in h.key.INT_FIELDS if f not in skip)
    return f"{types} {fields} M={h.M}"


def _by_bucket(scored: Sequence[Held]) -> list[str]:
    """MUL_MAT_ID's in-sample time per routing bucket: the table's time summed over the bucket's points
    against the sum of their per-point bests (the bucket's table time within IN_SAMPLE_SLACK of it)."""
    buckets: dict[int, list[Held]] = {}
    for h in scored:
        if isinstance(h.key, registry.MulMatIdKey):
            buckets.setdefault(h.key.routing, []).append(h)
    lines = []
    for b, hs in sorted(buckets.items()):
        t = sum(h.predicted_us or 0.0 for h in hs)
        o = sum(h.oracle_us for h in hs)
        verdict = "within" if t <= (1 + IN_SAMPLE_SLACK) * o else "BEYOND"
        lines.append(
            f"  MUL_MAT_ID bucket {registry.ROUTING_BUCKETS.get(b, str(b))}: {len(hs)} points, "
            f"table/per-point best {t / o:.3f} ({verdict} {IN_SAMPLE_SLACK:.0%})"
        )
    return lines


def report(held: Sequence[Held]) -> list[str]:
    lines = []
    for check in ("interpolation", "class", "in-sample"):
        hs = [h for h in held if h.check == check]
        if not hs:
            continue
        agree = sum(h.predicted == h.measured for h in hs)
        oracle_agree = sum(h.predicted == h.oracle for h in hs)
        harm = [h for h in hs if h.harm]
        scored = [h for h in hs if h.predicted_us is not None]
        t = sum(h.predicted_us or 0.0 for h in scored)
        o = sum(h.oracle_us for h in scored)
        s = sum(h.stock_us for h in scored)
        claimed = [h for h in hs if h.predicted is not None]
        lines.append(
            f"{check}: {len(hs)} held-out points; route = measured decision at {agree} "
            f"({100 * agree / len(hs):.1f}%), = oracle at {oracle_agree}; {len(claimed)} claimed a route, "
            f"{len(harm)} of them slower than stock "
            f"beyond noise; time-weighted predicted/oracle {t / o:.3f}, stock/oracle {s / o:.3f}"
        )
        by_via: dict[str, list[Held]] = {}
        for h in hs:
            by_via.setdefault(h.via, []).append(h)
        for via, vs in sorted(by_via.items()):
            ok = sum(h.predicted == h.measured for h in vs)
            lines.append(f"  via {via}: {len(vs)} points, {ok} agree with the measured decision")
        if check == "in-sample":
            far = [h for h in scored if (h.predicted_us or 0.0) > (1 + IN_SAMPLE_SLACK) * h.oracle_us]
            lines.append(
                f"  {len(far)} of {len(scored)} points beyond {IN_SAMPLE_SLACK:.0%} of the per-point best:"
            )
            for h in far:
                lines.append(
                    f"  {_point(h)}: table {h.predicted or 'stock'} "
                    f"({h.via}) {h.predicted_us:.2f} us, best {h.oracle or 'stock'} {h.oracle_us:.2f} us "
                    f"({(h.predicted_us or 0.0) / h.oracle_us:.3f})"
                )
            lines.extend(_by_bucket(scored))
            continue
        for h in hs:
            if h.predicted != h.measured:
                ratio = (h.predicted_us or float("nan")) / h.oracle_us
                lines.append(
                    f"  {_point(h)}: "
                    f"predicted {h.predicted or 'stock'} "
                    f"({h.via}), measured {h.measured or 'stock'}, oracle {h.oracle or 'stock'}; "
                    f"predicted/oracle {ratio:.3f}" + (" HARM" if h.harm else "")
                )
    return lines


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ggml_dispatch.codegen.loo",
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m ggml_dispatch.codegen.loo "
        "tables/cuda-sm90-nvidia-h200/tuning/attention.parquet "
        "--vram-budget 16384",
    )
    ap.add_argument("tuning", type=Path, help="a tuning.parquet (tune run / tune merge)")
    ap.add_argument(
        "--vram-budget",
        type=int,
        metavar="MiB",
        help="as codegen's: kv=shadow rows count only under a positive budget (the table's own)",
    )
    a = ap.parse_args(argv)
    params = decide.Params()
    try:
        df = tuning_artifact.read(a.tuning).frame()
        decide.check_rows(df, a.tuning, params)
        if not vram.check_budget(a.vram_budget, a.tuning):
            df = df[~kv_shadow.shadow_rows(df)]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for line in report(interpolation_loo(df, params) + class_loo(df, params) + in_sample(df, params)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
