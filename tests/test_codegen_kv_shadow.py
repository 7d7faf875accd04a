"""``codegen --vram-budget``, the KV shadow's part: its configurations enter a table only under a budget.

On the committed sweep of the H200 attention-shadow table (its q8_0 points, each configuration also
with ``kv=shadow``), measured on the GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from ggml_dispatch import archive, registry
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import kv_shadow

REPO = Path(__file__).resolve().parent.parent
SWEEP = archive.path("tables/cuda-sm90-nvidia-h200-attn-shadow/tuning-q8_0.parquet")


def _codegen(out: Path, *extra: str) -> tuple[str, dict]:
    res = CliRunner().invoke(main, ["codegen", str(SWEEP), "-o", str(out), *extra])
    assert res.exit_code == 0, res.output
    return res.output, json.loads((out / "table.json").read_text())


def _shadow_rules(table: dict) -> list[dict]:
    return [r for r in table["rules"] if kv_shadow.is_shadow(registry.Config.parse(r["config"]))]


def test_without_a_budget_the_shadow_is_left_out_and_said_so(tmp_path: Path) -> None:
    output, table = _codegen(tmp_path / "none")
    assert not _shadow_rules(table) and "kv_shadow" not in table
    m = re.search(r"KV shadow: left out \(no --vram-budget\): at (\d+) attention points", output)
    assert m and int(m.group(1)) > 0, output
    assert (
        "GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES 0"
        in (tmp_path / "none" / "ggml-dispatch-table.h").read_text()
    )


def test_a_budget_admits_the_shadow_and_compiles_it_in(tmp_path: Path) -> None:
    output, table = _codegen(tmp_path / "b", "--vram-budget", "16384")
    assert _shadow_rules(table) and table["kv_shadow"] == {"budget_mib": 16384, "budget_bytes": 16384 << 20}
    assert "left out" not in output and "caps: weight cache 0 MiB, KV shadow 16384 MiB" in output
    admitted = table["vram"]["admitted"]
    assert admitted and {a["kind"] for a in admitted} == {"kv_shadow"}
    # each admitted key's cost: one layer's K and V shadow at its measured KV length
    for a in admitted:
        heads = 32 if a["D_K"] == 128 else 24
        assert a["bytes"] <= a["kv"] * heads // a["gqa"] * (a["D_K"] + a["D_V"]) * 2
    header = (tmp_path / "b" / "ggml-dispatch-table.h").read_text()
    assert f"GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES {16384 << 20}" in header


def test_a_bad_budget_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["codegen", str(SWEEP), "-o", str(tmp_path / "x"), "--vram-budget", "-1"])
    assert res.exit_code == 2 and "--vram-budget" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(
        main, ["codegen", str(SWEEP), "-o", str(tmp_path / "x"), "--kv-shadow-budget", "64"]
    )
    assert res.exit_code == 2 and "--kv-shadow-budget is replaced by --vram-budget" in res.output
    assert not (tmp_path / "x").exists()


H100_S25 = archive.path("evidence/h100-2026-12-06-s25")


def test_shallow_shadow_rules_only_reuse_a_shadow_made_deeper(tmp_path: Path) -> None:
    """An H100 autotune sweep (H100_S25): shadow rules at KV buckets 256 (llama-bench's warm-up
    pass), 16384 (the depth fill), 32768 and 65536. Only the deepest unbroken run of buckets (16384-65536)
    makes the shadow; the bucket-256 rules read one made deeper (``kv=reuse``), so a context that stays
    shallow never pays the shadow's upkeep."""
    out = tmp_path / "t"
    res = CliRunner().invoke(
        main,
        [
            *["codegen", str(H100_S25 / "autotune-fill-tuning.parquet")],
            *["--census", str(H100_S25 / "autotune-fill-census.parquet"), "--vram-budget", "16384"],
            *["--op", "FLASH_ATTN_EXT", "-o", str(out)],
        ],
    )
    assert res.exit_code == 0, res.output
    # the default summary counts refusals by kind: one line for every candidate the race stopped
    race = [ln for ln in res.output.splitlines() if "stopped by the race" in ln]
    assert len(race) == 1 and len(res.output.splitlines()) < 40, res.output
    assert "KV shadow: 3 rule(s) below the deepest run of shadow buckets read kv=reuse" in res.output
    table = json.loads((out / "table.json").read_text())
    by_kv: dict[int, set[str]] = {}
    for r in table["rules"]:
        by_kv.setdefault(r["kv"], set()).add(r["config"].rsplit("kv=", 1)[1])
    assert by_kv == {256: {"reuse"}, 16384: {"shadow"}, 32768: {"shadow"}, 65536: {"shadow"}}
    # everything else as the committed attention-only table made before reuse (4a792bdf96fa)
    before = json.loads((H100_S25 / "attn-only" / "table.json").read_text())["rules"]
    assert [registry.measured_config(r["config"]) for r in table["rules"]] == [r["config"] for r in before]
    header = (out / "ggml-dispatch-table.h").read_text()
    assert f"{{ 256, 256, 6, 256, 0 }}, 1, 2, {registry.Config.parse('fa_tile/kv=reuse').code} }}" in header


def test_the_run_of_maker_buckets_is_per_attention_kind() -> None:
    rule = {"op": "FLASH_ATTN_EXT", "layout": "attention", "k_type": "q8_0", "v_type": "q8_0", "D_K": 256}
    rule |= {"D_V": 256, "gqa": 6, "M_lo": 1, "M_hi": 1, "route": "fa_mma"}
    other = rule | {"D_K": 128, "D_V": 128, "gqa": 4}
    rules = [
        rule | {"kv": 1024, "config": "fa_mma/kv=shadow"},  # below a gap (2048 has none): reuse
        rule | {"kv": 4096, "config": "fa_mma/kv=shadow"},
        rule | {"kv": 8192, "config": "fa_mma/kv=shadow"},
        rule | {"kv": 2048, "config": "fa_mma/ncols1=1"},  # no shadow: does not close the gap
        other | {"kv": 1024, "config": "fa_mma/kv=shadow"},  # its own kind: the deepest run is itself
    ]
    got = [r["config"] for r in kv_shadow.reuse_below_makers(rules)]
    assert got == [
        "fa_mma/kv=reuse",
        "fa_mma/kv=shadow",
        "fa_mma/kv=shadow",
        "fa_mma/ncols1=1",
        "fa_mma/kv=shadow",
    ]


def test_reuse_is_never_swept_and_stands_for_the_shadow_it_measured() -> None:
    for route in (registry.Route.FA_VEC, registry.Route.FA_TILE, registry.Route.FA_MMA):
        configs = [str(c) for c in registry.route_configs(route)]
        assert any("kv=shadow" in c for c in configs) and not any("kv=reuse" in c for c in configs)
    c = registry.Config.parse("fa_mma/ncols1=4,ncols2=2,kv=reuse")
    assert registry.Config.from_code(c.code) == c  # a code the header and the hook share
    assert registry.measured_config(str(c)) == "fa_mma/ncols1=4,ncols2=2,kv=shadow"
    assert registry.measured_config("fa_tile") == "fa_tile"
    assert kv_shadow.is_shadow(c)
