"""``ggml-dispatch codegen`` and ``diff``: the thin click layer over decide, table, render and diff."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from codegen import decide, render
from codegen import diff as dif
from codegen import table as tbl
from ggml_dispatch import fileio, schema
from ggml_dispatch.errors import InputError


def _read_parquet(path: Path, want_schema: str) -> pd.DataFrame:
    try:
        pf = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise InputError(path, f"cannot read as Parquet: {e}") from None
    meta = {k.decode(): v.decode() for k, v in (pf.schema.metadata or {}).items()}
    found = meta.get(schema.META_SCHEMA)
    if found != want_schema:
        raise InputError(path, f"schema is {found!r}, expected {want_schema}", field=schema.META_SCHEMA)
    df: pd.DataFrame = pf.to_pandas()
    return df


def _under_tables(path: Path) -> bool:
    return "tables" in path.resolve().parts


@click.command("codegen")
@click.argument("tuning", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--census",
    "census_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="census Parquet: report the predicted change in estimated matmul time for its shapes",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="folder to write table.json and ggml-dispatch-table.h into",
)
@click.option(
    "--theta",
    default=decide.DEFAULT_THETA,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="a route replaces stock only if at least this much faster (0.03 = 3%)",
)
@click.option(
    "--reference-margin",
    type=float,
    default=None,
    help="declared fixed margin for source=reference rows (one sample, no CI); required for them",
)
@click.option("--allow-mixed", is_flag=True, help="accept rows from several GPUs or upstream commits")
@click.option(
    "--min-trials",
    default=decide.DEFAULT_MIN_TRIALS,
    show_default=True,
    type=click.IntRange(min=2),
    help="paired ok trials a measured route needs at a point",
)
@click.option(
    "--resamples",
    default=decide.DEFAULT_RESAMPLES,
    show_default=True,
    type=click.IntRange(min=100),
    help="bootstrap resamples for the 95% CI",
)
@click.option("--seed", default=decide.DEFAULT_SEED, show_default=True, type=int, help="bootstrap seed")
@click.option(
    "--min-default-shapes",
    default=decide.DEFAULT_MIN_DEFAULT_SHAPES,
    show_default=True,
    type=click.IntRange(min=2),
    help="measured (N, K) a per-type default needs",
)
@click.option(
    "--interpolate/--no-interpolate",
    default=True,
    show_default=True,
    help="rules inside gaps between measured M from the fitted crossover (kind interpolated)",
)
@click.option(
    "--class-defaults/--no-class-defaults",
    default=True,
    show_default=True,
    help="size-class defaults (by N*K) for (N, K) without an exact rule",
)
def codegen_cmd(
    tuning: Path,
    census_path: Path | None,
    out_dir: Path,
    theta: float,
    reference_margin: float | None,
    allow_mixed: bool,
    min_trials: int,
    resamples: int,
    seed: int,
    min_default_shapes: int,
    interpolate: bool,
    class_defaults: bool,
) -> None:
    """Turn tuning results into table.json and the C header ggml-dispatch-table.h.

    \b
    Only ok trials count. At each measured point (shape, M) the route with the lowest median
    replaces stock only if it is >= theta faster with the 95% paired bootstrap CI of the
    stock/route ratio above 1. A rule covers the M range between measured neighbours where the
    same route passes (kind measured); inside a gap between adjacent measured M a fitted crossover
    may carry a route where the fitted curve passes with its uncertainty (interpolated); size-class
    defaults cover unseen (N, K) of a measured type (default). Beyond the measured M range:
    stock. Every refused candidate is listed with the point that refused it. The table applies
    only on the measured GPU (name, cc, SM count).

    \b
    Rows with source = reference (one sample) need --reference-margin, and a table built from
    them is never written under tables/.
    """
    params = decide.Params(
        theta=theta,
        reference_margin=reference_margin,
        min_trials=min_trials,
        resamples=resamples,
        seed=seed,
        min_default_shapes=min_default_shapes,
        allow_mixed=allow_mixed,
        interpolate=interpolate,
        class_defaults=class_defaults,
    )
    df = _read_parquet(tuning, schema.TUNING_SCHEMA)
    census_df = None
    if census_path is not None:
        census_df = _read_parquet(census_path, schema.CENSUS_SCHEMA)
        dif.check_census(census_df, str(census_path))
    decisions = decide.decide(df, params, tuning)
    reference = decisions.identity.source == schema.Source.REFERENCE.value
    if reference and _under_tables(out_dir):
        raise InputError(
            out_dir,
            "a table built from source = reference rows is never written under tables/ "
            "(measured tables only)",
        )
    table = tbl.build_table(
        decisions,
        tuning_sha256=fileio.sha256_file(tuning),
        census_sha256=fileio.sha256_file(census_path) if census_path else None,
    )
    text = tbl.dumps(table)
    header = render.render_header(table)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (
        fileio.atomic_path(out_dir / tbl.TABLE_FILENAME) as tj,
        fileio.atomic_path(out_dir / tbl.HEADER_FILENAME) as th,
    ):
        tj.write_text(text, encoding="utf-8")
        th.write_text(header, encoding="utf-8")

    ident = decisions.identity
    g = ident.gpu
    echo = click.echo
    echo(
        f"table for {g.name} (cc {g.cc}, {g.sm_count} SMs), upstream {ident.upstream_commit[:12]}: "
        f"{len(table['rules'])} rules from {decisions.n_ok} ok of {decisions.n_rows} tuning rows"
    )
    if reference:
        echo(
            f"evidence: source = reference rows (one sample each, no CI); declared margin "
            f"{reference_margin:.0%}: a route passes only at >= {1 + max(theta, reference_margin or 0):.2f}x "
            "stock. For tests and demos only; never under tables/."
        )
    else:
        echo(
            f"evidence: measured trials; theta {theta:.0%}, 95% paired bootstrap CI ({resamples} resamples), "
            f">= {min_trials} paired ok trials"
        )
    if ident.mixed:
        echo(
            f"warning: --allow-mixed: rows from {len(ident.gpus)} GPUs and {len(ident.upstream_commits)} "
            "commits; the table is stamped with the one that contributed most rows",
            err=True,
        )
    echo("rules:")
    for r in table["rules"]:
        extra = f" (default over N,K {r['shapes']})" if r.get("shapes") else ""
        echo(f"  {dif.rule_line(r)}  min ratio {r['min_ratio']:.3f}x at M {r['measured_M']}{extra}")
    if not table["rules"]:
        echo("  (none: stock everywhere)")
    echo(f"refused candidates ({len(table['refused'])}):")
    for f in table["refused"]:
        echo(f"  {f['route']} at {tbl.rule_label({**f, 'M_lo': f['M'], 'M_hi': f['M']})}: {f['reason']}")
    if census_df is not None:
        p = dif.predict(census_df, tbl.empty_table(), table, decisions.evals)
        echo("predicted change vs stock:")
        for line in dif.format_prediction(p):
            echo(f"  {line}")
    else:
        echo("predicted change vs stock: pass --census to estimate it for your shapes")
    echo(
        f"wrote {out_dir / tbl.TABLE_FILENAME} and {out_dir / tbl.HEADER_FILENAME} "
        f"(table sha256 {tbl.table_hash(table)[:16]})"
    )


def _load_arg(arg: str) -> dif.LoadedTable:
    """A table.json, a rendered header, REV:path (git show), or the word ``empty``."""
    p = Path(arg)
    if p.is_file():
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(arg, f"cannot read: {e}") from None
        return dif.load_text(text, arg)
    if arg == "empty":
        return dif.empty()
    if ":" in arg:
        rev, _, rel = arg.partition(":")
        try:
            res = subprocess.run(["git", "show", f"{rev}:{rel}"], capture_output=True, check=False)
        except OSError as e:
            raise InputError(arg, f"cannot run git: {e}") from None
        if res.returncode != 0:
            raise InputError(arg, f"git show failed: {res.stderr.decode(errors='replace').strip()}")
        return dif.load_text(res.stdout.decode("utf-8", errors="strict"), arg)
    raise InputError(arg, "no such file (and not REV:path or 'empty')")


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option(
    "--census",
    "census_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="census Parquet: list affected shapes and predict the change in estimated matmul time",
)
@click.option(
    "--tuning",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="tuning Parquet whose stock/route ratios time the routes (needed with --census)",
)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--exit-code", is_flag=True, help="exit 1 when the tables differ, 0 when not (as git diff)")
def diff_cmd(
    a: str, b: str, census_path: Path | None, tuning: Path | None, as_json: bool, exit_code: bool
) -> None:
    """Compare two dispatch tables A and B: added, removed and changed rules.

    \b
    A and B are table.json files, rendered ggml-dispatch-table.h headers, git references
    REV:path (e.g. HEAD~1:tables/cuda-sm90-nvidia-h200/table.json), or the word `empty`
    (the table with no rules, i.e. stock). Tables differ when a rule or the runtime identity
    (GPU, upstream commit, layout version) differs.
    """
    if (census_path is None) != (tuning is None):
        raise click.UsageError("--census and --tuning go together")
    ta, tb = _load_arg(a), _load_arg(b)
    d = dif.diff_tables(ta, tb)
    pred = None
    if census_path is not None and tuning is not None:
        census_df = _read_parquet(census_path, schema.CENSUS_SCHEMA)
        dif.check_census(census_df, str(census_path))
        tdf = _read_parquet(tuning, schema.TUNING_SCHEMA)
        missing = [c for c in schema.TUNING_COLUMNS if c not in tdf.columns]
        if missing:
            raise InputError(tuning, f"not a tuning file: missing columns {', '.join(missing)}")
        evals, _ = decide.evaluate(tdf, decide.Params(resamples=0))
        pred = dif.predict(census_df, ta.table, tb.table, evals)
    if as_json:
        click.echo(dif.to_json(d, pred), nl=False)
    else:
        for line in dif.format_diff(d):
            click.echo(line)
        if pred is not None:
            for line in dif.format_prediction(pred):
                click.echo(line)
    if exit_code and d.differs:
        raise SystemExit(1)
