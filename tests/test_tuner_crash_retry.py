"""A harness child killed while checking or timing one candidate configuration (ggml's GGML_ASSERT after
cudaGraphExecUpdate under a cuBLAS configuration, on the H200) costs that configuration, not the point: the
case runs again without it, and its rows say how it failed. The harness here is a stand-in script that
logs and aborts as the real one does (the real one needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ggml_dispatch import schema
from ggml_dispatch.tuner import results
from ggml_dispatch.tuner.run import CRASH_RETRIES, crashed_candidate, run_harness_case
from ggml_dispatch.tuner.select import Case

FAKE = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
cases = json.load(open(args[args.index("--cases") + 1]))
crash = set(os.environ.get("FAKE_CRASH", "").split(";"))
header = {{"kind": "header", "gpu_name": "NVIDIA H200", "gpu_cc": 900, "gpu_sm_count": 132}}
print(json.dumps(header), flush=True)
for c in cases:
    for r in ["stock", *c["routes"]]:
        print(f"harness: case {{c['case']}}: check route={{r}}", file=sys.stderr, flush=True)
        if r in crash:
            assertion = "GGML_ASSERT(stat == cudaSuccess) failed"
            print(f"/src/ggml/src/ggml-cuda/ggml-cuda.cu:2750: {{assertion}}", file=sys.stderr)
            for _ in range(14):  # ggml's backtrace: more lines than the journal's stderr tail keeps
                print("/lib/libggml-base.so.0(ggml_abort+0x15b)[0x7f95d2947b3b]", file=sys.stderr)
            sys.stderr.flush()
            os.abort()
    for t in range(c["trials"]):
        for r in ["stock", *c["routes"]]:
            print(json.dumps({{"kind": "trial", "case": c["case"], "route": r, "trial": t, "us": 10.0,
                              "anchor_us": 12.0, "status": "ok", "replays": 5, "nodes": 8, "nmse": 1e-6,
                              "route_ran": r.split("/")[0], "reason": ""}}))
    print(json.dumps({{"kind": "case", "case": c["case"], "status": "done"}}))
"""

CONFIGS = ("mmq", "cublas/out=f16,compute=f16", "cublas/out=f32,compute=f16", "cublas/out=f32,compute=f32")
CASE = Case(schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 4096, 1), 128, 1.0, True, CONFIGS, 3)


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    p = tmp_path / "ggml-dispatch-harness"
    p.write_text(FAKE)
    p.chmod(0o755)
    return p


def test_a_crash_on_one_configuration_costs_that_configuration(
    harness: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CRASH", "cublas/out=f32,compute=f16")
    r = run_harness_case(harness, CASE, harness_args=(), timeout=60)
    assert r.status == "done"
    by_route: dict[str, list[dict[str, object]]] = {}
    for t in r.trials:
        by_route.setdefault(str(t["route"]), []).append(t)
    assert set(by_route) == {"stock", *CONFIGS}
    lost = by_route["cublas/out=f32,compute=f16"]
    assert len(lost) == CASE.trials and all(t["us"] is None for t in lost)
    assert all(
        str(t["status"]).startswith(
            "failed:killed by SIGABRT during check route=cublas/out=f32,compute=f16: "
        )
        and str(t["status"]).endswith("GGML_ASSERT(stat == cudaSuccess) failed")
        for t in lost
    )
    assert all(t["status"] == "ok" for c in ("mmq", "cublas/out=f32,compute=f32") for t in by_route[c])
    assert list(r.case_info["crashed"]) == ["cublas/out=f32,compute=f16"]
    # the tuning rows: the lost configuration's say how it failed; the others are timed
    rec = {
        "spec": CASE.spec(),
        "status": r.status,
        "trials": r.trials,
        "header": r.header,
        "case_info": r.case_info,
    }
    rows = results.rows_of_record(rec)
    failed = [x for x in rows if x["config"] == "cublas/out=f32,compute=f16"]
    assert len(failed) == 3 and all(str(x["status"]).startswith(schema.FAILED_PREFIX) for x in failed)
    assert {x["status"] for x in rows if x["config"] == "mmq"} == {"ok"}


def test_crashes_beyond_the_retries_and_a_crash_of_stock_fail_the_case(
    harness: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CRASH", ";".join(CONFIGS))  # every candidate crashes: 4 > CRASH_RETRIES
    assert len(CONFIGS) > CRASH_RETRIES
    r = run_harness_case(harness, CASE, harness_args=(), timeout=60)
    assert r.status.startswith("failed:killed by SIGABRT during check route=") and r.trials == []
    monkeypatch.setenv("FAKE_CRASH", "stock")  # the anchor itself: nothing to drop
    r = run_harness_case(harness, CASE, harness_args=(), timeout=60)
    assert r.status.startswith("failed:killed by SIGABRT during check route=stock") and r.crashed_on is None


def test_the_candidate_is_read_from_the_last_progress_line() -> None:
    err = "\n".join(
        [
            "harness: case X: check route=mmq",
            "harness: case X: pruned route=mmq (slower)",
            "harness: case X: trial 2 route=cublas/out=f16,compute=f16",
            "GGML_ASSERT(x) failed",
        ]
    )
    assert crashed_candidate(err, CASE) == "cublas/out=f16,compute=f16"
    assert crashed_candidate("harness: case X: check route=stock\nboom", CASE) is None
    assert crashed_candidate("no progress line", CASE) is None
