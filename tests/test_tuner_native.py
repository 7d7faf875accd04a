"""The real harness, built against the pinned tree's CPU backend, and `ggml-dispatch tune` end to end.

CI has no GPU: the CPU backend has no route-override API, so the harness measures stock only and
reports the five routes as ineligible (no-override-api). Everything else is the real thing: ggml's
quantization, the rotated copies, the replicated graph, the CPU reference and NMSE, the journal, the
child processes. A CUDA context killed by a trap is stood in for by a wrapper that kills the real
harness with a signal (test_failures_cost_one_case)."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.tuner import agreement, build, results, select
from ggml_dispatch.tuner.journal import read_journal

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).parent / "ggml-dispatch")
FAST = ["--harness-arg=--trial-ms=2", "--harness-arg=--threads=1", "--harness-arg=--target-graph-us=200"]
ROUTES_ONLY = ["--configs", "routes"]  # the plain routes: 5 candidates per case


@pytest.fixture(scope="module")
def test_backend_ops(harness: Path) -> Path:
    """The tree's tests/test-backend-ops.cpp linked against the same ggml (the harness' CMake option)."""
    bdir = harness.parent.parent
    subprocess.run(["cmake", "-DTUNER_TEST_BACKEND_OPS=ON", str(bdir)], check=True, capture_output=True)
    subprocess.run(
        ["cmake", "--build", str(bdir), "--target", "test-backend-ops", "-j", str(os.cpu_count() or 2)],
        check=True,
        capture_output=True,
    )
    return bdir / "bin" / "test-backend-ops"


def harness_run(harness: Path, cases: list[dict[str, Any]], tmp: Path, *args: str) -> list[dict[str, Any]]:
    f = tmp / "cases.json"
    f.write_text(json.dumps(cases))
    p = subprocess.run(
        [str(harness), "--cases", str(f), "--threads", "1", *args], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def case(
    cid: str, src0: str = "q4_0", M: int = 4, N: int = 64, K: int = 256, B: int = 1, **kw: Any
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "case": cid,
        "op": "MUL_MAT",
        "layout": "weight" if B == 1 else "attention",
        "src0_type": src0,
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": K,
        "B": B,
        "routes": ["mmvq", "mmq", "cublas"],
        "trials": 3,
        "nmse_max": 5e-4,
    }
    d.update(kw)
    return d


def write_census(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    typ = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    dflt = {"string": "", "int64": 1, "float64": 0.0, "bool": True}
    cols = {
        name: pa.array([r.get(name, None if name == "fused" else dflt[t]) for r in rows], type=typ[t])
        for name, t in schema.CENSUS_COLUMNS.items()
    }
    fileio.write_parquet(pa.table(cols), path, fileio.base_metadata(schema.CENSUS_SCHEMA))
    return path


def census_row(src0: str, M: int, N: int, K: int, est: float, **kw: Any) -> dict[str, Any]:
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": src0,
        "src1_type": "f32",
        "M": M,
        "N": N,
        "K": K,
        "B": 1,
        "E": 1,
        "U": 1,
        "est_us": est,
        "calls": 1,
        "source": "declared",
        **kw,
    }


@pytest.fixture()
def small_census(tmp_path: Path) -> Path:
    # 3 shapes, 8 cases with neighbours: q4_0 N64 K256 at M 1, 8 (-> 1 2 4 8 16), q8_0 at M 4 (-> 2 4 8)
    return write_census(
        tmp_path / "census.parquet",
        [
            census_row("q4_0", 1, 64, 256, 50.0),
            census_row("q4_0", 8, 64, 256, 30.0),
            census_row("q8_0", 4, 32, 64, 20.0),
            census_row("q4_0", 1, 128, 256, 40.0, fused="glu"),
        ],
    )


def tune(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "tune", *args], capture_output=True, text=True, env=env, timeout=timeout)


def run_args(census: Path, tree: Path, out: Path, *extra: str, harness: Path | None = None) -> list[str]:
    """``tune run`` arguments: CENSUS --llama-cpp TREE -o OUT [--harness H] EXTRA..."""
    via = ["--harness", str(harness)] if harness is not None else []
    return ["run", str(census), "--llama-cpp", str(tree), *via, "-o", str(out), *extra]


def rows_of(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


# ---------------------------------------------------------------------------------------------
# the harness itself


def test_info_header_on_cpu(harness: Path) -> None:
    p = subprocess.run([str(harness), "--info"], capture_output=True, text=True, check=True)
    (h,) = [json.loads(line) for line in p.stdout.splitlines()]
    assert h["kind"] == "header" and h["backend"] == "CPU" and h["dispatch_api"] is False
    assert h["harness_version"] == build.harness_version()
    assert h["l2_bytes"] == 0 and "unknown" in h["l2_source"]
    assert h["gpu_cc"] == 0 and h["gpu_name"]


def test_harness_exports_its_symbols(harness: Path) -> None:
    """ENABLE_EXPORTS: ggml libraries that carry a static libstdc++ (the GPU machines' g++) bind to the
    executable's copy; without it the H100 run aborted with free(): invalid pointer before main."""
    syms = subprocess.run(
        ["nm", "-D", "--defined-only", str(harness)], capture_output=True, text=True, check=True
    )
    assert " main" in syms.stdout, "the harness exports no symbols of its own (ENABLE_EXPORTS lost?)"


def test_stock_measured_routes_reported_and_rotation(harness: Path, tmp_path: Path) -> None:
    cases = [
        case("w", M=8),
        case("att", src0="f16", M=3, N=32, K=64, B=4, routes=["mmvf"]),
        case("one", M=8, rotate=False),
        case("badk", K=100),
        case("badtype", src0="q9_Z"),
    ]
    out = harness_run(harness, cases, tmp_path, "--l2-bytes", "100000", "--trial-ms", "2")
    by: dict[str, list[dict[str, Any]]] = {}
    for r in out:
        by.setdefault(str(r.get("case")), []).append(r)
    wbytes = 64 * schema.ggml_type("q4_0").row_bytes(256)
    w_end = next(r for r in by["w"] if r["kind"] == "case")
    assert w_end["status"] == "done" and w_end["weight_bytes"] == wbytes
    assert w_end["weight_copies"] == math.ceil(4 * 100000 / wbytes)
    assert w_end["nodes"] % w_end["weight_copies"] == 0
    assert w_end["rotated_bytes"] >= 4 * 100000
    stock = [r for r in by["w"] if r.get("route") == "stock"]
    assert [r["trial"] for r in stock] == [0, 1, 2]
    for r in stock:
        assert r["status"] in ("ok", "drifted") and r["us"] > 0 and r["anchor_us"] == r["us"]
        assert r["nmse"] is not None and r["nmse"] <= 5e-4 and r["route_ran"] == "unverified"
        assert r["replays"] >= 5
    routes = [r for r in by["w"] if r.get("route") in ("mmvq", "mmq", "cublas")]
    assert len(routes) == 9 and all(
        r["status"] == "ineligible" and r["reason"] == "no-override-api" for r in routes
    )
    anchors = {r["trial"]: r["us"] for r in stock}
    assert all(r["anchor_us"] == anchors[r["trial"]] and r["us"] is None for r in routes)
    att_end = next(r for r in by["att"] if r["kind"] == "case")
    assert att_end["status"] == "done" and att_end["weight_bytes"] == 32 * 4 * 64 * 2
    one_end = next(r for r in by["one"] if r["kind"] == "case")
    assert one_end["weight_copies"] == 1
    (bad,) = by["badk"]
    assert bad["status"] == "failed:K = 100 is not a multiple of the q4_0 block size 32"
    (bad,) = by["badtype"]
    assert bad["status"] == "failed:unknown src0_type 'q9_Z'"


def test_racing_options_and_configuration_candidates_on_cpu(harness: Path, tmp_path: Path) -> None:
    """Racing's settings reach the header; configurations with parameters are candidates like routes (on the
    CPU backend there is no override API: reported ineligible, never timed, stock is timed every trial)."""
    p = subprocess.run(
        [str(harness), "--info", "--race-min-trials", "4", "--race-noise", "0.05"],
        capture_output=True,
        text=True,
        check=True,
    )
    (h,) = [json.loads(line) for line in p.stdout.splitlines()]
    assert h["opts"]["race_min_trials"] == 4 and h["opts"]["race_noise"] == 0.05
    cfgs = ["cublas/out=f32,compute=bf16", "mmq/j=64,stream_k=off", "mmq/j=12"]
    out = harness_run(
        harness, [case("w", M=8, routes=cfgs)], tmp_path, "--trial-ms", "2", "--race-min-trials", "2"
    )
    rows = [r for r in out if r["kind"] == "trial"]
    assert [r["trial"] for r in rows if r["route"] == "stock"] == [0, 1, 2]
    by = {r["route"]: r for r in rows if r["route"] != "stock"}
    assert by["cublas/out=f32,compute=bf16"]["reason"] == "no-override-api"
    assert by["mmq/j=64,stream_k=off"]["reason"] == "no-override-api"
    assert by["mmq/j=12"]["reason"] == "unknown-route"  # 12 is not a legal J: no configuration code
    assert all(r["status"] == "ineligible" and r["us"] is None for r in by.values())


def test_bad_arguments_and_case_lists(harness: Path, tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_text("[{")
    p = subprocess.run([str(harness), "--cases", str(f)], capture_output=True, text=True)
    assert p.returncode == 2 and "not JSON" in p.stderr
    p = subprocess.run([str(harness), "--cases", str(f), "--trials", "x"], capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run([str(harness), "--info", "--device", "NOPE0"], capture_output=True, text=True)
    assert p.returncode == 1 and "no ggml device named 'NOPE0'" in p.stderr


def test_test_file_runs_in_test_backend_ops_and_its_sql_parses(
    harness: Path, test_backend_ops: Path, tmp_path: Path
) -> None:
    cases = [case("q4_0:N64:K256:M4"), case("att", src0="f16", M=3, N=32, K=64, B=4)]
    (tmp_path / "c.json").write_text(json.dumps(cases))
    tf = tmp_path / "ops.txt"
    subprocess.run(
        [str(harness), "--cases", str(tmp_path / "c.json"), "--emit-test-file", str(tf)], check=True
    )
    assert len(tf.read_text().splitlines()) == 2
    p = subprocess.run(
        [str(test_backend_ops), "perf", "-b", "CPU", "--test-file", str(tf), "--output", "sql"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = agreement.parse_tbo_sql("-- run: config=stock rep=0 wall_s=1 cases=2\n" + p.stdout)
    assert [r["case"] for r in rows] == ["q4_0:N64:K256:M4", "att"]
    assert all(float(r["time_us"]) > 0 and r["config"] == "stock" for r in rows)
    # the attention case travels as a non-contiguous KV-cache-like view
    assert "nb[2," in rows[1]["op_params"]


# ---------------------------------------------------------------------------------------------
# ggml-dispatch tune run / merge


def test_sweep_end_to_end(
    tree: Path, harness: Path, harness_cache: Path, small_census: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tuning.parquet"
    env = {**os.environ, "GGML_DISPATCH_HARNESS_CACHE": str(harness_cache)}
    sweep = run_args(small_census, tree, out, "--cpu", "--coverage", "1", "--l2-bytes", "100000", *FAST)
    p = tune(*sweep, "--trials", "3", env=env)
    assert p.returncode == 0, p.stderr
    assert "building the harness" not in p.stderr  # the cached build was found
    assert "8 cases (3 census points + 5 grid neighbours) over 2 shapes" in p.stderr
    assert "skipped 1 rows fused" in p.stderr
    rows = rows_of(out)
    # the default candidates: every configuration of every route, each a row of its route with its config
    every = select.candidate_configs(list(select.ALL_ROUTES), "all")
    configs = [c for c in every if registry.route_allowed("MUL_MAT", c)]  # mmq's split is MUL_MAT_ID's
    n_split = 16 * 3 + len(registry.MMQ_FUSED_J) + 2  # 2j (x stream-k), 2j_wave, 2j_fused, fit, fit64
    n_split += 1  # and the MUL_MAT_ID fallback, id_sorted
    assert len(configs) == len(every) - n_split and not any("split=" in c for c in configs)
    # the decode launch shapes (mmvq nwarps x rows, mmvf block) only at points the vector kernels run
    points = {(r["N"], r["M"], r["src0_type"]) for r in rows}
    per_trial = sum(len(select.configs_at(configs, m, t)) for _, m, t in points)
    assert per_trial < len(points) * len(configs)  # M = 16 leaves them out
    assert len(rows) == per_trial * 3
    assert {r["route"] for r in rows} == set(select.ALL_ROUTES) - {"id_sorted"}  # the MUL_MAT routes
    assert {r["config"] for r in rows} == set(configs)
    assert all(r["config"].split("/")[0] == r["route"] for r in rows)
    assert all(r["status"] == "ineligible" and r["anchor_us"] > 0 for r in rows)
    assert {(r["N"], r["M"]) for r in rows} == {(64, m) for m in (1, 2, 4, 8, 16)} | {
        (32, m) for m in (2, 4, 8)
    }
    r0 = rows[0]
    assert r0["upstream_commit"] == schema.PINNED_UPSTREAM_COMMIT
    assert r0["harness_version"] == build.harness_version() and r0["source"] == "measured"
    assert r0["weight_copies"] >= 1
    meta = fileio.read_parquet_metadata(out)
    assert json.loads(meta[schema.META_INPUT_HASHES]) == {str(small_census): fileio.sha256_file(small_census)}
    settings = json.loads(meta[results.META_TUNER])
    assert settings["coverage"] == 1.0 and settings["harness_header"]["backend"] == "CPU"
    cases = json.loads(meta[results.META_TUNER_CASES])
    assert len(cases) == 8 and all(c["reasons"]["mmq"] == "no-override-api" for c in cases.values())
    # a second run finds everything in the journal
    p = tune(*sweep, "--trials", "3", env=env)
    assert p.returncode == 0 and "0 cases measured (0 failed), 8 resumed" in p.stderr
    assert len(rows_of(out)) == per_trial * 3
    # --remeasure: a case recorded as failed and one with a wrong trial run again, the rest resume
    journal = tmp_path / "tuning.parquet.journal.jsonl"
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    lines[1]["status"], lines[1]["trials"] = "failed:killed by SIGABRT", []
    lines[2]["trials"][0]["status"] = "wrong"
    journal.write_text("".join(json.dumps(x) + "\n" for x in lines))
    p = tune(*sweep, "--trials", "3", env=env)
    assert p.returncode == 0 and "0 cases measured (0 failed), 8 resumed" in p.stderr  # not without the flag
    p = tune(*sweep, "--trials", "3", "--remeasure", env=env)
    assert p.returncode == 0, p.stderr
    assert "remeasuring 2 failed or wrong cases" in p.stderr
    assert "2 cases measured (0 failed), 6 resumed" in p.stderr
    assert read_journal(journal).unsound_ids() == set()  # the new records replace the old
    assert len(rows_of(out)) == per_trial * 3
    # another method (here: trials) cannot resume this journal
    p = tune(*sweep, "--trials", "4", env=env)
    assert p.returncode == 2 and "belongs to another sweep (trials = 3" in p.stderr


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([CLI, "tune", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_cases(journal: Path, n: int, proc: subprocess.Popen[str], limit: float = 300) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if journal.exists():
            k = len(read_journal(journal).cases)
            if k >= n:
                return k
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"the sweep finished or stalled before {n} cases: {proc.communicate()[1]}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_resume_after_a_killed_run(
    tree: Path, harness: Path, small_census: Path, tmp_path: Path, sig: int
) -> None:
    out = tmp_path / "tuning.parquet"
    journal = tmp_path / "tuning.parquet.journal.jsonl"
    args = run_args(
        small_census,
        tree,
        out,
        "--trials",
        "3",
        "--coverage",
        "1",
        "--harness-arg=--trial-ms=150",  # each case takes long enough that the signal lands mid-sweep
        "--harness-arg=--threads=1",
        *ROUTES_ONLY,
        harness=harness,
    )
    proc = _start(args)
    _wait_for_cases(journal, 2, proc)
    assert proc.poll() is None, proc.communicate()[1]
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "re-run the same command to resume" in err
    else:
        assert proc.returncode == -signal.SIGKILL, err
    assert not out.exists()
    before = read_journal(journal).cases
    done_before = {c["case"]: c["finished"] for c in before}
    assert 2 <= len(done_before) < 8
    time.sleep(0.5)  # the orphaned harness (if any) gets SIGKILL from PR_SET_PDEATHSIG
    p = subprocess.run([CLI, "tune", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert f"resuming: {len(done_before)} of 8 cases" in p.stderr
    after = read_journal(journal).cases
    assert len(after) == 8
    assert all(c["finished"] == done_before[c["case"]] for c in after if c["case"] in done_before)
    rows = rows_of(out)
    keys = [(r["N"], r["M"], r["route"], r["trial"]) for r in rows]
    assert len(keys) == len(set(keys)) == 8 * 5 * 3


def test_max_seconds_stops_and_a_rerun_continues(
    tree: Path, harness: Path, small_census: Path, tmp_path: Path
) -> None:
    out = tmp_path / "t.parquet"
    args = run_args(
        small_census,
        tree,
        out,
        "--trials",
        "3",
        "--coverage",
        "1",
        "--harness-arg=--trial-ms=200",
        "--harness-arg=--max-replays=1000000",  # tiny CPU graphs must not cap a trial below 200 ms
        "--harness-arg=--threads=1",
        harness=harness,
    )
    p = tune(*args, "--max-seconds", "0.001")
    assert p.returncode == 0 and "stopped by --max-seconds with 8 cases left" in p.stderr
    assert rows_of(out) == []
    # each case takes >= 3 trials x 200 ms: 8 of them (>= 4.8 s) do not fit in 2.5 s, the first one starts
    p = tune(*args, "--max-seconds", "2.5")
    assert p.returncode == 0 and "stopped by --max-seconds with" in p.stderr, p.stderr
    n = len({(r["N"], r["M"]) for r in rows_of(out)})
    assert 1 <= n < 8
    p = tune(*args)
    assert p.returncode == 0 and f"{8 - n} cases measured" in p.stderr
    assert len({(r["N"], r["M"]) for r in rows_of(out)}) == 8


def test_shards_and_merge(tree: Path, harness: Path, small_census: Path, tmp_path: Path) -> None:
    outs = []
    for i in (0, 1):
        out = tmp_path / f"t.{i}.parquet"
        p = tune(
            *run_args(
                small_census,
                tree,
                out,
                "--trials",
                "2",
                "--coverage",
                "1",
                "--shard",
                f"{i}/2",
                *FAST,
                *ROUTES_ONLY,
                harness=harness,
            )
        )
        assert p.returncode == 0, p.stderr
        outs.append(out)
    shapes = [{(r["N"], r["K"]) for r in rows_of(o)} for o in outs]
    assert shapes == [{(64, 256)}, {(32, 64)}]
    merged = tmp_path / "all.parquet"
    p = tune("merge", *map(str, outs), "-o", str(merged))
    assert p.returncode == 0, p.stderr
    rows = rows_of(merged)
    assert len(rows) == 8 * 5 * 2
    assert {(r["N"], r["M"]) for r in rows} == {(64, m) for m in (1, 2, 4, 8, 16)} | {
        (32, m) for m in (2, 4, 8)
    }
    p = tune("merge", str(outs[0]), str(outs[0]), "-o", str(tmp_path / "dup.parquet"))
    assert p.returncode == 2 and "ggml-dispatch: error:" in p.stderr and "duplicates" in p.stderr
    assert not (tmp_path / "dup.parquet").exists()
    # a shard's journal is not another shard's
    p = tune(*run_args(small_census, tree, outs[0], "--shard", "1/2", *FAST, *ROUTES_ONLY, harness=harness))
    assert p.returncode == 2 and "belongs to another sweep" in p.stderr


WRAPPER = """#!/bin/sh
# Stands in for a CUDA trap: the real harness, except that chosen cases die the ways a dead CUDA
# context makes a process die (a signal), exit non-zero, or hang.
for a in "$@"; do
  case "$a" in *.json)
    if grep -q '"M": 2,' "$a"; then
      (sleep 0.5; kill -ABRT $$) & exec "{harness}" "$@" --min-replays 100000 --max-replays 100000
    fi
    if grep -q '"M": 16,' "$a"; then echo "CUDA error: an illegal instruction was encountered" >&2; exit 3; fi
    if grep -q '"M": 8,' "$a" && grep -q '"N": 32,' "$a"; then exec sleep 30; fi
  esac
done
exec "{harness}" "$@"
"""


def test_failures_cost_one_case(tree: Path, harness: Path, tmp_path: Path) -> None:
    census = write_census(
        tmp_path / "census.parquet",
        [
            census_row("q4_0", 1, 64, 256, 50.0),
            census_row("q4_0", 8, 64, 256, 30.0),
            census_row("q8_0", 4, 32, 64, 20.0),
            census_row("q4_K", 64, 48, 100, 10.0),  # K not a multiple of 256: the real harness refuses it
        ],
    )
    wrapper = tmp_path / "harness.sh"
    wrapper.write_text(WRAPPER.replace("{harness}", str(harness)))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "t.parquet"
    p = tune(
        *run_args(
            census,
            tree,
            out,
            "--trials",
            "2",
            "--coverage",
            "1",
            "--case-timeout",
            "3",
            *FAST,
            *ROUTES_ONLY,
            harness=wrapper,
        )
    )
    assert p.returncode == 0, p.stderr
    status = {(r["src0_type"], r["N"], r["M"]): r["status"] for r in rows_of(out)}
    assert status[("q4_0", 64, 2)].startswith("failed:killed by SIGABRT")
    assert status[("q8_0", 32, 2)].startswith("failed:killed by SIGABRT")
    assert status[("q4_0", 64, 16)] == "failed:exit 3: CUDA error: an illegal instruction was encountered"
    assert status[("q8_0", 32, 8)] == "failed:timeout after 3 s"
    for m in (32, 64, 128):
        assert status[("q4_K", 48, m)] == "failed:K = 100 is not a multiple of the q4_K block size 256"
    assert status[("q4_0", 64, 1)] == "ineligible" and status[("q4_0", 64, 4)] == "ineligible"
    assert status[("q8_0", 32, 4)] == "ineligible"
    assert "11 cases measured (7 failed)" in p.stderr
    failed = [r for r in rows_of(out) if r["status"].startswith("failed:")]
    assert all(r["us"] is None for r in failed) and len(failed) == 7 * 5


def test_bad_input_is_one_clear_error(tree: Path, harness: Path, small_census: Path, tmp_path: Path) -> None:
    notcensus = tmp_path / "n.parquet"
    fileio.write_parquet(results.to_table([]), notcensus, fileio.base_metadata(schema.TUNING_SCHEMA))
    out = tmp_path / "o.parquet"
    p = tune(*run_args(notcensus, tree, out, harness=harness))
    assert p.returncode == 2 and p.stderr.startswith(
        f"ggml-dispatch: error: {notcensus}: {schema.META_SCHEMA}: not a census"
    )
    garbage = tmp_path / "g.parquet"
    garbage.write_text("nope")
    p = tune(*run_args(garbage, tree, out, harness=harness))
    assert p.returncode == 2 and f"{garbage}: not a readable Parquet file" in p.stderr
    bad = write_census(tmp_path / "b.parquet", [census_row("q4_0", 1, 64, 256, float("nan"))])
    p = tune(*run_args(bad, tree, out, harness=harness))
    assert p.returncode == 2 and "row 0: est_us" in p.stderr
    p = tune(*run_args(small_census, tree, out, "--routes", "mmq,tensorcore", harness=harness))
    assert p.returncode == 2 and "unknown route(s) tensorcore" in p.stderr
    assert not out.exists() and not list(tmp_path.glob("o.parquet*"))


def test_real_census_from_the_smollm2_gguf_selects_cases(
    tree: Path, smollm2_gguf: Path, tmp_path: Path
) -> None:
    census = tmp_path / "census.parquet"
    p = subprocess.run(
        [CLI, "census", "from-gguf", str(smollm2_gguf), "--m", "1,512", "-o", str(census)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    p = tune(*run_args(census, tree, tmp_path / "t.parquet", "--dry-run"))
    assert p.returncode == 0, p.stderr
    specs = [json.loads(line) for line in p.stdout.splitlines()]
    assert specs and all(s["op"] == "MUL_MAT" and s["layout"] == "weight" for s in specs)
    census_ms = {1, 512}
    by_shape: dict[tuple[str, int, int], set[int]] = {}
    for s in specs:
        by_shape.setdefault((s["src0_type"], s["N"], s["K"]), set()).add(s["M"])
    for ms in by_shape.values():
        for m in ms & census_ms:
            assert m == 1 or (m // 2 in ms and m * 2 in ms)  # measured neighbours on both sides
    assert "covering" in p.stderr and not (tmp_path / "t.parquet").exists()


# ---------------------------------------------------------------------------------------------
# the agreement experiment, run on the CPU backend


TINY_TSV = """# a reference in the format of samples/reference/h200-mul-mat-routes.tsv
type\tm\tn\tk\troute\truns\tus_per_run
q4_0\t64\t64\t256\tmmq\t100\t10.0
q4_0\t64\t64\t256\tcublas\t100\t12.0
q4_0\t64\t1\t256\tmmvq\t100\t3.0
q4_0\t64\t8\t256\tmmvq\t100\t4.0
"""


def test_agreement_pipeline_on_cpu(harness: Path, test_backend_ops: Path, tmp_path: Path) -> None:
    tsv = tmp_path / "ref.tsv"
    tsv.write_text(TINY_TSV)
    out = tmp_path / "out"
    rc = agreement.main(
        [
            "--harness",
            str(harness),
            "--tbo",
            str(test_backend_ops),
            "--tsv",
            str(tsv),
            "--out",
            str(out),
            "--device",
            "CPU",
            "--cost-cases",
            "1",
            "--cost-trials",
            "4",
            "--tbo-reps",
            "3",
            "--trials",
            "3",
            "--harness-arg=--trial-ms=2",
            "--harness-arg=--l2-bytes=10000",
            "--harness-arg=--threads=1",
        ]
    )
    assert rc == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "harness-agreement.jsonl",
        "harness-cost.jsonl",
        "harness-l2.jsonl",
        "summary.json",
        "summary.md",
        "tbo-agreement.sql",
        "tbo-cost.sql",
    ]
    s = json.loads((out / "summary.json").read_text())
    stock = [r for r in s["agreement"] if r["route"] == "stock"]
    assert [r["case"] for r in stock] == ["q4_0:N64:K256:M64"]
    assert stock[0]["harness_us"] > 0 and stock[0]["tbo_us"] > 0 and stock[0]["harness_over_tbo"] > 0
    assert stock[0]["fits_l2"]  # 9216 bytes of weights, a declared 10000-byte L2
    l2 = {(r["case"], r["route"]): r for r in s["l2"]}
    assert l2[("q4_0:N64:K256:M1", "stock")]["copies"] == math.ceil(4 * 10000 / 9216)
    assert l2[("q4_0:N64:K256:M1", "stock")]["rotated_us"] > 0
    assert [c["route"] for c in s["cost"]] == ["cublas", "mmq"]
    for cost in s["cost"]:
        assert cost["tbo"]["n"] == 3 and cost["harness"]["reached"] is False  # no route can be forced on CPU
    assert "## 1. Agreement" in (out / "summary.md").read_text()


def test_device_script_runs_on_the_cpu_backend(
    tree: Path, harness: Path, test_backend_ops: Path, tmp_path: Path
) -> None:
    """lab/tune-agreement.sh as it runs on the GPU machine, with DEVICE=CPU: the harness is built in the
    prebuilt-libraries mode (-DGGML_BUILD_DIR) against this module's CPU build, whose bin/ also holds
    test-backend-ops."""
    tsv = tmp_path / "ref.tsv"
    tsv.write_text(TINY_TSV)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "WORK": str(tmp_path / "work"),
        "DEVICE": "CPU",
        "BUILD_DIR": str(harness.parent.parent),
        "LLAMA_CPP_DIR": str(tree),
        "REFERENCE_TSV": str(tsv),
        "PYTHON": sys.executable,
        "AGREEMENT_ARGS": "--cost-cases 1 --cost-trials 4 --tbo-reps 3 --trials 3 --harness-arg=--trial-ms=2 "
        "--harness-arg=--l2-bytes=10000 --harness-arg=--threads=1",
    }
    repo = Path(__file__).resolve().parent.parent
    p = subprocess.run(
        ["bash", str(repo / "lab" / "tune-agreement.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(x.name for x in out.iterdir()) == [
        "harness-agreement.jsonl",
        "harness-cost.jsonl",
        "harness-l2.jsonl",
        "run.log",
        "summary.json",
        "summary.md",
        "tbo-agreement.sql",
        "tbo-cost.sql",
    ]
    assert "linking the prebuilt ggml" in p.stderr and "carries no ggml-dispatch install" in p.stderr
    assert p.stdout.startswith("# Harness vs test-backend-ops") and "## 3. M = 1" in p.stdout
    header = json.loads((out / "harness-agreement.jsonl").read_text().splitlines()[0])
    assert header["harness_version"] == build.harness_version() and header["backend"] == "CPU"


def test_sweep_script_runs_on_the_cpu_backend_and_resumes(tree: Path, harness: Path, tmp_path: Path) -> None:
    """lab/tune-sweep.sh with DEVICE=CPU against this module's CPU build: a first call stopped by its
    budget, a second call that finishes from the journal the first one left (a warm machine)."""
    census = write_census(
        tmp_path / "census.parquet",
        [census_row("q4_0", 1, 64, 256, 50.0), census_row("q8_0", 4, 32, 64, 20.0)],
    )
    repo = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "WORK": str(tmp_path / "work"),
        "DEVICE": "CPU",
        "BUILD_DIR": str(harness.parent.parent),
        "LLAMA_CPP_DIR": str(tree),
        "CENSUS": str(census),
        "PYTHON": sys.executable,
        "TRIALS": "2",
        "COVERAGE": "1",
        "TUNE_ARGS": "--l2-bytes 100000 --harness-arg=--trial-ms=2 --harness-arg=--threads=1",
    }
    out1 = tmp_path / "out1"
    p = subprocess.run(
        ["bash", str(repo / "lab" / "tune-sweep.sh")],
        capture_output=True,
        text=True,
        # a later --max-seconds overrides the script's: stop after a case or two
        env={
            **env,
            "OUT": str(out1),
            "TUNE_ARGS": env["TUNE_ARGS"] + " --harness-arg=--trial-ms=1000 --max-seconds 5",
        },
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # 5 cases (M 1 2 | 2 4 8); the budget left after the build is what --max-seconds gets
    assert sorted(x.name for x in out1.iterdir()) == ["run.log", "tuning.journal.jsonl", "tuning.parquet"]
    first = len(read_journal(out1 / "tuning.journal.jsonl").cases)
    assert 1 <= first < 5 and "stopped by --max-seconds" in p.stderr
    out2 = tmp_path / "out2"
    p = subprocess.run(
        ["bash", str(repo / "lab" / "tune-sweep.sh")],
        capture_output=True,
        text=True,
        env={**env, "OUT": str(out2)},
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(read_journal(out2 / "tuning.journal.jsonl").cases) == 5
    assert {(r["N"], r["M"]) for r in rows_of(out2 / "tuning.parquet")} == {
        (64, 1),
        (64, 2),
        (32, 2),
        (32, 4),
        (32, 8),
    }
    assert f"resuming: {first} of 5 cases" in p.stderr
