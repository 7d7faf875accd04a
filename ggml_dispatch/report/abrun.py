"""Run a stock-vs-table A/B with llama-bench: arms as interleaved pairs, one record per test of each run.

Each arm is a llama-bench binary (its build) and a ``GGML_CUDA_DISPATCH`` value. Per model and pair, every
arm runs each benchmark invocation once (``-r`` repetitions inside), in an order rotated per pair so that
no arm always runs first. llama-bench runs with ``-v``: without it llama-bench silences the ggml log and
the run's own ``ggml_cuda_dispatch:`` start-up line, which each record carries, would be lost. Records are
appended as each run finishes (a killed A/B keeps every finished run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click

from ggml_dispatch import fileio
from ggml_dispatch.artifacts import ab
from ggml_dispatch.census import gguf_meta
from ggml_dispatch.errors import InputError

LIB_NAME: Final = "libggml-cuda.so"
DEFAULT_BENCH: Final = ("-p 512,2048 -n 0 -b 2048 -ub 512 -fa on -ngl 99", "-p 0 -n 128 -fa on -ngl 99")


class RunError(RuntimeError):
    """A run that could not be measured (exit status, no start-up line, no JSON)."""


@dataclass(frozen=True)
class BenchResult:
    test: str
    ubatch: int
    tps: float
    samples_tps: tuple[float, ...]
    build_commit: str


def test_name(n_prompt: int, n_gen: int, n_depth: int = 0, type_k: str = "f16", type_v: str = "f16") -> str:
    """llama-bench's own test names: pp512, tg128, pp512+tg128, with @dN for a prefilled depth and the
    KV cache types when not llama-bench's default f16 (tg32 @ d49152 kv q8_0): one A/B may run a test
    with several caches."""
    if n_prompt and n_gen:
        name = f"pp{n_prompt}+tg{n_gen}"
    elif n_gen:
        name = f"tg{n_gen}"
    else:
        name = f"pp{n_prompt}"
    if n_depth:
        name = f"{name} @ d{n_depth}"
    return name + ab.kv_suffix(type_k, type_v)


def _int(obj: Mapping[str, Any], key: str, source: str, lineno: int) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InputError(source, "expected a non-negative integer", line=lineno, field=key)
    return v


def parse_bench_output(text: str, source: str = "<llama-bench>") -> list[BenchResult]:
    """llama-bench's ``-o json`` (one array) or ``-o jsonl`` (one object a line) -> results."""
    stripped = text.strip()
    objs: list[tuple[int, Any]] = []
    if stripped.startswith("["):
        try:
            arr = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise InputError(source, f"invalid JSON: {e.msg}", line=e.lineno) from None
        objs = [(1, o) for o in arr]
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                objs.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise InputError(source, f"invalid JSON: {e.msg}", line=lineno) from None
    out = []
    for lineno, o in objs:
        if not isinstance(o, dict):
            raise InputError(source, "expected a JSON object per test", line=lineno)
        ts = o.get("avg_ts")
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not ts > 0:
            raise InputError(source, "expected a positive number", line=lineno, field="avg_ts")
        samples = o.get("samples_ts", [])
        if not isinstance(samples, list) or not all(isinstance(x, int | float) for x in samples):
            raise InputError(source, "expected a list of numbers", line=lineno, field="samples_ts")
        name = test_name(
            _int(o, "n_prompt", source, lineno),
            _int(o, "n_gen", source, lineno),
            int(o.get("n_depth") or 0),
            str(o.get("type_k") or "f16"),
            str(o.get("type_v") or "f16"),
        )
        out.append(
            BenchResult(
                name,
                _int(o, "n_ubatch", source, lineno),
                float(ts),
                tuple(float(x) for x in samples),
                str(o.get("build_commit") or ""),
            )
        )
    return out


@dataclass(frozen=True)
class Arm:
    name: str  # stock | table | crude | cached | hook
    bench: Path  # the llama-bench binary of this arm's build
    dispatch: str  # GGML_CUDA_DISPATCH value: off | table
    env: tuple[tuple[str, str], ...] = ()  # more environment (e.g. LD_LIBRARY_PATH for a carried build)


def parse_arm(spec: str) -> Arm:
    """``NAME=PATH[:MODE]``: PATH a llama-bench binary or the folder holding it; MODE off|table (stock
    defaults to off, the others to table)."""
    name, sep, rest = spec.partition("=")
    if not sep or name not in ab.ARMS or not rest:
        raise click.BadParameter(f"{spec!r}: expected NAME=PATH[:MODE] with NAME one of {', '.join(ab.ARMS)}")
    path, _, mode = rest.partition(":")
    mode = mode or ("off" if name == ab.STOCK_ARM else "table")
    if mode not in ("off", "table"):
        raise click.BadParameter(f"{spec!r}: MODE must be off or table")
    p = Path(path)
    bench = p / "llama-bench" if p.is_dir() else p
    return Arm(name, bench, mode)


def rotation(arms: Sequence[Arm], pair: int) -> list[Arm]:
    """The order of the arms in pair ``pair`` (1-based): rotated by one each pair."""
    k = pair % len(arms)
    return [*arms[k:], *arms[:k]]


def ggml_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith("GGML_")}


def resolve_lib(bench: Path, env: Mapping[str, str]) -> Path:
    """The libggml-cuda that ``bench`` loads under ``env`` (ldd, honouring LD_LIBRARY_PATH), else the one
    beside it; a static build has none, and then the binary itself is what ran."""
    ldd = shutil.which("ldd")
    if ldd is not None:
        res = subprocess.run([ldd, str(bench)], capture_output=True, text=True, env=dict(env), check=False)
        for line in res.stdout.splitlines():
            if LIB_NAME in line and "=>" in line:
                target = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
                if target and target != "not found" and Path(target).is_file():
                    return Path(target).resolve()
    beside = bench.parent / LIB_NAME
    if beside.is_file():
        return beside.resolve()
    return bench.resolve()


@dataclass(frozen=True)
class Gpu:
    name: str
    uuid: str
    driver: str


def query_gpu(nvidia_smi: str | None = None) -> Gpu | None:
    """The first visible GPU (nvidia-smi); None when there is none, no nvidia-smi, or CUDA_VISIBLE_DEVICES
    hides every device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return None
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_gpu_query(res.stdout) if res.returncode == 0 else None


def parse_gpu_query(text: str) -> Gpu | None:
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(parts):
            return Gpu(*parts)
    return None


def parse_compute_apps(text: str, pid: int) -> float | None:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``: MiB of ``pid``
    (summed over its lines, one per GPU), None when it is not listed (e.g. another PID namespace)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) != pid:
            continue
        try:
            total += float(parts[1])
        except ValueError:
            continue
        seen = True
    return total if seen else None


def parse_memory_used(text: str) -> float | None:
    """``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits``: the first GPU's MiB."""
    for line in text.splitlines():
        try:
            return float(line.strip())
        except ValueError:
            continue
    return None


@dataclass
class VramPeak:
    """Polls nvidia-smi while a process runs: its own peak (per-process accounting), and the device's peak
    rise over the memory used before it started (when the process is not listed, e.g. in a container)."""

    pid: int
    nvidia_smi: str
    baseline_mib: float | None
    interval_s: float = 0.2
    process_mib: float | None = None
    device_mib: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _query(self, what: str) -> str:
        try:
            res = subprocess.run(
                [self.nvidia_smi, what, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return res.stdout if res.returncode == 0 else ""

    def poll_once(self) -> None:
        p = parse_compute_apps(self._query("--query-compute-apps=pid,used_memory"), self.pid)
        if p is not None:
            self.process_mib = max(self.process_mib or 0.0, p)
        d = parse_memory_used(self._query("--query-gpu=memory.used"))
        if d is not None and self.baseline_mib is not None:
            self.device_mib = max(self.device_mib or 0.0, d - self.baseline_mib)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float | None, str | None]:
        """(peak MiB, source): the process' own peak when nvidia-smi listed it, else the device's rise."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.process_mib is not None:
            return self.process_mib, "process"
        if self.device_mib is not None:
            return self.device_mib, "device"
        return None, None


@dataclass
class Runner:
    """Runs one llama-bench invocation of one arm and turns it into records (the impure part)."""

    gpu: Gpu
    reps: int = 3
    log: Path | None = None  # stderr of every run, appended
    extra_env: Mapping[str, str] = field(default_factory=dict)
    clock: Callable[[], str] = fileio.now_iso
    vram: bool = False  # poll nvidia-smi for the run's peak GPU memory

    def command(self, arm: Arm, model: Path, bench_args: str) -> list[str]:
        return [
            str(arm.bench),
            "-m",
            str(model),
            *shlex.split(bench_args),
            "-r",
            str(self.reps),
            "-o",
            "jsonl",
            "-v",
        ]

    def run(self, arm: Arm, model_name: str, model: Path, bench_args: str, pair: int) -> list[ab.Record]:
        env = {**os.environ, **self.extra_env, **dict(arm.env), "GGML_CUDA_DISPATCH": arm.dispatch}
        # the build's own libraries first (a carried build has no RUNPATH; a normal one loads these anyway)
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (str(arm.bench.parent), env.get("LD_LIBRARY_PATH", "")) if p
        )
        env.pop("GGML_CUDA_ROUTE_TRACE", None)  # an A/B never traces
        cmd = self.command(arm, model, bench_args)
        started = self.clock()
        peak: tuple[float | None, str | None] = (None, None)
        smi = shutil.which("nvidia-smi") if self.vram else None
        if self.vram and smi is None:
            raise RunError("--vram: no nvidia-smi on PATH to measure the peak GPU memory with")
        if smi is not None:
            base = VramPeak(0, smi, None)
            baseline = parse_memory_used(base._query("--query-gpu=memory.used"))
            with subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            ) as proc:
                poller = VramPeak(proc.pid, smi, baseline)
                poller.start()
                stdout, stderr = proc.communicate()
                peak = poller.stop()
            res = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
            if peak[0] is None:
                raise RunError(f"{shlex.join(cmd)}: --vram: nvidia-smi reported no memory for the run")
        else:
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as f:
                f.write(f"$ {shlex.join(cmd)}\n{res.stderr}\n")
        if res.returncode != 0:
            tail = "\n".join(res.stderr.splitlines()[-5:])
            raise RunError(f"{shlex.join(cmd)}: exit {res.returncode}\n{tail}")
        line = ab.find_dispatch_line(res.stderr)
        if line is None:
            raise RunError(
                f"{shlex.join(cmd)}: no '{ab.LINE_PREFIX.strip()}' start-up line in its output: "
                "is the ggml-dispatch hook installed in this build?"
            )
        lib = resolve_lib(arm.bench, env)
        results = parse_bench_output(res.stdout, f"{arm.bench} (stdout)")
        if not results:
            raise RunError(f"{shlex.join(cmd)}: no test results on stdout")
        out = []
        for r in results:
            prov = ab.Provenance(
                command=tuple(cmd),
                env=tuple(ggml_env(env).items()),
                dispatch_line=line.text,
                table_hash=line.table_hash,
                table_applied=line.applied,
                lib_path=str(lib),
                lib_sha256=fileio.sha256_file(lib),
                gpu_name=self.gpu.name,
                gpu_uuid=self.gpu.uuid,
                driver=self.gpu.driver,
                started=started,
                build_commit=r.build_commit,
                peak_vram_mib=peak[0],
                vram_source=peak[1],
            )
            out.append(ab.Record(model_name, r.test, r.ubatch, arm.name, pair, r.tps, r.samples_tps, prov))
        return out


def plan_runs(
    arms: Sequence[Arm], models: Sequence[tuple[str, Path]], bench: Sequence[str], pairs: int
) -> Iterator[tuple[str, Path, int, Arm, str]]:
    """(model name, model, pair, arm, bench args) in run order: per model, per pair, arms rotated."""
    for name, model in models:
        for pair in range(1, pairs + 1):
            for arm in rotation(arms, pair):
                for args in bench:
                    yield name, model, pair, arm, args


def run_ab(
    runner: Runner,
    arms: Sequence[Arm],
    models: Sequence[tuple[str, Path]],
    bench: Sequence[str],
    pairs: int,
    out: Path,
    progress: Callable[[str], None] | None = None,
    expect_table: str | None = None,
) -> int:
    """Run every pair and append its records to ``out`` as it goes; returns the number of records. With
    ``expect_table`` (a table hash), a run whose start-up line shows another table than the arm should
    have (report's check) stops the A/B at once, before its records are written."""
    n = 0
    planned = list(plan_runs(arms, models, bench, pairs))
    for i, (name, model, pair, arm, args) in enumerate(planned, start=1):
        records = runner.run(arm, name, model, args, pair)
        if expect_table is not None:
            try:
                ab.check_records(
                    list(enumerate(records, start=1)), Path(f"{arm.bench} ({arm.name} arm)"), expect_table
                )
            except InputError as e:
                raise RunError(f"{e.render()}: stopped before measuring further") from None
        ab.write_records(out, records, append=n > 0)
        n += len(records)
        if progress is not None:
            line = records[0].provenance.dispatch_line if records[0].provenance else ""
            progress(f"[{i}/{len(planned)}] {name} pair {pair} {arm.name}: {line}")
    return n


def parse_arm_env(spec: str) -> tuple[str, str, str]:
    """``ARM=VAR=VALUE``: one more environment variable (GGML_* only) for the runs of one arm."""
    arm, sep, rest = spec.partition("=")
    var, sep2, value = rest.partition("=")
    if not sep or not sep2 or arm not in ab.ARMS or not var.startswith("GGML_") or not var.isidentifier():
        raise click.BadParameter(
            f"{spec!r}: expected ARM=GGML_VAR=VALUE with ARM one of {', '.join(ab.ARMS)}",
            param_hint="--arm-env",
        )
    return arm, var, value


def _model(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep:
        p = Path(spec)
        return p.stem, p
    return name, Path(path)


@click.command("ab")
@click.option(
    "--arm",
    "arm_specs",
    multiple=True,
    required=True,
    help="NAME=LLAMA_BENCH[:off|table], repeatable; NAME stock, table, crude, cached or hook (a hooked build "
    "with no table: the hook's own cost).",
)
@click.option("--model", "model_specs", multiple=True, required=True, help="[NAME=]MODEL.gguf, repeatable.")
@click.option(
    "--bench",
    "bench_args",
    multiple=True,
    help="llama-bench arguments of one invocation per arm-run (repeatable; default "
    + " and ".join(map(repr, DEFAULT_BENCH))
    + ").",
)
@click.option("--pairs", type=click.IntRange(1, 1000), default=5, show_default=True)
@click.option(
    "--reps", type=click.IntRange(1, 1000), default=3, show_default=True, help="llama-bench -r per arm-run."
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="append every run's stderr here.",
)
@click.option(
    "--expect-table",
    "expect_path",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="table.json the table arm must run: stop at the first run that applied another (or none).",
)
@click.option(
    "--arm-env",
    "arm_env_specs",
    multiple=True,
    help="ARM=GGML_VAR=VALUE: more environment for one arm's runs (e.g. cached=GGML_CUDA_DISPATCH_CACHE=0), "
    "recorded with each record; repeatable.",
)
@click.option(
    "--vram",
    is_flag=True,
    help="record each run's peak GPU memory (nvidia-smi polled every 0.2 s: the process' own, else the "
    "device's rise over its use before the run).",
)
@click.option("-o", "--out", "out_path", type=click.Path(path_type=Path, dir_okay=False), required=True)
def ab_cmd(
    arm_specs: tuple[str, ...],
    model_specs: tuple[str, ...],
    bench_args: tuple[str, ...],
    pairs: int,
    reps: int,
    log_path: Path | None,
    expect_path: Path | None,
    arm_env_specs: tuple[str, ...],
    vram: bool,
    out_path: Path,
) -> None:
    """Stock-vs-table A/B with llama-bench as interleaved pairs; writes ggml-dispatch-ab/1 records
    (one per test of each run, with its command, GGML_* environment, start-up line, library sha256,
    GPU and time). Needs a GPU.

    \b
    Example:
      ggml-dispatch ab --arm stock=build/bin --arm table=build/bin --model m.gguf --pairs 5 -o ab.jsonl
    """
    arms = [parse_arm(s) for s in arm_specs]
    extra: dict[str, list[tuple[str, str]]] = {}
    for spec in arm_env_specs:
        arm_name, var, value = parse_arm_env(spec)
        if arm_name not in {a.name for a in arms}:
            raise click.BadParameter(f"{spec!r}: no arm {arm_name!r}", param_hint="--arm-env")
        extra.setdefault(arm_name, []).append((var, value))
    arms = [dataclasses.replace(a, env=a.env + tuple(extra.get(a.name, ()))) for a in arms]
    if len({a.name for a in arms}) != len(arms):
        raise click.BadParameter("each arm name once", param_hint="--arm")
    for a in arms:
        if not a.bench.is_file():
            raise InputError(a.bench, "no such llama-bench binary")
    models = [_model(s) for s in model_specs]
    for _, m in models:
        if not m.is_file():
            raise InputError(m, "no such model file")
        gguf_meta.read_gguf(m)  # a GGUF whose header parses, before any GPU work
    if out_path.exists():
        raise InputError(out_path, "exists: an A/B run writes a new file (remove it or choose another -o)")
    expect = None
    if expect_path is not None:
        from ggml_dispatch.codegen import table as table_mod

        expect = table_mod.table_hash(table_mod.load(expect_path))
    gpu = query_gpu()
    if gpu is None:
        click.echo("ggml-dispatch: error: no GPU visible (nvidia-smi found none): an A/B needs one", err=True)
        sys.exit(2)
    runner = Runner(gpu, reps=reps, log=log_path, vram=vram)
    try:
        n = run_ab(
            runner,
            arms,
            models,
            bench_args or DEFAULT_BENCH,
            pairs,
            out_path,
            progress=lambda s: click.echo(s, err=True),
            expect_table=expect,
        )
    except RunError as e:
        click.echo(f"ggml-dispatch: error: {e}", err=True)
        sys.exit(1)
    click.echo(f"{out_path}: {n} records")


def main(argv: list[str] | None = None) -> None:
    from ggml_dispatch.cli import main as root

    root(["ab", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
