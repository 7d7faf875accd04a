"""FLASH_ATTN_EXT through census, selection, tuning rows and the decision (no GPU: the harness's
trial lines of a case are written here in the form it emits; tests/test_tuner_native_attn.py runs the
real harness on the CPU backend, tests/test_native_fattn.py the hook's kernel choice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_codegen_render import GCC, compile_and_run

from ggml_dispatch import registry, schema
from ggml_dispatch.census import attention
from ggml_dispatch.census.trace import AttnInfo, RouteKey, Tally
from ggml_dispatch.codegen import decide, table
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import attention as tattn
from ggml_dispatch.tuner import results

H200 = schema.GpuId("NVIDIA H200", 900, 132)


def attn_key(
    kv: str, M: int, n_kv: int, D: int = 256, q_heads: int = 24, kv_heads: int = 4, **flags: Any
) -> RouteKey:
    row_k = schema.ggml_type(kv).row_bytes(D)
    nb = (schema.ggml_type(kv).type_size, row_k * kv_heads, row_k, row_k * kv_heads * n_kv)
    info = AttnInfo(
        d_k=D, d_v=D, q_heads=q_heads, kv_heads=kv_heads, q_cols=M, n_kv=n_kv, seqs=1, k_type=kv, v_type=kv,
        v_nb=nb, mask=flags.get("mask", True), sinks=flags.get("sinks", False),
        softcap=flags.get("softcap", 0.0), max_bias=0.0, scale=1 / 16,
    )  # fmt: skip
    stock = "fa_vec" if M <= 2 else "fa_mma"
    return RouteKey(
        gpu=H200, op="FLASH_ATTN_EXT", tensor="cache_k_l0 (view) (permuted)", src0_type=kv, src1_type="f32",
        src0_ne=(D, n_kv, kv_heads, 1), src0_nb=nb, src1_ne=(D, M, q_heads, 1), layout="attention",
        fused=None, route=stock, stock_route=stock, reason="stock", config=stock, attn=info,
    )  # fmt: skip


def tally(calls: int) -> Tally:
    t = Tally("trace.jsonl", 2)
    t.calls = calls
    return t


def test_attention_rows_carry_the_shape_key_and_a_roofline_estimate() -> None:
    rows = attention.attention_rows(
        {
            attn_key("q8_0", 1, 49152): tally(128),
            attn_key("q8_0", 3, 49152): tally(4),
            attn_key("f16", 1, 4096): tally(8),
        }
    )
    assert [r["M"] for r in rows] == [1, 3, 1]  # by est_us: 128 decode calls first
    top = rows[0]
    assert attention.key_of(top) == registry.FlashAttnKey(
        "FLASH_ATTN_EXT", "attention", "q8_0", "q8_0", 256, 256, 6, 65536
    )
    # decode at 49152 on an H200: K and V read once (memory bound), 4.8 TB/s
    kv_bytes = 2 * 49152 * 4 * schema.ggml_type("q8_0").row_bytes(256)
    per_call = (kv_bytes + 4 * 256 * 24 * 2) / 4.8e12 * 1e6
    assert top["est_us"] == pytest.approx(128 * per_call) and top["est_kind"] == "roofline"
    # MMA converts the q8_0 cache: the f16 copy is written and read (4 bytes per element more)
    mma = attention.work_of(attention.AttnShape("q8_0", "q8_0", 256, 256, 24, 4, 3, 49152), "fa_mma")
    vec = attention.work_of(attention.AttnShape("q8_0", "q8_0", 256, 256, 24, 4, 3, 49152), "fa_vec")
    assert (
        mma.bytes - vec.bytes == 2 * 4 * 49152 * 4 * 256
        and mma.flops == vec.flops == 2 * 3 * 24 * 49152 * 512
    )


def test_selection_takes_the_largest_points_and_skips_unbuilt_flags() -> None:
    rows = attention.attention_rows(
        {
            attn_key("q8_0", 1, 49152): tally(100),
            attn_key("q8_0", 2, 16384): tally(50),
            attn_key("q8_0", 1, 4096, sinks=True): tally(100),
            attn_key("f16", 1, 256): tally(1),
        }
    )
    sel = tattn.select_attention(rows, coverage=0.9, trials=5)
    assert [(c.M, c.n_kv) for c in sel.cases] == [(1, 49152), (2, 16384)]
    assert sel.skipped_rows == {"with attention sinks": 1, "beyond the coverage": 1}
    spec = sel.cases[0].spec()
    assert (spec["k_type"], spec["D_K"], spec["gqa"], spec["kv"], spec["q_heads"], spec["kv_heads"]) == (
        "q8_0", 256, 6, 65536, 24, 4
    )  # fmt: skip
    assert spec["routes"] == ["fa_vec", "fa_tile", "fa_mma"] and spec["trials"] == 5
    assert (spec["src0_type"], spec["N"], spec["K"], spec["B"]) == ("q8_0", 49152, 256, 24)
    with pytest.raises(ValueError, match="not FlashAttention routes: mmq"):
        tattn.select_attention(rows, routes=["mmq"])


def journal_record(case: tattn.AttnCase, speed: dict[str, float], n: int = 6) -> dict[str, Any]:
    rng = np.random.default_rng(case.M)
    lines = []
    for t in range(n):
        anchor = 100.0 * (1 + 0.004 * rng.standard_normal())
        lines.append({"route": "stock", "trial": t, "us": anchor, "anchor_us": anchor, "status": "ok"})
        for route, s in speed.items():
            us = 100.0 / s * (1 + 0.004 * rng.standard_normal())
            lines.append(
                {"route": route, "trial": t, "us": us, "anchor_us": anchor, "status": "ok", "nmse": 1e-7,
                 "route_ran": route, "replays": 20, "weight_copies": 3}
            )  # fmt: skip
    header = {
        "gpu_name": "NVIDIA H200",
        "gpu_uuid": "GPU-1",
        "gpu_cc": 900,
        "gpu_sm_count": 132,
        "driver": "580",
        "cuda_version": "13.0",
        "cublas_version": "13.0.2",
        "harness_version": "test",
    }
    return {
        "case": case.id, "spec": case.spec(), "status": "done", "header": header,
        "stamp": {"upstream_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "patch_hash": "ab" * 32},
        "trials": lines, "case_info": {"nodes": 9},
    }  # fmt: skip


def test_tuning_rows_keep_the_attention_key_and_decide_makes_attention_rules(tmp_path: Path) -> None:
    rows = attention.attention_rows(
        {attn_key("q8_0", 1, 49152): tally(10), attn_key("q8_0", 3, 49152): tally(5)}
    )
    sel = tattn.select_attention(rows)
    by_m = {c.M: c for c in sel.cases}
    recs = [
        journal_record(by_m[1], {"fa_vec": 1.0, "fa_mma": 1.35, "fa_tile": 0.5}),
        journal_record(by_m[3], {"fa_vec": 0.9, "fa_mma": 1.0, "fa_tile": 0.4}),
    ]
    out = tmp_path / "tuning.parquet"
    n = results.write_tuning(out, recs, input_hashes={}, settings={})
    assert n == 2 * 3 * 6
    tbl, _ = results.read_tuning(out)
    df = tbl.to_pandas()
    fa = df[df["op"] == "FLASH_ATTN_EXT"]
    assert set(fa["k_type"]) == {"q8_0"} and set(fa["kv"]) == {65536} and set(fa["gqa"]) == {6}
    d = decide.decide(df, decide.Params())
    (rule,) = [r for r in d.rules if str(r.route) != "stock"]
    assert (str(rule.route), rule.M_lo, rule.M_hi) == ("fa_mma", 1, 1)  # M = 3: stock's own kernel, no rule
    key = registry.FlashAttnKey("FLASH_ATTN_EXT", "attention", "q8_0", "q8_0", 256, 256, 6, 65536)
    assert key in d.evals and set(d.evals[key]) == {1, 3}

    # the codegen command: table.json and the C header carry the attention rule
    from cli_support import run

    res = run("codegen", out, "-o", tmp_path / "table")
    assert res.exit_code == 0, res.output
    t = table.load(tmp_path / "table" / "table.json")
    (r,) = t["rules"]
    assert (r["op"], r["k_type"], r["D_K"], r["gqa"], r["kv"], r["M_lo"], r["M_hi"], r["route"]) == (
        "FLASH_ATTN_EXT", "q8_0", 256, 6, 65536, 1, 1, "fa_mma"
    )  # fmt: skip
    assert "GGML_DISPATCH_TABLE_RULE_COUNT 1" in (tmp_path / "table" / "ggml-dispatch-table.h").read_text()


def test_attention_census_file_round_trip_and_refusals(tmp_path: Path) -> None:
    rows = attention.attention_rows({attn_key("q8_0", 1, 4096): tally(3)})
    path = tmp_path / "attn.parquet"
    attention.write(rows, path, {"trace.jsonl": "00"}, tmp_path / "trace.jsonl")
    assert tattn.read_attention_census(path) == rows
    with pytest.raises(InputError, match="nothing to census"):
        attention.write([], tmp_path / "empty.parquet", {}, tmp_path / "trace.jsonl")
    assert not (tmp_path / "empty.parquet").exists()
    other = tmp_path / "other.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), other)
    with pytest.raises(InputError, match="not an attention census"):
        tattn.read_attention_census(other)


def test_table_json_takes_attention_rules() -> None:
    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    t["provenance"] = {"source": "measured"}
    key = {"op": "FLASH_ATTN_EXT", "layout": "attention", "k_type": "q8_0", "v_type": "q8_0", "D_K": 256}
    t["rules"] = [key | {"D_V": 256, "gqa": 6, "kv": 65536, "M_lo": 1, "M_hi": 2, "route": "fa_vec"}]
    text = table.dumps(t)
    assert '"route": "fa_vec"' in text
    fa = registry.FlashAttnKey("FLASH_ATTN_EXT", "attention", "q8_0", "q8_0", 256, 256, 6, 65536)
    assert table.lookup_key(table.loads(text), table.table_gpu(t), fa, 2) == "fa_vec"
    assert table.lookup_key(table.loads(text), table.table_gpu(t), fa, 3) is None
    t["rules"] = [key | {"D_V": 256, "gqa": 6, "kv": 65536, "M_lo": 1, "M_hi": 2, "route": "mmq"}]
    with pytest.raises(InputError, match="route mmq does not serve FLASH_ATTN_EXT"):
        table.validate(t)


def test_tune_run_dry_run_on_an_attention_census_lists_attention_cases(tmp_path: Path) -> None:
    import json

    from cli_support import refused, run

    rows = attention.attention_rows(
        {attn_key("q8_0", 2, 16384): tally(9), attn_key("q8_0", 1, 16384): tally(9)}
    )
    census = tmp_path / "attn.parquet"
    attention.write(rows, census, {}, tmp_path / "trace.jsonl")
    args = ["tune", "run", census, "--llama-cpp", tmp_path, "-o", tmp_path / "t.parquet", "--dry-run"]
    res = run(*args, "--configs", "routes")
    assert res.exit_code == 0, res.output
    cases = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert [(c["op"], c["M"], c["n_kv"], c["routes"]) for c in cases] == [
        ("FLASH_ATTN_EXT", 2, 16384, ["fa_vec", "fa_tile", "fa_mma"]),  # larger est_us first
        ("FLASH_ATTN_EXT", 1, 16384, ["fa_vec", "fa_tile", "fa_mma"]),
    ]
    refused(run(*args, "--routes", "mmq"), "--routes", "fa_vec")
    # a targeted sweep: configurations (their commas kept together) are the candidates as given
    picked = "fa_vec,fa_mma/ncols1=1,ncols2=8,stream_k=on,kv=shadow,fa_tile/kv=shadow"
    res = run(*args, "--configs", "routes", "--routes", picked)
    assert res.exit_code == 0, res.output
    cases = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert cases[0]["routes"] == [
        "fa_vec",
        "fa_mma/ncols1=1,ncols2=8,stream_k=on,kv=shadow",
        "fa_tile/kv=shadow",
    ]
    refused(run(*args, "--routes", picked), "--routes", "--configs routes")


def test_tune_run_times_every_attention_configuration_with_configs_all(tmp_path: Path) -> None:
    import json

    from cli_support import run

    rows = attention.attention_rows({attn_key("q8_0", 2, 16384): tally(9)})
    census = tmp_path / "attn.parquet"
    attention.write(rows, census, {}, tmp_path / "trace.jsonl")
    args = ["tune", "run", census, "--llama-cpp", tmp_path, "-o", tmp_path / "t.parquet", "--dry-run"]
    res = run(*args, "--configs", "all")
    assert res.exit_code == 0, res.output
    (case,) = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    want = [str(c) for r in ("fa_vec", "fa_tile", "fa_mma") for c in registry.route_configs(r)]
    assert case["routes"] == want and len(want) == 20 + 2 + 130  # each also with kv=shadow, alone too
    assert "fa_vec/blocks=16" in want and "fa_mma/ncols1=2,ncols2=8,sparse=off,stream_k=off" in want


def test_attention_configurations_become_rules_and_the_header_looks_them_up(tmp_path: Path) -> None:

    rows = attention.attention_rows(
        {attn_key("q8_0", 1, 49152): tally(10), attn_key("q8_0", 3, 49152): tally(5)}
    )
    cfgs = ["fa_vec", "fa_vec/blocks=32", "fa_mma", "fa_mma/ncols1=2,ncols2=4,sparse=off,stream_k=on"]
    sel = tattn.select_attention(rows, routes=cfgs)
    by_m = {c.M: c for c in sel.cases}
    recs = []
    for M, speed in (
        (1, {"fa_vec": 1.0, "fa_vec/blocks=32": 1.3, "fa_mma": 0.8, cfgs[3]: 0.9}),
        (3, {"fa_vec": 0.9, "fa_vec/blocks=32": 0.95, "fa_mma": 1.0, cfgs[3]: 1.25}),
    ):
        rec = journal_record(by_m[M], speed)
        for line in rec["trials"]:
            if line["route"] != "stock":
                line["route_ran"] = registry.config_route(line["route"])  # the harness verifies the route
        recs.append(rec)
    out = tmp_path / "tuning.parquet"
    results.write_tuning(out, recs, input_hashes={}, settings={})
    df = results.read_tuning(out)[0].to_pandas()
    assert set(df["config"]) == set(cfgs) and set(df["route"]) == {"fa_vec", "fa_mma"}
    d = decide.decide(df, decide.Params())
    chosen = sorted((r.M_lo, str(r.route)) for r in d.rules if str(r.route) != "stock")
    assert chosen == [(1, cfgs[1]), (3, cfgs[3])]

    from cli_support import run

    res = run("codegen", out, "-o", tmp_path / "table")
    assert res.exit_code == 0, res.output
    t = table.load(tmp_path / "table" / "table.json")
    assert sorted((r["M_lo"], r["config"], r["route"]) for r in t["rules"]) == [
        (1, cfgs[1], "fa_vec"),
        (3, cfgs[3], "fa_mma"),
    ]
    # the header compiles (the codes header beside it) and looks the configurations up by the attention key
    from ggml_dispatch import codes

    codes.write_codes_header(tmp_path / "table")
    op, lay = registry.OP_CODES[registry.Op.FLASH_ATTN_EXT], registry.LAYOUT_CODES[registry.Layout.ATTENTION]
    q8 = registry.GGML_TYPES["q8_0"].id
    driver = (
        '#include "ggml-dispatch-table.h"\n#include <stdio.h>\nint main(void) {\n'
        "    const int64_t k[GGML_DISPATCH_TABLE_KEY_SLOTS] = {256, 256, 6, 65536, 0};\n"
        f'    printf("%d %d %d\\n", ggml_dispatch_table_lookup({op}, {lay}, {q8}, {q8}, k, 1),\n'
        f"           ggml_dispatch_table_lookup({op}, {lay}, {q8}, {q8}, k, 3),\n"
        f"           ggml_dispatch_table_lookup({op}, {lay}, {q8}, {q8}, k, 2));\n"
        "    return 0;\n}\n"
    )
    table_dir = tmp_path / "table"
    header = (table_dir / table.HEADER_FILENAME).read_text()
    got = [int(x) for x in compile_and_run(header, table_dir, GCC, ".c", driver).decode().split()]
    assert got == [registry.Config.parse(cfgs[1]).code, registry.Config.parse(cfgs[3]).code, 0]
