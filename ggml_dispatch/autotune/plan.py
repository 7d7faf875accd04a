"""``autotune``'s plan: options -> stages -> the commands each runs (pure; nothing runs or is written here).

Stages, in order: hook (install the hook, no table), build (llama.cpp with CUDA and FlashAttention),
trace (llama-bench workloads with GGML_CUDA_ROUTE_TRACE), census, tune (resumable by its journal),
codegen, install-table, rebuild, ab (stock vs table, interleaved pairs) and report. The A/B arms use one
build: stock is ``GGML_CUDA_DISPATCH=off``, the table arm the compiled table.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

STAGES: Final = (
    "hook",
    "build",
    "trace",
    "census",
    "tune",
    "codegen",
    "install-table",
    "rebuild",
    "ab",
    "report",
)
GPU_STAGES: Final = ("trace", "tune", "ab")  # the stages that run on the GPU
WORKLOADS: Final = ("decode", "verify", "prefill")
# with --depth: decode and verify at prefilled KV depths, the FlashAttention points (census attention)
DEPTH_WORKLOAD: Final = "depth"
DEPTH_MAX_M: Final = 16  # the attention census keeps calls of at most this many Q columns
KV_TYPES: Final = ("f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")  # llama-bench -ctk/-ctv
DEFAULT_UBATCH: Final = (128, 256, 512, 1024, 2048)
WORK_DIR: Final = ".autotune"  # traces, logs and the partial A/B inside the output folder
STATE_FILE: Final = "autotune.state.json"
BUILD_TARGETS: Final = ("llama-bench", "test-backend-ops")
# The CMake line (README): CUDA, FlashAttention kernels, no native CPU tuning, no network or server.
CMAKE_OPTIONS: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_CUDA=ON",
    "-DGGML_CUDA_FA=ON",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)
# Rough minutes for the dry-run's estimate, from this project's H200 runs (evidence/): a cold
# ggml-cuda build for one arch takes about 120 core-minutes (~1 hour on 2 cores), an incremental one
# after a header change about 4 core-minutes; one traced llama-bench workload well under a minute;
# a tuning case about 1.5 s per trial; an A/B run loads the model (~10 s) and repeats its tests.
COLD_BUILD_CORE_MIN: Final = 120.0
INCREMENTAL_BUILD_CORE_MIN: Final = 4.0
TRACE_MIN_PER_RUN: Final = 0.5
TUNE_CASES_GUESS_PER_MODEL: Final = 40
TUNE_SECONDS_PER_TRIAL: Final = 1.5
AB_MIN_PER_RUN: Final = 0.15
AB_MIN_PER_REP: Final = 0.05


@dataclass(frozen=True)
class Options:
    llama_cpp: Path
    models: tuple[Path, ...]
    out: Path
    build_dir: Path
    workloads: tuple[str, ...] = WORKLOADS
    ubatches: tuple[int, ...] = DEFAULT_UBATCH
    cuda_arch: str = "native"
    nvcc: Path | None = None
    jobs: int = 2
    trials: int = 7
    tune_seconds: float | None = None
    case_timeout: float | None = None
    coverage: float = 0.95
    pairs: int = 5
    reps: int = 3
    skip: frozenset[str] = frozenset()
    depths: tuple[int, ...] = ()  # KV depths of the attention workload (none: no attention tuning)
    kv_type: str = "f16"  # its KV cache type
    # MiB of VRAM for rules that trade memory for time (weight cache, KV shadow; codegen's --vram-budget);
    # 0: none. A positive budget has the matmul sweep time the weight cache's configurations too.
    vram_budget: int = 0
    depth_fill: bool = False  # the attention census keeps each depth's last KV-fill point too
    # speculative decoding as served: draft tokens per step and server slots decoding together; they add
    # the widths such a server verifies (see verify_widths) to the verify and depth workloads
    spec_draft: int = 0
    slots: int = 1
    tool: tuple[str, ...] = ("ggml-dispatch",)  # how the stage CLIs are called
    generator: tuple[str, ...] = ()  # e.g. ("-G", "Ninja")
    built: bool = False  # the build folder already holds a configured build (reused)


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    stdout: Path | None = None  # where the step's stdout goes (else the stage log)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        cmd = shlex.join(self.argv)
        out = f" > {shlex.quote(str(self.stdout))}" if self.stdout else ""
        return f"{env} {cmd}{out}".strip()


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    steps: tuple[Step, ...]
    minutes: float
    outputs: tuple[Path, ...] = field(default_factory=tuple)


def model_name(path: Path) -> str:
    """A short name for a model file (its stem, made safe for file names)."""
    name = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "model"


def unique_names(models: Sequence[Path]) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    seen: dict[str, int] = {}
    for m in models:
        n = model_name(m)
        if n in seen:
            seen[n] += 1
            n = f"{n}-{seen[n]}"
        else:
            seen[n] = 1
        out.append((n, m))
    return out


def ab_depths(depths: Sequence[int]) -> tuple[int, ...]:
    """The A/B's depths: the tuned ones and a shallower control no tuned depth reaches (a quarter of the
    smallest, a multiple of 256, at least 512): a context passes through it on the way to a tuned depth, and
    a table's cost where none of its attention rules apply shows there (measured: 1.5-3.6% at depth 4096
    with rules tuned at 16384 and 49152, evidence/h100-2026-12-06-s25/README.md)."""
    if not depths:
        return ()
    control = max(512, min(depths) // 4 // 256 * 256)
    return tuple(sorted({control, *depths}))


def verify_widths(spec_draft: int, slots: int) -> tuple[int, ...]:
    """The batch widths (M) a server verifies or decodes with beyond 1: each slot's draft plus its own token
    (``spec_draft + 1``, and every shorter draft), the slots batched together (``slots`` plain, ``slots *
    (spec_draft + 1)`` speculating): e.g. MTP draft 2 on 4 slots -> 2, 3, 4, 8, 12."""
    per_slot = range(2, spec_draft + 2)
    together = {slots * w for w in range(1, spec_draft + 2)} if slots > 1 else set()
    return tuple(sorted({*per_slot, *together} - {1}))


def bench_args(
    workload: str,
    ubatches: Sequence[int],
    depths: Sequence[int] = (),
    kv_type: str = "f16",
    widths: Sequence[int] = (),
) -> str:
    """llama-bench arguments of one workload (FlashAttention on, every layer on the GPU); ``widths`` adds
    batch widths (``verify_widths``) to the verify and depth workloads."""
    common = "-ngl 99 -fa on"
    if workload == DEPTH_WORKLOAD:  # decode and verify widths 2-4 over a prefilled KV cache
        ps = ",".join(map(str, sorted({2, 3, 4, *widths})))
        return f"{common} -ctk {kv_type} -ctv {kv_type} -p {ps} -n 32 -d {','.join(map(str, depths))}"
    if workload == "decode":
        return f"{common} -p 0 -n 128"
    if workload == "verify":  # speculative verify and small batches
        return f"{common} -p {','.join(map(str, sorted({2, 3, 4, 8, 16, *widths})))} -n 0 -ub 512"
    if workload == "prefill":
        return f"{common} -p 2048 -n 0 -b 2048 -ub {','.join(map(str, ubatches))}"
    raise ValueError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")


def _widths(opts: Options) -> tuple[int, ...]:
    return verify_widths(opts.spec_draft, opts.slots)


def bin_dir(build_dir: Path) -> Path:
    """Where a build's binaries are: BUILD/bin (CMake), or BUILD itself for an unpacked bin folder."""
    if (build_dir / "llama-bench").is_file() and not (build_dir / "bin" / "llama-bench").is_file():
        return build_dir
    return build_dir / "bin"


def _loader_env(bins: Path, base: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    ld = ":".join(p for p in (str(bins), base.get("LD_LIBRARY_PATH", "")) if p)
    return (("LD_LIBRARY_PATH", ld),)


def plan(opts: Options, base_env: Mapping[str, str] | None = None) -> list[Stage]:
    env = dict(base_env or {})
    out, work, tree, build = opts.out, opts.out / WORK_DIR, opts.llama_cpp, opts.build_dir
    bins = bin_dir(build)
    tool = opts.tool
    models = unique_names(opts.models)
    loader = _loader_env(bins, env)
    census = out / "census.parquet"
    tuning = out / "tuning.parquet"
    attention = work / "attention.parquet"  # the attention census (with --depth)
    workloads = (*opts.workloads, DEPTH_WORKLOAD) if opts.depths else opts.workloads
    table = out / "table.json"
    stages: list[Stage] = []

    stages.append(
        Stage(
            "hook",
            "install the ggml-dispatch hook (no table) into the llama.cpp tree",
            (Step((*tool, "install", "--llama-cpp", str(tree))),),
            0.1,
        )
    )

    configure = [
        "cmake",
        "-S",
        str(tree),
        "-B",
        str(build),
        *opts.generator,
        *CMAKE_OPTIONS,
        f"-DCMAKE_CUDA_ARCHITECTURES={opts.cuda_arch}",
    ]
    if opts.nvcc is not None:
        configure.append(f"-DCMAKE_CUDA_COMPILER={opts.nvcc}")
    compile_step = Step(("cmake", "--build", str(build), "-j", str(opts.jobs), "--target", *BUILD_TARGETS))
    build_steps = (compile_step,) if opts.built else (Step(tuple(configure)), compile_step)
    cold = not opts.built
    stages.append(
        Stage(
            "build",
            ("reuse" if opts.built else "configure and build")
            + f" llama.cpp in {build} (CUDA, FlashAttention)",
            build_steps,
            (COLD_BUILD_CORE_MIN if cold else INCREMENTAL_BUILD_CORE_MIN) / max(1, opts.jobs),
            (bins / "llama-bench",),
        )
    )

    traces: list[Path] = []
    trace_steps = []
    for name, model in models:
        for w in workloads:
            t = work / "traces" / f"{name}.{w}.jsonl"
            traces.append(t)
            argv = (
                str(bins / "llama-bench"),
                "-m",
                str(model),
                *shlex.split(bench_args(w, opts.ubatches, opts.depths, opts.kv_type, _widths(opts))),
                "-r",
                "1",
                "-o",
                "jsonl",
            )
            trace_steps.append(
                Step(
                    argv,
                    (("GGML_CUDA_ROUTE_TRACE", str(t)), *loader),
                    work / "traces" / f"{name}.{w}.bench.jsonl",
                )
            )
    stages.append(
        Stage(
            "trace",
            f"route traces of llama-bench: {', '.join(workloads)} on {len(models)} model(s)",
            tuple(trace_steps),
            TRACE_MIN_PER_RUN * len(trace_steps),
            tuple(traces),
        )
    )

    census_steps = []
    if len(models) == 1:
        name, model = models[0]
        census_steps.append(
            Step((*tool, "census", "ingest", *map(str, traces), "--gguf", str(model), "-o", str(census)))
        )
    else:  # each model's traces held against its GGUF, then every model's shapes together
        for name, model in models:
            mine = [str(t) for t in traces if t.name.startswith(name + ".")]
            census_steps.append(
                Step(
                    (
                        *tool,
                        "census",
                        "ingest",
                        *mine,
                        "--gguf",
                        str(model),
                        "-o",
                        str(work / f"census-{name}.parquet"),
                    )
                )
            )
        census_steps.append(Step((*tool, "census", "ingest", *map(str, traces), "-o", str(census))))
    depth_traces = [str(t) for t in traces if t.name.endswith(f".{DEPTH_WORKLOAD}.jsonl")]
    if depth_traces:
        # decode and verify points (the depth fill runs at the ubatch, one point per KV length), and with
        # depth_fill the fill's last point at each depth
        fill = ("--fill-kv", ",".join(map(str, opts.depths))) if opts.depth_fill else ()
        census_steps.append(
            Step(
                (
                    *tool,
                    "census",
                    "attention",
                    *depth_traces,
                    "--max-m",
                    str(DEPTH_MAX_M),
                    *fill,
                    "-o",
                    str(attention),
                )
            )
        )
    stages.append(
        Stage(
            "census",
            "census of the traced shapes" + (" and of their FlashAttention calls" if depth_traces else ""),
            tuple(census_steps),
            0.2 * len(census_steps),
            (census, *((attention,) if depth_traces else ())),
        )
    )

    def tune_argv(census_in: Path, tuning_out: Path, journal: Path, *extra: str) -> tuple[str, ...]:
        argv = [
            *tool,
            "tune",
            "run",
            str(census_in),
            "--llama-cpp",
            str(tree),
            "--build-dir",
            str(bins.parent if bins == build / "bin" else bins),
            "-o",
            str(tuning_out),
            "--journal",
            str(journal),
            "--trials",
            str(opts.trials),
            *extra,
        ]
        if opts.case_timeout is not None:
            argv += ["--case-timeout", str(opts.case_timeout)]
        if opts.tune_seconds is not None:
            argv += ["--max-seconds", str(opts.tune_seconds)]
        return tuple(argv)

    if opts.tune_seconds is not None:
        tune_min = opts.tune_seconds / 60 * (2 if depth_traces else 1)
    else:
        tune_min = len(models) * TUNE_CASES_GUESS_PER_MODEL * opts.trials * TUNE_SECONDS_PER_TRIAL / 60
    matmul_tuning = work / "tuning-matmul.parquet" if depth_traces else tuning
    attention_tuning = work / "tuning-attention.parquet"
    tune_steps = [
        Step(
            tune_argv(
                census,
                matmul_tuning,
                out / "tuning.journal.jsonl",
                "--coverage",
                str(opts.coverage),
                *(("--configs", "cache") if opts.vram_budget else ()),
            ),
            loader,
        )
    ]
    if depth_traces:
        # every attention point of the depth workload (verify widths weigh little in a traced run's time
        # but run as often as decode in the workload they stand for), every kernel configuration; the two
        # sweeps' rows are one tuning file
        tune_steps += [
            Step(
                tune_argv(
                    attention,
                    attention_tuning,
                    out / "tuning-attention.journal.jsonl",
                    "--coverage",
                    "1",
                    "--configs",
                    "all",
                ),
                loader,
            ),
            Step((*tool, "tune", "merge", str(matmul_tuning), str(attention_tuning), "-o", str(tuning))),
        ]
        if opts.tune_seconds is None:  # else each sweep's bound is in tune_min already
            tune_min += len(models) * len(opts.depths) * 8 * opts.trials * TUNE_SECONDS_PER_TRIAL / 60
    stages.append(
        Stage(
            "tune",
            "time every eligible route of the census shapes (resumes from its journal)"
            + ("; then every FlashAttention configuration at the traced depths" if depth_traces else ""),
            tuple(tune_steps),
            tune_min,
            (tuning, *((matmul_tuning, attention_tuning) if depth_traces else ())),
        )
    )
    budget = ("--vram-budget", str(opts.vram_budget)) if opts.vram_budget else ()
    stages.append(
        Stage(
            "codegen",
            "no-harm decisions -> table.json + ggml-dispatch-table.h"
            + (
                f" (VRAM budget {opts.vram_budget} MiB: weight cache and KV shadow)"
                if opts.vram_budget
                else ""
            ),
            (Step((*tool, "codegen", str(tuning), "--census", str(census), "-o", str(out), *budget)),),
            0.2,
            (table, out / "ggml-dispatch-table.h"),
        )
    )
    stages.append(
        Stage(
            "install-table",
            "compile the table into the tree's ggml-cuda",
            (Step((*tool, "install", "--llama-cpp", str(tree), "--table", str(table))),),
            0.1,
        )
    )
    stages.append(
        Stage(
            "rebuild",
            "rebuild with the table",
            (compile_step,),
            INCREMENTAL_BUILD_CORE_MIN / max(1, opts.jobs),
        )
    )

    ab_argv: list[str] = [
        *tool,
        "ab",
        "--arm",
        f"stock={bins / 'llama-bench'}:off",
        "--arm",
        f"table={bins / 'llama-bench'}:table",
    ]
    for name, model in models:
        ab_argv += ["--model", f"{name}={model}"]
    for w in workloads:
        args = bench_args(w, opts.ubatches, ab_depths(opts.depths), opts.kv_type, _widths(opts))
        ab_argv += ["--bench", args]
    ab_argv += [
        "--pairs",
        str(opts.pairs),
        "--reps",
        str(opts.reps),
        "--vram",  # each arm's peak GPU memory: what the table's VRAM budget cost, beside what it saved
        "--log",
        str(work / "ab-runs.log"),
        "--expect-table",
        str(table),
        "-o",
        str(work / "ab.partial.jsonl"),
    ]
    ab_runs = 2 * opts.pairs * len(models) * len(workloads)
    stages.append(
        Stage(
            "ab",
            f"stock vs table: {opts.pairs} interleaved pairs of -r {opts.reps} per workload and model",
            (Step(tuple(ab_argv), loader),),
            ab_runs * (AB_MIN_PER_RUN + AB_MIN_PER_REP * opts.reps),
            (out / "ab.jsonl",),
        )
    )
    stages.append(
        Stage(
            "report",
            "REPORT.md + plots (A/B with 95% bootstrap CIs)",
            (
                Step(
                    (
                        *tool,
                        "report",
                        "--tuning",
                        str(tuning),
                        "--census",
                        str(census),
                        "--table",
                        str(table),
                        "--ab",
                        str(out / "ab.jsonl"),
                        "-o",
                        str(out),
                    )
                ),
            ),
            0.5,
            (out / "REPORT.md",),
        )
    )
    return stages


def render(stages: Sequence[Stage], skip: frozenset[str], done: frozenset[str] = frozenset()) -> str:
    """The plan as text: each stage with its commands and estimated minutes."""
    lines = []
    total = 0.0
    for i, s in enumerate(stages, start=1):
        mark = " (skipped)" if s.name in skip else " (done: resumed past)" if s.name in done else ""
        if not mark:
            total += s.minutes
        lines.append(f"[{i}/{len(stages)}] {s.name}: {s.what} ~{s.minutes:.1f} min{mark}")
        lines += [f"    $ {st.shell()}" for st in s.steps]
    lines.append(f"estimated total: ~{total:.0f} min (stages not skipped or done)")
    return "\n".join(lines)
