"""Device experiments that check the harness against test-backend-ops (lab/tune-agreement.sh).

Three parts, one device run:

1. agreement: the reference TSV's shapes with M >= 64 (test-backend-ops ``m, n, k`` converted at the
   border: N = m, M = n, K = k), timed by the harness (median over ok trials) and by
   test-backend-ops ``perf --output sql`` (cases through ``--test-file``, the route forced with
   ``GGML_CUDA_DISPATCH=force:<route>``, stock with ``off``). Where the weights do not fit in L2 the
   two medians should agree within 10% (test-backend-ops re-reads one weight copy, so shapes that fit
   in L2 are cache-flattered there and are reported, not judged).
2. cost: device-seconds until the 95% CI of the route/stock ratio (median of paired per-trial ratios,
   percentile bootstrap, the statistic codegen decides with) is narrower than +-1%, per (shape, route):
   the harness (trials in one process, each trial pairs stock with the route) next to test-backend-ops
   (one stock and one forced-route process per repetition, each sample >= 1 s by its perf loop).
3. L2: the M = 1 shapes with and without weight rotation, same shapes, same process.

Standard library only (it runs under the GPU machine's own python3 with PYTHONPATH at the repo).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import schema

AGREE_TOLERANCE: Final = 0.10
CI_HALF_WIDTH: Final = 0.01
CONFIDENCE: Final = 0.95
RESAMPLES: Final = 2000
STOCK: Final = "stock"


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class RefRow:
    src0_type: str
    M: int
    N: int
    K: int
    route: str
    us: float


def parse_reference_tsv(path: Path) -> list[RefRow]:
    """samples/reference/h200-mul-mat-routes.tsv: ``type m n k route runs us_per_run`` (m = N, n = M)."""
    rows: list[RefRow] = []
    header: list[str] | None = None
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            need = {"type", "m", "n", "k", "route", "us_per_run"}
            if not need <= set(header):
                raise ValueError(f"{path}:{i}: header lacks {sorted(need - set(header))}")
            continue
        d = dict(zip(header, cells, strict=False))
        M, N, K = schema.from_test_backend_ops(int(d["m"]), int(d["n"]), int(d["k"]))
        rows.append(RefRow(d["type"], M, N, K, d["route"], float(d["us_per_run"])))
    return rows


def case_id(src0_type: str, N: int, K: int, M: int) -> str:
    return f"{src0_type}:N{N}:K{K}:M{M}"


def _case(t: str, N: int, K: int, M: int, routes: Iterable[str], trials: int, **extra: Any) -> dict[str, Any]:
    return {
        "case": case_id(t, N, K, M),
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": t,
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": K,
        "B": 1,
        "routes": sorted(set(routes)),
        "trials": trials,
        "nmse_max": 5e-4,
        **extra,
    }


def agreement_cases(ref: Sequence[RefRow], *, min_m: int = 64, trials: int = 5) -> list[dict[str, Any]]:
    """One case per (type, N, K, M) with M >= min_m; the candidates are the routes the TSV timed there."""
    routes: dict[tuple[str, int, int, int], set[str]] = defaultdict(set)
    for r in ref:
        if min_m <= r.M:
            routes[(r.src0_type, r.N, r.K, r.M)].add(r.route)
    return [_case(t, N, K, M, rs, trials) for (t, N, K, M), rs in sorted(routes.items())]


def l2_cases(ref: Sequence[RefRow], *, trials: int = 5) -> list[dict[str, Any]]:
    """The M = 1 shapes twice: with weight rotation and with one copy (what test-backend-ops does)."""
    routes: dict[tuple[str, int, int], set[str]] = defaultdict(set)
    for r in ref:
        if r.M == 1:
            routes[(r.src0_type, r.N, r.K)].add(r.route)
    out = []
    for (t, N, K), rs in sorted(routes.items()):
        for rotate in (True, False):
            c = _case(t, N, K, 1, rs, trials, rotate=rotate)
            c["case"] += ":rotated" if rotate else ":one-copy"
            out.append(c)
    return out


# ---------------------------------------------------------------------------------------------
# outputs of the two tools


def read_jsonl(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


_NAME = re.compile(r"(?:^|,)name=([^,]+)")


def parse_tbo_sql(text: str) -> list[dict[str, Any]]:
    """test-backend-ops ``--output sql`` (with ``-- key=value ...`` comment lines this module adds
    before each run) -> one dict per INSERT, with ``case`` (the test-file name) and the run's keys."""
    out: list[dict[str, Any]] = []
    run: dict[str, str] = {}
    chunk: list[str] = []

    def flush() -> None:
        if not chunk:
            return
        db = sqlite3.connect(":memory:")
        db.executescript("\n".join(chunk))
        db.row_factory = sqlite3.Row
        try:
            for row in db.execute("SELECT * FROM test_backend_ops"):
                d = dict(row)
                m = _NAME.search(str(d.get("op_params", "")))
                d["case"] = m.group(1) if m else None
                d.update(run)
                out.append(d)
        except sqlite3.OperationalError:
            pass
        db.close()
        chunk.clear()

    for line in text.splitlines():
        if line.startswith("-- run:"):
            flush()
            run = dict(kv.split("=", 1) for kv in line[len("-- run:") :].split() if "=" in kv)
        elif line.startswith(("CREATE TABLE", "INSERT INTO", "  ", ");")):
            chunk.append(line)
    flush()
    return out


def routes_in_trace(path: Path) -> dict[str, set[str]]:
    """A route trace (ggml-route-trace/1) -> case key (type:N..:K..:M..) -> routes that ran."""
    seen: dict[str, set[str]] = defaultdict(set)
    if not path.is_file():
        return seen
    for rec in read_jsonl(
        path.read_text(encoding="utf-8", errors="replace").replace(schema.TRACE_STDERR_PREFIX, "")
    ):
        if rec.get("kind") != "route" or rec.get("op") != "MUL_MAT":
            continue
        ne0, ne1 = rec.get("src0_ne") or [0, 0], rec.get("src1_ne") or [0, 0]
        seen[case_id(str(rec.get("src0_type")), int(ne0[1]), int(ne0[0]), int(ne1[1]))].add(
            str(rec.get("route"))
        )
    return seen


# ---------------------------------------------------------------------------------------------
# statistics


def _median(v: Sequence[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def ratio_ci(ratios: Sequence[float], *, seed: int = 0) -> tuple[float, float, float]:
    """Median of paired ratios and its percentile-bootstrap 95% CI (trials resampled)."""
    med = _median(ratios)
    rng = random.Random(seed)
    n = len(ratios)
    boots = sorted(_median([ratios[rng.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES))
    alpha = (1 - CONFIDENCE) / 2
    lo = boots[math.floor(alpha * (RESAMPLES - 1))]
    hi = boots[math.ceil((1 - alpha) * (RESAMPLES - 1))]
    return med, lo, hi


def first_precise(ratios: Sequence[float], costs: Sequence[float], *, min_n: int = 3) -> dict[str, Any]:
    """The first prefix of the ratio sequence whose CI half-width is <= 1% of the median, with the
    cumulative cost (device-seconds) at that point; ``reached`` False if none is."""
    best: dict[str, Any] = {"reached": False, "n": len(ratios), "cost_s": costs[-1] if costs else None}
    for n in range(min_n, len(ratios) + 1):
        med, lo, hi = ratio_ci(ratios[:n], seed=n)
        half = (hi - lo) / 2 / med if med > 0 else math.inf
        best.update(ratio=med, lo=lo, hi=hi, half_width=half, n=n, cost_s=costs[n - 1])
        if half <= CI_HALF_WIDTH:
            best["reached"] = True
            return best
    return best


# ---------------------------------------------------------------------------------------------
# running the tools


def _log(msg: str) -> None:
    print(f"agreement: {msg}", file=sys.stderr, flush=True)


def run_harness(
    harness: Path, cases: list[dict[str, Any]], work: Path, name: str, args: Sequence[str]
) -> str:
    spec = work / f"{name}.cases.json"
    spec.write_text(json.dumps(cases, indent=1))
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(harness), "--cases", str(spec), *args], capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - t0
    (work / f"{name}.stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        _log(f"harness ({name}) exited {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}")
    return (
        proc.stdout
        + json.dumps({"kind": "process", "name": name, "rc": proc.returncode, "wall_s": wall})
        + "\n"
    )


def emit_test_file(harness: Path, cases: list[dict[str, Any]], work: Path, name: str) -> Path:
    spec = work / f"{name}.tbo-cases.json"
    spec.write_text(json.dumps(cases))
    out = work / f"{name}.test-file.txt"
    subprocess.run([str(harness), "--cases", str(spec), "--emit-test-file", str(out)], check=True)
    return out


def run_tbo(tbo: Path, test_file: Path, device: str, config: str, work: Path, tag: str) -> str:
    env = dict(os.environ)
    env["GGML_CUDA_DISPATCH"] = "off" if config == STOCK else f"force:{config}"
    trace = work / f"trace-{tag}.jsonl"
    env["GGML_CUDA_ROUTE_TRACE"] = str(trace)
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(tbo), "perf", "-b", device, "--test-file", str(test_file), "--output", "sql"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.monotonic() - t0
    n = sum(1 for line in test_file.read_text().splitlines() if line.strip())
    (work / f"tbo-{tag}.stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        _log(f"test-backend-ops ({tag}) exited {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}")
    sql = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("-- "))
    return f"-- run: config={config} tag={tag} wall_s={wall:.3f} cases={n} rc={proc.returncode}\n{sql}\n"


# ---------------------------------------------------------------------------------------------
# summaries


def _harness_index(
    recs: list[dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, dict[str, list[dict[str, Any]]]]]:
    header = next((r for r in recs if r.get("kind") == "header"), {})
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in recs:
        if r.get("kind") == "trial":
            by[str(r["case"])][str(r["route"])].append(r)
    return header, by


def _ok_us(rows: list[dict[str, Any]]) -> list[float]:
    return [float(r["us"]) for r in rows if r.get("status") == "ok" and r.get("us") is not None]


def summarize_agreement(
    harness_text: str,
    sql_text: str,
    cases: list[dict[str, Any]],
    ref: Sequence[RefRow],
    l2_bytes: int,
    work: Path,
) -> list[dict[str, Any]]:
    header, by = _harness_index(read_jsonl(harness_text))
    tbo: dict[tuple[str, str], float] = {}
    for r in parse_tbo_sql(sql_text):
        if r.get("case") and int(r.get("supported", 0) or 0) == 1 and float(r.get("time_us") or 0) > 0:
            tbo[(str(r["case"]), str(r["config"]))] = float(r["time_us"])
    ref_us = {(case_id(x.src0_type, x.N, x.K, x.M), x.route): x.us for x in ref}
    traces = {
        p.name[len("trace-agree-") : -len(".jsonl")]: routes_in_trace(p)
        for p in work.glob("trace-agree-*.jsonl")
    }
    out = []
    for c in cases:
        wbytes = schema.ggml_type(c["src0_type"]).row_bytes(c["K"]) * c["N"]
        for route in [STOCK, *c["routes"]]:
            rows = by.get(c["case"], {}).get(route, [])
            us = _ok_us(rows)
            statuses = sorted({str(r.get("status")) for r in rows})
            h = _median(us) if us else None
            t = tbo.get((c["case"], route))
            ran_tbo = sorted(traces.get(route, {}).get(c["case"], set()))
            d: dict[str, Any] = {
                "case": c["case"],
                "route": route,
                "weight_mb": round(wbytes / 1e6, 2),
                "fits_l2": wbytes <= l2_bytes,
                "harness_us": h,
                "harness_status": ",".join(statuses),
                "harness_route_ran": sorted(
                    {str(r.get("route_ran")) for r in rows if r.get("status") == "ok"}
                ),
                "tbo_us": t,
                "tbo_route_ran": ran_tbo,
                "reference_us": ref_us.get((c["case"], route)),
            }
            if h and t:
                d["harness_over_tbo"] = h / t
                d["within_10pct"] = abs(h / t - 1) <= AGREE_TOLERANCE
            out.append(d)
    _ = header
    return out


def summarize_cost(
    harness_text: str, sql_text: str, cost_cases: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    recs = read_jsonl(harness_text)
    _, by = _harness_index(recs)
    per_sample: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)  # (rep, us, cost_s)
    for r in parse_tbo_sql(sql_text):
        if not r.get("case") or int(r.get("supported", 0) or 0) != 1:
            continue
        cost = float(r["wall_s"]) / max(1, int(r["cases"]))
        per_sample[(str(r["case"]), str(r["config"]))].append((int(r["rep"]), float(r["time_us"]), cost))
    out = []
    for c in cost_cases:
        rows = by.get(c["case"], {})
        for route in c["routes"]:
            trials = sorted(
                (r for r in rows.get(route, []) if r.get("status") == "ok"), key=lambda r: int(r["trial"])
            )
            ratios = [
                float(r["anchor_us"]) / float(r["us"]) for r in trials if r.get("anchor_us") and r.get("us")
            ]
            # device-seconds from the harness' start to the end of that trial (all its candidates)
            trial_end: dict[int, float] = {}
            for rr in (x for xs in rows.values() for x in xs):
                if rr.get("t_end_s") is not None:
                    t = int(rr["trial"])
                    trial_end[t] = max(trial_end.get(t, 0.0), float(rr["t_end_s"]))
            costs = [
                max(v for k, v in trial_end.items() if k <= int(r["trial"]))
                for r in trials
                if r.get("anchor_us") and r.get("us")
            ]
            d: dict[str, Any] = {"case": c["case"], "route": route}
            d["harness"] = (
                first_precise(ratios, costs) if len(ratios) >= 3 else {"reached": False, "n": len(ratios)}
            )
            stock = {rep: (us, cost) for rep, us, cost in per_sample.get((c["case"], STOCK), [])}
            pairs = sorted(
                (rep, stock[rep][0] / us, stock[rep][1] + cost)
                for rep, us, cost in per_sample.get((c["case"], route), [])
                if rep in stock
            )
            t_ratios = [p[1] for p in pairs]
            t_costs = [sum(p[2] for p in pairs[: i + 1]) for i in range(len(pairs))]
            d["tbo"] = (
                first_precise(t_ratios, t_costs)
                if len(t_ratios) >= 3
                else {"reached": False, "n": len(t_ratios)}
            )
            hs, ts = d["harness"].get("cost_s"), d["tbo"].get("cost_s")
            if d["harness"]["reached"] and hs:
                # test-backend-ops' cost is a lower bound when it never reached the precision
                d["tbo_over_harness"] = ts / hs if ts else None
                d["tbo_lower_bound"] = not d["tbo"]["reached"]
            out.append(d)
    return out


def summarize_l2(harness_text: str, ref: Sequence[RefRow]) -> list[dict[str, Any]]:
    _, by = _harness_index(read_jsonl(harness_text))
    ref_us = {(case_id(x.src0_type, x.N, x.K, x.M), x.route): x.us for x in ref}
    out = []
    for cid in sorted({k.rsplit(":", 1)[0] for k in by if k.endswith((":rotated", ":one-copy"))}):
        rot, one = by.get(cid + ":rotated", {}), by.get(cid + ":one-copy", {})
        for route in sorted(set(rot) | set(one)):
            a, b = _ok_us(rot.get(route, [])), _ok_us(one.get(route, []))
            copies = next(
                (int(r["weight_copies"]) for r in rot.get(route, []) if r.get("weight_copies")), None
            )
            d: dict[str, Any] = {
                "case": cid,
                "route": route,
                "rotated_us": _median(a) if a else None,
                "one_copy_us": _median(b) if b else None,
                "copies": copies,
                "reference_us": ref_us.get((cid, route)),
            }
            if d["rotated_us"] and d["one_copy_us"]:
                d["rotated_over_one_copy"] = d["rotated_us"] / d["one_copy_us"]
            out.append(d)
    return out


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_markdown(summary: dict[str, Any]) -> str:
    lines: list[str] = [f"# Harness vs test-backend-ops on {summary.get('device', '?')}", ""]
    if "agreement" in summary:
        a = summary["agreement"]
        judged = [r for r in a if not r["fits_l2"] and "within_10pct" in r]
        ok = sum(r["within_10pct"] for r in judged)
        lines += [
            f"## 1. Agreement (M >= 64): {ok}/{len(judged)} within 10% where the weights exceed L2",
            "",
            "| case | route | MB | fits L2 | harness us | tbo us | harness/tbo | tbo ran | reference us |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in a:
            lines.append(
                f"| {r['case']} | {r['route']} | {r['weight_mb']} | {'yes' if r['fits_l2'] else 'no'} | "
                f"{_f(r['harness_us'])} | {_f(r['tbo_us'])} | {_f(r.get('harness_over_tbo'), '{:.3f}')} | "
                f"{','.join(r['tbo_route_ran']) or '-'} | {_f(r['reference_us'])} |"
            )
        lines.append("")
    if "cost" in summary:
        lines += [
            "## 2. Device-seconds to a +-1% 95% CI of the stock/route ratio (median of paired ratios)",
            "",
            "| case | route | harness s (trials) | tbo s (pairs) | tbo/harness |",
            "|---|---|---|---|---|",
        ]
        for r in summary["cost"]:
            h, t = r["harness"], r["tbo"]
            hs = f"{_f(h.get('cost_s'), '{:.2f}')} ({h.get('n')}){'' if h['reached'] else ' not reached'}"
            ts = f"{_f(t.get('cost_s'), '{:.1f}')} ({t.get('n')}){'' if t['reached'] else ' not reached'}"
            sp = r.get("tbo_over_harness")
            sps = "-" if sp is None else (">" if r.get("tbo_lower_bound") else "") + f"{sp:.1f}x"
            lines.append(f"| {r['case']} | {r['route']} | {hs} | {ts} | {sps} |")
        lines.append("")
    if "l2" in summary:
        lines += [
            "## 3. M = 1 with and without weight rotation",
            "",
            "| case | route | copies | rotated us | one copy us | rotated/one copy | reference us |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in summary["l2"]:
            lines.append(
                f"| {r['case']} | {r['route']} | {_f(r['copies'], '{}')} | {_f(r['rotated_us'])} | "
                f"{_f(r['one_copy_us'])} | {_f(r.get('rotated_over_one_copy'), '{:.3f}')} | "
                f"{_f(r['reference_us'])} |"
            )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# command line


def _pick_cost_cases(
    cases: list[dict[str, Any]], agree: list[dict[str, Any]], n: int
) -> list[dict[str, Any]]:
    """Cases whose weights exceed L2, with the routes the harness found eligible; spread over the list."""
    eligible: dict[str, list[str]] = defaultdict(list)
    big = set()
    for r in agree:
        if r["route"] != STOCK and r["harness_us"] is not None:
            eligible[r["case"]].append(r["route"])
        if not r["fits_l2"]:
            big.add(r["case"])
    pool = (
        [c for c in cases if c["case"] in big and eligible.get(c["case"])]
        or [c for c in cases if eligible.get(c["case"])]
        or list(cases)
    )
    picked = pool if n >= len(pool) else [pool[round(i * (len(pool) - 1) / max(1, n - 1))] for i in range(n)]
    return [{**c, "routes": eligible.get(c["case"]) or c["routes"]} for c in picked]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ggml_dispatch.tuner.agreement", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--harness", type=Path, required=True, help="ggml-dispatch-harness binary")
    p.add_argument("--tbo", type=Path, required=True, help="test-backend-ops binary of the same ggml build")
    p.add_argument("--tsv", type=Path, required=True, help="samples/reference/h200-mul-mat-routes.tsv")
    p.add_argument("--out", type=Path, required=True, help="folder for raw results and the summary")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: OUT/../agreement-work)")
    p.add_argument("--parts", default="1,2,3", help="which parts to run (default 1,2,3)")
    p.add_argument("--device", default="CUDA0", help="ggml device for both tools (default CUDA0)")
    p.add_argument("--min-m", type=int, default=64)
    p.add_argument("--trials", type=int, default=5, help="harness trials for parts 1 and 3")
    p.add_argument("--cost-cases", type=int, default=3)
    p.add_argument("--cost-trials", type=int, default=40, help="harness trials for part 2")
    p.add_argument("--tbo-reps", type=int, default=8, help="test-backend-ops repetitions for part 2")
    p.add_argument(
        "--max-cases", type=int, default=0, help="use only the first N cases of each part (0 = all)"
    )
    p.add_argument("--harness-arg", action="append", default=[], help="extra harness argument (repeatable)")
    a = p.parse_args(argv)

    parts = {int(x) for x in a.parts.split(",") if x.strip()}
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work or a.out.parent / "agreement-work"
    work.mkdir(parents=True, exist_ok=True)
    ref = parse_reference_tsv(a.tsv)
    hargs = ["--device", a.device, *a.harness_arg]
    info = read_jsonl(
        subprocess.run([str(a.harness), "--info", *hargs], capture_output=True, text=True).stdout
    )
    header = info[0] if info else {}
    l2 = int(header.get("l2_bytes") or 0)
    summary: dict[str, Any] = {
        "device": header.get("gpu_name") or header.get("description"),
        "header": header,
    }

    def lim(xs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return xs[: a.max_cases] if a.max_cases > 0 else xs

    cases = lim(agreement_cases(ref, min_m=a.min_m, trials=a.trials))
    agree: list[dict[str, Any]] = []
    if 1 in parts or 2 in parts:
        saved = work / "harness-agreement.jsonl"
        if 1 not in parts and saved.is_file():
            # part 2 only needs which routes are eligible where: reuse an earlier call's part 1
            _log(f"part 2: eligibility from the earlier part 1 in {saved}")
            h_text = saved.read_text()
        else:
            _log(f"part 1: {len(cases)} cases, harness")
            h_text = run_harness(a.harness, cases, work, "agree", hargs)
            saved.write_text(h_text)
            (a.out / "harness-agreement.jsonl").write_text(h_text)
        tfile = emit_test_file(a.harness, cases, work, "agree")
        _, by = _harness_index(read_jsonl(h_text))
        configs = [
            STOCK,
            *sorted({r for c in by.values() for r, rows in c.items() if r != STOCK and _ok_us(rows)}),
        ]
        sql = ""
        if 1 in parts:
            for cfg in configs:
                _log(f"part 1: test-backend-ops perf, {cfg}")
                sql += run_tbo(a.tbo, tfile, a.device, cfg, work, f"agree-{cfg}")
            (a.out / "tbo-agreement.sql").write_text(sql)
        agree = summarize_agreement(h_text, sql, cases, ref, l2, work)
        if 1 in parts:
            summary["agreement"] = agree

    if 2 in parts:
        cost_cases = _pick_cost_cases(cases, agree, a.cost_cases)
        _log(
            f"part 2: {len(cost_cases)} cases, {a.cost_trials} harness trials, "
            f"{a.tbo_reps} test-backend-ops reps"
        )
        h_text = ""
        for c in cost_cases:
            h_text += run_harness(
                a.harness,
                [{**c, "trials": a.cost_trials}],
                work,
                "cost-" + c["case"].replace(":", "_"),
                hargs,
            )
        (a.out / "harness-cost.jsonl").write_text(h_text)
        tfile = emit_test_file(a.harness, cost_cases, work, "cost")
        configs = [STOCK, *sorted({r for c in cost_cases for r in c["routes"]})]
        sql = ""
        for rep in range(a.tbo_reps):
            for cfg in configs:
                sql += run_tbo(a.tbo, tfile, a.device, cfg, work, f"cost-{cfg}-{rep}").replace(
                    "-- run: ", f"-- run: rep={rep} ", 1
                )
        (a.out / "tbo-cost.sql").write_text(sql)
        summary["cost"] = summarize_cost(h_text, sql, cost_cases)

    if 3 in parts:
        lc = lim(l2_cases(ref, trials=a.trials))
        _log(f"part 3: {len(lc)} cases (M = 1, rotated and one copy)")
        h_text = run_harness(a.harness, lc, work, "l2", hargs)
        (a.out / "harness-l2.jsonl").write_text(h_text)
        summary["l2"] = summarize_l2(h_text, ref)

    (a.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))
    md = render_markdown(summary)
    (a.out / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
