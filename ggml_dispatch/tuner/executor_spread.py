"""Do the GPUs of a multi-GPU sweep agree with a one-GPU sweep of the same cases?

``spread(multi, single)`` takes the tuning rows (schema.TUNING_COLUMNS dicts) of a sweep spread over
several GPUs (``tune run --executor ray``: each case on one GPU, named by its rows' ``gpu_uuid``)
and of the same cases swept on one GPU, and returns per case and route the median over trials of
each sweep, their ratio, and the trial spread of each (noise: (max - min) / median over the ok
trials); per GPU of the multi-GPU sweep the median and the extremes of the ratios and how many of
its cases agree within their noise. Stock is its own route here, from ``anchor_us``.

``cost(...)`` sets the two sweeps' wall and device seconds side by side (from their journals and the
wall time of each call that ran them): the target is a wall time on n GPUs of at most 1.2 x the
one-GPU sweep's / n.

``python -m ggml_dispatch.tuner.executor_spread MULTI.parquet SINGLE.parquet [--multi-journal J
--single-journal J
--phases P --gpus N]`` prints both as JSON (lab/tune-ray.sh).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

SHAPE: Final = ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B")
STOCK: Final = "stock"

Key = tuple[Any, ...]


def _times(rows: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, Any]]:
    """(shape..., route) -> {"us": [per-trial us], "gpus": {uuid}} over the ok trials."""
    out: dict[Key, dict[str, Any]] = {}
    stock_seen: set[Key] = set()

    def add(key: Key, us: float, gpu: str) -> None:
        e = out.setdefault(key, {"us": [], "gpus": set()})
        e["us"].append(float(us))
        e["gpus"].add(gpu)

    for r in rows:
        shape = tuple(r[k] for k in SHAPE)
        gpu = str(r.get("gpu_uuid", ""))
        # every row of a trial carries stock as anchor_us: count it once per trial
        skey = (*shape, STOCK, r.get("trial"))
        if r.get("anchor_us") is not None and skey not in stock_seen:
            stock_seen.add(skey)
            add((*shape, STOCK), r["anchor_us"], gpu)
        if r.get("status") == "ok" and r.get("us") is not None:
            # a configuration is its own candidate (rows of one route may carry several)
            add((*shape, str(r.get("config") or r["route"])), r["us"], gpu)
    return out


def _noise(us: Sequence[float]) -> float:
    med = statistics.median(us)
    return (max(us) - min(us)) / med if med > 0 else 0.0


def spread(multi: Iterable[Mapping[str, Any]], single: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    a, b = _times(multi), _times(single)
    cases = []
    for key in sorted(set(a) & set(b), key=lambda k: tuple(map(str, k))):
        ua, ub = a[key]["us"], b[key]["us"]
        ma, mb = statistics.median(ua), statistics.median(ub)
        ratio = ma / mb if mb > 0 else float("nan")
        noise = max(_noise(ua), _noise(ub))
        cases.append(
            {
                **dict(zip((*SHAPE, "route"), key, strict=True)),
                "gpu": ",".join(sorted(a[key]["gpus"])),
                "multi_us": ma,
                "single_us": mb,
                "ratio": ratio,
                "noise": noise,
                "agrees": abs(ratio - 1) <= noise,
            }
        )
    per_gpu: dict[str, dict[str, Any]] = {}
    for gpu in sorted({c["gpu"] for c in cases}):
        mine = [c for c in cases if c["gpu"] == gpu]
        ratios = [c["ratio"] for c in mine]
        per_gpu[gpu] = {
            "cases": len(mine),
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "agree_within_noise": sum(1 for c in mine if c["agrees"]),
        }
    return {
        "cases": cases,
        "per_gpu": per_gpu,
        "only_multi": len(set(a) - set(b)),
        "only_single": len(set(b) - set(a)),
    }


TARGET: Final = 1.2  # wall on n GPUs <= TARGET x (one-GPU wall / n)


def _where(rec: Mapping[str, Any]) -> str:
    p = rec.get("placement") or {}
    gpus = ",".join(str(g) for g in p.get("gpu_ids") or [])
    return f"{p.get('node_ip', '')}/{gpus}" if p else "(this machine)"


def cost(
    multi_cases: Iterable[Mapping[str, Any]],
    single_cases: Iterable[Mapping[str, Any]],
    *,
    multi_wall_s: float,
    single_wall_s: float,
    gpus: int,
) -> dict[str, Any]:
    """Journal case records of the two sweeps, and the wall seconds each took (all its calls)."""
    busy: dict[str, float] = {}
    for r in multi_cases:
        busy[_where(r)] = busy.get(_where(r), 0.0) + float(r.get("wall_s") or 0.0)
    single_case_s = sum(float(r.get("wall_s") or 0.0) for r in single_cases)
    ideal = single_wall_s / gpus if gpus > 0 else float("nan")
    return {
        "gpus": gpus,
        "multi_wall_s": multi_wall_s,
        "multi_device_s": multi_wall_s * gpus,
        "multi_case_s": sum(busy.values()),
        "busy_s": dict(sorted(busy.items())),
        "single_wall_s": single_wall_s,
        "single_case_s": single_case_s,
        "speedup": single_wall_s / multi_wall_s if multi_wall_s > 0 else float("nan"),
        "wall_over_ideal": multi_wall_s / ideal if ideal > 0 else float("nan"),
        "target": TARGET,
        "target_met": multi_wall_s <= TARGET * ideal,
    }


def phase_walls(lines: Iterable[str]) -> dict[str, float]:
    """``{"phase": NAME, "wall_s": S}`` lines (one per call of a sweep) -> seconds per phase."""
    out: dict[str, float] = {}
    for line in lines:
        if line.strip():
            rec = json.loads(line)
            out[str(rec["phase"])] = out.get(str(rec["phase"]), 0.0) + float(rec["wall_s"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import pyarrow.parquet as pq

    from ggml_dispatch.tuner.journal import read_journal

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("multi")
    ap.add_argument("single")
    ap.add_argument("--multi-journal")
    ap.add_argument("--single-journal")
    ap.add_argument("--phases", help="JSON Lines {phase: multi|single, wall_s}")
    ap.add_argument("--gpus", type=int, default=0)
    ns = ap.parse_args(argv)
    out: dict[str, Any] = {
        "spread": spread(pq.read_table(ns.multi).to_pylist(), pq.read_table(ns.single).to_pylist())
    }
    if ns.multi_journal and ns.single_journal and ns.phases:
        with open(ns.phases) as f:
            walls = phase_walls(f)
        out["cost"] = cost(
            read_journal(ns.multi_journal).cases,
            read_journal(ns.single_journal).cases,
            multi_wall_s=walls.get("multi", 0.0),
            single_wall_s=walls.get("single", 0.0),
            gpus=ns.gpus,
        )
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
