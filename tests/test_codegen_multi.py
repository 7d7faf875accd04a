"""``codegen`` over several tuning files: one set of rows, checked across files (one GPU and upstream
commit, no trial twice), on the committed sweeps; and the one VRAM budget ranking the weight cache and the
KV shadow together on the committed cache and attention-shadow sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from ggml_dispatch import archive
from ggml_dispatch.artifacts import census as census_artifact
from ggml_dispatch.artifacts import tuning
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import decide, kv_shadow, vram
from ggml_dispatch.errors import InputError

ATTN = archive.path("tables/cuda-sm90-nvidia-h200-attn-shadow")
CACHE = archive.path("tables/cuda-sm90-nvidia-h200-cache")
H200_MOE = archive.path("tables/cuda-sm90-nvidia-h200-moe-fit/tuning.parquet")
H100_MOE = archive.path("tables/cuda-sm90-nvidia-h100-moe-fit/tuning.parquet")
P = decide.Params(resamples=200)


def test_a_trial_in_two_files_is_refused_naming_both() -> None:
    # the q8_0 sweep's rows are also in the merged attention file: each trial would count twice
    with pytest.raises(InputError) as e:
        tuning.read_many([ATTN / "merged.parquet", ATTN / "tuning-q8_0.parquet"])
    msg = str(e.value)
    assert "tuning-q8_0.parquet" in msg and "merged.parquet" in msg and "counted twice" in msg


def test_files_of_two_gpus_are_refused_unless_mixing_is_allowed() -> None:
    with pytest.raises(InputError, match=r"2 GPUs .*NVIDIA H100 80GB HBM3.*NVIDIA H200|2 GPUs"):
        tuning.read_many([H200_MOE, H100_MOE])
    both = tuning.read_many([H200_MOE, H100_MOE], allow_mixed=True)
    assert both.table.num_rows == sum(tuning.read(p).table.num_rows for p in (H200_MOE, H100_MOE))


def test_a_file_given_twice_is_refused() -> None:
    with pytest.raises(InputError, match="given twice"):
        tuning.read_many([H200_MOE, H200_MOE])


def test_the_cli_decides_several_files_as_one_and_lists_them(tmp_path: Path) -> None:
    out = tmp_path / "t"
    files = [H200_MOE, ATTN / "tuning-q8_0.parquet"]
    res = CliRunner().invoke(main, ["codegen", *map(str, files), "-o", str(out)])
    assert res.exit_code == 0, res.output
    table = json.loads((out / "table.json").read_text())
    assert [f["name"] for f in table["provenance"]["tuning_files"]] == [p.name for p in files]
    assert {r["op"] for r in table["rules"]} == {"MUL_MAT_ID", "FLASH_ATTN_EXT"}
    # each op's rules are those of its file alone
    for f in files:
        one = tmp_path / f.stem
        assert CliRunner().invoke(main, ["codegen", str(f), "-o", str(one)]).exit_code == 0
        alone = json.loads((one / "table.json").read_text())["rules"]
        ops = {r["op"] for r in alone}
        assert [r for r in table["rules"] if r["op"] in ops] == alone
    res = CliRunner().invoke(main, ["codegen", str(H200_MOE), str(H100_MOE), "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "Traceback" not in res.output and not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def memory_rows() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The committed cache sweep (weight=cached rows) and the q8_0 attention sweep (kv=shadow rows)."""
    ts = tuning.read_many([CACHE / "tuning.parquet", ATTN / "tuning-q8_0.parquet"])
    return ts.frame(), census_artifact.read(CACHE / "census.parquet").frame()


def test_one_budget_ranks_both_kinds_by_time_saved_per_mib(
    memory_rows: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    df, census = memory_rows
    _, plan, _ = vram.decide_with_budget(df, census, 1 << 20, P)
    assert plan is not None
    kinds = {c.kind for c in plan.admitted}
    assert kinds == {vram.WEIGHT_CACHE, vram.KV_SHADOW}  # a budget this large admits every candidate
    ranked = sorted(plan.admitted, key=vram._rank)
    per_mib = [c.saved_per_mib for c in ranked]
    assert per_mib == sorted(per_mib, reverse=True) and all(x > 0 for x in per_mib)
    # a budget that holds only the best few admits a prefix of that ranking (greedy; skipped ones are larger)
    small = ranked[0].bytes // (1 << 20) + 1
    _, part, _ = vram.decide_with_budget(df, census, small, P)
    assert part is not None and part.admitted[0] == ranked[0] and part.bytes <= small << 20


def test_budget_zero_has_no_memory_rules_and_more_budget_never_drops_one(
    memory_rows: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    df, census = memory_rows
    d0, plan0, left_out = vram.decide_with_budget(df, census, 0, P)
    assert plan0 is not None and plan0.admitted == () and left_out > 0
    assert not any(kv_shadow.is_shadow(r.route) or "weight=cached" in str(r.route) for r in d0.rules)
    dn, none, _ = vram.decide_with_budget(df, census, None, P)
    assert none is None and [(r.key, r.route, r.M_lo) for r in dn.rules] == [
        (r.key, r.route, r.M_lo) for r in d0.rules
    ]
    before: set[tuple[str, object]] = set()
    for budget in (0, 64, 256, 1024, 4096, 16384, 65536):
        # budget 0's plan is plan0 above (the same call: not decided again)
        plan = plan0 if budget == 0 else vram.decide_with_budget(df, census, budget, P)[1]
        assert plan is not None and plan.bytes <= budget << 20
        now = {(c.kind, c.key) for c in plan.admitted}
        assert before <= now, budget  # monotone: a larger budget keeps every rule a smaller one admitted
        before = now
    assert before


@pytest.mark.parametrize("bad", ["-1", "nan", "lots", "1.5", str(1 << 40)])
def test_a_bad_budget_is_one_clear_error(bad: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["codegen", str(H200_MOE), "-o", str(tmp_path / "x"), "--vram-budget", bad]
    )
    assert res.exit_code == 2 and "--vram-budget" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()
    with pytest.raises(InputError, match="VRAM budget"):
        vram.check_budget(-1)
