"""codegen.crude / ``ggml-dispatch codegen-crude``: the crude rule of
samples/reference/h200-e2e-crude-rule.md as a table, checked rule by rule and through the compiled header."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggml_dispatch import schema
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import crude, render
from ggml_dispatch.codegen import table as tbl

REPO = Path(__file__).resolve().parent.parent
GCC = ["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]
H200 = schema.GpuId("NVIDIA H200", 900, 132)
SHAPES = ((4096, 4096), (14336, 4096), (1024, 4096), (17408, 5120), (151936, 896))
MS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 64, 256, 383, 384, 385, 512, 2048, 2**20, 2**31 - 1)


def reference_rule(op: str, layout: str, src0_type: str, M: int) -> str | None:
    """The sentence of the reference file, written out independently of codegen.crude."""
    t = schema.GGML_TYPES[src0_type]
    if op != "MUL_MAT" or layout != "weight" or not t.quantized or src0_type in ("q8_1", "q8_K"):
        return None
    if M >= 384:
        return "cublas"
    if 5 <= M <= 8:
        return "mmq"
    return None


def test_the_reference_file_states_the_rule_the_table_encodes() -> None:
    text = (REPO / crude.RULE_SOURCE).read_text()
    assert (
        "quantized weights with M >= 384 go to cuBLAS and\n  5 <= M <= 8 go to mmq; everything else stock"
        in text
    )


def test_rules_are_exactly_the_reference_rule() -> None:
    t = crude.crude_table()
    assert t["gpu"] == {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    assert t["provenance"] == {"source": "declared", "rule": crude.RULE_SOURCE}
    assert t["upstream_commit"] == schema.PINNED_UPSTREAM_COMMIT and t["refused"] == []
    types = crude.weight_types()
    assert {"q4_0", "q4_K", "q5_K", "q6_K", "q8_0", "iq4_xs", "mxfp4"} <= set(types)
    assert not {"f32", "f16", "bf16", "q8_1", "q8_K", "i32"} & set(types)
    assert len(t["rules"]) == 2 * len(types)
    for r in t["rules"]:
        assert (r["op"], r["layout"], r["src1_type"], r["N"], r["K"], r["B"]) == (
            "MUL_MAT",
            "weight",
            "f32",
            0,
            0,
            1,
        )
        assert (r["M_lo"], r["M_hi"], r["route"]) in {(5, 8, "mmq"), (384, 2**31 - 1, "cublas")}
    for typ in schema.GGML_TYPES:
        for layout in ("weight", "attention"):
            for N, K in SHAPES:
                for M in MS:
                    got = tbl.lookup(t, H200, "MUL_MAT", layout, typ, "f32", M, N, K, 1)
                    assert got == reference_rule("MUL_MAT", layout, typ, M), (typ, layout, M, N, K)
    # the rule never reaches MUL_MAT_ID, and applies on its GPU only (an H100 SXM is cc 900 / 132 SMs too)
    assert tbl.lookup(t, H200, "MUL_MAT_ID", "expert", "q4_K", "f32", 512, 4096, 4096, 1) is None
    assert (
        tbl.lookup(
            t,
            schema.GpuId("NVIDIA H100 80GB HBM3", 900, 132),
            "MUL_MAT",
            "weight",
            "q4_K",
            "f32",
            512,
            1,
            1,
            1,
        )
        is None
    )


DRIVER = r"""
#include "ggml-dispatch-table.h"
#include <stdio.h>
/* Each stdin line: op, layout, src0_type, M, N, K. Prints the route code the table gives (0 = stock). */
int main(void) {
    int op, layout, s0;
    long long M, N, K;
    printf("%d\n", ggml_dispatch_table_gpu_matches(ggml_dispatch_table_gpu_name, GGML_DISPATCH_TABLE_GPU_CC,
                                                   GGML_DISPATCH_TABLE_GPU_SM_COUNT));
    while (scanf("%d %d %d %lld %lld %lld", &op, &layout, &s0, &M, &N, &K) == 6) {
        const int64_t k[GGML_DISPATCH_TABLE_KEY_SLOTS] = { (int64_t) N, (int64_t) K, 1 }; /* MUL_MAT: B = 1 */
        const int     r = ggml_dispatch_table_lookup(op, layout, s0, 0, k, (int64_t) M);
        printf("%d\n", r);
    }
    return 0;
}
"""


def test_rendered_header_compiles_and_answers_the_reference_rule(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["codegen-crude", "-o", str(tmp_path / "crude")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "50 declared rules over 25 quantized weight types" in res.output
    header = (tmp_path / "crude" / tbl.HEADER_FILENAME).read_text()
    t = tbl.load(tmp_path / "crude" / tbl.TABLE_FILENAME)
    assert header == render.render_header(t) and tbl.dumps(t) == tbl.dumps(crude.crude_table())
    (tmp_path / "driver.c").write_text(DRIVER)
    exe = tmp_path / "driver"
    cc = subprocess.run(
        [*GCC, "-I", str(tmp_path / "crude"), str(tmp_path / "driver.c"), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert cc.returncode == 0, cc.stderr
    queries, want = [], []
    for op, layout in (("MUL_MAT", "weight"), ("MUL_MAT", "attention"), ("MUL_MAT_ID", "expert")):
        for typ in schema.GGML_TYPES.values():
            for N, K in SHAPES[:2]:
                for M in MS:
                    queries.append(
                        f"{schema.OP_CODES[schema.Op(op)]} {schema.LAYOUT_CODES[schema.Layout(layout)]} "
                        f"{typ.id} {M} {N} {K}"
                    )
                    route = reference_rule(op, layout, typ.name, M)
                    want.append(schema.ROUTE_CODES[schema.Route(route)] if route else 0)
    out = subprocess.run(
        [str(exe)], input="\n".join(queries) + "\n", capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "1"  # the table's own GPU identity matches
    got = [int(x) for x in out[1:]]
    assert len(got) == len(want) and got == want
    assert {schema.ROUTE_CODES[schema.Route.MMQ], schema.ROUTE_CODES[schema.Route.CUBLAS], 0} == set(got)


def test_gpu_options_stamp_the_table(tmp_path: Path) -> None:
    args = ["codegen-crude", "-o", str(tmp_path / "c"), "--gpu-name", "NVIDIA H100 80GB HBM3", "--cc", "900",
            "--sm-count", "132"]  # fmt: skip
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    t = tbl.load(tmp_path / "c" / "table.json")
    assert t["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "cc": 900, "sm_count": 132}
    assert tbl.canonicalize(t)["rules"] == tbl.canonicalize(crude.crude_table())["rules"]
    header = (tmp_path / "c" / tbl.HEADER_FILENAME).read_text()
    assert '"NVIDIA H100 80GB HBM3"' in header


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpu-name", "NVIDIA\nH200"], "Invalid value for '--gpu-name'"),
        (["--gpu-name", ""], "Invalid value for '--gpu-name'"),
        (["--cc", "0"], "Invalid value for '--cc'"),
        (["--sm-count", "-3"], "Invalid value for '--sm-count'"),
        (["--upstream-commit", "0c1e570"], "Invalid value for '--upstream-commit'"),
    ],
)
def test_bad_options_are_refused_and_nothing_is_written(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    res = CliRunner().invoke(main, ["codegen-crude", "-o", str(tmp_path / "c"), *extra])
    assert res.exit_code == 2 and message in res.output
    assert not (tmp_path / "c").exists()


def test_never_under_tables_and_never_over_a_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["codegen-crude", "-o", str(tmp_path / "tables" / "x")])
    assert res.exit_code == 2 and "never written under tables/" in res.output
    assert not (tmp_path / "tables").exists()
    f = tmp_path / "file"
    f.write_text("keep")
    res = CliRunner().invoke(main, ["codegen-crude", "-o", str(f)])
    assert res.exit_code == 2 and f.read_text() == "keep"
    d = tmp_path / "d"
    (d / tbl.TABLE_FILENAME).mkdir(parents=True)
    res = CliRunner().invoke(main, ["codegen-crude", "-o", str(d)])
    assert res.exit_code == 2 and "table.json: exists and is not a file" in res.output
    assert not (d / tbl.HEADER_FILENAME).exists()
    assert "Traceback" not in res.output
