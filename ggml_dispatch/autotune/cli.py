"""``ggml-dispatch autotune`` and ``ggml-dispatch status`` (options and printing only)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from ggml_dispatch.autotune import env as env_mod
from ggml_dispatch.autotune import plan as plan_mod
from ggml_dispatch.autotune import run as run_mod
from ggml_dispatch.autotune import status as status_mod
from ggml_dispatch.census import gguf_meta
from ggml_dispatch.codegen import cli as codegen_cli
from ggml_dispatch.options import FiniteFloat, Int, int_list, list_items


class _Refusal(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"ggml-dispatch: error: {self.format_message()}", err=True)


def _csv(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    try:
        items = list_items(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=what) from None
    bad = [p for p in items if p not in allowed]
    if bad:
        raise click.BadParameter(f"{text!r}: {what} must be among {', '.join(allowed)}")
    return tuple(dict.fromkeys(items))


def _configured(build: Path) -> bool:
    """A CMake build that configured to the end (a configure that failed leaves CMakeCache.txt alone)."""
    return (build / "CMakeCache.txt").is_file() and any(
        (build / f).is_file() for f in ("build.ninja", "Makefile")
    )


def _tool() -> tuple[str, ...]:
    """How stages call the other commands: the console script beside this Python, else python -c."""
    script = Path(sys.executable).parent / "ggml-dispatch"
    if script.is_file():
        return (str(script),)
    found = shutil.which("ggml-dispatch")
    if found:
        return (found,)
    return (sys.executable, "-c", "import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])")


_DIR = click.Path(path_type=Path, file_okay=False)


@click.command("autotune")
@click.option(
    "--llama-cpp",
    "tree",
    envvar="LLAMA_CPP_DIR",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="llama.cpp tree (the hook and the table are installed into it).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="GGUF model, repeatable.",
)
@click.option(
    "--workload", default=",".join(plan_mod.WORKLOADS), show_default=True, help="decode,verify,prefill."
)
@click.option(
    "--ubatch",
    default=",".join(map(str, plan_mod.DEFAULT_UBATCH)),
    show_default=True,
    help="prefill micro-batch sizes (llama-bench -ub).",
)
@click.option(
    "--depth",
    default=None,
    help="KV depths, comma-separated (e.g. 4096,16384,49152): adds decode and verify (pp2-4) at each "
    "prefilled depth and tunes every FlashAttention kernel configuration there.",
)
@click.option(
    "--kv-type",
    type=click.Choice(plan_mod.KV_TYPES),
    default="f16",
    show_default=True,
    help="the KV cache type of the --depth workload (llama-bench -ctk/-ctv).",
)
@click.option(
    "--spec-draft",
    type=Int(0, 16),
    default=0,
    show_default=True,
    help="draft tokens per step of the speculative decoding you serve (MTP or a draft model; 2 for "
    "--spec-draft-n-max 2): the verify and --depth workloads add its widths (draft + 1 per slot).",
)
@click.option(
    "--slots",
    type=Int(1, 256),
    default=1,
    show_default=True,
    help="server slots decoding together (llama-server --parallel): adds slots x (draft + 1) rows.",
)
@click.option(
    "--vram-budget",
    type=Int(0, 1 << 30),
    default=0,
    show_default=True,
    help="MiB of VRAM the table may spend to save time, shared by persistent f16 weight copies (the sweep "
    "then times cuBLAS from a cached copy too) and an f16 shadow of a quantized KV cache (kv=shadow, "
    "measured with --depth and a quantized --kv-type): codegen ranks them together by measured time saved "
    "per MiB; 0 leaves both out.",
)
@codegen_cli.replaced_budget_options
@click.option(
    "--depth-fill/--no-depth-fill",
    default=None,
    help="with --depth: tune the KV fill's last step at each depth too (the ubatch's FlashAttention "
    "there), besides decode and verify. A kv=shadow rule there makes the shadow during the fill, not in "
    "the first decode step. On by default with --kv-shadow-budget, off otherwise; the fill's points are "
    "large and come early in the sweep: give --tune-seconds room.",
)
@click.option(
    "--cuda-arch",
    default="native",
    show_default=True,
    help="CMAKE_CUDA_ARCHITECTURES (70 for V100: needs a CUDA 12 nvcc).",
)
@click.option(
    "--nvcc",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="the nvcc to build with (CMAKE_CUDA_COMPILER) [default: $CUDACXX, nvcc on PATH].",
)
@click.option(
    "--cuda-home",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a CUDA toolkit root to build with (its bin/nvcc), e.g. /usr/local/cuda-12.9 for a V100.",
)
@click.option(
    "--build-dir",
    type=_DIR,
    help="llama.cpp build folder, reused when it holds a build (or a bin folder of prebuilt binaries) "
    "[default: LLAMA_CPP/build-dispatch].",
)
@click.option("--jobs", type=Int(1, 1024), default=None, help="build parallelism [default: CPU count].")
@click.option("--trials", type=Int(3, 1000), default=7, show_default=True, help="tuning trials per case.")
@click.option(
    "--tune-seconds",
    type=FiniteFloat(1, 1e7),
    default=None,
    help="stop starting tuning cases after this many seconds, in each sweep: the matmul one and, with "
    "--depth, the attention one (re-run to continue).",
)
@click.option(
    "--case-timeout",
    type=FiniteFloat(1, 1e6),
    default=None,
    help="seconds before a tuning case is killed and recorded as failed [default: tune run's].",
)
@click.option(
    "--coverage",
    type=FiniteFloat(0, 1, min_open=True),
    default=0.95,
    show_default=True,
    help="tune the census points that make up this share of the estimated matmul time.",
)
@click.option("--pairs", type=Int(1, 1000), default=5, show_default=True, help="A/B interleaved pairs.")
@click.option("--reps", type=Int(1, 1000), default=3, show_default=True, help="llama-bench -r per arm-run.")
@click.option(
    "--skip",
    "skips",
    multiple=True,
    type=click.Choice(plan_mod.STAGES),
    help="skip a stage (repeatable), e.g. --skip build with a prebuilt --build-dir.",
)
@click.option(
    "-o", "--out", type=_DIR, help="table folder [default: tables/<gpu>, e.g. tables/cuda-sm90-nvidia-h200]."
)
@click.option("--dry-run", is_flag=True, help="print the plan (commands, estimated minutes); touch nothing.")
def autotune_cmd(
    tree: Path,
    models: tuple[Path, ...],
    workload: str,
    ubatch: str,
    depth: str | None,
    kv_type: str,
    spec_draft: int,
    slots: int,
    vram_budget: int,
    depth_fill: bool | None,
    cuda_arch: str,
    nvcc: Path | None,
    cuda_home: Path | None,
    build_dir: Path | None,
    jobs: int | None,
    trials: int,
    tune_seconds: float | None,
    case_timeout: float | None,
    coverage: float,
    pairs: int,
    reps: int,
    skips: tuple[str, ...],
    out: Path | None,
    dry_run: bool,
) -> None:
    """Measure and compile a dispatch table for this GPU and these models, end to end.

    \b
    Stages (each resumable: re-run the same command; each skippable with --skip):
      hook           ggml-dispatch install (no table)
      build          cmake configure + build (CUDA, FlashAttention on), reusing --build-dir
      trace          llama-bench workloads with GGML_CUDA_ROUTE_TRACE (with --depth: decode and
                     verify at those KV depths too)
      census         ggml-dispatch census ingest (with --depth: census attention too)
      tune           ggml-dispatch tune run (resumes from its journal); with --depth a second run
                     over the attention census (every configuration) and tune merge
      codegen        ggml-dispatch codegen -> table.json + header
      install-table  ggml-dispatch install --table
      rebuild        cmake --build
      ab             stock vs table, interleaved pairs (ggml-dispatch ab)
      report         REPORT.md with the A/B's 95% CIs
    The state is OUT/autotune.state.json; logs and traces are under OUT/.autotune/.

    \b
    Examples:
      ggml-dispatch autotune --llama-cpp ~/llama.cpp --model model.gguf
      ggml-dispatch autotune --llama-cpp ~/llama.cpp --model model.gguf --depth 16384,49152 --kv-type q8_0
      ggml-dispatch autotune --llama-cpp ~/llama.cpp --model model.gguf --vram-budget 8192
      ggml-dispatch autotune --llama-cpp ~/llama.cpp --model model.gguf --depth 16384,49152 --kv-type q8_0 \\
          --vram-budget 16384 --tune-seconds 240
      ggml-dispatch autotune --llama-cpp ~/llama.cpp --model model.gguf --dry-run
      # a llama-server with MTP draft 2 on 4 slots, ubatch 1024, a Q8_0 cache at ~48k tokens:
      ggml-dispatch autotune --llama-cpp ~/llama.cpp --model qwen35.gguf --spec-draft 2 --slots 4 \\
          --ubatch 1024 --depth 16384,49152 --kv-type q8_0
    """
    # every option value and input file is checked here, before the environment is looked at
    workloads = _csv(workload, plan_mod.WORKLOADS, "--workload")
    ubatches = int_list(ubatch, "ubatch", param_hint="--ubatch")
    depths = int_list(depth, "depth", param_hint="--depth") if depth is not None else ()
    for m in models:  # a GGUF whose header parses, not merely a file
        model_meta = gguf_meta.read_gguf(m)
        if spec_draft and (no_mtp := model_meta.mtp_problem()) is not None:
            click.echo(
                f"note: {m}: {no_mtp}: the --spec-draft widths are measured for a separate draft model's "
                "verify; llama-server --spec-type draft-mtp would refuse this model",
                err=True,
            )
    quantized_kv = bool(depth) and kv_type not in ("f16", "bf16")
    if depth_fill and not depth:
        raise click.UsageError("--depth-fill needs --depth")
    if depth_fill is None:
        # measured: without a fill rule the shadow is made inside the first timed decode step at depth
        depth_fill = bool(vram_budget) and quantized_kv
    if quantized_kv and not vram_budget:
        click.echo(
            f"note: --kv-type {kv_type} without --vram-budget: attention configurations that read "
            "an f16 shadow of the KV cache are measured but left out of the table "
            "(--vram-budget MiB admits them)",
            err=True,
        )
    try:
        archs = env_mod.parse_archs(cuda_arch)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--cuda-arch") from None
    del archs
    gpus = env_mod.visible_gpus()
    if not gpus and not dry_run and not set(plan_mod.GPU_STAGES) <= set(skips):
        raise _Refusal(
            "no GPU visible (nvidia-smi lists none): autotune traces and times on the GPU; "
            "--dry-run prints the plan without one"
        )
    needs_build = not ({"build", "rebuild"} <= set(skips))
    if cuda_home is not None:
        if nvcc is not None:
            raise click.UsageError("give --nvcc or --cuda-home, not both")
        nvcc = cuda_home / "bin" / "nvcc"
        if not nvcc.is_file():
            raise _Refusal(f"{cuda_home}: no bin/nvcc (--cuda-home takes a CUDA toolkit root)")
    found_nvcc = env_mod.find_nvcc(nvcc)
    version = env_mod.nvcc_version(found_nvcc) if found_nvcc is not None else None
    # CMake finds PATH's nvcc (and $CUDACXX) itself; any other toolkit it is told, so that it builds
    # with the one checked here
    on_path = shutil.which("nvcc")
    named = nvcc is not None or str(found_nvcc) != on_path
    compiler = found_nvcc if found_nvcc is not None and named else None
    if needs_build:
        problem = env_mod.arch_problem(cuda_arch, version, found_nvcc, gpus[0].cc if gpus else None)
        if problem:
            raise _Refusal(problem)
    build = build_dir if build_dir is not None else tree / "build-dispatch"
    prebuilt_only = (
        not (build / "CMakeCache.txt").is_file() and (plan_mod.bin_dir(build) / "llama-bench").is_file()
    )
    if prebuilt_only and needs_build:
        raise _Refusal(
            f"{build}: prebuilt binaries without a CMake build (no CMakeCache.txt) cannot be rebuilt; "
            "pass --skip build --skip rebuild (and --skip install-table unless the build has the new table), "
            "or give a CMake build folder"
        )
    if out is None:
        out = Path("tables") / (env_mod.table_folder_name(gpus[0]) if gpus else "<gpu>")
    if out.is_dir() and any(out.iterdir()) and not (out / plan_mod.STATE_FILE).is_file():
        raise _Refusal(
            f"{out}: exists and was not written by autotune (no {plan_mod.STATE_FILE}); "
            "autotune never overwrites a table folder: choose another -o"
        )
    if out.exists() and not out.is_dir():
        raise _Refusal(f"{out}: not a folder")
    for m in models:
        if m.resolve().parent == out.resolve():
            raise _Refusal(f"{m}: a model inside the output folder {out}; choose another -o")
    generator = ("-G", "Ninja") if shutil.which("ninja") else ()
    opts = plan_mod.Options(
        llama_cpp=tree,
        models=models,
        out=out,
        build_dir=build,
        workloads=workloads,
        ubatches=ubatches,
        depths=depths,
        kv_type=kv_type,
        spec_draft=spec_draft,
        slots=slots,
        vram_budget=vram_budget,
        depth_fill=depth_fill,
        cuda_arch=cuda_arch,
        nvcc=compiler,
        jobs=jobs or os.cpu_count() or 2,
        trials=trials,
        tune_seconds=tune_seconds,
        case_timeout=case_timeout,
        coverage=coverage,
        pairs=pairs,
        reps=reps,
        skip=frozenset(skips),
        tool=_tool(),
        generator=generator,
        built=_configured(build) or (plan_mod.bin_dir(build) / "llama-bench").is_file(),
    )
    stages = plan_mod.plan(opts, os.environ)
    if dry_run:
        state_path = out / plan_mod.STATE_FILE
        try:
            state = run_mod.load_state(state_path)
        except run_mod.StageFailed as e:
            raise _Refusal(str(e)) from None
        done = run_mod.done_stages(stages, state, opts.skip)
        gpu = f"{gpus[0].name} (cc {gpus[0].cc})" if gpus else "none visible (a real run refuses)"
        cuda = f" (CUDA {version[0]}.{version[1]})" if version else ""
        click.echo(f"autotune plan: GPU {gpu}; nvcc {found_nvcc or 'not found'}{cuda}; output {out}")
        click.echo(plan_mod.render(stages, opts.skip, done))
        return
    live = _live_line() if sys.stderr.isatty() else None
    try:
        run_mod.execute(stages, opts, echo=_echo_line, live=live)
    except run_mod.StageFailed as e:
        click.echo(f"\nggml-dispatch: error: {e}", err=True)
        sys.exit(1)
    click.echo(out / "REPORT.md" if (out / "REPORT.md").is_file() else out)


def _echo_line(text: str) -> None:
    if sys.stderr.isatty():
        click.echo("\r\033[K", nl=False, err=True)
    click.echo(text, err=True)


def _live_line() -> Any:
    width = shutil.get_terminal_size((100, 20)).columns - 4

    def show(line: str) -> None:
        if line:
            click.echo("\r\033[K  " + line[:width], nl=False, err=True)

    return show


@click.command("status")
@click.option(
    "--llama-cpp",
    "tree",
    envvar="LLAMA_CPP_DIR",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="llama.cpp tree.",
)
@click.option(
    "--build-dir", type=_DIR, help="its build folder [default: LLAMA_CPP/build-dispatch if present]."
)
@click.option(
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="a GGUF for the short llama-bench run (default: test-backend-ops support -o MUL_MAT).",
)
def status_cmd(tree: Path, build_dir: Path | None, model: Path | None) -> None:
    """Is the tree hooked, which table it compiles in (hash, GPU), does it apply on the visible GPU, and
    the ggml_cuda_dispatch: start-up line of a short run."""
    if model is not None:
        gguf_meta.read_gguf(model)
    lines, header = status_mod.tree_lines(tree)
    gpus = env_mod.visible_gpus()
    lines += status_mod.applies_lines(header, gpus)
    build = build_dir if build_dir is not None else tree / "build-dispatch"
    if build.is_dir():
        blines, lib = status_mod.build_lines(build, header)
        lines += blines
        if gpus and lib is not None:
            lines.append(status_mod.short_run(build, model))
        elif lib is not None:
            lines.append("run: skipped (no GPU visible)")
    else:
        lines.append(f"build: none at {build} (--build-dir B)")
    for ln in lines:
        click.echo(ln)
