"""``ggml-dispatch report``: Parquet files (+ table, A/B runs) -> DIR/REPORT.md and DIR/plots/*.png."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ggml_dispatch import fileio
from ggml_dispatch.options import FiniteFloat
from ggml_dispatch.report import ab, attribution, markdown, timeline
from ggml_dispatch.report import inputs as inputs_mod
from ggml_dispatch.report.output import write_report

_FILE = click.Path(path_type=Path, dir_okay=False)


@click.command("report")
@click.option(
    "--tuning", "tuning_path", type=_FILE, required=True, help="tuning.parquet from `tune run|merge`."
)
@click.option(
    "--census", "census_path", type=_FILE, help="census.parquet: adds census weights and predicted gains."
)
@click.option("--table", "table_path", type=_FILE, help="table.json: marks the M range each rule covers.")
@click.option(
    "--ab",
    "ab_paths",
    type=_FILE,
    multiple=True,
    help="End-to-end A/B runs, JSON Lines, one run per line: "
    '{"model", "test" (pp512, tg128, ...), "ubatch", "arm" (stock|table|crude|cached|hook), "pair", '
    '"tps"}. Repeatable.',
)
@click.option(
    "--pool-ab",
    is_flag=True,
    help="The --ab files are calls of one A/B (one table): pool each workload's pairs over them "
    "(pairs still formed within a file) instead of reporting each file apart.",
)
@click.option(
    "--reference-margin",
    type=FiniteFloat(0.0, 1.0, min_open=True, max_open=True),
    help="Declared fixed margin for tuning rows with source = reference (one sample, no CI); "
    "a table's own decision parameters are used when --table is given.",
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(path_type=Path),
    help="Kernel timelines (a folder or .tar.gz of <arm>.<test>.ktl + llama-bench .jsonl, what "
    "lab/e2e.sh's profile part writes): adds where a step's time goes per arm.",
)
@click.option(
    "--attribution",
    "attribution_path",
    type=click.Path(path_type=Path),
    help="A server profile (a folder or archive of <mode>.ktl + phases-<mode>.jsonl, what "
    "lab/serve_ab.py profile writes): the report opens with where the GPU time goes per phase (prefill, "
    "decode, MTP decode) by op and route, and Amdahl's bound on what a table can win there.",
)
@click.option("--notes", "notes_path", type=_FILE, help="Markdown appended verbatim as a Notes section.")
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Output folder.",
)
def report_cmd(
    tuning_path: Path,
    census_path: Path | None,
    table_path: Path | None,
    ab_paths: tuple[Path, ...],
    pool_ab: bool,
    reference_margin: float | None,
    profile_path: Path | None,
    attribution_path: Path | None,
    notes_path: Path | None,
    out_dir: Path,
) -> None:
    """Build a Markdown + PNG report from tuning (and census) Parquet files.

    \b
    Writes OUT/REPORT.md and OUT/plots/*.png:
    - with --attribution, at the top: where a server's GPU time goes per phase, by op and route,
      and the share a table chooses the kernels of (Amdahl's bound on what it can win);
      - first, a one-screen summary: the end-to-end gain per workload (with --ab), where the
        table ties the crude rule, every loss beyond noise, the predicted matmul-time gain;
      - time vs M per route for each shape key (median, IQR bars, min-max band, stock anchor,
        table rule ranges), and the fastest route's speed-up per type;
      - trial counts by status (ok, ineligible, wrong, drifted, failed) - nothing hidden;
      - census weights (est_us share by shape key, role and quant type), with --census;
      - predicted speed-up per census point (the model `diff` uses: measured stock time where
        tuned, census est_us elsewhere) and, with --ab, measured end-to-end ratios with 95%
        bootstrap CIs;
      - losing cases: candidates slower than stock beyond noise, A/B CIs below 1;
      - with --profile: each arm's GPU time per run by kernel category (matmul routes, cuBLAS
        conversions, attention, other, idle) and what the matmul savings alone predict.

    Verdicts use codegen's decision statistics (the table's own parameters with --table), so the
    report and the table agree. --notes adds hand-written findings (e.g. why an end-to-end gain
    falls short of the per-op prediction) that survive regenerating the report.

    The same inputs give the same REPORT.md. Other files in OUT are left alone, except stale
    PNGs under OUT/plots/ from an earlier report.

    \b
    Example:
      ggml-dispatch report --tuning tuning.parquet --census census.parquet \\
          --table table.json --ab ab.jsonl -o tables/cuda-sm90-nvidia-h200
      # two calls of one A/B, pooled into one comparison per workload
      ggml-dispatch report --tuning tuning.parquet --ab call1.jsonl --ab call2.jsonl \\
          --pool-ab -o report-pooled
    """
    given = [
        p
        for p in (tuning_path, census_path, table_path, profile_path, attribution_path, notes_path, *ab_paths)
        if p is not None
    ]
    plots = out_dir / markdown.PLOTS_DIR
    fileio.check_output(out_dir / markdown.REPORT_NAME, given)
    fileio.check_output_folder(plots)
    table = None
    files = []
    if table_path is not None:
        table, table_file = inputs_mod.load_table(table_path)
        files.append(table_file)
    params = inputs_mod.params_from_table(table, reference_margin)
    tuning, tuning_file = inputs_mod.load_tuning(tuning_path, params)
    files.insert(0, tuning_file)
    inputs = inputs_mod.Inputs(tuning=tuning, files=files, params=params, table=table)
    if census_path is not None:
        inputs.census, census_file = inputs_mod.load_census(census_path)
        files.insert(1, census_file)
    if ab_paths:
        inputs.ab, ab_files = ab.load_ab(ab_paths, pool=pool_ab)
        files.extend(ab.provenance_details(ab_paths, ab_files, table_path))
    if profile_path is not None:
        inputs.profile = timeline.load_profile(profile_path)
        files.append(inputs_mod.profile_file(profile_path, inputs.profile))
    if attribution_path is not None:
        inputs.attribution = attribution.load(attribution_path)
        files.append(inputs_mod.attribution_file(attribution_path, inputs.attribution))
    if notes_path is not None:
        try:
            inputs.notes = notes_path.read_text(encoding="utf-8")
        except OSError as e:
            raise click.BadParameter(str(e), param_hint="--notes") from None

    with click.progressbar(length=markdown.figure_count(inputs), label="plots", file=sys.stderr) as bar:

        def tick(n: int) -> None:
            bar.update(n)

        result = markdown.build_report(inputs, progress=tick)

    click.echo(write_report(out_dir, result, given))
