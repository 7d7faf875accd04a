"""The sweep: census -> selected cases -> one harness child process per case -> journal -> Parquet.

Each case runs in its own child so that a candidate which kills the CUDA context (a NO_DEVICE_CODE
``__trap()``, an illegal address) costs that case only: it is recorded as ``failed:<msg>`` and the
sweep goes on. Finished cases are appended to the journal (fsync'd); re-running the same command
skips them, so a killed sweep resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fileio, schema
from ggml_dispatch.artifacts import census as census_artifact
from ggml_dispatch.tuner import candidates, results
from ggml_dispatch.tuner import mul_mat_id as tmoe
from ggml_dispatch.tuner.build import TreeStamp
from ggml_dispatch.tuner.executor import Executor, HarnessJob, SerialExecutor, check_sweep_gpus, gpu_id
from ggml_dispatch.tuner.journal import Journal
from ggml_dispatch.tuner.select import (
    DEFAULT_LAYOUTS,
    NEEDED_COLUMNS,
    Case,
    CompiledMmvq,
    Selection,
    shard_cases,
)

STDERR_TAIL_LINES: Final = 12
FAILED_MSG_MAX: Final = 240


class SweepInterrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def read_census(path: Path) -> list[dict[str, Any]]:
    """Census rows as dicts (the columns case selection needs), through the one census reader."""
    rows: list[dict[str, Any]] = census_artifact.read(path).table.select(list(NEEDED_COLUMNS)).to_pylist()
    return rows


@dataclass(frozen=True)
class SweepSettings:
    """What one sweep measures and how, built once from ``tune run``'s options and passed down: the case
    selection (coverage .. routing_kinds), the run (shard .. remeasure). The journal's identity and the
    tuning file's recorded settings are both derived from it."""

    routes: tuple[str, ...]
    trials: int
    nmse_max: float
    coverage: float = 0.95
    layouts: tuple[str, ...] = DEFAULT_LAYOUTS
    whole_shapes: bool = False
    routing_kinds: tuple[str, ...] = tuple(tmoe.ROUTING_KINDS)
    shard: tuple[int, int] = (0, 1)
    max_seconds: float | None = None
    case_timeout: float = 900
    harness_args: tuple[str, ...] = ()
    allow_mixed: bool = False
    remeasure: bool = False

    def shard_text(self) -> str:
        return f"{self.shard[0]}/{self.shard[1]}"

    def journal_identity(self, census_sha256: str) -> dict[str, Any]:
        """What a resumed sweep must share with its journal (coverage may grow: more cases, same method)."""
        return {
            "census_sha256": census_sha256,
            "shard": self.shard_text(),
            "trials": self.trials,
            "nmse_max": self.nmse_max,
            "routes": list(self.routes),
        }

    def recorded(self) -> dict[str, Any]:
        """The settings a tuning file records."""
        return {
            "coverage": self.coverage,
            "whole_shapes": self.whole_shapes,
            "shard": self.shard_text(),
            "trials": self.trials,
            "nmse_max": self.nmse_max,
            "routes": list(self.routes),
            "layouts": list(self.layouts),
            "routing_kinds": list(self.routing_kinds),
            "harness_args": list(self.harness_args),
        }


def harness_args(device: str | None, l2_bytes: int | None, extra: Sequence[str]) -> tuple[str, ...]:
    """The harness options of ``--device``, ``--l2-bytes`` and ``--harness-arg`` (``--x=y`` split in two)."""
    args: list[str] = []
    if device:
        args += ["--device", device]
    if l2_bytes is not None:
        args += ["--l2-bytes", str(l2_bytes)]
    for a in extra:
        args += a.split("=", 1) if a.startswith("--") and "=" in a else [a]
    return tuple(args)


def select_census(
    census_path: Path, settings: SweepSettings, *, mmvq: CompiledMmvq | None = None
) -> Selection:
    """The cases of a census (a matmul census: MUL_MAT points, and under each of the settings'
    ``routing_kinds`` MUL_MAT_ID points; an attention census: FLASH_ATTN_EXT points), each op's from the
    candidate generator its description names (tuner.candidates)."""
    return candidates.select(census_path, settings, mmvq=mmvq)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the harness gets SIGKILL if the sweep dies (so a killed sweep frees the GPU)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _parse_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        with contextlib.suppress(json.JSONDecodeError):
            rec = json.loads(line)
            if isinstance(rec, dict):
                out.append(rec)
    return out


_BACKTRACE: Final = re.compile(
    r"\([^()]*\+0x[0-9a-f]+\)\s*\[0x[0-9a-f]+\]$"  # backtrace_symbols_fd: "lib.so(fn+0x1b)[0x7f...]"
    r"|^#\d+\s+0x[0-9a-f]+"  # gdb: "#3  0x00007f... in fn ()"
    r"|^\[0x[0-9a-f]+\]$"
)


def _failure_message(rc: int, stderr: str, timed_out: bool, timeout: float) -> str:
    if timed_out:
        what = f"timeout after {timeout:g} s"
    elif rc < 0:
        try:
            what = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            what = f"killed by signal {-rc}"
    else:
        what = f"exit {rc}"
    lines = [s.strip() for s in stderr.splitlines() if s.strip()]
    where = next(
        (
            s.split("case ", 1)[-1].split(": ", 1)[-1]
            for s in reversed(lines)
            if " route=" in s and "harness:" in s
        ),
        "",
    )
    # the last line that says something: not the harness' own progress, not a backtrace frame (ggml's
    # abort handler prints the assertion, then frames like "lib.so(+0x14f15)[0x55ca...]")
    last = next(
        (s for s in reversed(lines) if not s.startswith("harness: case ") and not _BACKTRACE.search(s)), ""
    )
    msg = what + (f" during {where}" if where else "") + (f": {last}" if last else "")
    return msg.replace("\n", " ")[:FAILED_MSG_MAX]


@dataclass
class ChildResult:
    status: str
    header: dict[str, Any] | None
    trials: list[dict[str, Any]]
    case_info: dict[str, Any]
    stderr_tail: list[str]
    wall_s: float
    crashed_on: str | None = None  # a failed child: the candidate it was checking or timing (None: stock)


# the candidate a child was on when it died: the harness logs "case <id>: check route=<c>" before checking a
# candidate against the CPU backend and "case <id>: trial <t> route=<c>" before timing it
_ON_CANDIDATE: Final = re.compile(r"^harness: case \S+: (?:check|trial \d+) route=(\S+)\s*$")
CRASH_RETRIES: Final = 3  # candidates a case may lose to crashes before the case itself fails


def crashed_candidate(stderr: str, case: Case) -> str | None:
    """The candidate configuration a killed child was checking or timing (None: stock, or unknown)."""
    for line in reversed(stderr.splitlines()):
        m = _ON_CANDIDATE.match(line.strip())
        if m:
            name = m.group(1)
            return name if name in case.routes else None  # stock, the anchor, is never a candidate
    return None


def run_harness_case(
    harness: Path,
    case: Case,
    *,
    harness_args: Sequence[str],
    timeout: float,
    register: Callable[[subprocess.Popen[str] | None], None] = lambda p: None,
) -> ChildResult:
    """One case: a harness child, and where the child dies (a signal, an abort) while checking or timing a
    candidate configuration, the case again without it, up to CRASH_RETRIES times. The candidate that took
    the child down gets failed rows naming the failure, like a candidate the check refuses: a crash of ggml
    under one configuration (an assert in a cuBLAS path, say) then costs that configuration, not the other
    candidates of the point. Never raises for what the child does; the status says."""
    lost: list[tuple[str, str]] = []  # (candidate, failure) in the order they crashed
    wall = 0.0
    current = case
    while True:
        r = _run_child(harness, current, harness_args=harness_args, timeout=timeout, register=register)
        wall += r.wall_s
        crashed = r.crashed_on
        if crashed is None or len(lost) >= CRASH_RETRIES:
            break
        lost.append((crashed, r.status))
        current = replace(current, routes=tuple(c for c in current.routes if c != crashed))
    if not lost:
        return r
    if r.status != "done":  # still failing: the case fails as the last child did, naming what was lost
        return replace(r, wall_s=wall)
    rows = [
        {"kind": "trial", "case": case.id, "route": name, "trial": t, "us": None, "replays": 0, "nodes": 0,
         "nmse": None, "route_ran": "", "status": status, "reason": status[len(schema.FAILED_PREFIX):]}
        for name, status in lost
        for t in range(case.trials)
    ]  # fmt: skip
    info = {**r.case_info, "crashed": {name: status for name, status in lost}}
    return replace(r, trials=[*r.trials, *rows], case_info=info, wall_s=wall)


def _run_child(
    harness: Path,
    case: Case,
    *,
    harness_args: Sequence[str],
    timeout: float,
    register: Callable[[subprocess.Popen[str] | None], None],
) -> ChildResult:
    """One harness child for one case."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ggml-dispatch-case-") as tmp:
        spec_path = Path(tmp) / "case.json"
        spec_path.write_text(json.dumps([case.spec()]))
        cmd = [str(harness), "--cases", str(spec_path), *harness_args]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        register(proc)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            out, err = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            register(None)
    wall = time.monotonic() - t0
    recs = _parse_lines(out)
    header = next((r for r in recs if r.get("kind") == "header"), None)
    trials = [r for r in recs if r.get("kind") == "trial" and r.get("case") == case.id]
    end = next((r for r in recs if r.get("kind") == "case" and r.get("case") == case.id), None)
    tail = err.splitlines()[-STDERR_TAIL_LINES:]
    if timed_out or proc.returncode != 0 or end is None:
        msg = _failure_message(proc.returncode, err, timed_out, timeout)
        if not timed_out and proc.returncode == 0 and end is None:
            msg = "the harness ended without a result for the case"
        # a child killed by a signal (an abort, a fault) on a candidate; a timeout may be the machine's
        on = crashed_candidate(err, case) if proc.returncode < 0 and not timed_out else None
        return ChildResult(schema.FAILED_PREFIX + msg, header, [], {}, tail, wall, on)
    status = str(end.get("status", ""))
    if status != "done":
        if not status.startswith(schema.FAILED_PREFIX):
            status = schema.FAILED_PREFIX + status
        return ChildResult(status[: len(schema.FAILED_PREFIX) + FAILED_MSG_MAX], header, [], end, tail, wall)
    return ChildResult("done", header, trials, end, [], wall)


def probe_harness(harness: Path, harness_args: Sequence[str], timeout: float = 300) -> dict[str, Any]:
    """The harness' device header (``--info``): proves the binary and device work before the sweep."""
    args = [a for a in harness_args]
    proc = subprocess.run([str(harness), "--info", *args], capture_output=True, text=True, timeout=timeout)
    recs = _parse_lines(proc.stdout)
    header = next((r for r in recs if r.get("kind") == "header"), None)
    if proc.returncode != 0 or header is None:
        tail = "\n".join(proc.stderr.splitlines()[-10:])
        raise RuntimeError(f"the harness cannot start (exit {proc.returncode}):\n{tail}")
    return header


@dataclass
class SweepResult:
    selection: Selection
    planned: int
    resumed: int
    ran: int
    failed: int
    stopped_early: bool
    rows: int
    warnings: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _signals_raise() -> Iterator[Callable[[], None]]:
    """Signals raise SweepInterrupted; the context yields a check that raises it again.

    The raise in the handler can be swallowed: a signal that lands while a case's harness
    is being forked runs the handler inside an at-fork hook (logging's lock release), whose
    exceptions Python ignores. The signal is kept, and the sweep calls the check after each
    case, so an interrupt always ends the sweep.
    """
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        raise SweepInterrupted(signum)

    def check() -> None:
        if received:
            raise SweepInterrupted(received[0])

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield check
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_sweep(
    census_path: Path,
    out: Path,
    settings: SweepSettings,
    *,
    harness: Path,
    stamp: TreeStamp,
    journal_path: Path,
    recorded: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda s: None,
    progress: Callable[[int], Any] | None = None,
    on_plan: Callable[[int], Any] | None = None,
    executor: Executor | None = None,
    selection: Selection | None = None,
) -> SweepResult:
    """``selection``: the cases, already selected from ``census_path``; else the census is read and
    selected here (:func:`select_census`).
    ``settings.remeasure``: cases the journal holds as failed or with wrong trials run again (their new
    records replace the old). ``recorded``: more settings for the tuning file to record."""
    shard, max_seconds, allow_mixed = settings.shard, settings.max_seconds, settings.allow_mixed
    t_start = time.monotonic()
    census_sha = fileio.sha256_file(census_path)
    if selection is None:
        selection = select_census(census_path, settings)
    cases = shard_cases(selection.cases, shard)
    log(selection.summary())
    if shard != (0, 1):
        log(f"shard {shard[0]}/{shard[1]}: {len(cases)} of {len(selection.cases)} cases")

    executor = executor or SerialExecutor()
    job = HarnessJob(harness, settings.harness_args, settings.case_timeout)
    probes = executor.probe(job)
    header = probes[0]
    where = executor.describe()
    if where:
        log(where)
    log(
        f"harness {header.get('harness_version')} on {header.get('device')} ({header.get('gpu_name')}), "
        f"override API {'found' if header.get('dispatch_api') else 'absent: stock only'}, "
        f"L2 {header.get('l2_bytes')} bytes ({header.get('l2_source')})"
    )
    stamp_d = {"upstream_commit": stamp.upstream_commit, "patch_hash": stamp.patch_hash}
    identity = settings.journal_identity(census_sha)
    ran = failed = 0
    stopped = False
    warnings: list[str] = []

    with Journal.open(journal_path, identity) as journal:
        warnings += journal.contents.warnings
        done = journal.contents.done_ids()
        if settings.remeasure:
            again = done & journal.contents.unsound_ids()
            done -= again
            if again:
                log(f"remeasuring {len(again)} failed or wrong cases from {journal_path}")
        todo = [c for c in cases if c.id not in done]
        resumed = len(cases) - len(todo)
        if resumed:
            log(f"resuming: {resumed} of {len(cases)} cases are already in {journal_path}")
        gpus = {gpu_id(h): "the probe" for h in probes}
        for c in journal.contents.cases:
            if c.get("header"):
                gpus.setdefault(gpu_id(c["header"]), f"case {c['case']}")
        check_sweep_gpus(gpus, journal_path, allow_mixed=allow_mixed)
        if on_plan is not None:
            on_plan(len(todo))
        durations: list[float] = []

        def may_start() -> bool:
            nonlocal stopped
            if max_seconds is None:
                return True
            elapsed = time.monotonic() - t_start
            mean = sum(durations) / len(durations) if durations else 0.0
            if elapsed + mean > max_seconds:
                stopped = True
            return not stopped

        with (
            _signals_raise() as interrupted,
            contextlib.closing(executor.run(job, todo, may_start)) as finished,
        ):
            # closing: an interrupt or a refusal stops the cases still running
            for f in finished:
                r = f.result
                rec: dict[str, Any] = {
                    "case": f.case.id,
                    "spec": f.case.spec(),
                    "status": r.status,
                    "header": r.header or header,
                    "stamp": stamp_d,
                    "trials": r.trials,
                    "case_info": r.case_info,
                    "wall_s": round(r.wall_s, 3),
                    "finished": fileio.now_iso(),
                }
                if f.placement:
                    rec["placement"] = f.placement
                if r.status != "done":
                    rec["stderr_tail"] = r.stderr_tail
                    failed += 1
                    log(f"case {f.case.id}: {r.status}")
                journal.append(rec)
                ran += 1
                durations.append(r.wall_s)
                if progress is not None:
                    progress(1)
                if r.header and gpu_id(r.header) not in gpus:
                    gpus[gpu_id(r.header)] = f"case {f.case.id}"
                    check_sweep_gpus(gpus, journal_path, allow_mixed=allow_mixed)
                interrupted()
            interrupted()
        records = list(journal.contents.cases)
    if (w := results.stock_wrong_warning(records)) is not None:
        warnings.append(w)

    written = {**(recorded or {}), **settings.recorded()}
    written.update(
        harness_header={
            k: header.get(k)
            for k in (
                "harness_version",
                "backend",
                "device",
                "l2_bytes",
                "l2_source",
                "features",
                "opts",
                "dispatch_api",
                "graph_uid",
                "driver_source",
                "pci_bus_id",
                "smpbo",
            )
        },
        stopped_early=stopped,
        executor=executor.name,
    )
    n_rows = results.write_tuning(out, records, input_hashes={str(census_path): census_sha}, settings=written)
    return SweepResult(
        selection=selection,
        planned=len(cases),
        resumed=resumed,
        ran=ran,
        failed=failed,
        stopped_early=stopped,
        rows=n_rows,
        warnings=warnings,
    )


def default_journal(out: Path) -> Path:
    return out.with_name(out.name + ".journal.jsonl")
