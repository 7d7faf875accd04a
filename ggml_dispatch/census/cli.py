"""``ggml-dispatch census``: route traces or a GGUF model -> census.parquet, and a readable summary."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ggml_dispatch import fileio, schema
from ggml_dispatch.census import aggregate, attention, build, estimate, gguf_meta, show, trace
from ggml_dispatch.errors import InputError
from ggml_dispatch.options import INT32_MAX, MAX_TOKENS, Int, allow_mixed_option, int_list, output_option


@click.group()
def census() -> None:
    """Build and inspect the census of matmul shapes (trace or GGUF -> Parquet).

    \b
    A census has one row per distinct matmul key (GPU, op, layout, types, M/N/K/B, tensor, route)
    with its call count and est_us, the estimated time those calls take (a roofline estimate from
    bytes and FLOPs on the recorded GPU until a measured time exists). Priorities and coverage are
    by est_us, never by call counts.
    """


def _warn(message: str) -> None:
    click.echo(f"ggml-dispatch: warning: {message}", err=True)


def _info(message: str = "") -> None:
    click.echo(message, err=True)


def _summary(table: Any, meta: dict[str, str], out: Path) -> None:
    decoded: dict[str, Any] = {}
    for k, v in meta.items():
        decoded[k] = json.loads(v) if v[:1] in ("{", "[") else v
    rep = show.report(table, decoded, str(out), top=0)
    for g in rep["gpus"]:
        cov = g["coverage"]["by_est_us"]
        gpu = g["gpu"]
        _info(
            f"{show.safe(gpu['name'])} (cc {gpu['cc']}, {gpu['sm_count']} SMs): {g['rows']} rows, "
            f"{g['calls']:,} calls, estimated {g['est_us']:,.1f} us; by estimated time "
            + ", ".join(f"{k} in {v} of {g['shape_count']} shapes" for k, v in cov.items())
        )
        quant = ", ".join(
            f"{show.safe(q['type'])} {100 * q['est_share']:.1f}%" for q in g["quant"] if q["est_us"] > 0
        )
        _info(f"  est_us by weight type: {quant}")


@census.command("ingest")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--gguf",
    "ggufs",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Model file the trace ran (repeatable). Tensor types and shapes must agree with the trace; "
    "adds the quant histogram and the weight tensors the trace never used.",
)
@output_option("census.parquet to write.")
@allow_mixed_option("accept traces of several upstream commits (stamped as a list).")
def ingest_cmd(traces: tuple[Path, ...], ggufs: tuple[Path, ...], output: Path, allow_mixed: bool) -> None:
    """Aggregate route traces into a census.

    TRACE is a ggml-route-trace/1 file written by a patched ggml-cuda (GGML_CUDA_ROUTE_TRACE=path),
    plain or .gz, or an ordinary llama.cpp log whose trace lines start with "ggml-route-trace: ".
    Identical keys add up across lines and files; different GPUs stay apart. A torn last line or a
    missing footer (a killed run) is read with a warning; any other bad line stops with its file:line
    and leaves no output behind. Traces of different upstream commits are refused unless --allow-mixed.
    """
    fileio.check_output(output, [*traces, *ggufs])
    agg = aggregate.Aggregator()
    reports: list[trace.FileReport] = []
    total = 0
    for p in traces:
        try:
            total += p.stat().st_size
        except OSError as e:
            raise InputError(p, f"cannot read trace: {e.strerror or e}") from None
    if sys.stderr.isatty():
        with click.progressbar(length=total, label="reading traces", file=sys.stderr) as bar:
            for p in traces:
                reports.append(trace.read_trace(p, agg.sink, bar.update))
                trace.check_counts(agg.tallies, p)
    else:
        for p in traces:
            reports.append(trace.read_trace(p, agg.sink))
            trace.check_counts(agg.tallies, p)
    trace.check_commits(reports, allow_mixed=allow_mixed)
    models = [gguf_meta.read_gguf(g) for g in ggufs]
    rows, join = aggregate.trace_rows(agg.tallies, models, consume=True)
    del agg
    if not rows:
        raise InputError(traces[0], "no route records in the input: nothing to census")

    warnings: list[str] = []
    for r in reports:
        warnings += r.warnings
    first_by_hash: dict[str, str] = {}
    for r in reports:
        if r.sha256 in first_by_hash:
            warnings.append(
                f"{r.path}: same content as {first_by_hash[r.sha256]}: its counts were added again"
            )
        first_by_hash.setdefault(r.sha256, r.path)
    if join.layout_disagrees:
        warnings.append(
            f"{len(join.layout_disagrees)} key(s) carry a layout other than their shape's class, "
            f"first: {join.layout_disagrees[0]}"
        )
    if join.not_in_gguf and models:
        missing = ", ".join(repr(n) for n in join.not_in_gguf[:5])
        warnings.append(
            f"{len(join.not_in_gguf)} traced weight tensor(s) are in none of the GGUF files: {missing}"
        )
    for w in warnings:
        _warn(show.safe(w))

    headers: list[dict[str, Any]] = [h for r in reports for h in r.headers]
    meta = build.metadata(
        inputs={str(r.path): r.sha256 for r in reports},
        ggufs={str(g): fileio.sha256_file(g) for g in ggufs},
        headers=headers,
        gpu_specs=[s.as_dict() for s in join.specs.values()],
        warnings=warnings,
        unseen=join.unseen,
    )
    table = build.write(rows, output, meta, source=traces[-1])
    del rows  # the table has them: the summary reads the table

    for r in reports:
        _info(
            f"{show.safe(r.path)}: {r.lines:,} lines ({r.mode}{', gzip' if r.compressed else ''}), "
            f"{r.route_lines:,} route records, {r.calls:,} calls"
        )
    if models:
        hist = aggregate.weight_type_histogram(models)
        _info(
            "GGUF weight types: "
            + ", ".join(f"{h['type']} {h['tensors']} tensors {h['bytes'] / (1 << 20):,.1f} MiB" for h in hist)
        )
        for gguf_path, names in join.unseen.items():
            shown = ", ".join(show.safe(n) for n in names[:6])
            more = f" and {len(names) - 6} more" if len(names) > 6 else ""
            _info(f"{show.safe(gguf_path)}: {len(names)} weight tensor(s) never in the trace: {shown}{more}")
    _summary(table, meta, output)
    _info(f"wrote {output} ({table.num_rows} rows)")


@census.command("attention")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@output_option("attention census .parquet to write.")
@click.option(
    "--max-m",
    type=Int(1, MAX_TOKENS),
    default=None,
    help="keep only calls with at most this many Q columns (decode and verify: a depth run's KV fill "
    "runs at the ubatch, one point per KV length on the way).",
)
@click.option(
    "--fill-kv",
    "fill_kv_text",
    default=None,
    metavar="LIST",
    help="with --max-m: also keep the KV fill's last point below each of these KV lengths (a depth run's "
    "depths, e.g. 16384,49152), so the table may choose the fill's kernel at that depth too.",
)
@allow_mixed_option("accept traces of several upstream commits (stamped as a list).")
def attention_cmd(
    traces: tuple[Path, ...], output: Path, max_m: int | None, fill_kv_text: str | None, allow_mixed: bool
) -> None:
    """FLASH_ATTN_EXT calls of route traces -> the attention census.

    One row per GPU, attention shape key (K/V types, head dims D_K/D_V, GQA ratio, KV-length bucket
    kv), Q columns M, exact KV length, flags (mask, sinks, softcap, ALiBi) and stock kernel, with calls
    and est_us (roofline from bytes and FLOPs, K/V conversions of TILE/MMA included). Matmul records
    are left to `census ingest`.

    \b
    Examples:
      ggml-dispatch census attention decode-d16384.jsonl --max-m 16 -o attention.parquet
      ggml-dispatch census attention depth.jsonl --max-m 16 --fill-kv 16384,49152 -o attention.parquet
    """
    fill_kv = _fill_kv(fill_kv_text, max_m)
    fileio.check_output(output, traces)
    agg = aggregate.Aggregator()
    reports: list[trace.FileReport] = []
    for p in traces:
        reports.append(trace.read_trace(p, agg.sink))
        trace.check_counts(agg.tallies, p)
    trace.check_commits(reports, allow_mixed=allow_mixed)
    for f in reports:
        for w in f.warnings:
            _warn(show.safe(w))
    rows = attention.attention_rows(agg.tallies)
    if max_m is not None:
        kept, fill = attention.keep_points(rows, max_m, fill_kv)
        _info(f"--max-m {max_m}: {len(kept)} of {len(rows)} attention points kept")
        if fill_kv:
            at = ", ".join(str(r["n_kv"]) for r in fill) or "none"
            _info(f"--fill-kv: {len(fill)} point(s) of the KV fill kept too (n_kv {at})")
        rows = sorted(kept + fill, key=lambda r: (-r["est_us"], r["M"], r["n_kv"]))
    table = attention.write(rows, output, {str(f.path): f.sha256 for f in reports}, traces[-1])
    total = sum(x["est_us"] for x in rows) or 1.0
    for row in rows[:20]:
        _info(
            f"{row['k_type']}/{row['v_type']} D={row['D_K']}/{row['D_V']} gqa={row['gqa']} M={row['M']} "
            f"n_kv={row['n_kv']} "
            f"{row['stock_route']}: {row['calls']:,} calls, est {row['est_us']:,.1f} us "
            f"({100 * row['est_us'] / total:.1f}%)"
        )
    _info(f"wrote {output} ({table.num_rows} rows)")


def _fill_kv(text: str | None, max_m: int | None) -> tuple[int, ...]:
    if text is None:
        return ()
    if max_m is None:
        raise click.UsageError("--fill-kv adds to what --max-m keeps: give --max-m too")
    return int_list(text, "KV length", param_hint="--fill-kv")


@census.command("from-gguf")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--m",
    "m_values",
    required=True,
    metavar="LIST",
    help="Comma-separated token counts per forward pass, e.g. 1,2,3,4,8,512,1024 (decode, speculative "
    "verify, prefill ubatches). Each weight matmul gets one call per M.",
)
@click.option(
    "--output-rows",
    default=1,
    show_default=True,
    type=Int(1, MAX_TOKENS),
    help="Rows the LM head computes per pass (logits requested); it runs at this M only, not at every M.",
)
@click.option(
    "--gpu",
    default="NVIDIA H200",
    show_default=True,
    help=f"GPU for the roofline estimate, matched by name ({', '.join(estimate.datasheet_names())}).",
)
@click.option(
    "--n-kv",
    type=Int(1, MAX_TOKENS),
    help="Also list attention KQ/KQV matmuls (FlashAttention off) over this many cached tokens; "
    "without it only weight matmuls are declared.",
)
@click.option(
    "--n-ctx",
    type=Int(1, MAX_TOKENS),
    help="KV-cache size in cells for --n-kv (its strides); default: the larger of n_kv and 4096.",
)
@click.option(
    "--kv-type",
    default="f16",
    show_default=True,
    type=click.Choice(["f16", "bf16", "f32"]),
    help="KV-cache type for --n-kv.",
)
@click.option(
    "--cc",
    type=Int(1, INT32_MAX),
    help="Compute capability as ggml encodes it (900) for a GPU "
    "not in the list; with --sm-count it gives a rough fallback estimate.",
)
@click.option("--sm-count", type=Int(1, INT32_MAX), help="SM count for a GPU not in the list.")
@output_option("census.parquet to write.")
def from_gguf_cmd(
    model: Path,
    m_values: str,
    output_rows: int,
    gpu: str,
    n_kv: int | None,
    n_ctx: int | None,
    kv_type: str,
    cc: int | None,
    sm_count: int | None,
    output: Path,
) -> None:
    """A declared-workload census from a GGUF model, without a trace (source = declared).

    Every matmul weight is listed at each M; the LM head (token_embd.weight with tied embeddings) only
    at M = --output-rows; with --n-kv, the attention KQ/KQV of every layer too. Routes are left
    empty: nothing ran.
    """
    fileio.check_output(output, [model])
    try:
        ms = aggregate.parse_m_list(m_values)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--m") from None
    spec = _declared_spec(gpu, cc, sm_count)
    m = gguf_meta.read_gguf(model)
    rows = aggregate.declared_rows(m, ms, output_rows, spec)
    if not rows:
        raise InputError(model, "no matmul weight tensors (blk.N.*.weight, output.weight) in this model")
    declared: dict[str, Any] = {"M": ms, "output_rows": output_rows, "architecture": m.architecture}
    if n_kv is not None:
        ctx = n_ctx if n_ctx is not None else max(n_kv, 4096)
        if ctx < n_kv:
            raise click.BadParameter(f"{ctx} cells cannot hold n_kv = {n_kv}", param_hint="--n-ctx")
        rows += aggregate.declared_attention_rows(m, ms, n_kv, ctx, kv_type, spec)
        declared.update(n_kv=n_kv, n_ctx=ctx, kv_type=kv_type)
    meta = build.metadata(
        inputs={},
        ggufs={str(model): fileio.sha256_file(model)},
        gpu_specs=[spec.as_dict()],
        declared=declared,
    )
    table = build.write(rows, output, meta, source=model)
    hist = aggregate.weight_type_histogram([m])
    _info(
        f"{show.safe(str(model))}: {m.architecture or 'unknown architecture'}, "
        f"{'tied embeddings, ' if m.tied_embeddings else ''}"
        + ", ".join(f"{h['type']} {h['tensors']} tensors" for h in hist)
    )
    _summary(table, meta, output)
    _info(f"wrote {output} ({table.num_rows} rows)")


def _declared_spec(gpu: str, cc: int | None, sm_count: int | None) -> estimate.GpuSpec:
    if (cc is None) != (sm_count is None):
        raise click.UsageError("give --cc and --sm-count together")
    if cc is not None and sm_count is not None:
        return estimate.spec_for(schema.GpuId(gpu, cc, sm_count))
    spec = estimate.lookup_name(gpu)
    if spec is None:
        raise click.BadParameter(
            f"unknown GPU {gpu!r}: use one of {', '.join(estimate.datasheet_names())}, "
            "or give --cc and --sm-count for a rough estimate",
            param_hint="--gpu",
        )
    return spec


@census.command("show")
@click.argument("census_file", type=click.Path(path_type=Path))
@click.option("--top", default=20, show_default=True, type=Int(1), help="Shapes to list per GPU.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
def show_cmd(census_file: Path, top: int, as_json: bool) -> None:
    """Top shapes by estimated time, quant histogram and coverage of a census file."""
    table, meta = build.read(census_file)
    rep = show.report(table, meta, str(census_file), top=top)
    if as_json:
        click.echo(show.to_json(rep))
    else:
        click.echo(show.render_text(rep, top=top), nl=False)


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - convenience for python -m
    census.main(args=list(argv) if argv is not None else None)
