"""Differential test: the rendered header, compiled by gcc (C11) and g++ (C++17) into a small driver,
answers 10,000 queries exactly as the Python lookup does. At least half the queries sit on rule edges
(a-1, a, b, b+1), on measured points, or carry a GPU identity that must not match."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_codegen_support import frame, reference_tsv, trials

from codegen import decide, render
from codegen import table as tbl
from ggml_dispatch import schema
from tuner import reference

GPU = schema.GpuId('NVIDIA H200 "SXM" \\ ??= */ é', 900, 132)
N_QUERIES = 10_000

DRIVER = r"""
#include "ggml-dispatch-table.h"
#include <stdio.h>
#include <string.h>

/* Each stdin line: hex(name) or "-", cc, sm_count, op, layout, src0_type, src1_type, M, N, K, B.
   Prints: gpu_matches, lookup (ungated), gated route. */
int main(void) {
    static char hex[4096];
    static char name[2048];
    int cc, sm, op, layout, s0, s1;
    long long M, N, K, B;
    while (scanf("%4095s %d %d %d %d %d %d %lld %lld %lld %lld", hex, &cc, &sm, &op, &layout, &s0, &s1, &M,
                 &N, &K, &B) == 11) {
        size_t n = 0;
        if (strcmp(hex, "-") != 0) {
            for (size_t i = 0; hex[2 * i] != 0 && hex[2 * i + 1] != 0; ++i) {
                unsigned v = 0;
                sscanf(hex + 2 * i, "%2x", &v);
                name[n++] = (char) v;
            }
        }
        name[n] = 0;
        const int m = ggml_dispatch_table_gpu_matches(name, cc, sm);
        const int r = ggml_dispatch_table_lookup(op, layout, s0, s1, (int64_t) M, (int64_t) N, (int64_t) K,
                                                 (int64_t) B);
        printf("%d %d %d\n", m, r, m ? r : 0);
    }
    return 0;
}
"""


def rich_table() -> tuple[dict[str, Any], decide.Decisions]:
    """Exact rules in several keys and layouts, adjacent routes, and per-type defaults."""
    rows: list[dict[str, Any]] = []
    seed = 0
    for typ in ("q4_K", "q6_K", "q8_0"):
        for N, K in ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)):
            for M in (1, 2, 4, 8, 16, 64, 256, 512, 1024):
                seed += 1
                if M <= 2:
                    speed = {"mmvq": 1.0, "mmq": 0.7}
                elif M <= 8:
                    speed = {"mmvq": 1.0, "mmq": 1.4 if (N + M) % 3 else 1.01}
                elif M <= 64:
                    speed = {"mmq": 1.0, "cublas": 0.6}
                else:
                    speed = {"mmq": 1.0, "cublas": 1.3 if (K + M + len(typ)) % 5 else 0.9}
                rows += trials(speed=speed, M=M, N=N, K=K, src0_type=typ, gpu=GPU, n=3, seed=seed)
    for B in (8, 32):
        for M in (1, 64, 512):
            rows += trials(
                speed={"mmvf": 1.0, "cublas": 1.6},
                M=M,
                N=128,
                K=512,
                B=B,
                layout="attention",
                src0_type="f16",
                gpu=GPU,
                n=3,
            )
    for M, speed in ((4, {"mmq": 1.0, "mmvq": 1.5}), (512, {"mmq": 1.0, "cublas": 1.5})):
        rows += trials(
            speed=speed,
            M=M,
            N=2880,
            K=2880,
            op="MUL_MAT_ID",
            layout="expert",
            src0_type="mxfp4",
            gpu=GPU,
            n=3,
        )
    d = decide.decide(frame(rows), decide.Params(min_trials=3, resamples=300))
    return tbl.build_table(d, tuning_sha256="ef" * 32), d


def queries(t: dict[str, Any], d: decide.Decisions, rng: random.Random) -> tuple[list[tuple[Any, ...]], int]:
    """(gpu, op, layout, src0_type, src1_type, M, N, K, B) tuples, and how many are edge queries."""
    edge: list[tuple[Any, ...]] = []
    measured_nk = {(k.src0_type, k.N, k.K) for k in d.evals}
    for r in t["rules"]:
        base = (r["op"], r["layout"], r["src0_type"], r["src1_type"])
        nks = [(r["N"], r["K"])]
        if r["N"] == 0:
            nks += [tuple(s) for s in r["shapes"]] + [(5120, 5120), (0, 0)]
        if tbl.is_class(r):  # the edges of a size class's N*K range
            hi = min(r["NK_hi"], 1 << 40)
            nks += [(1, r["NK_lo"] - 1), (1, r["NK_lo"]), (1, hi), (1, hi + 1), (2, r["NK_lo"] // 2)]
        for N, K in nks:
            for M in (r["M_lo"] - 1, r["M_lo"], r["M_hi"], r["M_hi"] + 1):
                for dn, dk, db in ((0, 0, 0), (0, 0, 1), (1, 0, 0), (0, -1, 0)):
                    edge.append((GPU, *base, M, N + dn, K + dk, r["B"] + db))
    for key, by_m in d.evals.items():
        for M in by_m:
            edge.append((GPU, key.op, key.layout, key.src0_type, key.src1_type, M, key.N, key.K, key.B))
    mismatches = [
        schema.GpuId("NVIDIA H200", 900, 132),
        schema.GpuId(GPU.name + " ", 900, 132),
        schema.GpuId(GPU.name[:-1], 900, 132),
        schema.GpuId(GPU.name.upper(), 900, 132),
        schema.GpuId(GPU.name, 890, 132),
        schema.GpuId(GPU.name, 900, 114),
        schema.GpuId("", 900, 132),
    ]
    edge += [(g, *q[1:]) for q in list(edge) for g in mismatches]
    rng.shuffle(edge)
    edge = edge[: N_QUERIES * 3 // 5]
    types = ["q4_K", "q6_K", "q8_0", "f16", "mxfp4", "q5_K", "f32"]
    dims = sorted({n for _, n, _ in measured_nk} | {k for _, _, k in measured_nk} | {128, 512, 2880, 5120, 1})
    rand = []
    while len(edge) + len(rand) < N_QUERIES:
        rand.append(
            (
                GPU if rng.random() < 0.9 else rng.choice(mismatches),
                rng.choice(["MUL_MAT", "MUL_MAT", "MUL_MAT_ID"]),
                rng.choice(["weight", "weight", "attention", "expert"]),
                rng.choice(types),
                rng.choice(["f32", "f32", "f16"]),
                rng.choice([rng.randint(1, 16), rng.randint(1, 2048), rng.randint(1, 1 << 40)]),
                rng.choice(dims),
                rng.choice(dims),
                rng.choice([1, 1, 8, 32]),
            )
        )
    return edge + rand, len(edge)


def dims_of(d: decide.Decisions) -> set[int]:
    return {k.N for k in d.evals}


def _line(q: tuple[Any, ...]) -> str:
    gpu, op, layout, s0, s1, M, N, K, B = q
    name = gpu.name.encode("utf-8").hex() or "-"
    codes = (
        schema.OP_CODES[schema.Op(op)],
        schema.LAYOUT_CODES[schema.Layout(layout)],
        schema.GGML_TYPES[s0].id,
        schema.GGML_TYPES[s1].id,
    )
    return " ".join(str(x) for x in (name, gpu.cc, gpu.sm_count, *codes, M, N, K, B))


def _python(t: dict[str, Any], q: tuple[Any, ...]) -> str:
    gpu = q[0]
    m = int(tbl.gpu_matches(t, gpu))
    ungated = tbl.lookup(t, tbl.table_gpu(t), *q[1:]) if t["rules"] else None
    gated = tbl.lookup(t, gpu, *q[1:])
    code = schema.ROUTE_CODES[schema.Route(ungated)] if ungated else 0
    gcode = schema.ROUTE_CODES[schema.Route(gated)] if gated else 0
    return f"{m} {code} {gcode}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("compiler", "suffix"),
    [
        (["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"], ".c"),
        (["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1"], ".cpp"),
    ],
)
def test_c_lookup_agrees_with_python(compiler: list[str], suffix: str, tmp_path: Path) -> None:
    t, d = rich_table()
    assert len(t["rules"]) >= 30 and any(r["N"] == 0 for r in t["rules"])
    assert any(tbl.is_class(r) for r in t["rules"]) and any(r["kind"] == "interpolated" for r in t["rules"])
    assert {r["layout"] for r in t["rules"]} == {"weight", "attention", "expert"}
    qs, n_edge = queries(t, d, random.Random(20261130))
    assert len(qs) == N_QUERIES and n_edge >= N_QUERIES // 2
    (tmp_path / tbl.HEADER_FILENAME).write_text(render.render_header(t))
    (tmp_path / f"driver{suffix}").write_text(DRIVER)
    exe = tmp_path / "driver"
    build = subprocess.run(
        [*compiler, "-I", str(tmp_path), str(tmp_path / f"driver{suffix}"), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    out = subprocess.run(
        [str(exe)], input="\n".join(_line(q) for q in qs) + "\n", capture_output=True, text=True, check=True
    ).stdout.splitlines()
    expected = [_python(t, q) for q in qs]
    assert len(out) == len(expected)
    diffs = [(q, o, e) for q, o, e in zip(qs, out, expected, strict=True) if o != e]
    assert not diffs, diffs[:5]
    # the run exercised every outcome: matches and mismatches, stock, exact rules and defaults
    assert {o.split()[0] for o in out} == {"0", "1"}
    assert {o.split()[2] for o in out} == {"0", "3", "4", "5"}
    default_hits = [q for q, o in zip(qs, out, strict=True) if o.split()[2] != "0" and q[6] not in dims_of(d)]
    assert default_hits  # some answers came from a per-type default (an (N, K) never measured)


@pytest.mark.slow
def test_reference_table_agrees_with_python(tmp_path: Path) -> None:
    text = reference_tsv().read_text()
    ident = reference.parse_identity(text.splitlines())
    assert ident is not None
    rows = reference.to_tuning_rows(reference.parse_samples(text, "tsv"), ident, 132)
    d = decide.decide(frame(rows), decide.Params(reference_margin=0.10))
    t = tbl.build_table(d, tuning_sha256="0" * 64)
    qs, _ = queries(t, d, random.Random(1))
    qs = [(schema.GpuId("NVIDIA H200", 900, 132) if q[0] == GPU else q[0], *q[1:]) for q in qs]
    (tmp_path / tbl.HEADER_FILENAME).write_text(render.render_header(t))
    (tmp_path / "d.c").write_text(DRIVER)
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
            str(tmp_path),
            str(tmp_path / "d.c"),
            "-o",
            str(tmp_path / "d"),
        ],
        check=True,
    )
    out = subprocess.run(
        [str(tmp_path / "d")],
        input="\n".join(_line(q) for q in qs) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [_python(t, q) for q in qs]
