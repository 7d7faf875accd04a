"""``tune run --executor ray``: every case a Ray task on one GPU of a Ray cluster.

Each task runs the same harness child process as the serial sweep (tuner.run.run_harness_case) on
the GPU Ray gave it (Ray sets CUDA_VISIBLE_DEVICES, so the harness' first GPU is that one) and
returns the result to the driver, which journals it like a serial case. A task that dies with its
worker or node (a CUDA trap that takes the worker down, a lost node) costs its case: it is
recorded as ``failed:ray task lost: ...`` and never retried (a retried trap would trap again).

Cluster requirement: every node that has the task's resources runs the same ggml-dispatch install
(same Python package) and has the harness binary at the same absolute path (a local cluster, a
shared filesystem, or the same build copied to the same path); the probe at the start runs
``harness --info`` on each such node and stops the sweep if one cannot start it.

Ray is an optional extra (``pip install 'ggml-dispatch[ray]'``): it is imported only here, and only
when the executor is used.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import schema
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner.executor import Executor, Finished, HarnessJob
from ggml_dispatch.tuner.run import (
    FAILED_MSG_MAX,
    STDERR_TAIL_LINES,
    ChildResult,
    probe_harness,
    run_harness_case,
)
from ggml_dispatch.tuner.select import Case

DEFAULT_RESOURCES: Final = "GPU=1"
PROBE_TIMEOUT_S: Final = 600.0
WAIT_S: Final = 0.5  # ray.wait slice: signals (SIGTERM, Ctrl-C) reach the driver within this
INSTALL_HINT: Final = "pip install 'ggml-dispatch[ray]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RuntimeError(
            f"--executor ray needs Ray, which is not importable here ({e}): {INSTALL_HINT}"
        ) from None
    return ray


def parse_resources(text: str) -> dict[str, float]:
    """``GPU=1`` / ``CPU=1`` / ``GPU=1,CPU=2,my_res=1``: what one case's task holds while it runs.
    CPU defaults to 1 (Ray's default for a task)."""
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, value = part.partition("=")
        name = name.strip()
        try:
            amount = float(value) if eq else math.nan
        except ValueError:
            amount = math.nan
        if not name or not math.isfinite(amount) or amount < 0:
            raise InputError(
                None, f"{part!r} is not NAME=AMOUNT (e.g. GPU=1 or CPU=1)", field="ray-resources"
            )
        out[name] = amount
    if not out or not any(v > 0 for v in out.values()):
        raise InputError(None, f"{text!r} asks for no resource (e.g. GPU=1)", field="ray-resources")
    out.setdefault("CPU", 1.0)
    return out


def task_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's ``.options()`` for these resources."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    opts: dict[str, Any] = {"num_cpus": resources.get("CPU", 1.0), "num_gpus": resources.get("GPU", 0.0)}
    if custom:
        opts["resources"] = custom
    return opts


def node_slots(node_resources: Mapping[str, float], resources: Mapping[str, float]) -> int:
    """How many tasks with ``resources`` fit on a node at once."""
    fits = [math.floor(node_resources.get(k, 0.0) / v + 1e-9) for k, v in resources.items() if v > 0]
    return max(0, min(fits)) if fits else 0


def _placement() -> dict[str, Any]:
    """On the worker: the node and the GPUs Ray assigned to this task."""
    ray = import_ray()
    ctx = ray.get_runtime_context()
    gpus = ctx.get_accelerator_ids().get("GPU", [])
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "gpu_ids": list(gpus)}


def _probe_task(harness: str, harness_args: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    return probe_harness(Path(harness), harness_args), _placement()


def _case_task(
    harness: str, case: Case, harness_args: Sequence[str], timeout: float
) -> tuple[ChildResult, dict[str, Any]]:
    return run_harness_case(Path(harness), case, harness_args=harness_args, timeout=timeout), _placement()


def _first_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return lines[0] if lines else type(e).__name__


def _anonymous(header: Mapping[str, Any]) -> dict[str, Any] | None:
    """A node's probe header for a case that died before its own: the GPU model is the node's, the
    GPU it ran on unknown."""
    return {**header, "gpu_uuid": "", "pci_bus_id": ""} if header else None


def _signal_safe(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Ray's blocking calls run Python signal handlers inside Cython; an exception the handler raises
    (the sweep's SweepInterrupted) comes out as a SystemError caused by it: raise the cause."""
    try:
        return fn(*args, **kw)
    except SystemError as e:
        cause = e.__cause__ or e.__context__
        if cause is not None and not isinstance(cause, SystemError):
            raise cause from None
        raise


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, address: str | None = None, resources: str = DEFAULT_RESOURCES) -> None:
        self.address = address
        self.resources = parse_resources(resources)
        self._ray: Any = None
        self._owns_connection = False
        self._node_headers: dict[str, dict[str, Any]] = {}

    def _connect(self) -> Any:
        if self._ray is None:
            ray = import_ray()
            if not ray.is_initialized():
                try:
                    ray.init(
                        address=self.address,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level=logging.WARNING,
                    )
                except (ConnectionError, RuntimeError, ValueError) as e:
                    where = self.address or "(a new local cluster)"
                    raise RuntimeError(f"cannot connect to the Ray cluster at {where}: {e}") from None
                self._owns_connection = True
            self._ray = ray
        return self._ray

    def _nodes(self) -> list[tuple[dict[str, Any], int]]:
        ray = self._connect()
        out = []
        for n in ray.nodes():
            if n.get("Alive"):
                k = node_slots(n.get("Resources") or {}, self.resources)
                if k > 0:
                    out.append((n, k))
        return out

    def slots(self) -> int:
        """Tasks that run at once on the cluster now (each holds one GPU with the default resources)."""
        return sum(k for _, k in self._nodes())

    def probe(self, job: HarnessJob) -> list[dict[str, Any]]:
        ray = self._connect()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = self._nodes()
        if not nodes:
            have = ray.cluster_resources()
            want = ", ".join(f"{k}={v:g}" for k, v in sorted(self.resources.items()))
            raise RuntimeError(
                f"no node of the Ray cluster has {want} (the cluster has "
                f"{', '.join(f'{k}={v:g}' for k, v in sorted(have.items()) if '.' not in k) or 'nothing'}); "
                "--ray-resources CPU=1 runs the cases on CPUs"
            )
        remote = ray.remote(_probe_task)
        harness = str(Path(job.harness).resolve())
        refs = {
            remote.options(
                **task_options(self.resources),
                max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False),
            ).remote(harness, list(job.harness_args)): n
            for n, _ in nodes
        }
        headers = []
        for ref, n in refs.items():
            where = f"node {n.get('NodeManagerAddress', '?')} ({n['NodeID'][:12]})"
            try:
                header, _ = ray.get(ref, timeout=PROBE_TIMEOUT_S)
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise RuntimeError(
                    f"{where}: {_first_line(cause)} (every node needs the harness at {harness})"
                ) from None
            except ray.exceptions.RayError as e:
                raise RuntimeError(
                    f"{where}: the probe task died: {type(e).__name__}: {_first_line(e)}"
                ) from None
            self._node_headers[n["NodeID"]] = header
            headers.append(header)
        return headers

    def describe(self) -> str:
        nodes = self._nodes()
        want = ",".join(f"{k}={v:g}" for k, v in sorted(self.resources.items()))
        return (
            f"ray: {sum(k for _, k in nodes)} cases at a time ({want} each) on {len(nodes)} node(s) "
            f"of the cluster at {self._connect().get_runtime_context().gcs_address}"
        )

    def run(
        self, job: HarnessJob, cases: Sequence[Case], may_start: Callable[[], bool]
    ) -> Generator[Finished, None, None]:
        ray = self._connect()
        remote = ray.remote(_case_task).options(**task_options(self.resources), max_retries=0)
        harness = str(Path(job.harness).resolve())
        args = list(job.harness_args)
        pending: dict[Any, tuple[Case, float]] = {}
        todo = iter(cases)
        more = True
        slots = self.slots()
        try:
            while True:
                while more and len(pending) < max(slots, 1):
                    case = next(todo, None)
                    if case is None or not may_start():
                        more = False
                        break
                    pending[remote.remote(harness, case, args, job.timeout)] = (case, time.monotonic())
                if not pending:
                    return
                ready, _ = _signal_safe(ray.wait, list(pending), num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    case, t0 = pending.pop(ref)
                    yield self._collect(ray, ref, case, t0)
                if ready:
                    slots = self.slots()  # nodes come and go
        finally:
            # the cases still running: their workers are killed, and with them the harness children
            # (PR_SET_PDEATHSIG); a task that finished meanwhile is left alone
            if pending:
                _, running = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                for ref in running:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)

    def _collect(self, ray: Any, ref: Any, case: Case, t0: float) -> Finished:
        fallback = next(iter(self._node_headers.values()), {})
        try:
            result, placement = _signal_safe(ray.get, ref)
        except ray.exceptions.RayTaskError as e:  # the task raised (e.g. no harness at that path)
            cause = e.cause if getattr(e, "cause", None) is not None else e
            msg = f"ray task raised {type(cause).__name__}: {_first_line(cause)}"
            tail = str(e).splitlines()[-STDERR_TAIL_LINES:]
            result = ChildResult(schema.FAILED_PREFIX + msg[:FAILED_MSG_MAX], None, [], {}, tail, 0.0)
            placement = {}
        except ray.exceptions.RayError as e:  # the worker or its node died
            msg = f"ray task lost: {type(e).__name__}: {_first_line(e)}"
            tail = str(e).splitlines()[-STDERR_TAIL_LINES:]
            result = ChildResult(schema.FAILED_PREFIX + msg[:FAILED_MSG_MAX], None, [], {}, tail, 0.0)
            placement = {}
        if not result.wall_s:
            result.wall_s = time.monotonic() - t0
        if result.header is None:
            result.header = _anonymous(self._node_headers.get(str(placement.get("node_id")), fallback))
        return Finished(case, result, placement)

    def close(self) -> None:
        if self._ray is not None and self._owns_connection:
            self._ray.shutdown()
        self._ray = None
        self._owns_connection = False
