"""Differential test: the rendered header, compiled by gcc (C11) and g++ (C++17) into a small driver,
answers 10,000 queries exactly as the Python lookup does. At least half the queries sit on rule edges
(a-1, a, b, b+1), on measured points, or carry a GPU identity that must not match."""

from __future__ import annotations

import dataclasses
import itertools
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_codegen_support import frame, reference_tsv, trials

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import decide, render
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.tuner import reference

GPU = schema.GpuId('NVIDIA H200 "SXM" \\ ??= */ é', 900, 132)
N_QUERIES = 10_000

DRIVER = r"""
#include "ggml-dispatch-table.h"
#include <stdio.h>
#include <string.h>

/* Each stdin line: hex(name) or "-", cc, sm_count, op, layout, type0, type1, k[0..4], M.
   Prints: gpu_matches, lookup (ungated), gated configuration code. */
int main(void) {
    static char hex[4096];
    static char name[2048];
    int cc, sm, op, layout, s0, s1;
    long long k[5], M;
    while (scanf("%4095s %d %d %d %d %d %d %lld %lld %lld %lld %lld %lld", hex, &cc, &sm, &op, &layout, &s0,
                 &s1, &k[0], &k[1], &k[2], &k[3], &k[4], &M) == 13) {
        size_t n = 0;
        if (strcmp(hex, "-") != 0) {
            for (size_t i = 0; hex[2 * i] != 0 && hex[2 * i + 1] != 0; ++i) {
                unsigned v = 0;
                sscanf(hex + 2 * i, "%2x", &v);
                name[n++] = (char) v;
            }
        }
        name[n] = 0;
        int64_t slots[GGML_DISPATCH_TABLE_KEY_SLOTS];
        for (int i = 0; i < GGML_DISPATCH_TABLE_KEY_SLOTS; ++i) {
            slots[i] = (int64_t) k[i];
        }
        const int m = ggml_dispatch_table_gpu_matches(name, cc, sm);
        const int r = ggml_dispatch_table_lookup(op, layout, s0, s1, slots, (int64_t) M);
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
    # two MUL_MAT_ID shapes of one type and size class, each point measured in every routing bucket:
    # routing-0 rules (MUL_MAT_ID gets no per-type or class defaults: codegen.moe)
    for (N, K), (M, speed) in itertools.product(
        ((2880, 2880), (4096, 2880)), ((4, {"mmq": 1.0, "mmvq": 1.5}), (512, {"mmq": 1.0, "mmf": 1.5}))
    ):
        id_rows = trials(
            speed=speed,
            M=M,
            N=N,
            K=K,
            op="MUL_MAT_ID",
            layout="expert",
            src0_type="mxfp4",
            gpu=GPU,
            n=3,
        )
        rows += [r | {"routing": b} for b in (1, 2, 3) for r in id_rows]
    routing = [r.get("routing") for r in rows]
    df = frame(rows)
    is_id = df["op"] == "MUL_MAT_ID"
    df["E"] = is_id.map({True: 32, False: 1})  # MUL_MAT_ID's key has E and U (op-specific columns)
    df["U"] = is_id.map({True: 4, False: 1})
    df["routing"] = routing  # the bucket each MUL_MAT_ID case measured
    d = decide.decide(df, decide.Params(min_trials=3, resamples=300))
    return tbl.build_table(d, tuning_sha256="ef" * 32), d


Query = tuple[schema.GpuId, Any, int]  # (GPU, shape key of any op, M)


def _bump(key: Any, field: str, by: int) -> Any:
    return dataclasses.replace(key, **{field: getattr(key, field) + by})


def queries(t: dict[str, Any], d: decide.Decisions, rng: random.Random) -> tuple[list[Query], int]:
    """(gpu, key, M) tuples, and how many are edge queries."""
    edge: list[Query] = []
    for r in t["rules"]:
        key = registry.shape_key(r)
        keys = [key]
        if r.get("shapes"):
            keys += [dataclasses.replace(key, N=n, K=k) for n, k in [*r["shapes"], (5120, 5120)]]
        if tbl.is_class(r):  # the edges of a size class's N*K range
            hi = min(r["NK_hi"], 1 << 40)
            nks = [(1, r["NK_lo"] - 1), (1, r["NK_lo"]), (1, hi), (1, hi + 1), (2, r["NK_lo"] // 2)]
            keys += [dataclasses.replace(key, N=n, K=k) for n, k in nks]
        for k in keys:
            near = [k, _bump(k, k.INT_FIELDS[-1], 1), _bump(k, "N", 1), _bump(k, "K", -1)]
            for M in (r["M_lo"] - 1, r["M_lo"], r["M_hi"], r["M_hi"] + 1):
                edge += [(GPU, q, M) for q in near]
    for key, by_m in d.evals.items():
        # a MUL_MAT_ID point's evaluations are per routing bucket; the runtime asks at routing 0
        edge += [(GPU, k, M) for M in by_m for k in dict.fromkeys((key, registry.runtime_key(key)))]
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
    # every rule is asked at least once on its own key, M and GPU (the shuffle keeps what else survives)
    must: list[Query] = [(GPU, registry.shape_key(r), int(r["M_lo"])) for r in t["rules"]]
    edge = must + edge[: N_QUERIES * 3 // 5 - len(must)]
    types = ["q4_K", "q6_K", "q8_0", "f16", "mxfp4", "q5_K", "f32"]
    dims = sorted({k.N for k in d.evals} | {k.K for k in d.evals} | {128, 512, 2880, 5120, 1})
    rand: list[Query] = []
    while len(edge) + len(rand) < N_QUERIES:
        op = rng.choice(["MUL_MAT", "MUL_MAT", "MUL_MAT_ID"])
        common = (
            op,
            rng.choice(["weight", "weight", "attention", "expert"]),
            rng.choice(types),
            rng.choice(["f32", "f32", "f16"]),
            rng.choice(dims),
            rng.choice(dims),
        )
        key: Any
        if op == "MUL_MAT":
            key = registry.ShapeKey(*common, rng.choice([1, 1, 8, 32]))
        else:
            key = registry.MulMatIdKey(*common, rng.choice([32, 32, 8]), rng.choice([4, 4, 2]), 0)
        M = rng.choice([rng.randint(1, 16), rng.randint(1, 2048), rng.randint(1, 1 << 40)])
        rand.append((GPU if rng.random() < 0.9 else rng.choice(mismatches), key, M))
    return edge + rand, len(edge)


def dims_of(d: decide.Decisions) -> set[int]:
    return {k.N for k in d.evals}


def _line(q: Query) -> str:
    gpu, key, M = q
    name = gpu.name.encode("utf-8").hex() or "-"
    return " ".join(str(x) for x in (name, gpu.cc, gpu.sm_count, *key.codes(), M))


def _code(config: str | None) -> int:
    return registry.Config.parse(config).code if config else 0


def _python(t: dict[str, Any], q: Query) -> str:
    gpu, key, M = q
    m = int(tbl.gpu_matches(t, gpu))
    ungated = tbl.lookup_key(t, tbl.table_gpu(t), key, M) if t["rules"] else None
    gated = tbl.lookup_key(t, gpu, key, M)
    return f"{m} {_code(ungated)} {_code(gated)}"


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
    id_rules = [r for r in t["rules"] if r["op"] == "MUL_MAT_ID"]
    assert id_rules and all(r["routing"] == 0 and r["kind"] == "measured" and r["buckets"] for r in id_rules)
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
    assert {o.split()[2] for o in out} == {"0", "2", "3", "4", "5"}
    default_hits = [
        q for q, o in zip(qs, out, strict=True) if o.split()[2] != "0" and q[1].N not in dims_of(d)
    ]
    assert default_hits  # some answers came from a per-type default (an (N, K) never measured)
    # and some from size-class defaults (MUL_MAT only): no exact rule answers, a class rule does
    exact = {**t, "rules": [r for r in t["rules"] if not registry.shape_key(r).is_default]}
    with_class = {**t, "rules": [r for r in t["rules"] if r in exact["rules"] or tbl.is_class(r)]}
    class_hits = {
        q[1].op
        for q in qs
        if tbl.lookup_key(exact, *q) is None and tbl.lookup_key(with_class, *q) is not None
    }
    assert class_hits == {"MUL_MAT"}


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
