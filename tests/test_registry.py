"""The registry (ggml_dispatch/registry.py) against the pinned tree's ggml.h / ggml.c, its configuration
forms, and the generated ggml-dispatch-codes.h: compiled by gcc (C11) and g++ (C++17), it answers what
the Python registry answers for every legal configuration and for malformed ones."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from ggml_dispatch import codes, fetch, registry, schema

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ggml_h() -> str:
    return (fetch.llama_cpp_dir() / "ggml" / "include" / "ggml.h").read_text()


def _enum(text: str, name: str) -> dict[str, int]:
    body = re.search(rf"enum {name} \{{(.*?)\}};", text, re.S)
    assert body, name
    values: dict[str, int] = {}
    nxt = 0
    for line in body.group(1).splitlines():
        line = line.split("//")[0].strip().rstrip(",")
        m = re.fullmatch(r"([A-Z0-9_]+)(?:\s*=\s*(\d+))?", line)
        if not m:
            continue
        nxt = int(m.group(2)) if m.group(2) else nxt
        values[m.group(1)] = nxt
        nxt += 1
    return values


def test_ops_are_the_pinned_trees_ops(ggml_h: str) -> None:
    ops = _enum(ggml_h, "ggml_op")
    assert ops["GGML_OP_NONE"] == 0 and len(ops) > 50
    for spec in registry.OPS.values():
        assert spec.ggml_op in ops, spec.ggml_op
        assert spec.ggml_op == f"GGML_OP_{spec.op.value}"
    assert sorted(s.code for s in registry.OPS.values()) == list(range(len(registry.OPS)))


def test_types_are_the_pinned_trees_types(ggml_h: str) -> None:
    types = _enum(ggml_h, "ggml_type")
    count = types.pop("GGML_TYPE_COUNT")
    assert {f"GGML_TYPE_{t.name.upper()}": t.id for t in registry.GGML_TYPES.values()} == types
    assert max(types.values()) == count - 1
    # the names as ggml_type_name spells them (ggml.c's type_traits)
    ggml_c = (fetch.llama_cpp_dir() / "ggml" / "src" / "ggml.c").read_text()
    traits = dict(re.findall(r"\[(GGML_TYPE_[A-Z0-9_]+)\]\s*=\s*\{\s*\.type_name\s*=\s*\"([^\"]+)\"", ggml_c))
    for t in registry.GGML_TYPES.values():
        assert traits[f"GGML_TYPE_{t.name.upper()}"] == t.name
    assert schema.GGML_TYPES is registry.GGML_TYPES


def test_schema_names_come_from_the_registry() -> None:
    assert schema.Route is registry.Route and schema.Op is registry.Op and schema.Layout is registry.Layout
    assert {r: s.code for r, s in registry.ROUTES.items()} == schema.ROUTE_CODES
    assert frozenset(registry.TRACE_ROUTE_CODES) == schema.TRACE_ROUTES
    assert schema.SHAPE_KEY == ("op", "layout", "src0_type", "src1_type", "N", "K", "B")
    assert [registry.route_names_by_code()[c] for c in range(registry.ROUTE_COUNT)] == [
        "stock",
        *[r.value for r in sorted(registry.Route, key=lambda r: registry.ROUTES[r].code)],
    ]


def _all_configs() -> list[registry.Config]:
    out = []
    for route, spec in registry.ROUTES.items():
        choices = [[None, *p.values] for p in spec.params]
        for values in itertools.product(*choices):
            given = {p.name: v for p, v in zip(spec.params, values, strict=True) if v is not None}
            out.append(registry.Config.of(route, given))
    return out


def test_config_text_and_code_round_trip() -> None:
    configs = _all_configs()
    assert len({c.code for c in configs}) == len(configs)  # one code per configuration
    for c in configs:
        assert registry.Config.parse(str(c)) == c and registry.Config.from_code(c.code) == c
        assert c.code & registry.ROUTE_CODE_MASK == registry.ROUTES[str(c.route)].code
    assert str(registry.Config.parse("cublas/compute=f16,out=f32")) == "cublas/out=f32,compute=f16"
    assert registry.Config.parse("cublas").is_plain and registry.Config.parse("cublas").code == 5
    assert registry.canonical_config("mmq/stream_k=off,j=128") == "mmq/j=128,stream_k=off"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("stock", "unknown route 'stock'"),
        ("cublas/", "no parameters"),
        ("cublas/out", "not name=value"),
        ("cublas/out=", "not name=value"),
        ("cublas/out=f64", "is not one of f16, f32"),
        ("cublas/out=f32,out=f16", "given twice"),
        ("mmq/out=f32", "route mmq has no parameter 'out'"),
        ("mmf/j=8", "route mmf has no parameter 'j' (it has: none)"),
    ],
)
def test_bad_config_strings_say_why(text: str, message: str) -> None:
    with pytest.raises(registry.ConfigError, match=re.escape(message)):
        registry.Config.parse(text)


def test_bad_config_codes_are_refused() -> None:
    for code in (-1, 0, 200, 5 | (3 << 8), 5 | (1 << 20), 4 | (17 << 8)):
        with pytest.raises(registry.ConfigError):
            registry.Config.from_code(code)


def test_issue_configurations_are_declared() -> None:
    cublas, mmq = registry.ROUTES[registry.Route.CUBLAS], registry.ROUTES[registry.Route.MMQ]
    assert {p.name: p.values for p in cublas.params} == {
        "out": ("f16", "f32"),
        "compute": ("f16", "f32", "bf16"),
        "weight": ("cached",),
    }
    assert {p.name: p.values for p in mmq.params} == {
        "j": tuple(str(j) for j in range(8, 129, 8)),
        "stream_k": ("on", "off"),
        "split": ("2j", "2j_wave", "2j_fused", "fit", "fit64"),
    }


def test_mmq_split_is_a_mul_mat_id_configuration_that_needs_its_j() -> None:
    split = "mmq/j=48,stream_k=off,split=2j"
    assert registry.route_allowed("MUL_MAT_ID", split) and not registry.route_allowed("MUL_MAT", split)
    assert registry.route_allowed("MUL_MAT", "mmq/j=48,stream_k=off")
    configs = [str(c) for c in registry.route_configs("mmq")]
    assert split in configs and "mmq/split=2j" not in configs  # the light side's J is the point
    # 2j_wave only beside stream_k=off (its first launch is the stream-k kernel over whole tiles)
    assert "mmq/j=48,stream_k=off,split=2j_wave" in configs
    assert "mmq/j=48,stream_k=on,split=2j_wave" not in configs
    # 2j_fused only beside stream_k=off and at the J with fused code
    assert "mmq/j=48,stream_k=off,split=2j_fused" in configs
    assert "mmq/j=48,stream_k=on,split=2j_fused" not in configs
    assert "mmq/j=40,stream_k=off,split=2j_fused" not in configs
    # fit and fit64 fit J per expert: each has one configuration, without J and with stream_k=off
    assert "mmq/stream_k=off,split=fit" in configs and "mmq/stream_k=off,split=fit64" in configs
    assert not any(",split=fit" in c and "j=" in c for c in configs)
    assert len(configs) == 1 + 16 * 2 * 2 + 16 + len(registry.MMQ_FUSED_J) + 2
    wave = registry.Config.parse("mmq/j=48,stream_k=off,split=2j_wave")
    assert registry.Config.from_code(wave.code) == wave and wave.code != registry.Config.parse(split).code
    assert registry.Config.from_code(registry.Config.parse(split).code) == registry.Config.parse(split)


def test_shape_keys_per_op() -> None:
    k = registry.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 14336, 1)
    assert k.label() == "MUL_MAT weight q4_Kxf32 N=4096 K=14336 B=1"
    assert k.group().label() == "MUL_MAT weight q4_Kxf32 N=* K=* B=1" and k.group().is_default
    assert k.id() == "MUL_MAT:weight:q4_K:f32:N4096:K14336:B1"
    assert k.codes() == (0, 0, 12, 0, 4096, 14336, 1, 0, 0)
    row = {"op": "MUL_MAT_ID", "layout": "expert", "src0_type": "q4_K", "src1_type": "f32", "N": 768}
    moe = registry.shape_key({**row, "K": 2048, "E": 128, "U": 8})
    assert isinstance(moe, registry.MulMatIdKey) and moe.routing == 0  # routing bucket: optional column
    assert moe.codes() == (1, 2, 12, 0, 768, 2048, 128, 8, 0) and moe.group().N == 0
    fa = registry.FlashAttnKey("FLASH_ATTN_EXT", "attention", "q8_0", "q8_0", 256, 256, 6, 65536)
    assert fa.codes() == (2, 1, 8, 8, 256, 256, 6, 65536, 0) and fa.group() is not fa and not fa.is_default
    assert [registry.kv_bucket(n) for n in (1, 4096, 4097, 49152)] == [1, 4096, 8192, 65536]
    assert registry.OPS[registry.Op.FLASH_ATTN_EXT].default_mask == 0
    fa_routes = (registry.Route.FA_VEC, registry.Route.FA_TILE, registry.Route.FA_MMA)
    not_mm = (*fa_routes, registry.Route.ID_SORTED)
    assert registry.OPS[registry.Op.MUL_MAT].routes == tuple(r for r in registry.Route if r not in not_mm)
    assert registry.OPS[registry.Op.FLASH_ATTN_EXT].routes == fa_routes
    assert registry.Route.CUBLAS not in registry.OPS[registry.Op.MUL_MAT_ID].routes
    # the per-expert fallback is a MUL_MAT_ID route of its own (a measured candidate), and the only one
    # that breaks CUDA graphs
    assert registry.OPS[registry.Op.MUL_MAT_ID].routes[-1] is registry.Route.ID_SORTED
    assert {registry.Route.ID_SORTED} == registry.GRAPH_BREAKING_ROUTES
    assert (
        "id_sorted" not in registry.TRACE_ONLY_ROUTES and registry.ROUTE_CODES[registry.Route.ID_SORTED] == 9
    )


DRIVER = r"""
#include "ggml-dispatch-codes.h"
#include <stdio.h>
#include <string.h>

static void names(const char * key, const char * (*fn)(int), int n, int first) {
    printf("\"%s\":[", key);
    for (int i = 0; i < n; ++i) {
        const char * s = fn(i);
        printf(i ? ",\"%s\"" : "\"%s\"", s ? s : "null");
    }
    printf("]%s", first ? "," : ",");
}

int main(void) {
    printf("{");
    names("ops", ggml_dispatch_op_name, GGML_DISPATCH_OP_COUNT, 1);
    names("layouts", ggml_dispatch_layout_name, GGML_DISPATCH_LAYOUT_COUNT, 1);
    names("routes", ggml_dispatch_route_name, GGML_DISPATCH_TRACE_ROUTE_COUNT, 1);
    names("fused", ggml_dispatch_fused_name, GGML_DISPATCH_FUSED_COUNT, 1);
    names("reasons", ggml_dispatch_reason_name, GGML_DISPATCH_REASON_COUNT, 1);
    names("whys", ggml_dispatch_why_name, GGML_DISPATCH_WHY_COUNT, 1);
    printf("\"route_count\":%d,\"route_ops\":[", GGML_DISPATCH_ROUTE_COUNT);
    for (int r = 0; r < GGML_DISPATCH_ROUTE_COUNT; ++r) {
        int mask = 0;
        for (int op = 0; op < GGML_DISPATCH_OP_COUNT; ++op) {
            mask |= ggml_dispatch_route_allows_op(r, op) << op;
        }
        printf(r ? ",%d" : "%d", mask);
    }
    const int masks[GGML_DISPATCH_OP_COUNT] = GGML_DISPATCH_OP_DEFAULT_MASKS;
    printf("],\"default_masks\":[%d,%d,%d],", masks[0], masks[1], masks[2]);
    printf("\"mul_mat_slots\":[%d,%d,%d],\"configs\":[", GGML_DISPATCH_KEY_MUL_MAT_N,
           GGML_DISPATCH_KEY_MUL_MAT_K, GGML_DISPATCH_KEY_MUL_MAT_B);
    char line[256];
    int  first = 1;
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = 0;
        int32_t code = -7;
        const int ok = ggml_dispatch_config_parse(line, &code);
        char text[64] = "";
        const int n = ok ? ggml_dispatch_config_format(code, text, sizeof(text)) : 0;
        printf("%s[%d,%d,\"%s\",%d,%d]", first ? "" : ",", ok, ok ? (int) code : 0, text, n,
               ok ? ggml_dispatch_config_valid(code) : 0);
        first = 0;
    }
    printf("],\"valid\":[");
    for (int32_t c = 0; c < (1 << 20); ++c) {
        if (ggml_dispatch_config_valid(c)) {
            printf(c ? ",%d" : "%d", (int) c);
        }
    }
    printf("]}\n");
    return 0;
}
"""

BAD = [
    "",
    "stock",
    "cublas/",
    "cublas/out",
    "cublas/out=",
    "cublas/out=f64",
    "cublas/out=f32,out=f16",
    "mmq/out=f32",
    "mmvq/j=8",
    "cublas/out=f32,",
    "cublas/=f32",
    "mmq/j=64,",
    "CUBLAS",
    "cublas /out=f32",
]


@pytest.mark.parametrize(
    ("compiler", "suffix"), [(["gcc", "-std=c11"], ".c"), (["g++", "-std=c++17"], ".cpp")]
)
def test_codes_header_compiles_and_agrees_with_python(
    compiler: list[str], suffix: str, tmp_path: Path
) -> None:
    codes.write_codes_header(tmp_path)
    src = tmp_path / f"driver{suffix}"
    src.write_text(DRIVER)
    exe = tmp_path / "driver"
    flags = ["-Wall", "-Wextra", "-Werror", "-pedantic"]
    build = subprocess.run(
        [*compiler, *flags, "-I", str(tmp_path), str(src), "-o", str(exe)], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr
    configs = _all_configs()
    shuffled = [
        str(registry.Config.of(str(c.route), dict(reversed(c.params)))) for c in configs
    ]  # any order parses
    lines = [str(c) for c in configs] + shuffled + BAD
    out: dict[str, Any] = json.loads(
        subprocess.run(
            [str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True
        ).stdout
    )
    assert out["ops"] == [o.value for o in sorted(registry.OPS, key=lambda o: registry.OP_CODES[o])]
    assert out["layouts"] == [
        lay.value for lay in sorted(registry.LAYOUT_CODES, key=registry.LAYOUT_CODES.get)
    ]
    assert out["routes"] == registry.route_names_by_code()
    assert out["fused"] == [
        "null",
        *(f.value for f in sorted(registry.FUSED_CODES, key=registry.FUSED_CODES.get)),
    ]
    assert out["reasons"] == list(registry.REASONS)
    assert out["whys"] == list(registry.INELIGIBLE) and out["whys"][0] == "ok"
    assert out["route_count"] == registry.ROUTE_COUNT
    assert out["route_ops"] == [0] + [
        sum(1 << registry.OP_CODES[o] for o in s.ops)
        for s in sorted(registry.ROUTES.values(), key=lambda s: s.code)
    ]
    assert out["default_masks"] == [
        registry.OPS[o].default_mask for o in sorted(registry.OPS, key=registry.OP_CODES.get)
    ]
    assert out["mul_mat_slots"] == [0, 1, 2]
    got = out["configs"]
    n = len(configs)
    for c, row, again in zip(configs, got[:n], got[n : 2 * n], strict=True):
        assert row == [1, c.code, str(c), len(str(c)), 1], (str(c), row)
        assert again == row
    assert all(row[0] == 0 for row in got[2 * n :]), list(zip(BAD, got[2 * n :], strict=True))
    assert out["valid"] == [0, *sorted(c.code for c in configs)]


def test_no_hand_copied_name_list_in_c() -> None:
    """Route, op, layout, fused and reason names reach C only through the generated header."""
    names = [r.value for r in registry.Route] + list(registry.TRACE_ONLY_ROUTES)
    names += (
        [lay.value for lay in registry.Layout] + [f.value for f in registry.Fused] + list(registry.REASONS)
    )
    names += [o.value for o in registry.Op]
    names.remove("table")  # also a GGML_CUDA_DISPATCH mode, which the env parser spells
    names.remove("ineligible")  # also a trial status (schema.TrialStatus), which the harness writes
    native = [
        *sorted((REPO / "ggml_dispatch" / "hook" / "native").glob("*.h")),
        *sorted((REPO / "ggml_dispatch" / "hook" / "native").glob("*.cu*")),
    ]
    native += sorted((REPO / "ggml_dispatch" / "tuner" / "harness").glob("*.[ch]*"))
    assert native
    for path in native:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.S)  # code, not comments
        for name in names:
            assert f'"{name}"' not in text, f"{path.name} spells {name!r}"
    assert not (REPO / "ggml_dispatch" / "tuner" / "harness" / "dispatch_api.h").exists()


def test_census_refuses_a_flash_attn_record_without_its_attention_fields(tmp_path: Path) -> None:
    """A FLASH_ATTN_EXT record needs its attn member (head dims, heads, KV length, ...): ingest names the
    line and writes nothing."""
    from click.testing import CliRunner

    from ggml_dispatch.cli import main

    lines = (REPO / "samples" / "trace-smollm2.jsonl").read_text().splitlines()
    route = next(i for i, ln in enumerate(lines) if '"kind":"route"' in ln.replace(" ", ""))
    rec = json.loads(lines[route])
    rec["op"] = "FLASH_ATTN_EXT"
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([*lines[:route], json.dumps(rec), *lines[route + 1 :]]) + "\n")
    out = tmp_path / "c.parquet"
    res = CliRunner().invoke(main, ["census", "ingest", str(trace), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert f"{trace}:{route + 1}:" in res.output and "needs its attn member" in res.output
    assert not out.exists()


def test_decide_keys_points_by_op_and_names_what_a_row_of_another_op_lacks() -> None:
    from test_codegen_support import frame, trials

    from ggml_dispatch.codegen import decide
    from ggml_dispatch.errors import InputError

    rows = trials(speed={"mmq": 1.0, "mmvq": 1.5}, M=4, N=2880, K=2880, op="MUL_MAT_ID", layout="expert")
    with pytest.raises(InputError, match="row 0: E: MUL_MAT_ID rows need a positive integer E"):
        decide.decide(frame(rows), decide.Params())
    df = frame(rows).assign(E=32, U=4)
    d = decide.decide(df, decide.Params())
    (key,) = d.evals
    assert isinstance(key, registry.MulMatIdKey) and (key.E, key.U, key.routing) == (32, 4, 0)
    # rows without a measured routing bucket make no MUL_MAT_ID rule (codegen.moe)
    assert d.rules == [] and {f.reason for f in d.refusals} == {
        "MUL_MAT_ID rows without a measured routing bucket"
    }
    # measured in every bucket: one routing-0 rule
    d = decide.decide(
        pd.concat([df.assign(routing=b) for b in (1, 2, 3)], ignore_index=True), decide.Params()
    )
    assert {k.routing for k in d.evals} == {1, 2, 3}
    assert [(str(r.route), r.M_lo, r.M_hi, r.key.routing) for r in d.rules] == [("mmvq", 4, 4, 0)]
    # a matmul route on FLASH_ATTN_EXT rows is refused, naming the row
    fa = trials(speed={"mmq": 1.0}, M=1, op="FLASH_ATTN_EXT", layout="attention")
    with pytest.raises(InputError, match="row 0: route: route 'mmq' does not serve FLASH_ATTN_EXT"):
        decide.decide(frame(fa), decide.Params())


def test_decide_times_configurations_and_refuses_one_of_another_route() -> None:
    from test_codegen_support import frame, trials

    from ggml_dispatch.codegen import decide
    from ggml_dispatch.errors import InputError

    df = frame(trials(speed={"mmq": 1.0, "mmvq": 1.5}, M=4))
    df["config"] = df["route"].map({"mmq": "mmq/stream_k=off,j=16", "mmvq": None})
    d = decide.decide(df, decide.Params())
    # the config column names the candidate (canonical spelling), a row without one is its plain route
    assert set(map(str, d.evals[next(iter(d.evals))][4])) == {"mmq/j=16,stream_k=off", "mmvq"}
    bad = df.assign(config=df["route"].map({"mmq": "cublas/out=f32", "mmvq": None}))
    with pytest.raises(InputError, match="row 0: config: config 'cublas/out=f32' is not a configuration of"):
        decide.decide(bad, decide.Params())
    bad = df.assign(config=df["route"].map({"mmq": "mmq/j=7", "mmvq": None}))
    with pytest.raises(InputError, match="row 0: config: mmq/j='7' is not one of"):
        decide.decide(bad, decide.Params())


def test_a_switch_parameter_is_swept_left_out_and_set() -> None:
    configs = [str(c) for c in registry.route_configs("cublas")]
    # the plain route, the switch alone on the route's own out/compute, then every combination
    assert configs[:2] == ["cublas", "cublas/weight=cached"]
    full = configs[2:]
    assert len(full) == 2 * 3 * 2 and len(set(configs)) == len(configs)
    assert "cublas/out=f16,compute=f16" in full and "cublas/out=f16,compute=f16,weight=cached" in full
    assert sum(c.endswith(",weight=cached") for c in full) == 6
    # a config without the switch is the per-call path: its code leaves the weight field 0
    c = registry.Config.parse("cublas/weight=cached")
    assert c.code != registry.Config.parse("cublas").code and registry.Config.from_code(c.code) == c
    # mmq's split (MUL_MAT_ID only) is swept left out and set, only together with a J (2j_wave: stream_k=off;
    # 2j_fused: stream_k=off at the J with fused code)
    assert len(registry.route_configs("mmq")) == 1 + 16 * 2 * 2 + 16 + len(registry.MMQ_FUSED_J) + 2


# --------------------------------------------------------------------------------------------
# An op's file columns come from its key class (registry.op_columns)


def test_each_ops_census_and_tuning_columns_come_from_its_key_class() -> None:
    census = {**schema.CENSUS_COLUMNS, **schema.CENSUS_OPTIONAL_COLUMNS}
    tuning = {**schema.TUNING_COLUMNS, **schema.TUNING_OPTIONAL_COLUMNS}
    assert registry.op_columns("tuning", schema.TUNING_COLUMNS) == schema.TUNING_OP_COLUMNS
    assert schema.TUNING_OPTIONAL_COLUMNS == {"config": "string", **schema.TUNING_OP_COLUMNS}
    assert (
        registry.op_columns("census", schema.CENSUS_COLUMNS, schema.TRACE_OPS)
        == schema.CENSUS_OPTIONAL_COLUMNS
    )
    for op, spec in registry.OPS.items():
        key = spec.key
        files = [tuning] + ([census] if op in schema.TRACE_OPS else [])
        for columns in files:  # every key field is a column of the op's rows, typed by the key
            assert {f: columns.get(f) for f in key.fields()} == key.column_types(), op
        for name, kind in key.EXTRA_COLUMNS.items():  # and so is every other column the key declares
            assert any(columns.get(name) == kind for columns in files), (op, name)
    # the attention census (its own file) leads with the FlashAttnKey's columns
    from ggml_dispatch.artifacts.validators import ARROW_TYPES
    from ggml_dispatch.census import attention

    names = list(attention.COLUMNS)
    fa = registry.FlashAttnKey.column_types()
    assert names[3 : 3 + len(fa)] == list(fa)
    assert all(attention.COLUMNS[n] == ARROW_TYPES[k] for n, k in fa.items())
    assert registry.OPS[registry.Op.FLASH_ATTN_EXT].census == registry.CENSUS_ATTENTION


def test_the_derived_columns_keep_the_file_formats() -> None:
    """Derived, the optional columns are still exactly the committed files' (names, order, types)."""
    assert list(schema.CENSUS_OPTIONAL_COLUMNS.items()) == [
        ("routing", "int64"),
        ("experts_nonempty", "float64"),
        ("tokens_max", "float64"),
        ("tokens_cv", "float64"),
    ]
    assert list(schema.TUNING_OPTIONAL_COLUMNS.items()) == [
        ("config", "string"),
        *[(n, "string") for n in ("k_type", "v_type")],
        *[(n, "int64") for n in ("D_K", "D_V", "gqa", "kv", "E", "U")],
        ("routing_kind", "string"),
        ("routing", "int64"),
        ("used", "int64"),
    ]
    assert {registry.Op.MUL_MAT, registry.Op.MUL_MAT_ID} == schema.TRACE_OPS


def test_a_new_key_class_brings_its_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key class with other fields (standing in for a new op's) adds its fields to the tuning file's
    columns without a list elsewhere; a declared column without a type, or a key field left out, is
    refused."""
    import dataclasses

    @dataclasses.dataclass(frozen=True, order=True)
    class NewKey(registry._Key):
        OP = registry.Op.FLASH_ATTN_EXT
        TYPE_FIELDS = ("a_type", "b_type")
        INT_FIELDS = ("rows", "N")

        op: str
        layout: str
        a_type: str
        b_type: str
        rows: int
        N: int

    spec = registry.OPS[registry.Op.FLASH_ATTN_EXT]
    monkeypatch.setitem(registry.OPS, registry.Op.FLASH_ATTN_EXT, dataclasses.replace(spec, key=NewKey))
    cols = registry.op_columns("tuning", schema.TUNING_COLUMNS)
    assert list(cols)[:3] == ["a_type", "b_type", "rows"]  # N: a shared matmul column
    assert cols["rows"] == "int64" and "k_type" not in cols and "E" in cols
    monkeypatch.setattr(NewKey, "TUNING_COLUMNS", ("a_type", "b_type", "rows", "note"), raising=False)
    with pytest.raises(ValueError, match="'note' has no type"):
        registry.op_columns("tuning", schema.TUNING_COLUMNS)
    monkeypatch.setattr(NewKey, "EXTRA_COLUMNS", {"note": "string"}, raising=False)
    assert list(registry.op_columns("tuning", schema.TUNING_COLUMNS))[:4] == [
        "a_type",
        "b_type",
        "rows",
        "note",
    ]
    monkeypatch.setattr(NewKey, "TUNING_COLUMNS", ("a_type", "note"), raising=False)
    with pytest.raises(ValueError, match="lack its key field"):
        registry.op_columns("tuning", schema.TUNING_COLUMNS)
    monkeypatch.setattr(NewKey, "TUNING_COLUMNS", None, raising=False)
    with pytest.raises(ValueError, match="'N' is int64 here, string elsewhere"):
        registry.op_columns("tuning", {**schema.TUNING_COLUMNS, "N": "string"})


def test_every_op_is_in_one_census_with_a_candidate_generator() -> None:
    """Each op's description names its census and its tuner candidate generator (resolved by the tuner:
    tests/test_tuner_candidates.py); every op is in exactly one census kind."""
    ops = [o for kind in registry.CENSUS_KINDS for o in registry.census_ops(kind)]
    assert sorted(ops) == sorted(registry.OPS)
    for spec in registry.OPS.values():
        assert spec.candidates.startswith("ggml_dispatch.tuner."), spec
