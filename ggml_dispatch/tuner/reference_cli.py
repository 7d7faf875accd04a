"""``ggml-dispatch tune import-reference``: reference timings -> tuning rows (``source = reference``)."""

from __future__ import annotations

from pathlib import Path

import click

from ggml_dispatch import fileio, schema
from ggml_dispatch.artifacts import validators
from ggml_dispatch.errors import InputError
from ggml_dispatch.options import INT32_MAX, Int, output_option
from ggml_dispatch.tuner import reference


@click.command("import-reference")
@click.argument("tsv", type=click.Path(path_type=Path))
@output_option("tuning Parquet file to write (atomically)")
@click.option(
    "--sm-count",
    type=Int(1, INT32_MAX),
    default=None,
    help="SM count of the GPU that was measured; the TSV does not record it (NVIDIA H200: 132)",
)
@click.option("--gpu-name", default=None, help="override the GPU name read from the TSV's first comment")
@click.option(
    "--cc", type=Int(1, INT32_MAX), default=None, help="override the compute capability (ggml: 900)"
)
def import_reference_cmd(
    tsv: Path, output: Path, sm_count: int | None, gpu_name: str | None, cc: int | None
) -> None:
    """Convert reference per-route timings (e.g. samples/reference/h200-mul-mat-routes.tsv) into
    tuning rows with `source = reference`.

    \b
    Each TSV row (test-backend-ops m,n,k = N,M,K; one sample) becomes one tuning row, trial 0,
    status ok. Stock's route at a point is the converter's declared assumption (cc 900: mmvq for
    M <= 8, mmq above), written into anchor_us. Reference rows carry no confidence interval:
    `ggml-dispatch codegen` accepts them only with --reference-margin and never under tables/.
    """
    fileio.check_output(output, [tsv])
    text = validators.read_text(tsv, "a reference TSV (test-backend-ops perf timings)")
    samples = reference.parse_samples(text, tsv)
    identity = reference.parse_identity(text.splitlines())
    if identity is None:
        raise InputError(
            tsv,
            "first comment does not say 'NAME (cc X.Y, driver D, CUDA V), llama.cpp COMMIT'",
            line=1,
        )
    try:
        schema.check_upstream_id(identity.upstream_commit)
    except ValueError as e:
        # only a prefix of the pinned commit is expanded; any other short hash names no tree exactly
        raise InputError(tsv, f"{e}; write the full commit", field="llama.cpp commit") from None
    if gpu_name is not None or cc is not None:
        identity = reference.ReferenceIdentity(
            gpu_name=gpu_name if gpu_name is not None else identity.gpu_name,
            cc=cc if cc is not None else identity.cc,
            driver=identity.driver,
            cuda_version=identity.cuda_version,
            upstream_commit=identity.upstream_commit,
        )
    if sm_count is None:
        raise click.UsageError("the TSV does not record the SM count: pass --sm-count (NVIDIA H200: 132)")
    rows = reference.to_tuning_rows(samples, identity, sm_count)
    table = reference.rows_to_table(rows)
    meta = fileio.base_metadata(
        schema.TUNING_SCHEMA,
        input_hashes={str(tsv): fileio.sha256_file(tsv)},
        upstream_commit=identity.upstream_commit,
        source=schema.Source.REFERENCE.value,
        reference_assumptions={
            "stock": reference.STOCK_ASSUMPTION,
            "sm_count": f"declared by the caller: {sm_count}",
            "route_ran": "the forced route, not verified by the reference build",
            "layout": "MUL_MAT weight layout, B = 1, src1 f32 (test-backend-ops perf cases)",
        },
    )
    fileio.write_parquet(table, output, meta)
    unanchored = sum(1 for r in rows if r["anchor_us"] is None)
    click.echo(
        f"{output}: {len(rows)} reference rows ({identity.gpu_name}, cc {identity.cc}, {sm_count} SMs, "
        f"upstream {identity.upstream_commit[:12]}); {unanchored} without a stock sample at their point"
    )
    click.echo(f"assumed stock: {reference.STOCK_ASSUMPTION}", err=True)
