"""codegen --vram-budget, the weight cache's part: which weights get a persistent f16 copy
(cublas/weight=cached), chosen greedily by measured time saved per MiB over the census, never over
budget; budget 0 = the table without the cache."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_support import run
from test_codegen_render import GCC, compile_and_run
from test_codegen_support import census_row, frame, trials, write_census, write_tuning

from ggml_dispatch import archive, registry, schema
from ggml_dispatch.codegen import cache, decide, render, vram
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError

CACHED = "cublas/out=f16,compute=f16,weight=cached"
P = decide.Params(resamples=400)
A = {"N": 4096, "K": 4096}  # 2 tensors: 64 MiB of f16 copies
B = {"N": 14336, "K": 4096}  # 1 tensor: 112 MiB


def _trials(speed: dict[str, float], M: int, **key: Any) -> list[dict[str, Any]]:
    """Paired trials keyed by configuration (trials() keys by route)."""
    names = {f"c{i}": c for i, c in enumerate(sorted(speed))}
    rows = trials(speed={n: speed[c] for n, c in names.items()}, M=M, **key)
    for r in rows:
        config = names[r["route"]]
        r["route"] = r["route_ran"] = registry.config_route(config)
        r["config"] = config
    return rows


def _tuning() -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for key, cached_speed in ((A, 1.6), (B, 2.5)):
        # stock runs mmq; uncached cuBLAS loses at 128 and wins at 512; the cached copy wins at both
        rows += _trials({"mmq": 1.0, "cublas": 0.8, CACHED: cached_speed}, 128, **key)
        rows += _trials({"mmq": 1.0, "cublas": 1.3, CACHED: cached_speed + 0.5}, 512, **key)
    df = frame([{k: v for k, v in r.items() if k != "config"} for r in rows])
    return df.assign(config=[r["config"] for r in rows])


def _census() -> pd.DataFrame:
    rows = [
        census_row(M=M, calls=100, tensor=f"blk.{i}.attn_q.weight", **A) for i in range(2) for M in (128, 512)
    ]
    rows += [census_row(M=M, calls=100, tensor="blk.0.ffn_up.weight", **B) for M in (128, 512)]
    return pd.DataFrame(rows)


def _with_cache(df: pd.DataFrame, census: pd.DataFrame | None, budget: int | None) -> Any:
    d, plan, _ = vram.decide_with_budget(df, census, budget, P)
    return d, plan


def _chosen(plan: vram.VramPlan) -> list[int]:
    return [c.key.N for c in plan.of(vram.WEIGHT_CACHE)]


def _configs(d: decide.Decisions, N: int) -> list[tuple[int, int, str]]:
    return [(r.M_lo, r.M_hi, str(r.route)) for r in d.rules if r.key.N == N]


def test_greedy_by_saving_per_mib_never_over_budget_and_monotone() -> None:
    key = schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 1, 1, 1)
    s = [
        vram.Candidate(vram.WEIGHT_CACHE, key._replace_ints({"N": 1}), 60 << 20, 600.0, 1, 1),  # 10 us/MiB
        vram.Candidate(vram.WEIGHT_CACHE, key._replace_ints({"N": 2}), 50 << 20, 1000.0, 1, 1),  # 20 us/MiB
        vram.Candidate(vram.WEIGHT_CACHE, key._replace_ints({"N": 3}), 30 << 20, 150.0, 1, 1),  # 5 us/MiB
    ]
    plan = vram.choose(s, 100)
    # 60 MiB does not fit after 50: admission stops there (30 MiB would fit, but a larger budget that
    # admits the 60 must keep everything this one admits)
    assert [c.key.N for c in plan.admitted] == [2] and plan.bytes == 50 << 20
    assert [(x.key.N, why.split(",")[0]) for x, why in plan.skipped] == [
        (1, f"{60 << 20} bytes do not fit the {50 << 20} bytes left of the budget"),
        (3, "ranked below weight_cache MUL_MAT weight q4_Kxf32 N=1 K=1 B=1"),
    ]
    before: set[int] = set()
    for budget in range(0, 200, 7):
        p = vram.choose(s, budget)
        assert p.bytes <= budget << 20 and before <= {c.key.N for c in p.admitted}
        before = {c.key.N for c in p.admitted}
    assert vram.choose(s, 0).admitted == () and before == {1, 2, 3}


def test_the_budget_moves_the_crossover_only_for_the_chosen_weights() -> None:
    df, census = _tuning(), _census()
    without, none = _with_cache(df, census, None)
    assert none is None
    assert _configs(without, 4096) == [(512, 512, "cublas")]  # uncached cuBLAS only where it wins
    d, plan = _with_cache(df, census, 100)
    assert plan is not None
    # B saves more per MiB but its 112 MiB do not fit; A's 64 MiB do
    assert _chosen(plan) == [4096] and plan.bytes == 2 * 4096 * 4096 * 2
    assert [s.key.N for s, _ in plan.skipped] == [14336]
    assert _configs(d, 4096) == [(128, 512, CACHED)]
    assert _configs(d, 14336) == _configs(without, 14336)  # no cached rule for a shape not chosen
    saved = plan.of(vram.WEIGHT_CACHE)[0].saved_us
    # census calls x (uncached - cached): at 128 the table without cache runs stock (100 us), at 512 cuBLAS
    expected = 200 * (100 - 100 / 1.6) + 200 * (100 / 1.3 - 100 / 2.1)
    assert saved == pytest.approx(expected, rel=0.03)
    big, plan_big = _with_cache(df, census, 1000)
    assert plan_big is not None and len(plan_big.of(vram.WEIGHT_CACHE)) == 2
    assert _configs(big, 14336) == [(128, 512, CACHED)]


def test_budget_zero_is_the_table_without_the_cache() -> None:
    df, census = _tuning(), _census()
    without, _ = _with_cache(df, census, None)
    zero, plan = _with_cache(df, census, 0)
    assert plan is not None and plan.admitted == () and plan.bytes == 0
    t0 = tbl.build_table(without, tuning_sha256="0" * 64)
    tz = vram.attach(tbl.build_table(zero, tuning_sha256="0" * 64), plan)
    assert tz["rules"] == t0["rules"] and tz["vram"]["planned_bytes"] == 0 and "cache" not in tz
    assert not cache.cached_rule_keys(tz)
    assert "#define GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES 0\n" in render.render_header(tz)


def test_without_a_census_the_cache_is_left_out_and_said_so() -> None:
    d, plan = _with_cache(_tuning(), None, 1000)
    without, _ = _with_cache(_tuning(), None, None)
    assert plan.cache_unweighed and plan.admitted == ()
    assert [(r.key, str(r.route)) for r in d.rules] == [(r.key, str(r.route)) for r in without.rules]


def test_the_table_records_the_plan_and_refuses_one_over_budget() -> None:
    df, census = _tuning(), _census()
    d, plan = _with_cache(df, census, 100)
    t = vram.attach(tbl.build_table(d, tuning_sha256="0" * 64), plan)
    c = t["cache"]
    assert c["budget_mib"] == 100 and c["budget_bytes"] == 100 << 20 and c["bytes"] == 64 << 20
    assert [(x["N"], x["K"], x["tensors"], x["bytes"]) for x in c["tensors"]] == [(4096, 4096, 2, 64 << 20)]
    assert f"#define GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES {100 << 20}\n" in render.render_header(t)
    assert tbl.loads(tbl.dumps(t)) == tbl.canonicalize(t)
    over = json.loads(tbl.dumps(t))
    over["cache"]["budget_mib"], over["cache"]["budget_bytes"] = 10, 10 << 20
    with pytest.raises(InputError, match=r"cache\.bytes: the chosen copies exceed the budget"):
        tbl.validate(over, "t.json")
    bad = json.loads(tbl.dumps(t))
    bad["cache"]["tensors"][0]["bytes"] = 1
    with pytest.raises(InputError, match=r"cache\.bytes: the tensors' bytes add up to 1"):
        tbl.validate(bad, "t.json")


def test_cli_cache_budget(tmp_path: Path) -> None:
    df, census = _tuning(), _census()
    rows = df.to_dict("records")
    tuning = write_tuning(
        [{k: v for k, v in r.items() if k != "config"} for r in rows], tmp_path / "t.parquet"
    )
    # the writer keeps only the schema's columns: add the optional config column
    t = pq.read_table(tuning)
    t = t.append_column("config", pa.array([r["config"] for r in rows], pa.string()))
    pq.write_table(t.replace_schema_metadata(pq.read_table(tuning).schema.metadata), tuning)
    cen = write_census([dict(r) for r in census.to_dict("records")], tmp_path / "c.parquet")
    res = run("codegen", tuning, "-o", tmp_path / "nc", "--vram-budget", "100")
    assert res.exit_code == 0 and "weight cache: left out (no --census)" in res.output, res.output
    assert not cache.cached_rule_keys(tbl.load(tmp_path / "nc" / "table.json"))
    res = run("codegen", tuning, "--census", cen, "-o", tmp_path / "out", "--vram-budget", "100")
    assert res.exit_code == 0, res.output
    assert "VRAM budget: 100 MiB, 1 memory rules admitted, 67108864 bytes planned (64.0 MiB)" in res.output
    assert "not admitted: weight_cache MUL_MAT weight q4_Kxf32 N=14336 K=4096 B=1" in res.output
    table = tbl.load(tmp_path / "out" / "table.json")
    assert table["cache"]["bytes"] == 64 << 20
    assert cache.cached_rule_keys(table) == {
        schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 4096, 1)
    }
    res = run("codegen", tuning, "--census", cen, "-o", tmp_path / "o2", "--vram-budget", "-1")
    assert res.exit_code == 2
    res = run("codegen", tuning, "--census", cen, "-o", tmp_path / "o2", "--cache-budget", "100")
    assert res.exit_code == 2 and "--cache-budget is replaced by --vram-budget MiB" in res.output


def test_the_header_falls_back_to_the_table_without_the_cache(tmp_path: Path) -> None:
    """gcc compiles the rendered header; a node whose copy cannot be had gets what the table without the
    cache would run (lookup of the budget-less table), the others what the table says."""
    df, census = _tuning(), _census()
    without, _ = _with_cache(df, census, None)
    d, plan = _with_cache(df, census, 100)
    t = vram.attach(tbl.build_table(d, tuning_sha256="0" * 64), plan)
    t0 = tbl.build_table(without, tuning_sha256="0" * 64)
    assert [(r["N"], r["M_lo"], r["M_hi"], r["config"]) for r in t["cache"]["fallback"]] == [
        (4096, 512, 512, "cublas")
    ]
    gpu = tbl.table_gpu(t)
    lines, checked = [], 0
    for N in (4096, 14336):
        key = schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", N, 4096, 1)
        for M in (64, 128, 256, 512, 1024):
            main_cfg = tbl.lookup_key(t, gpu, key, M)
            plain = tbl.lookup_key(t0, gpu, key, M)
            want_main = registry.Config.parse(main_cfg).code if main_cfg else 0
            want_fb = registry.Config.parse(plain).code if plain else 0
            line = f"k[0] = {N}; ok &= ggml_dispatch_table_lookup(0, 0, 12, 0, k, {M}) == {want_main};"
            if main_cfg is not None and cache.is_cached(registry.Config.parse(main_cfg)):
                checked += 1
                line += f" ok &= ggml_dispatch_table_cache_fallback(0, 0, 12, 0, k, {M}) == {want_fb};"
            lines.append(line)
    assert checked == 3  # N = 4096 at M = 128, 256 (between measured M) and 512; nothing else cached
    assert _all_hold(render.render_header(t), tmp_path, "{0, 4096, 1, 0, 0}", lines)


def _all_hold(header: str, tmp_path: Path, k: str, lines: list[str]) -> bool:
    """The header compiled by gcc with a driver that runs ``lines`` (each ``ok &= <check>;``) over the
    key slots ``k``: did every check hold?"""
    driver = (
        '#include "ggml-dispatch-table.h"\n#include <stdio.h>\n'
        f"int main(void) {{ int64_t k[5] = {k}; int ok = 1;\n"
        + "\n".join(lines)
        + '\nprintf("%d\\n", ok); return 0; }\n'
    )
    return compile_and_run(header, tmp_path, GCC, ".c", driver).strip() == b"1"


def test_uncovered_m_ranges_keep_the_uncached_rules() -> None:
    assert cache._subtract(1, 100, [(10, 20), (50, 200)]) == [(1, 9), (21, 49)]
    assert cache._subtract(8, 16, [(1, 100)]) == []
    assert cache._subtract(8, 16, []) == [(8, 16)]


def test_merge_takes_the_chosen_shapes_rules_and_fills_their_gaps_from_the_uncached_table() -> None:
    a = schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 4096, 4096, 1)
    b = schema.ShapeKey("MUL_MAT", "weight", "q4_K", "f32", 14336, 4096, 1)
    default = a.group()
    base_rules = [
        decide.Rule(a, 128, 1024, "cublas", (128, 512, 1024), 1.1),
        decide.Rule(b, 256, 1024, "cublas", (256, 1024), 1.2),
        decide.Rule(default, 9, 64, "mmq", (16, 32), 1.3),
    ]
    full_rules = [
        decide.Rule(a, 256, 512, CACHED, (256, 512), 1.9),
        decide.Rule(b, 128, 1024, CACHED, (128, 1024), 2.0),  # b not chosen: must not appear
        decide.Rule(default, 9, 64, CACHED, (16, 32), 1.5),  # a default: never from the cached decision
    ]
    base = decide.decide(_tuning(), P)
    merged = cache.merge(
        dataclasses.replace(base, rules=base_rules, refusals=[]),
        dataclasses.replace(base, rules=full_rules, refusals=[]),
        {a},
    )
    got = sorted((r.key.N, r.M_lo, r.M_hi, str(r.route), r.measured_M) for r in merged.rules)
    assert got == [
        (0, 9, 64, "mmq", (16, 32)),
        (4096, 128, 255, "cublas", (128,)),
        (4096, 256, 512, CACHED, (256, 512)),
        (4096, 513, 1024, "cublas", (1024,)),
        (14336, 256, 1024, "cublas", (256, 1024)),
    ]


def test_the_committed_cache_tables_fallback_is_the_table_without_the_cache(tmp_path: Path) -> None:
    """The measured H200 cache table (tables/cuda-sm90-nvidia-h200-cache), its header compiled by gcc: at
    every census shape and M (the census' and the A/B's), a node whose copy cannot be had (budget 0 at
    run time, a failed allocation) is routed exactly as the table without the cache (nocache/) routes it,
    and every other node gets that table's route too."""
    folder = archive.path("tables/cuda-sm90-nvidia-h200-cache")
    t, t0 = tbl.load(folder / "table.json"), tbl.load(folder / "nocache" / "table.json")
    gpu = tbl.table_gpu(t)
    points = pd.read_parquet(folder / "census.parquet")[["src0_type", "N", "K", "M"]].drop_duplicates()
    lines, cached = [], 0
    for p in points.itertuples():
        key = schema.ShapeKey("MUL_MAT", "weight", str(p.src0_type), "f32", int(p.N), int(p.K), 1)
        type0 = schema.ggml_type(key.src0_type).id
        for M in sorted({int(p.M), 1, 8, 64, 128, 256, 512, 1024, 2048}):
            main_cfg, plain = tbl.lookup_key(t, gpu, key, M), tbl.lookup_key(t0, gpu, key, M)
            want = registry.Config.parse(plain).code if plain else 0
            call = "ggml_dispatch_table_lookup"
            if main_cfg is not None and cache.is_cached(registry.Config.parse(main_cfg)):
                cached += 1
                call = "ggml_dispatch_table_cache_fallback"
            lines.append(f"k[0] = {key.N}; k[1] = {key.K}; ok &= {call}(0, 0, {type0}, 0, k, {M}) == {want};")
    assert cached > 100  # the cached rules are exercised, not only the uncached ones
    assert _all_hold((folder / "ggml-dispatch-table.h").read_text(), tmp_path, "{0, 0, 1, 0, 0}", lines)
