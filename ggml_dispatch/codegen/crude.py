"""The one-threshold crude rule as a table: the end-to-end A/B baseline a measured table has to beat.

``samples/reference/h200-e2e-crude-rule.md`` states it: "at the top of ggml_cuda_mul_mat, quantized
weights with M >= 384 go to cuBLAS and 5 <= M <= 8 go to mmq; everything else stock." As a table that is
two per-type default rules (N = K = 0) for every quantized weight type, weight layout only, so it is
compiled into a second build of the same tree exactly as a measured table is, and the A/B compares
builds that differ only in their table. Its provenance says ``declared``: it is not a measurement, and
it is never written under ``tables/``.

    ggml-dispatch codegen-crude -o DIR [--gpu-name NAME --cc CC --sm-count N]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import click

from ggml_dispatch import fileio, schema
from ggml_dispatch.codegen import render
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError
from ggml_dispatch.options import output_option

RULE_SOURCE: Final = "samples/reference/h200-e2e-crude-rule.md"
# the GPU the rule was written and measured on (an H100 SXM is also cc 900 with 132 SMs)
DEFAULT_GPU: Final = schema.GpuId("NVIDIA H200", 900, 132)
MMQ_M: Final = (5, 8)
CUBLAS_M_LO: Final = 384
M_MAX: Final = 2**31 - 1  # "M >= 384": every M a ggml-cuda int32 grid dimension can take
# q8_1 and q8_K are ggml's activation formats: no model stores weights in them
ACTIVATION_TYPES: Final = frozenset({"q8_1", "q8_K"})


def weight_types() -> list[str]:
    """The quantized ggml types a model's weights can use, sorted by name."""
    return sorted(
        t.name for t in schema.GGML_TYPES.values() if t.quantized and t.name not in ACTIVATION_TYPES
    )


def crude_table(
    gpu: schema.GpuId = DEFAULT_GPU, upstream_commit: str = schema.PINNED_UPSTREAM_COMMIT
) -> dict[str, Any]:
    """The crude rule as a validated table dict for ``gpu``."""
    rules: list[dict[str, Any]] = []
    for typ in weight_types():
        base = {
            "op": "MUL_MAT",
            "layout": "weight",
            "src0_type": typ,
            "src1_type": "f32",
            "N": 0,
            "K": 0,
            "B": 1,
        }
        rules.append(
            {**base, "M_lo": MMQ_M[0], "M_hi": MMQ_M[1], "config": "mmq", "route": "mmq", "kind": "declared"}
        )
        rules.append(
            {
                **base,
                "M_lo": CUBLAS_M_LO,
                "M_hi": M_MAX,
                "config": "cublas",
                "route": "cublas",
                "kind": "declared",
            }
        )
    t = tbl.empty_table()
    t["gpu"] = {"name": gpu.name, "cc": gpu.cc, "sm_count": gpu.sm_count}
    t["upstream_commit"] = upstream_commit
    t["provenance"] = {"source": tbl.SOURCE_DECLARED, "rule": RULE_SOURCE}
    t["rules"] = rules
    return tbl.validate(t)


def write(out_dir: Path, table: dict[str, Any]) -> tuple[Path, Path]:
    """``out_dir/table.json`` and its header, both or neither; never under ``tables/``."""
    if "tables" in out_dir.resolve().parts:
        raise InputError(
            out_dir, "a declared (crude-rule) table is never written under tables/ (measured only)"
        )
    tj, th = out_dir / tbl.TABLE_FILENAME, out_dir / tbl.HEADER_FILENAME
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(out_dir, "is not a folder")
    for p in (tj, th):
        if p.exists() and not p.is_file():
            raise InputError(p, "exists and is not a file")
    text, header = tbl.dumps(table), render.render_header(table)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with fileio.atomic_path(tj) as a, fileio.atomic_path(th) as b:
            a.write_text(text, encoding="utf-8")
            b.write_text(header, encoding="utf-8")
    except OSError as e:
        raise InputError(out_dir, f"cannot write: {e.strerror or e}") from None
    return tj, th


def _printable(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value or not value.isprintable():
        raise click.BadParameter(f"{value!r}: needs printable characters (no newline or escape)")
    return value


def _commit(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return schema.check_upstream_id(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("codegen-crude")
@output_option(
    "folder to write table.json and ggml-dispatch-table.h into (not under tables/)",
    folder=True,
    dest="out_dir",
)
@click.option(
    "--gpu-name",
    default=DEFAULT_GPU.name,
    show_default=True,
    callback=_printable,
    help="GPU the table applies to",
)
@click.option(
    "--cc",
    default=DEFAULT_GPU.cc,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="its cc (900 = 9.0)",
)
@click.option(
    "--sm-count",
    default=DEFAULT_GPU.sm_count,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="its SM count",
)
@click.option(
    "--upstream-commit",
    default=schema.PINNED_UPSTREAM_COMMIT,
    show_default=True,
    callback=_commit,
    help="llama.cpp commit the table is stamped with",
)
def crude_cmd(out_dir: Path, gpu_name: str, cc: int, sm_count: int, upstream_commit: str) -> None:
    """Write the one-threshold crude rule as table.json + header: the A/B baseline.

    \b
    Quantized weights (weight layout) with M >= 384 go to cuBLAS and 5 <= M <= 8 go to mmq;
    everything else stays stock (samples/reference/h200-e2e-crude-rule.md). Declared, not measured:
    compile it into a second build with `ggml-dispatch install --table DIR/table.json`.
    """
    t = crude_table(schema.GpuId(gpu_name, cc, sm_count), upstream_commit)
    tj, th = write(out_dir, t)
    click.echo(
        f"crude rule for {gpu_name!r} (cc {cc}, {sm_count} SMs): {len(t['rules'])} declared rules over "
        f"{len(weight_types())} quantized weight types "
        f"(M {MMQ_M[0]}..{MMQ_M[1]} mmq, M >= {CUBLAS_M_LO} cublas)"
    )
    click.echo(f"wrote {tj} and {th} (table sha256 {tbl.table_hash(t)[:16]})")
