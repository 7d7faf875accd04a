"""``ggml-dispatch tune``: time every eligible route for the census shapes (run), combine shards (merge)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ggml_dispatch import fileio
from ggml_dispatch.options import INT32_MAX, FiniteFloat, Int, allow_mixed_option, list_items, output_option
from ggml_dispatch.tuner import attention as tattn
from ggml_dispatch.tuner import build, results
from ggml_dispatch.tuner import mul_mat_id as tmoe
from ggml_dispatch.tuner import run as tune_run
from ggml_dispatch.tuner.executor import Executor, SerialExecutor
from ggml_dispatch.tuner.reference_cli import import_reference_cmd
from ggml_dispatch.tuner.run import SweepInterrupted, SweepSettings, default_journal, run_sweep, select_census
from ggml_dispatch.tuner.select import (
    ALL_ROUTES,
    CONFIG_MODES,
    DEFAULT_NMSE_MAX,
    DEFAULT_TRIALS,
    candidate_configs,
    only_configs,
    parse_shard,
    shard_cases,
)

F = TypeVar("F", bound=Callable[..., Any])


class _Failed(click.ClickException):
    """A build or run that failed (not bad input): the same ``ggml-dispatch: error:`` form, exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"ggml-dispatch: error: {self.format_message()}", err=True)


def echo(msg: str) -> None:
    click.echo(f"tune: {msg}", err=True)


def _routes(text: str) -> tuple[str, ...]:
    try:
        routes = tuple(list_items(text))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--routes") from None
    bad = [r for r in routes if r not in ALL_ROUTES]
    if bad or not routes:
        raise click.BadParameter(
            f"unknown route(s) {', '.join(bad) or '(none)'}; choose from {', '.join(ALL_ROUTES)}",
            param_hint="--routes",
        )
    return routes


def _tree_option(help: str) -> Callable[[F], F]:
    return click.option(
        "--llama-cpp",
        "tree",
        envvar="LLAMA_CPP_DIR",
        required=True,
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help=help,
    )


def build_options(f: F) -> F:
    """The options that say how to build the harness (shared by ``run`` and ``build``)."""
    for option in reversed(
        (
            click.option(
                "--build-dir",
                type=click.Path(exists=True, file_okay=False, path_type=Path),
                help="an existing llama.cpp build of that tree: link its bin/libggml*.so instead of "
                "building ggml.",
            ),
            click.option(
                "--cuda/--cpu",
                "cuda",
                default=None,
                help="build ggml with CUDA or CPU only when no --build-dir is given "
                "[default: CUDA if nvcc is on PATH].",
            ),
            click.option(
                "--cuda-arch",
                default="90",
                show_default=True,
                help="CMAKE_CUDA_ARCHITECTURES for a CUDA build.",
            ),
            click.option("--jobs", type=Int(1, INT32_MAX), default=None, help="build parallelism."),
        )
    ):
        f = option(f)
    return f


def build_harness(
    tree: Path, build_dir: Path | None, cuda: bool | None, cuda_arch: str, jobs: int | None
) -> Path:
    use_cuda = cuda if cuda is not None else shutil.which("nvcc") is not None
    try:
        return build.build_harness(
            tree, build_dir=build_dir, cuda=use_cuda, cuda_arch=cuda_arch, jobs=jobs, log=echo
        )
    except build.BuildError as e:
        raise _Failed(str(e)) from None


def _executor(name: str, address: str | None, resources: str, device: str | None) -> Executor:
    if name == "serial":
        if address is not None:
            raise click.UsageError("--address needs --executor ray")
        return SerialExecutor()
    if device:
        raise click.UsageError("--device with --executor ray: Ray assigns each case its GPU")
    from ggml_dispatch.tuner import executor_ray  # imports ray only when it is used

    try:
        executor_ray.import_ray()
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None
    return executor_ray.RayExecutor(address, resources)


@click.group()
def tune() -> None:
    """Time every eligible route for the census shapes on the GPU."""


@tune.command("run")
@click.argument("census", type=click.Path(path_type=Path))
@_tree_option("llama.cpp tree (patched by `ggml-dispatch install` to time routes other than stock).")
@output_option("tuning Parquet file to write (atomically, from the journal).")
@build_options
@click.option(
    "--harness",
    "harness_bin",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="use this harness binary instead of building one.",
)
@click.option(
    "--coverage",
    type=FiniteFloat(0, 1, min_open=True),
    default=0.95,
    show_default=True,
    help="measure the census points that make up this share of the tunable est_us.",
)
@click.option(
    "--whole-shapes/--points",
    default=False,
    show_default=True,
    help="--whole-shapes: coverage picks shapes and every census M of a picked shape is measured "
    "(small M, e.g. speculative verify, has little estimated time but large per-op gains).",
)
@click.option(
    "--routes", default=",".join(ALL_ROUTES), show_default=True, help="candidate routes (stock always runs)."
)
@click.option(
    "--configs",
    "config_mode",
    type=click.Choice(CONFIG_MODES),
    default="all",
    show_default=True,
    help="all: every configuration of each route (cuBLAS output x compute type, mmq J x stream-k; on an "
    "attention census VEC parallel blocks, MMA ncols1 x ncols2 x sparse x stream-k), each "
    "checked for eligibility and numerics before it is timed; routes: the plain routes only; cache: the "
    "plain routes and cuBLAS f16 per call and from the cached weight copy (cublas/weight=cached).",
)
@click.option(
    "--only",
    "only_patterns",
    multiple=True,
    help="time only the candidate configurations matching this shell-style pattern (repeatable; stock "
    "always runs), e.g. --only '*split=2j_fused' --only 'mmq/j=64,stream_k=off'.",
)
@click.option(
    "--layouts",
    default="weight",
    show_default=True,
    help="layouts to tune: weight; attention is opt-in (timed as a KV-cache-like view, no GQA broadcast).",
)
@click.option(
    "--routing-kinds",
    default=",".join(tmoe.ROUTING_KINDS),
    show_default=True,
    help="MUL_MAT_ID rows of the census: each point is timed under these expert routings (the bucket "
    "each measured goes into the rows); none: no MUL_MAT_ID cases.",
)
@click.option(
    "--trials",
    type=Int(1, INT32_MAX),
    default=DEFAULT_TRIALS,
    show_default=True,
    help="trials per case; every trial times every candidate and stock.",
)
@click.option(
    "--nmse-max",
    type=FiniteFloat(0, min_open=True),
    default=DEFAULT_NMSE_MAX,
    show_default=True,
    help="NMSE threshold against the CPU reference, declared before measuring.",
)
@click.option(
    "--max-seconds",
    type=FiniteFloat(0, min_open=True),
    default=None,
    help="start no case that would end after this many seconds; re-run to continue.",
)
@click.option(
    "--shard",
    default="0/1",
    show_default=True,
    help="i/n: measure shard i of n (whole shapes dealt round-robin); one GPU per process.",
)
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="append-only journal [default: OUTPUT.journal.jsonl]; re-running resumes from it.",
)
@click.option(
    "--remeasure",
    is_flag=True,
    help="measure again the journal's failed cases and those with a trial that failed its numerics "
    "check (after a fix to the harness); their new records replace the old.",
)
@click.option("--device", default=None, help="ggml device name (default: first GPU, else CPU).")
@click.option(
    "--l2-bytes",
    type=Int(0),
    default=None,
    help="L2 size to rotate weights against (default: the harness queries CUDA; 0 = no rotation).",
)
@click.option(
    "--case-timeout",
    type=FiniteFloat(1),
    default=900,
    show_default=True,
    help="seconds before a case's child process is killed and the case recorded as failed.",
)
@click.option(
    "--harness-arg",
    "harness_extra",
    multiple=True,
    help="extra harness option, repeatable (e.g. --harness-arg=--trial-ms=10).",
)
@click.option(
    "--executor",
    type=click.Choice(["serial", "ray"]),
    default="serial",
    show_default=True,
    help="serial: one case at a time on this machine; ray: every case a Ray task on one GPU of a Ray "
    "cluster (pip install 'ggml-dispatch[ray]'; every node needs the harness at the same path).",
)
@click.option(
    "--address", default=None, help="Ray cluster address [default: Ray's own (RAY_ADDRESS, else local)]."
)
@click.option(
    "--ray-resources",
    default="GPU=1",
    show_default=True,
    help="what each case's Ray task holds, NAME=AMOUNT,... (CPU=1 on a cluster without GPUs).",
)
@allow_mixed_option("accept GPUs of several models in one sweep.")
@click.option("--dry-run", is_flag=True, help="print the cases (JSON Lines) and exit.")
def run_cmd(
    census: Path,
    tree: Path,
    output: Path,
    build_dir: Path | None,
    cuda: bool | None,
    cuda_arch: str,
    harness_bin: Path | None,
    coverage: float,
    whole_shapes: bool,
    routes: str,
    config_mode: str,
    only_patterns: tuple[str, ...],
    layouts: str,
    routing_kinds: str,
    trials: int,
    nmse_max: float,
    max_seconds: float | None,
    shard: str,
    journal_path: Path | None,
    remeasure: bool,
    device: str | None,
    l2_bytes: int | None,
    case_timeout: float,
    harness_extra: tuple[str, ...],
    jobs: int | None,
    executor: str,
    address: str | None,
    ray_resources: str,
    allow_mixed: bool,
    dry_run: bool,
) -> None:
    """Measure the routes of the census' shapes into a tuning Parquet file.

    \b
    Picks the census points that make up --coverage of the estimated time, adds the M neighbours a
    rule needs (powers of two on both sides), builds the harness against the tree (cached), and runs
    one harness child per case: a case whose child dies (a CUDA trap) is recorded as failed:<msg>
    and the sweep goes on. Every finished case is appended to the journal, so re-running the same
    command after a kill resumes; the Parquet file is written from the journal at the end.

    \b
    Examples:
      ggml-dispatch tune run census.parquet --llama-cpp ~/llama.cpp -o tuning.parquet
      ggml-dispatch tune run census.parquet --llama-cpp ~/llama.cpp --build-dir ~/llama.cpp/build \\
          -o tuning.parquet --max-seconds 3600
      CUDA_VISIBLE_DEVICES=1 ggml-dispatch tune run census.parquet --llama-cpp ~/llama.cpp \\
          --shard 1/2 -o tuning.1.parquet
      ggml-dispatch tune merge tuning.0.parquet tuning.1.parquet -o tuning.parquet
      ggml-dispatch tune run census.parquet --llama-cpp ~/llama.cpp -o tuning.parquet --executor ray
    """
    journal = journal_path or default_journal(output)
    if not dry_run:
        others = [census, *([harness_bin] if harness_bin else [])]
        fileio.check_output(output, [*others, journal])
        fileio.check_output(journal, [*others, output])
    try:
        layout_list = tuple(list_items(layouts))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--layouts") from None
    shard_t = parse_shard(shard)
    # the census is checked before anything is built; an attention census (`census attention`) gives
    # FLASH_ATTN_EXT cases with the FlashAttention kernels as candidates
    attention = tattn.is_attention_census(census)
    kinds: tuple[str, ...] = ()
    if attention:
        try:
            fa_routes = tattn.FA_ROUTES if routes == ",".join(ALL_ROUTES) else tattn.parse_routes(routes)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--routes") from None
        if config_mode != "routes" and any("/" in r for r in fa_routes):
            raise click.BadParameter(
                "configurations in --routes are the candidates as given: use them with --configs routes",
                param_hint="--routes",
            )
        route_list = candidate_configs(fa_routes, config_mode)
    else:
        route_list = candidate_configs(_routes(routes), config_mode)
        try:
            route_list = only_configs(route_list, only_patterns)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--only") from None
        try:
            kinds = tmoe.parse_routing_kinds(routing_kinds)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--routing-kinds") from None
    settings = SweepSettings(
        routes=tuple(route_list),
        trials=trials,
        nmse_max=nmse_max,
        coverage=coverage,
        layouts=layout_list,
        whole_shapes=whole_shapes,
        routing_kinds=kinds,
        shard=shard_t,
        max_seconds=max_seconds,
        case_timeout=case_timeout,
        harness_args=tune_run.harness_args(device, l2_bytes, harness_extra),
        allow_mixed=allow_mixed,
        remeasure=remeasure,
    )
    # each op of the census adds its cases through the candidate generator its description names
    selection = select_census(census, settings, mmvq=build.tree_mmvq(tree))
    if dry_run:
        for c in shard_cases(selection.cases, shard_t):
            click.echo(json.dumps(c.spec()))
        echo(selection.summary())
        return

    runner = _executor(executor, address, ray_resources, device)
    stamp = build.tree_stamp(tree)
    if harness_bin is None:
        harness_bin = build_harness(tree, build_dir, cuda, cuda_arch, jobs)
    if not stamp.patch_hash:
        echo(f"{tree}: no ggml-dispatch install stamp; upstream commit from {stamp.source}, patch hash empty")

    t0 = time.monotonic()
    try:
        with (
            runner,
            click.progressbar(length=1, label="tune", file=sys.stderr, show_eta=True, show_pos=True) as bar,
        ):
            # the bar's length is only known once the journal has been read: run_sweep sets it via on_plan
            result = run_sweep(
                census,
                output,
                settings,
                harness=harness_bin,
                stamp=stamp,
                journal_path=journal,
                recorded={"stamp_source": stamp.source},
                log=echo,
                progress=bar.update,
                on_plan=lambda todo: setattr(bar, "length", max(todo, 1)),
                executor=runner,
                selection=selection,
            )
    except SweepInterrupted as e:
        echo(f"interrupted by {e}; finished cases are in {journal}; re-run the same command to resume")
        sys.exit(128 + e.signum)
    except RuntimeError as e:
        raise _Failed(str(e)) from None
    for w in result.warnings:
        echo(w)
    echo(
        f"{result.ran} cases measured ({result.failed} failed), {result.resumed} resumed from the journal, "
        f"{result.rows} rows -> {output} in {time.monotonic() - t0:.0f} s"
    )
    if result.stopped_early:
        remaining = result.planned - result.resumed - result.ran
        echo(f"stopped by --max-seconds with {remaining} cases left; re-run the same command to continue")


@tune.command("build")
@_tree_option("llama.cpp tree.")
@build_options
def build_cmd(
    tree: Path, build_dir: Path | None, cuda: bool | None, cuda_arch: str, jobs: int | None
) -> None:
    """Build (or find in the cache) the harness for a tree and print its path.

    \b
    The cache (.cache/tuner-harness/<key>, or $GGML_DISPATCH_HARNESS_CACHE) is keyed by the harness
    sources, the tree's ggml sources or prebuilt libraries, the install stamp and the options.
    """
    click.echo(str(build_harness(tree, build_dir, cuda, cuda_arch, jobs)))


@tune.command("merge")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@output_option("merged tuning Parquet file (written atomically).")
@allow_mixed_option("accept inputs from several GPUs or upstream commits.")
def merge_cmd(inputs: tuple[Path, ...], output: Path, allow_mixed: bool) -> None:
    """Combine the tuning files of several shards (tune run --shard i/n) into one.

    \b
    Refuses inputs measured on different GPUs (name, cc, SM count) or upstream commits unless
    --allow-mixed, and any (shape, route, trial) that two inputs both contain.

    \b
    Example:
      ggml-dispatch tune merge tuning.0.parquet tuning.1.parquet -o tuning.parquet
    """
    fileio.check_output(output, inputs)
    n = results.merge_tuning(list(inputs), output, allow_mixed=allow_mixed)
    echo(f"{n} rows from {len(inputs)} files -> {output}")


tune.add_command(import_reference_cmd)
