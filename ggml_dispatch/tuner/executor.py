"""Where the sweep's cases run: the executor seam of ``tune run``.

An executor runs harness child processes for a list of cases and yields each case's result as it
finishes; the driver (ggml_dispatch/tuner/run.py) journals every result, so the journal, the resume and the
Parquet file are the same whatever runs the cases. ``SerialExecutor`` runs one child at a time on
this machine (one GPU); ``tuner.executor_ray.RayExecutor`` runs one Ray task per case, each pinned
to one GPU of a Ray cluster.

Mixed GPU models (name, compute capability, SM count) in one sweep are refused unless the caller
allows them, as ``tune merge`` refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggml_dispatch import schema
from ggml_dispatch.artifacts import validators
from ggml_dispatch.tuner.select import Case

if TYPE_CHECKING:
    from ggml_dispatch.tuner.run import ChildResult


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
        from ggml_dispatch.tuner.run import probe_harness  # tuner.run imports this module

        return [probe_harness(job.harness, job.harness_args)]

    def run(
        self, job: HarnessJob, cases: Sequence[Case], may_start: Callable[[], bool]
    ) -> Generator[Finished, None, None]:
        """Yield each case's result as it finishes (any order). ``may_start()`` is asked before each
        case starts; once it says no, no further case starts. Closing the iterator early (an
        interrupt, a refusal) kills or cancels the cases still running."""
        from ggml_dispatch.tuner.run import run_harness_case

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


def gpu_id(header: Mapping[str, Any]) -> schema.GpuId:
    """The GPU identity (name, cc, SM count) of a harness header."""
    return schema.GpuId(
        str(header.get("gpu_name", "")),
        int(header.get("gpu_cc", 0) or 0),
        int(header.get("gpu_sm_count", 0) or 0),
    )


def check_sweep_gpus(gpus: Mapping[schema.GpuId, str], journal: Path, *, allow_mixed: bool) -> None:
    """``gpus``: each GPU model the sweep has met and where (a probe, a case); one model unless allowed."""
    validators.check_one_gpu(gpus, journal, allow_mixed=allow_mixed, what="cases")
