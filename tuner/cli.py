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

from ggml_dispatch.errors import InputError
from tuner import build, results
from tuner.reference_cli import import_reference_cmd
from tuner.run import SweepInterrupted, default_journal, read_census, run_sweep
from tuner.select import (
    ALL_ROUTES,
    CONFIG_MODES,
    DEFAULT_NMSE_MAX,
    DEFAULT_TRIALS,
    candidate_configs,
    parse_shard,
    select_cases,
    shard_cases,
)

F = TypeVar("F", bound=Callable[..., Any])


def _echo(msg: str) -> None:
    click.echo(f"tune: {msg}", err=True)


def _routes(text: str) -> tuple[str, ...]:
    routes = tuple(r.strip() for r in text.split(",") if r.strip())
    bad = [r for r in routes if r not in ALL_ROUTES]
    if bad or not routes:
        raise InputError(
            None,
            f"unknown route(s) {', '.join(bad) or '(none)'}; choose from {', '.join(ALL_ROUTES)}",
            field="routes",
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


def _build_options(f: F) -> F:
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
            click.option("--jobs", type=click.IntRange(min=1), default=None, help="build parallelism."),
        )
    ):
        f = option(f)
    return f


def _build_harness(
    tree: Path, build_dir: Path | None, cuda: bool | None, cuda_arch: str, jobs: int | None
) -> Path:
    use_cuda = cuda if cuda is not None else shutil.which("nvcc") is not None
    try:
        return build.build_harness(
            tree, build_dir=build_dir, cuda=use_cuda, cuda_arch=cuda_arch, jobs=jobs, log=_echo
        )
    except build.BuildError as e:
        raise click.ClickException(str(e)) from None


@click.group()
def tune() -> None:
    """Time every eligible route for the census shapes on the GPU."""


@tune.command("run")
@click.argument("census", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_tree_option("llama.cpp tree (patched by `ggml-dispatch install` to time routes other than stock).")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="tuning Parquet file to write (atomically, from the journal).",
)
@_build_options
@click.option(
    "--harness",
    "harness_bin",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="use this harness binary instead of building one.",
)
@click.option(
    "--coverage",
    type=click.FloatRange(0, 1, min_open=True),
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
    help="all: every configuration of each route (cuBLAS output x compute type, mmq J x stream-k), each "
    "checked for eligibility and numerics before it is timed; routes: the plain routes only.",
)
@click.option(
    "--layouts",
    default="weight",
    show_default=True,
    help="layouts to tune: weight; attention is opt-in (timed as a KV-cache-like view, no GQA broadcast).",
)
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=DEFAULT_TRIALS,
    show_default=True,
    help="trials per case; every trial times every candidate and stock.",
)
@click.option(
    "--nmse-max",
    type=click.FloatRange(0, min_open=True),
    default=DEFAULT_NMSE_MAX,
    show_default=True,
    help="NMSE threshold against the CPU reference, declared before measuring.",
)
@click.option(
    "--max-seconds",
    type=click.FloatRange(0, min_open=True),
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
@click.option("--device", default=None, help="ggml device name (default: first GPU, else CPU).")
@click.option(
    "--l2-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="L2 size to rotate weights against (default: the harness queries CUDA; 0 = no rotation).",
)
@click.option(
    "--case-timeout",
    type=click.FloatRange(1),
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
    layouts: str,
    trials: int,
    nmse_max: float,
    max_seconds: float | None,
    shard: str,
    journal_path: Path | None,
    device: str | None,
    l2_bytes: int | None,
    case_timeout: float,
    harness_extra: tuple[str, ...],
    jobs: int | None,
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
    """
    route_list = candidate_configs(_routes(routes), config_mode)
    layout_list = tuple(x.strip() for x in layouts.split(",") if x.strip())
    shard_t = parse_shard(shard)
    # the census is checked before anything is built
    selection = select_cases(
        read_census(census),
        coverage=coverage,
        routes=route_list,
        trials=trials,
        nmse_max=nmse_max,
        layouts=layout_list,
        whole_shapes=whole_shapes,
        path=census,
    )
    if dry_run:
        for c in shard_cases(selection.cases, shard_t):
            click.echo(json.dumps(c.spec()))
        _echo(selection.summary())
        return

    stamp = build.tree_stamp(tree)
    if harness_bin is None:
        harness_bin = _build_harness(tree, build_dir, cuda, cuda_arch, jobs)
    args: list[str] = []
    if device:
        args += ["--device", device]
    if l2_bytes is not None:
        args += ["--l2-bytes", str(l2_bytes)]
    for a in harness_extra:
        args += a.split("=", 1) if a.startswith("--") and "=" in a else [a]
    journal = journal_path or default_journal(output)
    if not stamp.patch_hash:
        _echo(
            f"{tree}: no ggml-dispatch install stamp; upstream commit from {stamp.source}, patch hash empty"
        )

    t0 = time.monotonic()
    try:
        with click.progressbar(length=1, label="tune", file=sys.stderr, show_eta=True, show_pos=True) as bar:
            # the bar's length is only known once the journal has been read: run_sweep sets it via on_plan
            result = run_sweep(
                census,
                output,
                harness=harness_bin,
                stamp=stamp,
                journal_path=journal,
                coverage=coverage,
                whole_shapes=whole_shapes,
                routes=route_list,
                layouts=layout_list,
                trials=trials,
                nmse_max=nmse_max,
                shard=shard_t,
                max_seconds=max_seconds,
                case_timeout=case_timeout,
                harness_args=args,
                settings={"stamp_source": stamp.source},
                log=_echo,
                progress=bar.update,
                on_plan=lambda todo: setattr(bar, "length", max(todo, 1)),
            )
    except SweepInterrupted as e:
        _echo(f"interrupted by {e}; finished cases are in {journal}; re-run the same command to resume")
        sys.exit(128 + e.signum)
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None
    for w in result.warnings:
        _echo(w)
    _echo(
        f"{result.ran} cases measured ({result.failed} failed), {result.resumed} resumed from the journal, "
        f"{result.rows} rows -> {output} in {time.monotonic() - t0:.0f} s"
    )
    if result.stopped_early:
        remaining = result.planned - result.resumed - result.ran
        _echo(f"stopped by --max-seconds with {remaining} cases left; re-run the same command to continue")


@tune.command("build")
@_tree_option("llama.cpp tree.")
@_build_options
def build_cmd(
    tree: Path, build_dir: Path | None, cuda: bool | None, cuda_arch: str, jobs: int | None
) -> None:
    """Build (or find in the cache) the harness for a tree and print its path.

    \b
    The cache (.cache/tuner-harness/<key>, or $GGML_DISPATCH_HARNESS_CACHE) is keyed by the harness
    sources, the tree's ggml sources or prebuilt libraries, the install stamp and the options.
    """
    click.echo(str(_build_harness(tree, build_dir, cuda, cuda_arch, jobs)))


@tune.command("merge")
@click.argument(
    "inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="merged tuning Parquet file (written atomically).",
)
@click.option("--allow-mixed", is_flag=True, help="accept inputs from several GPUs or upstream commits.")
def merge_cmd(inputs: tuple[Path, ...], output: Path, allow_mixed: bool) -> None:
    """Combine the tuning files of several shards (tune run --shard i/n) into one.

    \b
    Refuses inputs measured on different GPUs (name, cc, SM count) or upstream commits unless
    --allow-mixed, and any (shape, route, trial) that two inputs both contain.

    \b
    Example:
      ggml-dispatch tune merge tuning.0.parquet tuning.1.parquet -o tuning.parquet
    """
    n = results.merge_tuning(list(inputs), output, allow_mixed=allow_mixed)
    _echo(f"{n} rows from {len(inputs)} files -> {output}")


tune.add_command(import_reference_cmd)
