"""``tune verify``: measure a table's choices against stock and the best route on chosen points.

It scores a table with the decision rule (``codegen.decide``), so it lives after codegen and drives the
tuner's harness path from here; the root CLI attaches the command to the ``tune`` group.

The points are shapes (from a census, or declared as ``TYPE:NxK``) at chosen M values (``--m``, e.g.
prompt tails or batched-decode widths; else the census' own M). Every route and stock are timed with the
sweep's harness path (one child per case, the journal, the tuning Parquet schema), so the output can
also feed ``codegen`` later; the table itself is never changed. :func:`summarize` (pure) then says, per
point, which route the table picks there (its lookup, with the GPU the trials ran on), how far it is
from the fastest measured route (stock included: the oracle), and where it is beyond noise from the
best or slower than stock beyond noise, plus the time-weighted table/oracle and stock/oracle ratios.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click
import numpy as np
import pandas as pd

from ggml_dispatch import fileio, options, registry, schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError
from ggml_dispatch.options import INT32_MAX, FiniteFloat, Int
from ggml_dispatch.tuner import build, results
from ggml_dispatch.tuner import cli as tune_cli
from ggml_dispatch.tuner.build import TreeStamp
from ggml_dispatch.tuner.journal import Journal
from ggml_dispatch.tuner.run import (
    default_journal,
    harness_args,
    probe_harness,
    read_census,
    run_harness_case,
)
from ggml_dispatch.tuner.select import ALL_ROUTES, DEFAULT_NMSE_MAX, DEFAULT_TRIALS, Case, mul_mat_configs

NEAR_BEST: Final = 1.05  # points whose table/oracle ratio exceeds this are listed
# --m ranges expand to every M in them: bounded so that a typo (1-2147483647) is refused, not allocated
MAX_M_VALUES: Final = 1 << 16

ShapeKey = schema.ShapeKey


def parse_m_list(text: str) -> tuple[int, ...]:
    """``5,6,7,384`` or ranges ``5-7,384`` -> sorted distinct positive M."""
    out: set[int] = set()
    try:
        parts = options.list_items(text)
    except ValueError as e:
        raise InputError(None, str(e), field="m") from None
    for part in parts:
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if a < 1 or b < a or b > options.MAX_TOKENS:
                    raise ValueError
                if b - a >= MAX_M_VALUES:
                    raise InputError(None, f"{part!r} spans more than {MAX_M_VALUES} M values", field="m")
                out.update(range(a, b + 1))
            else:
                m = int(part)
                if m < 1 or m > options.MAX_TOKENS:
                    raise ValueError
                out.add(m)
        except ValueError:
            raise InputError(
                None,
                f"{part!r} is not a positive integer (at most {options.MAX_TOKENS}) or a range a-b of them",
                field="m",
            ) from None
        if len(out) > MAX_M_VALUES:
            raise InputError(None, f"more than {MAX_M_VALUES} M values", field="m")
    if not out:
        raise InputError(None, "--m: no M values", field="m")
    return tuple(sorted(out))


def parse_shape(text: str) -> ShapeKey:
    """``TYPE:NxK`` (MUL_MAT, weight layout, f32 activations, B = 1)."""
    typ, _, dims = text.partition(":")
    n, _, k = dims.lower().partition("x")
    if typ not in schema.GGML_TYPES:
        raise InputError(None, f"--shape {text!r}: unknown ggml type {typ!r}", field="shape")
    try:
        N, K = int(n), int(k)
    except ValueError:
        raise InputError(
            None, f"--shape {text!r}: expected TYPE:NxK, e.g. q4_K:28672x8192", field="shape"
        ) from None
    if N < 1 or K < 1:
        raise InputError(None, f"--shape {text!r}: N and K must be positive", field="shape")
    return ShapeKey(schema.Op.MUL_MAT.value, schema.Layout.WEIGHT.value, typ, "f32", N, K, 1)


def verify_points(
    census_rows: Iterable[Mapping[str, Any]] | None,
    shapes: Sequence[ShapeKey],
    ms: Sequence[int] | None,
) -> dict[tuple[ShapeKey, int], float]:
    """(shape, M) -> weight. Census shapes (tunable rows: MUL_MAT, weight layout, not fused) at the census
    M weighted by calls, or at ``ms`` with weight 1; declared shapes at ``ms`` (weight 1)."""
    points: dict[tuple[ShapeKey, int], float] = {}
    census_shapes: dict[ShapeKey, dict[int, float]] = {}
    for r in census_rows or ():
        fused = r.get("fused")
        if fused is not None and not (isinstance(fused, float) and math.isnan(fused)) and str(fused) != "":
            continue
        if str(r["op"]) != schema.Op.MUL_MAT.value or str(r["layout"]) != schema.Layout.WEIGHT.value:
            continue
        key = ShapeKey.of(r)
        by_m = census_shapes.setdefault(key, {})
        by_m[int(r["M"])] = by_m.get(int(r["M"]), 0.0) + float(r.get("calls") or 1)
    for key, by_m in census_shapes.items():
        if ms is None:
            points.update({(key, m): w for m, w in by_m.items()})
        else:
            points.update({(key, m): 1.0 for m in ms})
    if shapes and ms is None:
        raise InputError(None, "--shape needs --m (the M values to measure it at)", field="shape")
    for key in shapes:
        points.update({(key, m): 1.0 for m in ms or ()})
    if not points:
        raise InputError(None, "no points to verify: give --census and/or --shape with --m", field="points")
    return points


def cases_for(
    points: Mapping[tuple[ShapeKey, int], float],
    *,
    routes: Sequence[str] = ALL_ROUTES,
    trials: int = DEFAULT_TRIALS,
    nmse_max: float = DEFAULT_NMSE_MAX,
) -> list[Case]:
    mul_mat = mul_mat_configs(routes)
    return [
        Case(shape=k, M=m, est_us=0.0, census=True, routes=mul_mat, trials=trials, nmse_max=nmse_max)
        for k, m in sorted(points, key=lambda km: (km[0].codes(), km[1]))
    ]


def run_verify(
    cases: Sequence[Case],
    out: Path,
    *,
    harness: Path,
    stamp: TreeStamp,
    journal_path: Path,
    identity: Mapping[str, Any],
    harness_args: Sequence[str] = (),
    case_timeout: float = 900,
    log: Callable[[str], None] = lambda s: None,
) -> int:
    """Time the cases (resumable through the journal) and write the tuning Parquet; returns its rows."""
    header = probe_harness(harness, harness_args)
    log(
        f"harness {header.get('harness_version')} on {header.get('device')} ({header.get('gpu_name')}), "
        f"override API {'found' if header.get('dispatch_api') else 'absent: stock only'}"
    )
    stamp_d = {"upstream_commit": stamp.upstream_commit, "patch_hash": stamp.patch_hash}
    with Journal.open(journal_path, dict(identity)) as journal:
        done = journal.contents.done_ids()
        for case in (c for c in cases if c.id not in done):
            r = run_harness_case(harness, case, harness_args=harness_args, timeout=case_timeout)
            rec: dict[str, Any] = {
                "case": case.id,
                "spec": case.spec(),
                "status": r.status,
                "header": r.header or header,
                "stamp": stamp_d,
                "trials": r.trials,
                "case_info": r.case_info,
                "wall_s": round(r.wall_s, 3),
                "finished": fileio.now_iso(),
            }
            if r.status != "done":
                rec["stderr_tail"] = r.stderr_tail
                log(f"case {case.id}: {r.status}")
            journal.append(rec)
        records = list(journal.contents.cases)
    settings = {"verify": dict(identity), "harness_args": list(harness_args), "finished": time.time()}
    return results.write_tuning(out, records, input_hashes={}, settings=settings)


# --------------------------------------------------------------------------------------------
# Summary (pure)


@dataclass
class PointResult:
    key: ShapeKey
    M: int
    weight: float
    table_route: str | None  # None = stock
    best_route: str | None  # fastest measured (None = stock)
    stock_us: float | None
    table_us: float | None  # None: the table's route has no ok trial here
    oracle_us: float | None
    slower_than_stock: bool  # the table's route is slower than stock beyond noise
    beyond_noise_from_best: bool  # the best route beats the table's choice by theta, CI low end above 1
    note: str = ""

    @property
    def table_vs_oracle(self) -> float | None:
        if self.table_us is None or not self.oracle_us:
            return None
        return self.table_us / self.oracle_us


@dataclass
class VerifySummary:
    gpu: schema.GpuId | None
    table_applies: bool
    points: list[PointResult] = field(default_factory=list)

    def _sums(self) -> tuple[float, float, float]:
        t = o = s = 0.0
        for p in self.points:
            if p.table_us is None or p.oracle_us is None or p.stock_us is None:
                continue
            t += p.weight * p.table_us
            o += p.weight * p.oracle_us
            s += p.weight * p.stock_us
        return t, o, s

    @property
    def table_over_oracle(self) -> float | None:
        t, o, _ = self._sums()
        return t / o if o > 0 else None

    @property
    def stock_over_oracle(self) -> float | None:
        _, o, s = self._sums()
        return s / o if o > 0 else None


def _paired_ci(
    df: pd.DataFrame, slow: str | None, fast: str, params: decide.Params, seed: int
) -> tuple[float, float] | None:
    """Median and low end of the bootstrap CI of the per-trial ratio time(slow) / time(fast) (slow None =
    stock's anchor), or None with fewer than two paired trials."""
    ok = df[
        (df["status"] == schema.TrialStatus.OK.value)
        & ((df["route_ran"].isna()) | (df["route_ran"] == df["route"]))
    ]
    f = ok[ok["route"] == fast].set_index("trial")["us"].astype(float)
    if slow is None:
        s = ok[ok["route"] == fast].set_index("trial")["anchor_us"].astype(float)
    else:
        s = ok[ok["route"] == slow].set_index("trial")["us"].astype(float)
    both = pd.concat([s.rename("s"), f.rename("f")], axis=1).dropna()
    if len(both) < 2:
        return None
    ratios = list((both["s"] / both["f"]).to_numpy())
    lo, _ = decide.bootstrap_ci(ratios, params, seed)
    return float(np.median(ratios)), lo


def summarize(
    df: pd.DataFrame,
    table: Mapping[str, Any],
    weights: Mapping[tuple[ShapeKey, int], float] | None = None,
    params: decide.Params | None = None,
) -> VerifySummary:
    """Verify rows (tuning columns) + a table -> per-point verdicts and the time-weighted ratios."""
    params = params or decide.Params()
    if df.empty:
        return VerifySummary(None, False)
    g = df.iloc[0]
    gpu = schema.GpuId(str(g["gpu_name"]), int(g["gpu_cc"]), int(g["gpu_sm_count"]))
    evals, stock = decide.evaluate(df, params)
    summary = VerifySummary(gpu, tbl.gpu_matches(table, gpu))
    cols = ["op", "layout", "src0_type", "src1_type", "N", "K", "B", "M"]
    groups = {
        (ShapeKey.of(dict(zip(cols, v, strict=True))), int(v[-1])): rows  # type: ignore[call-overload]
        for v, rows in df.groupby(cols, sort=True)
    }
    for (key, M), rows in sorted(groups.items(), key=lambda kv: (kv[0][0].codes(), kv[0][1])):
        point = evals.get(key, {}).get(M, {})
        s_us = stock.get(key, {}).get(M)
        route = tbl.lookup_config(table, gpu, key, M)
        medians = {r: ev.median_us for r, ev in point.items() if ev.median_us is not None}
        note = ""
        if route is None:
            t_us = s_us
        else:
            t_us = medians.get(route)
            if t_us is None:
                note = f"the table's route {route} has no ok trial here"
        cands: dict[registry.Config | str, float] = {r: us for r, us in medians.items()}
        if s_us is not None:
            cands["stock"] = s_us
        best = min(cands, key=lambda r: cands[r]) if cands else None
        o_us = cands[best] if best else None
        slower = route is not None and route in point and decide.slower_beyond_noise(point[route], params)
        beyond = False
        if best is not None and best != "stock" and best != route and t_us is not None:
            ci = _paired_ci(
                rows,
                _text(route),
                str(best),
                params,
                decide._seed_for(params.seed, key, M, f"{route}>{best}"),
            )
            beyond = ci is not None and ci[0] >= 1.0 + params.theta and ci[1] > 1.0
        elif best == "stock" and route is not None and t_us is not None:
            beyond = slower
        summary.points.append(
            PointResult(
                key=key,
                M=M,
                weight=(weights or {}).get((key, M), 1.0),
                table_route=_text(route),
                best_route=None if best == "stock" or best is None else str(best),
                stock_us=s_us,
                table_us=t_us,
                oracle_us=o_us,
                slower_than_stock=slower,
                beyond_noise_from_best=beyond,
                note=note,
            )
        )
    return summary


def _text(config: registry.Config | None) -> str | None:
    return None if config is None else str(config)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None or not np.isfinite(x) else format(x, fmt)


def format_markdown(s: VerifySummary, table_origin: str, threshold: float = NEAR_BEST) -> list[str]:
    out = [f"# Verify {table_origin}", ""]
    if s.gpu is None:
        return [*out, "No trials."]
    out.append(
        f"GPU {s.gpu.name} (cc {s.gpu.cc}, {s.gpu.sm_count} SMs): the table "
        + ("applies." if s.table_applies else "does not apply here (GPU identity differs): stock everywhere.")
    )
    out.append("")
    out.append(
        f"{len(s.points)} points; time-weighted table/oracle {_f(s.table_over_oracle)}, "
        f"stock/oracle {_f(s.stock_over_oracle)}."
    )
    slower = [p for p in s.points if p.slower_than_stock]
    beyond = [p for p in s.points if p.beyond_noise_from_best]
    far = [p for p in s.points if (r := p.table_vs_oracle) is not None and r > threshold]
    out.append(
        f"Slower than stock beyond noise: {len(slower)}; beyond noise from the best: {len(beyond)}; "
        f"table/oracle > {threshold:.2f}: {len(far)}."
    )
    out += ["", "| shape | M | table | best | stock us | table us | oracle us | table/oracle | flags |"]
    out.append("|---|---|---|---|---|---|---|---|---|")
    for p in s.points:
        flags = []
        if p.slower_than_stock:
            flags.append("SLOWER THAN STOCK")
        if p.beyond_noise_from_best:
            flags.append("beyond noise from best")
        if p.note:
            flags.append(p.note)
        out.append(
            f"| {p.key.src0_type} N={p.key.N} K={p.key.K} | {p.M} | {p.table_route or 'stock'} | "
            f"{p.best_route or 'stock'} | {_f(p.stock_us, '.2f')} | {_f(p.table_us, '.2f')} | "
            f"{_f(p.oracle_us, '.2f')} | {_f(p.table_vs_oracle)} | {'; '.join(flags)} |"
        )
    return out


@click.command("verify")
@click.argument("table_path", metavar="TABLE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--llama-cpp",
    "tree",
    envvar="LLAMA_CPP_DIR",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="llama.cpp tree (patched by `ggml-dispatch install` to time routes other than stock).",
)
@click.option(
    "--recorded",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="summarize these recorded trials (a verify or tuning Parquet) instead of measuring.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Parquet file of the verify trials (tuning schema; written atomically from the journal).",
)
@click.option(
    "--census",
    "census_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="census whose MUL_MAT weight shapes to verify (at its own M, weighted by calls, unless --m).",
)
@click.option("--m", "m_text", default=None, help="M values to verify at, e.g. 5,6,7,384,488 or 5-7,384.")
@click.option(
    "--shape",
    "shape_text",
    multiple=True,
    help="a shape to verify that no census has, TYPE:NxK (e.g. q4_K:28672x8192); repeatable; needs --m.",
)
@click.option(
    "--summary",
    "summary_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Markdown summary to write [default: OUTPUT with .md].",
)
@tune_cli.build_options
@click.option(
    "--harness",
    "harness_bin",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="use this harness binary instead of building one.",
)
@click.option("--trials", type=Int(2, INT32_MAX), default=DEFAULT_TRIALS, show_default=True)
@click.option("--device", default=None, help="ggml device name (default: first GPU, else CPU).")
@click.option("--case-timeout", type=FiniteFloat(1), default=900, show_default=True)
@click.option(
    "--l2-bytes",
    type=Int(0),
    default=None,
    help="L2 size to rotate weights against (default: the harness queries CUDA; 0 = no rotation).",
)
@click.option("--harness-arg", "harness_extra", multiple=True, help="extra harness option, repeatable.")
@click.option("--dry-run", is_flag=True, help="print the cases (JSON Lines) and exit.")
def verify_cmd(
    table_path: Path,
    tree: Path | None,
    recorded: Path | None,
    output: Path | None,
    census_path: Path | None,
    m_text: str | None,
    shape_text: tuple[str, ...],
    summary_path: Path | None,
    build_dir: Path | None,
    cuda: bool | None,
    cuda_arch: str,
    jobs: int | None,
    harness_bin: Path | None,
    trials: int,
    device: str | None,
    case_timeout: float,
    l2_bytes: int | None,
    harness_extra: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Measure TABLE's choices against stock and the best route on chosen points; TABLE is not changed.

    \b
    Every route and stock are timed at each point (the sweep's harness path and journal; the
    output is a tuning Parquet file). The summary lists, per point, the table's route, the best
    measured one, table/oracle, and flags points where the table is slower than stock beyond noise
    or where the best route beats its choice by theta with the 95% CI above 1; it ends with the
    time-weighted table/oracle and stock/oracle ratios.

    \b
    Examples:
      ggml-dispatch tune verify tables/x/table.json --census census.parquet --m 5,6,7,384,488 \\
          --llama-cpp ~/llama.cpp -o parquet
      ggml-dispatch tune verify table.json --shape q4_K:28672x8192 --shape q6_K:8192x28672 \\
          --m 1,8,384,512 --llama-cpp ~/llama.cpp -o verify-70b.parquet
    """
    table = tbl.load(table_path)
    if recorded is not None:
        df, _ = results.read_tuning(recorded)
        summary = summarize(df.to_pandas(), table)
        lines = format_markdown(summary, str(table_path))
        if summary_path is not None:
            with fileio.atomic_path(summary_path) as tmp:
                tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for line in lines:
            click.echo(line)
        return
    ms = parse_m_list(m_text) if m_text is not None else None
    shapes = [parse_shape(t) for t in shape_text]
    census_rows = read_census(census_path) if census_path is not None else None
    points = verify_points(census_rows, shapes, ms)
    cases = cases_for(points, trials=trials)
    if dry_run:
        for c in cases:
            click.echo(json.dumps(c.spec()))
        tune_cli.echo(f"{len(cases)} cases")
        return
    if output is None:
        raise click.UsageError("-o/--output is required (unless --recorded)")
    if tree is None:
        raise click.UsageError("--llama-cpp (or LLAMA_CPP_DIR) is required to measure")
    stamp = build.tree_stamp(tree)
    if harness_bin is None:
        harness_bin = tune_cli.build_harness(tree, build_dir, cuda, cuda_arch, jobs)
    args = list(harness_args(device, l2_bytes, harness_extra))
    identity = {"table_sha256": tbl.table_hash(table), "cases": sorted(c.id for c in cases), "trials": trials}
    try:
        n = run_verify(
            cases,
            output,
            harness=harness_bin,
            stamp=stamp,
            journal_path=default_journal(output),
            identity=identity,
            harness_args=args,
            case_timeout=case_timeout,
            log=tune_cli.echo,
        )
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None
    df, _ = results.read_tuning(output)
    summary = summarize(df.to_pandas(), table, points)
    lines = format_markdown(summary, str(table_path))
    out_md = summary_path or output.with_suffix(".md")
    if out_md == output or out_md.resolve() == table_path.resolve():
        raise InputError(out_md, "the summary would replace an input or the trials file", field="--summary")
    with fileio.atomic_path(out_md) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for line in lines[:6]:
        if line:
            click.echo(line)
    tune_cli.echo(f"{n} rows -> {output}; summary -> {out_md}")
