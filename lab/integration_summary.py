# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""Summary of lab/integration.sh (stdlib only: it runs on the GPU machine).

Reads the probe output, the test-backend-ops logs and traces, the llama-bench route trace and the A/B
llama-bench results; writes summary.json, summary.md and bench.jsonl under --out. Exit status 0 even
when a check fails: the summary says which.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROUTES = ("mmvf", "mmf", "mmvq", "mmq", "cublas")
WEIGHT_RE = re.compile(r"^blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
LM_HEAD = ("output.weight", "token_embd.weight")


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of a trace / JSON Lines file; the second value counts unreadable lines (torn tail)."""
    out, bad = [], 0
    if not path.is_file():
        return out, bad
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("ggml-route-trace: "):
            line = line[len("ggml-route-trace: ") :]
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            bad += 1
    return out, bad


def case_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["src0_type"], r["src1_type"], tuple(r["src0_ne"]), tuple(r["src0_nb"]), tuple(r["src1_ne"]))


def tbo_summary(work: Path) -> dict[str, Any]:
    d = work / "tbo"
    modes: dict[str, Any] = {}
    for mode in ["stock", "stock-id", *[f"force-{r}" for r in ROUTES]]:
        log = d / f"log-{mode}.txt"
        if not log.is_file():
            continue
        text = log.read_text(errors="replace")
        m = re.search(r"(\d+)/(\d+) tests passed", text)
        passed, total = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        rc = int((d / f"rc-{mode}").read_text().strip() or -1) if (d / f"rc-{mode}").is_file() else None
        recs, bad = read_jsonl(d / f"trace-{mode}.jsonl")
        routes = [r for r in recs if r.get("kind") == "route"]
        by_reason: Counter[str] = Counter()
        keys_by_reason: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
        why: Counter[str] = Counter()
        wrong_route = 0
        forced_route = mode.removeprefix("force-") if mode.startswith("force-") else None
        for r in routes:
            reason = r["reason"]
            kind = "ineligible" if reason.startswith("ineligible:") else reason
            by_reason[kind] += r["count"]
            keys_by_reason[kind].add(case_key(r))
            if kind == "ineligible":
                why[reason.split(":", 1)[1]] += 1
            if kind == "forced" and r["route"] != forced_route:
                wrong_route += 1
        ok = (
            rc == 0
            and passed is not None
            and passed == total
            and wrong_route == 0
            and (forced_route is None or by_reason["forced"] > 0)
            and (forced_route is not None or set(by_reason) <= {"stock", "fused"})
            and any(r.get("kind") == "footer" for r in recs)
            and bool(routes)
        )
        if mode == "stock-id":  # MUL_MAT_ID is traced (expert layout), never overridden
            ok = ok and all(r["op"] == "MUL_MAT_ID" and r["layout"] == "expert" for r in routes)
        modes[mode] = {
            "rc": rc,
            "tests_passed": passed,
            "tests_total": total,
            "seconds": int((d / f"sec-{mode}").read_text()) if (d / f"sec-{mode}").is_file() else None,
            "nodes": dict(by_reason),
            "cases_forced": len(keys_by_reason["forced"]),
            "cases_ineligible": len(keys_by_reason["ineligible"] - keys_by_reason["forced"]),
            "cases_stock": len(keys_by_reason["stock"]),
            "ineligible_why": dict(why),
            "forced_with_other_route": wrong_route,
            "torn_lines": bad,
            "ok": ok,
        }
    return modes


def bench_expectations(a: argparse.Namespace) -> dict[str, int]:
    """Tokens, outputs and ubatches llama-bench processes (warm-up included), from its source:
    pp: warm-up + reps runs of test_prompt (n_batch chunks, the last token of each chunk is an output);
    tg: warm-up of 1 token + reps x n_gen tokens, each an output, each its own ubatch."""
    chunks = math.ceil(a.n_prompt / a.n_batch)
    ub_per_pp = sum(math.ceil(min(a.n_batch, a.n_prompt - i * a.n_batch) / a.n_ubatch) for i in range(chunks))
    runs = a.reps + 1
    tokens = runs * a.n_prompt + 1 + a.reps * a.n_gen
    outputs = runs * chunks + 1 + a.reps * a.n_gen
    ubatches = runs * ub_per_pp + 1 + a.reps * a.n_gen
    return {"tokens": tokens, "outputs": outputs, "ubatches": ubatches}


def bench_summary(out: Path, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    recs, bad = read_jsonl(out / "trace-smollm2.jsonl")
    headers = [r for r in recs if r.get("kind") == "header"]
    footers = [r for r in recs if r.get("kind") == "footer"]
    routes = [r for r in recs if r.get("kind") == "route"]
    exp = bench_expectations(a)
    weight_rows: dict[str, int] = defaultdict(int)
    attention: dict[str, int] = defaultdict(int)
    lm_head_rows = 0
    by_route: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    for r in routes:
        M = r["src1_ne"][1] if r["op"] == "MUL_MAT" else r["src1_ne"][2]
        by_route[r["route"]] += r["count"]
        by_reason[r["reason"]] += r["count"]
        if r["tensor"] in LM_HEAD and r["layout"] == "weight":
            lm_head_rows += r["count"] * M
        elif WEIGHT_RE.match(r["tensor"]):
            weight_rows[r["tensor"]] += r["count"] * M
        elif r["layout"] == "attention":
            attention[r["tensor"]] += r["count"]
    layers = 1 + max((int(WEIGHT_RE.match(t).group(1)) for t in weight_rows), default=-1)  # type: ignore[union-attr]
    bad_weights = {}
    for t, rows in sorted(weight_rows.items()):
        m = WEIGHT_RE.match(t)
        assert m
        last_ffn = int(m.group(1)) == layers - 1 and m.group(2).startswith("ffn_")
        want = exp["outputs"] if last_ffn else exp["tokens"]
        if rows != want:
            bad_weights[t] = {"rows": rows, "expected": want}
    attn_total = sum(attention.values())
    attn_multiple = all(v % exp["ubatches"] == 0 for v in attention.values())
    checks = {
        "trace_header": len(headers) == 1 and bool(headers[0].get("patch_hash")),
        "trace_footer": len(footers) == 1,
        "weights_rows_equal_tokens": bool(weight_rows) and not bad_weights and len(weight_rows) == 7 * layers,
        "lm_head_rows_equal_outputs": lm_head_rows == exp["outputs"],
        "attention_once_per_ubatch": attn_multiple and attn_total == 2 * layers * exp["ubatches"],
    }
    census = (out / "census.txt").read_text(errors="replace") if (out / "census.txt").is_file() else ""
    checks["census_ingest_accepts"] = "census_ingest_rc=0" in census
    return {
        "expected": exp,
        "layers": layers,
        "weight_tensors": len(weight_rows),
        "weights_off": bad_weights,
        "lm_head_rows": lm_head_rows,
        "attention_groups": len(attention),
        "attention_nodes": attn_total,
        "route_nodes": dict(by_route),
        "reasons": dict(by_reason),
        "records": len(routes),
        "torn_lines": bad,
        "upstream_commit": headers[0].get("upstream_commit") if headers else None,
        "patch_hash": headers[0].get("patch_hash") if headers else None,
        "devices": headers[0].get("devices") if headers else None,
        "checks": checks,
        "ok": all(checks.values()),
    }


def ab_summary(work: Path) -> dict[str, Any]:
    rows, _ = read_jsonl(work / "ab.jsonl")
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        test = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        by[(test, r["variant"])].append(float(r["avg_ts"]))
    tests: dict[str, Any] = {}
    for test in sorted({t for t, _ in by}):
        variants = {}
        for v in ("stock", "patched-off", "patched-default"):
            xs = by.get((test, v), [])
            if xs:
                mean = statistics.fmean(xs)
                sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
                variants[v] = {
                    "runs_ts": xs,
                    "mean_ts": mean,
                    "stdev_ts": sd,
                    "cv": sd / mean if mean else 0.0,
                }
        entry: dict[str, Any] = {"variants": variants}
        if "stock" in variants:
            base = variants["stock"]
            for v in ("patched-off", "patched-default"):
                if v in variants:
                    ratio = variants[v]["mean_ts"] / base["mean_ts"]
                    # noise: 2 x the larger between-run coefficient of variation, at least 2%
                    noise = max(0.02, 2 * max(base["cv"], variants[v]["cv"]))
                    entry[f"{v}/stock"] = {
                        "ratio": ratio,
                        "noise": noise,
                        "within_noise": abs(ratio - 1) <= noise,
                    }
        tests[test] = entry
    ok = bool(tests) and all(
        e.get("patched-off/stock", {}).get("within_noise", False) for e in tests.values()
    )
    return {"tests": tests, "ok": ok}


def markdown(s: dict[str, Any]) -> str:
    lines = ["# ggml-dispatch integration on the GPU", ""]
    if "probe" in s:
        p = s["probe"]
        lines += [
            "## Harness interface (dispatch_probe)",
            "",
            f"ok: **{p.get('ok')}**, stock build has no procs: **{p.get('stock_has_no_procs')}**",
            "",
        ]
        lines += [
            "| step | override | expect | computes | ran (by route) | forced | inelig. | nmse | ok |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in p.get("checks", []):
            ran = " ".join(f"{k}:{v}" for k, v in c["counts"].items() if k in ("stock", *ROUTES) and v)
            lines.append(
                f"| {c['step']} | {c['override']} | {c['expect']} | {c['computes']} | {ran} | "
                f"{c['counts']['forced']} | {c['counts']['ineligible']} | {c['nmse']} | {c['ok']} |"
            )
        lines.append("")
    if "tbo" in s:
        lines += [
            "## test-backend-ops test -o MUL_MAT (CUDA0)",
            "",
            "| mode | passed | cases forced | cases refused | nodes forced | why refused | s | ok |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, m in s["tbo"].items():
            why = ", ".join(f"{k} {v}" for k, v in sorted(m["ineligible_why"].items()))
            forced = m["nodes"].get("forced", 0)
            lines.append(
                f"| {mode} | {m['tests_passed']}/{m['tests_total']} | {m['cases_forced']} | "
                f"{m['cases_ineligible']} | {forced} | {why} | {m['seconds']} | {m['ok']} |"
            )
        lines.append("")
    if "bench" in s:
        b = s["bench"]
        e = b["expected"]
        lines += [
            "## llama-bench SmolLM2 (pp512 + tg128, warm-up + 5 reps) with route trace",
            "",
            f"expected: tokens {e['tokens']}, outputs {e['outputs']}, ubatches {e['ubatches']}; "
            f"layers {b['layers']}",
            f"weight tensors {b['weight_tensors']} (off: {len(b['weights_off'])}), "
            f"LM head rows {b['lm_head_rows']}, attention nodes {b['attention_nodes']} "
            f"in {b['attention_groups']} groups, records {b['records']}",
            f"routes: {b['route_nodes']}",
            f"reasons: {b['reasons']}",
            "",
        ]
        lines += [f"- {k}: **{v}**" for k, v in b["checks"].items()]
        lines.append("")
    if "ab" in s:
        lines += [
            "## A/B: GGML_CUDA_DISPATCH=off (patched) vs unpatched, interleaved",
            "",
            "| test | stock t/s | patched-off t/s | default t/s | off/stock | default/stock | in noise |",
            "|---|---|---|---|---|---|---|",
        ]
        for test, t in s["ab"]["tests"].items():

            def cell(name: str, v: dict[str, Any] = t["variants"]) -> str:
                x = v.get(name)
                return f"{x['mean_ts']:.1f} ± {x['stdev_ts']:.1f}" if x else "-"

            off = t.get("patched-off/stock", {})
            de = t.get("patched-default/stock", {})
            lines.append(
                f"| {test} | {cell('stock')} | {cell('patched-off')} | {cell('patched-default')} | "
                f"{off.get('ratio', float('nan')):.4f} | {de.get('ratio', float('nan')):.4f} | "
                f"{off.get('within_noise')} (±{off.get('noise', 0):.3f}) |"
            )
        lines.append("")
    lines += ["## Verdict", ""] + [f"- {k}: **{v}**" for k, v in s["verdict"].items()] + [""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--parts", default="probe,tbo,bench,ab")
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--n-ubatch", type=int, default=512)
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    s: dict[str, Any] = {"parts": sorted(parts)}
    verdict: dict[str, bool] = {}
    if "probe" in parts:
        p: dict[str, Any] = {}
        try:
            p = json.loads((a.out / "probe.json").read_text())
        except (OSError, ValueError) as e:
            p = {"ok": False, "error": str(e)}
        try:
            stock = json.loads((a.work / "probe-stock.json").read_text())
            p["stock_has_no_procs"] = stock.get("procs") is False
        except (OSError, ValueError):
            p["stock_has_no_procs"] = False
        s["probe"] = p
        verdict["probe"] = bool(p.get("ok")) and p.get("procs") is True and p["stock_has_no_procs"]
    if "tbo" in parts:
        s["tbo"] = tbo_summary(a.work)
        n_modes = len(s["tbo"])
        verdict[f"test-backend-ops ({n_modes} of {2 + len(ROUTES)} modes run)"] = n_modes > 0 and all(
            m["ok"] for m in s["tbo"].values()
        )
    if "bench" in parts:
        s["bench"] = bench_summary(a.out, a.work, a)
        verdict["bench trace"] = s["bench"]["ok"]
    if "ab" in parts:
        s["ab"] = ab_summary(a.work)
        verdict["A/B off vs unpatched"] = s["ab"]["ok"]
    s["verdict"] = verdict
    with (a.out / "bench.jsonl").open("w") as f:
        for name, tag in (("bench-traced.jsonl", "traced"), ("ab.jsonl", None)):
            rows, _ = read_jsonl(a.work / name)
            for r in rows:
                if tag:
                    r["variant"] = tag
                f.write(json.dumps(r) + "\n")
    (a.out / "summary.json").write_text(json.dumps(s, indent=2, sort_keys=True) + "\n")
    (a.out / "summary.md").write_text(markdown(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
