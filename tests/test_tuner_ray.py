"""``tune run --executor ray`` on a local Ray cluster of this machine's CPUs, with the real harness
built against the pinned tree's CPU backend (the fixtures of test_tuner_native).

One cluster per module (``ray.init(num_cpus=2)``); every sweep is a ``ggml-dispatch tune run``
driver process that joins it with ``--address`` and asks ``CPU=1`` per case (there is no GPU here:
``--ray-resources`` stands in for ``GPU=1``). The cases are the same child processes as the serial
sweep's, so a case whose child dies, and a Ray worker killed under its case (a lost node, stood in
for by a wrapper that kills its parent), are real."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ggml_dispatch import fileio
from ggml_dispatch.tuner import results
from ggml_dispatch.tuner.journal import read_journal
from tests.test_tuner_native import (
    FAST,
    ROUTES_ONLY,
    _start,
    _wait_for_cases,
    census_row,
    rows_of,
    run_args,
    small_census,
    tune,
    write_census,
)

ray = pytest.importorskip(
    "ray", reason="the Ray executor's tests need Ray (pip install 'ggml-dispatch[ray]')"
)

pytestmark = pytest.mark.slow

__all__ = ["small_census"]  # a fixture used by name (harness, harness_cache, tree: conftest.py)

TIMING = ("us", "anchor_us", "nmse", "replays")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local two-CPU Ray cluster; the address the sweeps join."""
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield str(ctx.address_info["gcs_address"])
    finally:
        ray.shutdown()


def ray_args(address: str) -> list[str]:
    return ["--executor", "ray", "--address", address, "--ray-resources", "CPU=1"]


def untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_ray_sweep_holds_the_serial_sweeps_rows(
    cluster: str, tree: Path, harness: Path, small_census: Path, tmp_path: Path
) -> None:
    common = ["--trials", "3", "--coverage", "1", "--l2-bytes", "100000", *FAST, *ROUTES_ONLY]
    serial = tmp_path / "serial.parquet"
    p = tune(*run_args(small_census, tree, serial, *common, harness=harness))
    assert p.returncode == 0, p.stderr
    par = tmp_path / "ray.parquet"
    sweep = run_args(small_census, tree, par, *common, *ray_args(cluster), harness=harness)
    p = tune(*sweep)
    assert p.returncode == 0, p.stderr
    assert "8 cases measured (0 failed), 0 resumed" in p.stderr
    a, b = rows_of(serial), rows_of(par)
    assert len(b) == 8 * 5 * 3 and untimed(a) == untimed(b)  # same rows, same (canonical) order
    assert all(r["anchor_us"] > 0 for r in b)
    settings = fileio.read_parquet_metadata(par)[results.META_TUNER]
    assert '"executor": "ray"' in settings
    journal = read_journal(par.with_name(par.name + ".journal.jsonl"))
    assert {c["placement"]["node_id"] for c in journal.cases} == {ray.get_runtime_context().get_node_id()}
    # the same command again finds every case in the journal
    p = tune(*sweep)
    assert p.returncode == 0 and "0 cases measured (0 failed), 8 resumed" in p.stderr, p.stderr
    assert untimed(rows_of(par)) == untimed(a)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_ray_sweep_resumes_after_the_driver_is_killed(
    cluster: str, tree: Path, harness: Path, small_census: Path, tmp_path: Path, sig: int
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
        "--harness-arg=--trial-ms=150",  # long enough cases that the signal lands mid-sweep
        "--harness-arg=--threads=1",
        *ROUTES_ONLY,
        *ray_args(cluster),
        harness=harness,
    )
    proc = _start(args)
    _wait_for_cases(journal, 2, proc)
    assert proc.poll() is None, proc.communicate()[1]
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "re-run the same command to resume" in err and "Traceback" not in err
    else:
        assert proc.returncode == -signal.SIGKILL, err
    assert not out.exists()
    done_before = {c["case"]: c["finished"] for c in read_journal(journal).cases}
    assert 2 <= len(done_before) < 8
    p = tune(*args)
    assert p.returncode == 0, p.stderr
    assert f"resuming: {len(done_before)} of 8 cases" in p.stderr
    after = read_journal(journal).cases
    assert len(after) == 8
    assert all(c["finished"] == done_before[c["case"]] for c in after if c["case"] in done_before)
    keys = [(r["N"], r["M"], r["route"], r["trial"]) for r in rows_of(out)]
    assert len(keys) == len(set(keys)) == 8 * 5 * 3


WRAPPER = """#!/bin/sh
# Stands in for what kills a case on a GPU: the real harness, except that chosen cases die by a
# signal (a CUDA trap), take their Ray worker down with them (a lost node), or hang.
for a in "$@"; do
  case "$a" in *.json)
    if grep -q '"M": 2,' "$a"; then
      (sleep 0.5; kill -ABRT $$) & exec "{harness}" "$@" --min-replays 100000 --max-replays 100000
    fi
    if grep -q '"M": 16,' "$a"; then kill -9 $PPID; exec sleep 30; fi
    if grep -q '"M": 8,' "$a" && grep -q '"N": 32,' "$a"; then exec sleep 30; fi
  esac
done
exec "{harness}" "$@"
"""


def _wrapper(tmp_path: Path, text: str, harness: Path) -> Path:
    w = tmp_path / "harness.sh"
    w.write_text(text.replace("{harness}", str(harness)))
    w.chmod(w.stat().st_mode | stat.S_IXUSR)
    return w


def test_a_dead_task_costs_its_case(
    cluster: str, tree: Path, harness: Path, small_census: Path, tmp_path: Path
) -> None:
    out = tmp_path / "t.parquet"
    wrapper = _wrapper(tmp_path, WRAPPER, harness)
    t0 = time.monotonic()
    p = tune(
        *run_args(
            small_census,
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
            *ray_args(cluster),
            harness=wrapper,
        )
    )
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 120
    status = {(r["src0_type"], r["N"], r["M"]): r["status"] for r in rows_of(out)}
    assert status[("q4_0", 64, 2)].startswith("failed:killed by SIGABRT")
    assert status[("q8_0", 32, 2)].startswith("failed:killed by SIGABRT")
    assert status[("q4_0", 64, 16)].startswith("failed:ray task lost: ")
    assert status[("q8_0", 32, 8)] == "failed:timeout after 3 s"
    for m in (1, 4, 8):
        assert status[("q4_0", 64, m)] == "ineligible"
    assert status[("q8_0", 32, 4)] == "ineligible"
    assert "8 cases measured (4 failed)" in p.stderr
    lost = [r for r in rows_of(out) if r["M"] == 16]
    assert len(lost) == 5 and all(r["us"] is None and r["gpu_name"] for r in lost)


MIXED = """#!/bin/sh
# Stands in for a second GPU model in the cluster: the cases with N = 32 report another GPU name.
for a in "$@"; do
  case "$a" in *.json)
    if grep -q '"N": 32,' "$a"; then
      "{harness}" "$@" | sed 's/"gpu_name":"[^"]*"/"gpu_name":"Other GPU"/'; exit 0
    fi
  esac
done
exec "{harness}" "$@"
"""


def test_mixed_gpu_models_are_refused_unless_allowed(
    cluster: str, tree: Path, harness: Path, tmp_path: Path
) -> None:
    census = write_census(
        tmp_path / "census.parquet",
        [census_row("q4_0", 1, 64, 256, 50.0), census_row("q8_0", 4, 32, 64, 20.0)],
    )
    out = tmp_path / "t.parquet"
    args = run_args(
        census,
        tree,
        out,
        "--trials",
        "2",
        "--coverage",
        "1",
        *FAST,
        *ROUTES_ONLY,
        *ray_args(cluster),
        harness=_wrapper(tmp_path, MIXED, harness),
    )
    p = tune(*args)
    assert p.returncode == 2, p.stderr
    journal = f"{out}.journal.jsonl"
    # the probe is the CPU backend: its name is this machine's processor (Intel on CI, AMD elsewhere)
    assert f"ggml-dispatch: error: {journal}: gpu_name: cases come from 2 GPUs (" in p.stderr
    assert "Other GPU cc 0 0 SMs (case " in p.stderr and "q8_0:f32:N32:K64:B1:M" in p.stderr
    assert " cc 0 0 SMs (the probe)" in p.stderr
    assert "pass --allow-mixed" in p.stderr and not out.exists()
    # the journal keeps what was measured; without --allow-mixed a re-run is refused before any case
    p = tune(*args)
    assert p.returncode == 2 and "cases come from 2 GPUs" in p.stderr
    p = tune(*args, "--allow-mixed")
    assert p.returncode == 0, p.stderr
    names = {(r["N"], r["gpu_name"]) for r in rows_of(out)}
    assert {n for n, _ in names} == {64, 32} and {g for n, g in names if n == 32} == {"Other GPU"}
    assert "Other GPU" not in {g for n, g in names if n == 64}


def test_device_script_sweeps_on_the_cluster_and_on_one_slot(
    cluster: str, tree: Path, harness: Path, tmp_path: Path
) -> None:
    """lab/tune-ray.sh with DEVICE=CPU: the Ray sweep on this module's cluster (two CPU slots standing
    in for two GPUs), the serial sweep of the same cases, the spread and cost summary, the decisions."""
    census = write_census(
        tmp_path / "census.parquet",
        [census_row("q4_0", 1, 64, 256, 50.0), census_row("q8_0", 4, 32, 64, 20.0)],
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "WORK": str(tmp_path / "work"),
        "DEVICE": "CPU",
        "BUILD_DIR": str(harness.parent.parent),
        "LLAMA_CPP_DIR": str(tree),
        "CENSUS": str(census),
        "PYTHON": sys.executable,
        "RAY_ADDRESS": cluster,
        "RAY_CPUS": "2",
        "TRIALS": "3",
        "COVERAGE": "1",
        "TUNE_ARGS": "--l2-bytes 100000 " + " ".join(FAST),
    }
    repo = Path(__file__).resolve().parent.parent
    p = subprocess.run(
        ["bash", str(repo / "lab" / "tune-ray.sh")], capture_output=True, text=True, env=env, timeout=1200
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(x.name for x in out.iterdir()) == [
        "run.log",
        "summary.json",
        "tuning-multi.journal.jsonl",
        "tuning-multi.parquet",
        "tuning-single.journal.jsonl",
        "tuning-single.parquet",
    ]
    assert "ray: 2 cases at a time (CPU=1 each) on 1 node(s)" in p.stderr
    assert "decisions: not compared" in p.stderr
    assert untimed(rows_of(out / "tuning-multi.parquet")) == untimed(rows_of(out / "tuning-single.parquet"))
    s = json.loads((out / "summary.json").read_text())
    assert s["cost"]["gpus"] == 2 and s["cost"]["multi_wall_s"] > 0 and s["cost"]["single_wall_s"] > 0
    assert len(s["cost"]["busy_s"]) == 1  # CPU tasks hold no GPU: one place, this node
    # stock is the one route the CPU backend measures: 5 cases, each in both sweeps
    assert len(s["spread"]["cases"]) == 5 and {c["route"] for c in s["spread"]["cases"]} == {"stock"}
    assert p.stdout.startswith("multi: ") and "wall / (single / n) =" in p.stdout
    # a second call finds both sweeps complete
    p = subprocess.run(
        ["bash", str(repo / "lab" / "tune-ray.sh")], capture_output=True, text=True, env=env, timeout=1200
    )
    assert p.returncode == 0 and "multi sweep: complete in an earlier call" in p.stderr, p.stderr[-3000:]
