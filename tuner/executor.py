"""Where the sweep's cases run: the executor seam of ``tune run``.

An executor runs harness child processes for a list of cases and yields each case's result as it
finishes; the driver (tuner/run.py) journals every result, so the journal, the resume and the
Parquet file are the same whatever runs the cases. ``SerialExecutor`` runs one child at a time on
this machine (one GPU); ``tuner.executor_ray.RayExecutor`` runs one Ray task per case, each pinned
to one GPU of a Ray cluster.

Mixed GPU models (name, compute capability, SM count) in one sweep are refused unless the caller
allows them, as ``tune merge`` refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggml_dispatch.errors import InputError
from tuner.select import Case

if TYPE_CHECKING:
    from tuner.run import ChildResult

GpuModel = tuple[str, int, int]


@dataclass(frozen=True)
class HarnessJob:
    """What every case of a sweep runs: the harness binary (a path valid where the case runs), its
    extra options, and the seconds before a case's child is killed."""

    harness: Path
    harness_args: tuple[str, ...] = ()
    timeout: float = 900


@dataclass
class Finished:
    """One case's result; ``placement`` says where it ran (empty for this machine)."""

    case: Case
    result: ChildResult
    placement: dict[str, Any] = field(default_factory=dict)


class Executor:
    """Runs cases; subclasses override ``probe`` and ``run``. A context manager: ``close`` frees
    whatever ``probe``/``run`` started (a Ray connection)."""

    name = "serial"

    def probe(self, job: HarnessJob) -> list[dict[str, Any]]:
        """The harness' device header on every kind of place a case can run (one per Ray node);
        raises RuntimeError if the harness cannot start there. The first header describes the sweep."""
        from tuner.run import probe_harness  # tuner.run imports this module

        return [probe_harness(job.harness, job.harness_args)]

    def run(
        self, job: HarnessJob, cases: Sequence[Case], may_start: Callable[[], bool]
    ) -> Generator[Finished, None, None]:
        """Yield each case's result as it finishes (any order). ``may_start()`` is asked before each
        case starts; once it says no, no further case starts. Closing the iterator early (an
        interrupt, a refusal) kills or cancels the cases still running."""
        from tuner.run import run_harness_case

        for case in cases:
            if not may_start():
                return
            # an interrupt raised while the child runs kills it (run_harness_case's finally)
            r = run_harness_case(job.harness, case, harness_args=job.harness_args, timeout=job.timeout)
            yield Finished(case, r)

    def describe(self) -> str:
        """One line for the log after ``probe`` (empty: nothing to say)."""
        return ""

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialExecutor(Executor):
    """One harness child at a time on this machine: the default."""


def gpu_model(header: Mapping[str, Any] | None) -> GpuModel:
    h = header or {}
    return (str(h.get("gpu_name", "")), int(h.get("gpu_cc", 0) or 0), int(h.get("gpu_sm_count", 0) or 0))


def mixed_gpus(headers: Iterable[Mapping[str, Any] | None]) -> list[GpuModel]:
    """The distinct GPU models of these harness headers, sorted (one entry: not mixed)."""
    return sorted({gpu_model(h) for h in headers if h})


def refuse_mixed(models: Sequence[GpuModel], where: str) -> None:
    if len(models) > 1:
        listed = "; ".join(f"{n} cc {c} {s} SMs" for n, c, s in models)
        raise InputError(
            None,
            f"{where} runs on {len(models)} GPU models: {listed}; pass --allow-mixed to sweep them together",
            field="gpu_name",
        )
