"""lab/integration_summary.py: the checks the GPU run is judged by (no GPU: inputs written here).

The llama-bench expectations are derived from llama-bench.cpp of the pinned tree (warm-up included);
the trace fixture below is shaped like SmolLM2's (30 layers, tied embeddings) with counts a correct
hook produces, and each check must also fail when its count is off by one node.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "lab" / "integration_summary.py"


@pytest.fixture(scope="module")
def summ() -> ModuleType:
    spec = importlib.util.spec_from_file_location("integration_summary", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["integration_summary"] = mod
    spec.loader.exec_module(mod)
    return mod


class Args:
    n_prompt, n_gen, reps, n_batch, n_ubatch = 512, 128, 5, 2048, 512


def test_bench_expectations(summ: ModuleType) -> None:
    # pp512: warm-up + 5 runs of 512 tokens, one output (the last token) each;
    # tg128: a 1-token warm-up + 5 x 128 tokens, each an output and its own ubatch
    assert summ.bench_expectations(Args) == {
        "tokens": 6 * 512 + 1 + 640,
        "outputs": 6 + 1 + 640,
        "ubatches": 647,
    }

    class Chunked(Args):
        n_prompt, n_batch, n_ubatch = 1000, 512, 256

    # 1000 tokens in decode calls of 512 + 488 -> 2 outputs and 2 + 2 ubatches per run
    assert summ.bench_expectations(Chunked) == {
        "tokens": 6000 + 1 + 640,
        "outputs": 12 + 1 + 640,
        "ubatches": 24 + 641,
    }


def _route(tensor: str, layout: str, M: int, count: int, **kw: Any) -> dict[str, Any]:
    r = {
        "kind": "route",
        "op": "MUL_MAT",
        "device": 0,
        "tensor": tensor,
        "src0_type": "q4_1",
        "src1_type": "f32",
        "src0_ne": [576, 576, 1, 1],
        "src0_nb": [20, 360, 207360, 207360],
        "src1_ne": [576, M, 1, 1],
        "layout": layout,
        "fused": None,
        "route": "mmvq" if M == 1 else "mmq",
        "stock_route": "mmvq" if M == 1 else "mmq",
        "reason": "stock",
        "count": count,
    }
    r.update(kw)
    return r


def smollm2_like_trace(layers: int = 30, lm_head_extra: int = 0, attn_extra: int = 0) -> list[dict[str, Any]]:
    """What a correct trace of llama-bench pp512+tg128 (-r 5) on SmolLM2 aggregates to."""
    recs: list[dict[str, Any]] = [
        {
            "kind": "header",
            "schema": "ggml-route-trace/1",
            "patch_hash": "ab" * 32,
            "upstream_commit": "0" * 40,
        }
    ]
    for il in range(layers):
        for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            name = f"blk.{il}.{w}.weight"
            last_ffn = il == layers - 1 and w.startswith("ffn_")
            fused = "glu" if w in ("ffn_gate", "ffn_up") else None
            reason = "fused" if fused else "stock"
            recs.append(_route(name, "weight", 1 if last_ffn else 512, 6))  # pp: warm-up + 5
            recs.append(_route(name, "weight", 1, 641, fused=fused, reason=reason))  # tg
        for kv in (f"cache_k_l{il} (view)", f"cache_v_l{il} (view)"):
            recs.append(_route(kv, "attention", 512, 6, src0_type="f16"))
            # tg: the KV length grows, one key per length; split in two records here
            recs.append(_route(kv, "attention", 1, 600, src0_type="f16"))
            recs.append(_route(kv, "attention", 1, 41 + (attn_extra if il == 0 else 0), src0_type="f16"))
    recs.append(_route("token_embd.weight", "weight", 1, 6 + 641 + lm_head_extra))
    recs.append({"kind": "footer", "records": len(recs) - 1, "dropped": 0, "ended": "x"})
    return recs


def _write(tmp: Path, recs: list[dict[str, Any]], census_rc: int = 0) -> tuple[Path, Path]:
    out, work = tmp / "out", tmp / "work"
    out.mkdir()
    work.mkdir()
    (out / "trace-smollm2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (out / "census.txt").write_text(f"census_ingest_rc={census_rc}\n")
    return out, work


def test_bench_checks_pass_on_a_correct_trace(summ: ModuleType, tmp_path: Path) -> None:
    out, work = _write(tmp_path, smollm2_like_trace())
    b = summ.bench_summary(out, work, Args)
    assert b["layers"] == 30 and b["weight_tensors"] == 210
    assert b["checks"] == dict.fromkeys(b["checks"], True), b


@pytest.mark.parametrize(
    ("mutation", "failing"),
    [
        ({"lm_head_extra": 1}, "lm_head_rows_equal_outputs"),
        ({"attn_extra": 1}, "attention_once_per_ubatch"),
    ],
)
def test_bench_checks_catch_one_node_off(
    summ: ModuleType, tmp_path: Path, mutation: dict[str, int], failing: str
) -> None:
    out, work = _write(tmp_path, smollm2_like_trace(**mutation))
    b = summ.bench_summary(out, work, Args)
    assert b["checks"][failing] is False
    assert not b["ok"]


def test_bench_check_catches_a_missed_replay(summ: ModuleType, tmp_path: Path) -> None:
    recs = smollm2_like_trace()
    for r in recs:
        if r.get("tensor") == "blk.3.attn_q.weight" and r["src1_ne"][1] == 1:
            r["count"] -= 1  # one replayed token not counted
    out, work = _write(tmp_path, recs)
    b = summ.bench_summary(out, work, Args)
    assert b["weights_off"] == {"blk.3.attn_q.weight": {"rows": 3712, "expected": 3713}}
    assert not b["checks"]["weights_rows_equal_tokens"]


def test_tbo_summary(summ: ModuleType, tmp_path: Path) -> None:
    d = tmp_path / "tbo"
    d.mkdir()

    def mode(name: str, passed: str, recs: list[dict[str, Any]], rc: int = 0) -> None:
        (d / f"log-{name}.txt").write_text(
            f"Testing 2 devices\n  {passed} tests passed\n  Backend CUDA0: OK\n"
        )
        (d / f"rc-{name}").write_text(f"{rc}\n")
        (d / f"sec-{name}").write_text("12\n")
        footer = {"kind": "footer", "records": len(recs), "dropped": 0, "ended": "x"}
        (d / f"trace-{name}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in [{"kind": "header"}, *recs, footer])
        )

    a = _route("a", "weight", 1, 2)
    b = _route("a", "weight", 9, 1, src1_ne=[576, 9, 1, 1])
    mode("stock", "100/100", [a, b])
    mode("force-mmq", "100/100", [dict(a, route="mmq", reason="forced"), dict(b, reason="forced")])
    mode("force-mmvf", "100/100", [dict(a, reason="ineligible:src0_type")])
    mode("force-cublas", "99/100", [dict(a, route="cublas", reason="forced")], rc=1)
    mode("force-mmvq", "100/100", [dict(b, route="mmq", reason="forced")])  # forced but ran another route
    s = summ.tbo_summary(tmp_path)
    assert s["stock"]["ok"] and s["stock"]["cases_stock"] == 2
    assert (
        s["force-mmq"]["ok"]
        and s["force-mmq"]["cases_forced"] == 2
        and s["force-mmq"]["nodes"]["forced"] == 3
    )
    # a route no case could take is a failure of the proof, not a pass
    assert s["force-mmvf"]["cases_ineligible"] == 1 and not s["force-mmvf"]["ok"]
    assert s["force-mmvf"]["ineligible_why"] == {"src0_type": 1}
    assert not s["force-cublas"]["ok"]
    assert s["force-mmvq"]["forced_with_other_route"] == 1 and not s["force-mmvq"]["ok"]


def test_ab_summary(summ: ModuleType, tmp_path: Path) -> None:
    rows = []
    for rnd, (st, off, de) in enumerate([(100.0, 101.0, 99.0), (102.0, 100.0, 100.0), (101.0, 102.0, 100.0)]):
        for variant, ts in (("stock", st), ("patched-off", off), ("patched-default", de)):
            rows.append({"variant": variant, "round": rnd, "n_prompt": 512, "n_gen": 0, "avg_ts": ts * 100})
            rows.append({"variant": variant, "round": rnd, "n_prompt": 0, "n_gen": 128, "avg_ts": ts})
    (tmp_path / "ab.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summ.ab_summary(tmp_path)
    assert set(s["tests"]) == {"pp512", "tg128"}
    assert s["ok"]
    assert s["tests"]["tg128"]["patched-off/stock"]["ratio"] == pytest.approx(303 / 303)
    rows = [dict(r, avg_ts=r["avg_ts"] * (0.8 if r["variant"] == "patched-off" else 1.0)) for r in rows]
    (tmp_path / "ab.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summ.ab_summary(tmp_path)
    assert not s["ok"] and not s["tests"]["pp512"]["patched-off/stock"]["within_noise"]
