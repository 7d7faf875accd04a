"""Run an autotune plan stage by stage, with a state file that makes every stage resumable.

A stage counts as done when it finished with the same commands; re-running the same command line skips
the done stages and continues with the first that is not (tune resumes inside itself from its journal).
Once one stage re-runs, the stages after it re-run too: their inputs changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

from ggml_dispatch import fileio
from ggml_dispatch.artifacts import table as table_artifact
from ggml_dispatch.autotune import plan as plan_mod

STATE_SCHEMA: Final = "ggml-dispatch-autotune/1"
AB_DEPENDENT: Final = ("install-table", "rebuild", "ab")
TUNE_STOPPED_EARLY: Final = "stopped by --max-seconds"  # what `tune run` prints when its budget ends


class StageFailed(RuntimeError):
    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def stage_key(stage: plan_mod.Stage) -> str:
    data = [[list(s.argv), [list(kv) for kv in s.env], str(s.stdout)] for s in stage.steps]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def load_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"schema": STATE_SCHEMA, "stages": {}}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    if (
        not isinstance(state, dict)
        or state.get("schema") != STATE_SCHEMA
        or not isinstance(state.get("stages"), dict)
    ):
        raise StageFailed("state", f"{path}: not a {STATE_SCHEMA} state file (remove it to start over)")
    return state


def save_state(path: Path, state: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_text_atomic(path, json.dumps(state, indent=2, sort_keys=True) + "\n")


def done_stages(
    stages: Sequence[plan_mod.Stage], state: Mapping[str, Any], skip: frozenset[str]
) -> frozenset[str]:
    """The leading stages a re-run skips: done with the same commands, up to the first that is not."""
    done = set()
    for s in stages:
        if s.name in skip:
            continue
        rec = state["stages"].get(s.name)
        if not (isinstance(rec, dict) and rec.get("status") == "done" and rec.get("key") == stage_key(s)):
            break
        done.add(s.name)
    return frozenset(done)


def table_rule_count(table: Path) -> int:
    """Rules of the table codegen wrote, read as every command reads a table.json."""
    return len(table_artifact.load(table)["rules"])


def _run_step(step: plan_mod.Step, env: Mapping[str, str], log: IO[str], show: Callable[[str], None]) -> int:
    full = {**env, **dict(step.env)}
    log.write(f"$ {step.shell()}\n")
    log.flush()
    out_f = step.stdout.open("w", encoding="utf-8") if step.stdout else None
    try:
        proc = subprocess.Popen(
            list(step.argv),
            stdout=out_f if out_f else subprocess.PIPE,
            stderr=subprocess.STDOUT if out_f is None else subprocess.PIPE,
            text=True,
            env=full,
            errors="replace",
        )
    except OSError as e:
        if out_f:
            out_f.close()
        log.write(f"cannot start {step.argv[0]}: {e}\n")
        return 127
    stream = proc.stderr if out_f else proc.stdout
    assert stream is not None
    for line in stream:
        log.write(line)
        show(line.rstrip())
    rc = proc.wait()
    if out_f:
        out_f.close()
    log.write(f"# exit {rc}\n")
    log.flush()
    return rc


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def execute(
    stages: Sequence[plan_mod.Stage],
    opts: plan_mod.Options,
    *,
    env: Mapping[str, str] | None = None,
    echo: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    live: Callable[[str], None] | None = None,
) -> list[str]:
    """Run the stages; returns the names run. StageFailed names the stage and its log's tail."""
    base_env = dict(os.environ if env is None else env)
    out, work = opts.out, opts.out / plan_mod.WORK_DIR
    state_path = out / plan_mod.STATE_FILE
    state = load_state(state_path)
    skip = set(opts.skip)
    done = done_stages(stages, state, frozenset(skip))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "traces").mkdir(parents=True, exist_ok=True)
    ran = []
    t0 = time.monotonic()
    for i, stage in enumerate(stages, start=1):
        head = f"[{i}/{len(stages)}] {stage.name}"
        if stage.name in skip:
            echo(f"{head}: skipped")
            continue
        if stage.name in done:
            echo(f"{head}: done earlier (resumed past)")
            continue
        steps = list(stage.steps)
        if stage.name == "report" and not (out / "ab.jsonl").is_file():
            steps = [_without_ab(s) for s in steps]
        if stage.name == "ab":
            (work / "ab.partial.jsonl").unlink(missing_ok=True)
        echo(f"{head}: {stage.what} (~{stage.minutes:.1f} min)")
        log_path = work / "logs" / f"{stage.name}.log"
        started = time.monotonic()
        seen: list[str] = []
        show = _watcher(seen, live)
        with log_path.open("a", encoding="utf-8") as log:
            for step in steps:
                rc = _run_step(step, base_env, log, show)
                if rc != 0:
                    state["stages"][stage.name] = {"status": "failed", "key": stage_key(stage), "rc": rc}
                    save_state(state_path, state)
                    raise StageFailed(
                        stage.name,
                        f"stage {stage.name} failed (exit {rc}): {step.shell()}\n{_tail(log_path)}\n"
                        f"log: {log_path}; fix it and re-run the same command to resume from {stage.name}",
                    )
        if stage.name == "ab":
            (work / "ab.partial.jsonl").replace(out / "ab.jsonl")
        state["stages"][stage.name] = {
            "status": "done",
            "key": stage_key(stage),
            "seconds": round(time.monotonic() - started, 1),
            "finished": fileio.now_iso(),
            "partial": bool(seen),
        }
        save_state(state_path, state)
        ran.append(stage.name)
        echo(f"{head}: done in {time.monotonic() - started:.0f} s (total {time.monotonic() - t0:.0f} s)")
        if seen:
            echo(f"  {seen[-1]}")
            echo(
                "  the table covers the cases measured so far; "
                "a larger --tune-seconds continues from the journal"
            )
        if stage.name == "codegen" and table_rule_count(out / "table.json") == 0:
            echo("codegen: no rule passed the decision rule: stock is already the fastest measured route;")
            echo("  the table is stock, so install-table, rebuild and ab are skipped")
            skip.update(AB_DEPENDENT)
    return ran


def _watcher(seen: list[str], live: Callable[[str], None] | None) -> Callable[[str], None]:
    """A step's output lines: to the terminal's live line, and `tune run`'s stopped-early note kept."""

    def show(line: str) -> None:
        if line.startswith(TUNE_STOPPED_EARLY):
            seen.append(line)
        if live is not None:
            live(line)

    return show


def _without_ab(step: plan_mod.Step) -> plan_mod.Step:
    argv = list(step.argv)
    if "--ab" in argv:
        i = argv.index("--ab")
        del argv[i : i + 2]
    return plan_mod.Step(tuple(argv), step.env, step.stdout)
