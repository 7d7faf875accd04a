"""``ggml-dispatch codegen`` and ``diff``: the thin click layer over decide, table, render and diff."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import click
import pandas as pd

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.artifacts import census as census_artifact
from ggml_dispatch.artifacts import table as table_artifact
from ggml_dispatch.artifacts import tuning as tuning_artifact
from ggml_dispatch.codegen import decide, kv_shadow, render, vram
from ggml_dispatch.codegen import diff as dif
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError
from ggml_dispatch.options import INT32_MAX, FiniteFloat, Int, allow_mixed_option, output_option
from ggml_dispatch.text import printable

# bootstrap memory is resamples x trials x 8 bytes
MAX_RESAMPLES: Final = 1_000_000


def _under_tables(path: Path) -> bool:
    return "tables" in path.resolve().parts


def _replaced(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        raise click.UsageError(
            f"{param.opts[0]} is replaced by --vram-budget MiB: one budget shared by the weight cache and "
            "the KV shadow, admitted together by measured time saved per MiB",
            ctx,
        )
    return value


def replaced_budget_options(f: Any) -> Any:
    """The two budgets --vram-budget replaced: hidden, each refused with one line saying so."""
    for name in ("--cache-budget", "--kv-shadow-budget"):
        f = click.option(name, hidden=True, expose_value=False, callback=_replaced, default=None)(f)
    return f


def vram_budget_option(f: Any) -> Any:
    return click.option(
        "--vram-budget",
        "vram_budget",
        type=Int(0, vram.MAX_BUDGET_MIB),
        default=None,
        metavar="MiB",
        help="VRAM for rules that trade memory for time, shared by persistent f16 weight copies "
        "(cublas/weight=cached) and f16 shadows of quantized KV caches (kv=shadow): ranked together by "
        "measured time saved per MiB and admitted greedily within it; unset or 0: neither (cached and "
        "shadow rows are left out)",
    )(f)


@click.command("codegen")
@click.argument("tunings", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="TUNING...")
@click.option(
    "--census",
    "census_paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help="census Parquet (repeatable: their rows are pooled): weighs the weight cache's savings and reports "
    "the predicted change in estimated matmul time for its shapes",
)
@output_option("folder to write table.json and ggml-dispatch-table.h into", folder=True, dest="out_dir")
@click.option(
    "--theta",
    default=decide.DEFAULT_THETA,
    show_default=True,
    type=FiniteFloat(0.0, 1.0),
    help="a route replaces stock only if at least this much faster (0.03 = 3%; at most 1 = twice as fast)",
)
@click.option(
    "--reference-margin",
    type=FiniteFloat(0.0, 1.0, min_open=True, max_open=True),
    default=None,
    help="declared fixed margin for source=reference rows (one sample, no CI); required for them",
)
@allow_mixed_option("accept rows from several GPUs or upstream commits")
@click.option(
    "--min-trials",
    default=decide.DEFAULT_MIN_TRIALS,
    show_default=True,
    type=Int(2, INT32_MAX),
    help="paired ok trials a measured route needs at a point",
)
@click.option(
    "--resamples",
    default=decide.DEFAULT_RESAMPLES,
    show_default=True,
    type=Int(100, MAX_RESAMPLES),
    help="bootstrap resamples for the 95% CI",
)
@click.option("--seed", default=decide.DEFAULT_SEED, show_default=True, type=Int(), help="bootstrap seed")
@click.option(
    "--min-default-shapes",
    default=decide.DEFAULT_MIN_DEFAULT_SHAPES,
    show_default=True,
    type=Int(2),
    help="measured (N, K) a per-type default needs",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="list every refused candidate and every affected census row"
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
@vram_budget_option
@replaced_budget_options
@click.option(
    "--op",
    "ops",
    multiple=True,
    type=click.Choice([o.value for o in registry.Op]),
    help="decide only this op's rows (repeatable; default: every op in the tuning); the other ops run "
    "stock's choice, e.g. --op FLASH_ATTN_EXT for an attention-only table that an A/B separates from the "
    "matmul rules",
)
def codegen_cmd(
    tunings: tuple[Path, ...],
    census_paths: tuple[Path, ...],
    out_dir: Path,
    theta: float,
    reference_margin: float | None,
    allow_mixed: bool,
    min_trials: int,
    resamples: int,
    seed: int,
    min_default_shapes: int,
    verbose: bool,
    interpolate: bool,
    class_defaults: bool,
    vram_budget: int | None,
    ops: tuple[str, ...],
) -> None:
    """Turn tuning results into table.json and the C header ggml-dispatch-table.h.

    \b
    Only ok trials count. At each measured point (shape, M) the route with the lowest median
    replaces stock only if it is >= theta faster with the 95% paired bootstrap CI of the
    stock/route ratio above 1. A rule covers the M range between measured neighbours where the
    same route passes (kind measured); inside a gap between adjacent measured M a fitted crossover
    may carry a route where the fitted curve passes with its uncertainty (interpolated); size-class
    defaults cover unseen (N, K) of a measured type (default). Beyond the measured M range: stock.
    Refused candidates are counted by reason (--verbose lists each with the point that refused it;
    table.json keeps them all). The table applies only on the measured GPU (name, cc, SM count).

    \b
    Several tuning files are decided as one set of rows (one GPU and upstream commit unless
    --allow-mixed; a trial in two files is refused): one table for every op and configuration
    measured on that GPU. Rules that trade VRAM for time (weight cache, KV shadow) are admitted
    only under --vram-budget.

    \b
    Rows with source = reference (one sample) need --reference-margin, and a table built from
    them is never written under tables/.

    \b
    Examples:
      ggml-dispatch codegen tables/cuda-sm90-nvidia-h200/tuning/*.parquet \\
          --census tables/cuda-sm90-nvidia-h200/census.parquet --vram-budget 16384 -o my-table
      ggml-dispatch codegen tuning.parquet --vram-budget 16384 --op FLASH_ATTN_EXT -o attn-only
    """
    table_out, header_out = out_dir / tbl.TABLE_FILENAME, out_dir / tbl.HEADER_FILENAME
    inputs = [*tunings, *census_paths]
    for out in (table_out, header_out):
        fileio.check_output(out, inputs)
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
        ops=tuple(sorted(set(ops))) or None,
    )
    # one selection ahead of every consumer (budget plan, decision), so none sees the other ops
    tuning_set = tuning_artifact.read_many(tunings, allow_mixed=allow_mixed)
    where = tuning_set.where
    df = decide.select_ops(tuning_set.frame(), params.ops, where)
    census_df = read_censuses(census_paths)
    decisions, plan, shadow_left_out = vram.decide_with_budget(df, census_df, vram_budget, params, where)
    reference = decisions.identity.source == schema.Source.REFERENCE.value
    if reference and _under_tables(out_dir):
        raise InputError(
            out_dir,
            "a table built from source = reference rows is never written under tables/ "
            "(measured tables only)",
        )
    tuning_hashes = [(p.name, fileio.sha256_file(p)) for p in tunings]
    census_hashes = [(p.name, fileio.sha256_file(p)) for p in census_paths]
    table = tbl.build_table(
        decisions,
        tuning_sha256=tbl.inputs_sha256([h for _, h in tuning_hashes]),
        census_sha256=tbl.inputs_sha256([h for _, h in census_hashes]) if census_hashes else None,
        tuning_files=tuning_hashes if len(tuning_hashes) > 1 else None,
        census_files=census_hashes if len(census_hashes) > 1 else None,
    )
    typed = tbl.parse_table(tbl.canonicalize(vram.attach(table, plan)))  # typed once, rendered from it
    table = typed.data
    text = tbl.dumps(table)
    header = render.render_header(typed)
    with fileio.output_set([table_out, header_out], inputs) as outputs:
        outputs.path(table_out).write_text(text, encoding="utf-8")
        outputs.path(header_out).write_text(header, encoding="utf-8")

    ident = decisions.identity
    g = ident.gpu
    echo = click.echo
    echo(
        f"table for {printable(g.name)} (cc {g.cc}, {g.sm_count} SMs), "
        f"upstream {printable(ident.upstream_commit[:12])}: "
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
    if params.ops:
        echo(f"decided: {', '.join(params.ops)} only; every other op runs stock's choice")
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
    if plan is not None:
        cache_mib, shadow_mib = plan.caps_mib()
        echo(
            f"VRAM budget: {plan.budget_mib} MiB, {len(plan.admitted)} memory rules admitted, "
            f"{plan.bytes} bytes planned ({plan.bytes / vram.MIB:.1f} MiB); caps: weight cache "
            f"{cache_mib} MiB, KV shadow {shadow_mib} MiB"
        )
        for c in sorted(plan.admitted, key=vram._rank):
            what = f"{c.tensors} tensors" if c.kind == vram.WEIGHT_CACHE else "one layer's K and V"
            echo(
                f"  {c.label()}: {what}, {c.bytes / vram.MIB:.1f} MiB, saves {c.saved_us:.1f} us "
                f"({c.saved_per_mib:.3f} us/MiB) over {c.points} M"
            )
        for c, why in plan.skipped:
            echo(f"  not admitted: {c.label()} ({c.saved_per_mib:.3f} us/MiB): {why}")
        if plan.cache_unweighed:
            echo(
                "weight cache: left out (no --census): its weight=cached rows are priced by "
                "the census' calls;"
                " --census admits them"
            )
        configs = [r.config for r in typed.rules]
        reuse = sum(kv_shadow.REUSE_PARAM in c.params for c in configs)
        if reuse:
            echo(
                f"KV shadow: {reuse} rule(s) below the deepest run of shadow buckets read kv=reuse (a shadow "
                "made deeper, or made where the cache can reach a deeper shadow rule; else stock's kernel)"
            )
    if shadow_left_out:
        echo(
            f"KV shadow: left out (no --vram-budget): at {shadow_left_out} attention points a kv=shadow "
            "configuration was measured faster than stock; --vram-budget MiB admits them"
        )
    refused = table["refused"]
    if verbose:
        echo(f"refused candidates ({len(refused)}):")
        for f in refused:
            where = tbl.rule_label({**f, "M_lo": f["M"], "M_hi": f["M"]})
            echo(printable(f"  {f['route']} at {where}: {f['reason']}"))
    else:
        kinds = Counter(refusal_kind(f["reason"]) for f in refused)
        by = " by reason (--verbose lists each):" if refused else ""
        echo(f"refused candidates: {len(refused)}{by}")
        for kind, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])):
            echo(f"  {n:>6}  {printable(kind)}")
    if census_df is not None:
        p = dif.predict(census_df, tbl.empty_table(), table, decisions.evals, decisions.stock_us)
        echo("predicted change vs stock:")
        top = len(p.rows) if verbose else 5
        for line in dif.format_prediction(p, top=top):
            echo(f"  {line.replace('(--json lists all)', '(--verbose lists all)')}")
    else:
        echo("predicted change vs stock: pass --census to estimate it for your shapes")
    echo(
        f"wrote {out_dir / tbl.TABLE_FILENAME} and {out_dir / tbl.HEADER_FILENAME} "
        f"(table sha256 {tbl.table_hash(table)[:16]})"
    )


_RATIO_BELOW: Final = re.compile(r"^ratio [0-9.]+x below ")
_FEW_TRIALS: Final = re.compile(r"^only [0-9]+ paired ok trials \(< ([0-9]+)\)")
_CI_LOW: Final = re.compile(r"^ratio [0-9.]+x but the ([0-9]+% CI) low end [0-9.]+ is not above 1")
_AT_POINT: Final = re.compile(r"^at N=[0-9]+ K=[0-9]+ M=[0-9]+: ")


def read_censuses(paths: Sequence[Path]) -> pd.DataFrame | None:
    """The census files' rows pooled (None without one); each read by the census reader."""
    if not paths:
        return None
    frames = [census_artifact.read(p).frame() for p in paths]
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def refusal_kind(reason: str) -> str:
    """A refusal's reason without the numbers of its point (what the summary counts)."""
    prefix = ""
    for head, label in (
        ("type default (min-max regret choice): ", "type default: "),
        ("type default cannot join ", "type default cannot join its M neighbour: "),
    ):
        if reason.startswith(head):
            prefix = label
            reason = reason[len(head) :]
            if label.startswith("type default cannot"):
                reason = reason.split(": ", 1)[-1]
            reason = _AT_POINT.sub("", reason)
            break
    if reason.startswith("no ok trial"):
        reason = "no ok trial"
    elif reason.startswith("not the fastest"):
        reason = "not the fastest route"
    elif reason.startswith("stopped by the race"):
        reason = reason.split(" (median ", 1)[0]
    elif m := _FEW_TRIALS.match(reason):
        reason = f"fewer than {m.group(1)} paired ok trials"
    elif m := _CI_LOW.match(reason):
        reason = f"{m.group(1)} low end not above 1"
    else:
        reason = _RATIO_BELOW.sub("ratio below ", reason)
    return prefix + reason


def _load_arg(arg: str) -> table_artifact.LoadedTable:
    """A table.json, a rendered header, REV:path (git show), or the word ``empty``."""
    p = Path(arg)
    if p.exists():
        return dif.load_file(p)
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
        return dif.load_text(table_artifact.decode_text(res.stdout, arg, table_artifact.ANY_WHAT), arg)
    raise InputError(arg, "no such file (and not REV:path or 'empty')")


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option(
    "--census",
    "census_path",
    type=click.Path(path_type=Path),
    help="census Parquet: list affected shapes and predict the change in estimated matmul time",
)
@click.option(
    "--tuning",
    type=click.Path(path_type=Path),
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
        census_df = census_artifact.read(census_path).frame()
        tdf = tuning_artifact.read(tuning).frame()
        evals, stock_us = decide.evaluate(tdf, decide.Params(resamples=0))
        pred = dif.predict(census_df, ta.table, tb.table, evals, stock_us)
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
