"""lab/attn_configs_summary.py (lab/attn.sh PART=configs): the per-point summary of a configuration sweep
and its refusal of a sweep with a wrong configuration. The tuning rows are written from journal records in
the harness's form (their times need a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tuner_attention import attn_key, journal_record, tally

from ggml_dispatch import registry
from ggml_dispatch.census import attention
from ggml_dispatch.tuner import attention as tattn
from ggml_dispatch.tuner import results
from lab import attn_configs_summary

CFGS = ["fa_vec", "fa_vec/blocks=32", "fa_mma", "fa_mma/ncols1=2,ncols2=4,sparse=off,stream_k=on"]


def tuning(tmp_path: Path, wrong: bool = False, untunable: bool = False) -> Path:
    keys = [attn_key("q8_0", 1, 49152)] + ([attn_key("f16", 2, 49152)] if untunable else [])
    rows = attention.attention_rows({k: tally(10) for k in keys})
    recs = []
    for case in tattn.select_attention(rows, routes=CFGS).cases:
        rec = journal_record(case, {"fa_vec": 1.0, CFGS[1]: 1.3, "fa_mma": 0.8, CFGS[3]: 0.9})  # type: ignore[arg-type]
        dead = case.shape.k_type == "f16"
        for line in rec["trials"]:
            if line["route"] != "stock":
                line["route_ran"] = registry.config_route(line["route"])
                if (wrong and line["route"] == CFGS[3]) or dead:
                    line["status"] = "wrong"
        recs.append(rec)
    out = tmp_path / "tuning.parquet"
    results.write_tuning(out, recs, input_hashes={}, settings={})
    return out


def test_summary_names_the_fastest_configuration_per_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert attn_configs_summary.main([str(tuning(tmp_path))]) == 0
    out = capsys.readouterr().out
    (row,) = [ln for ln in out.splitlines() if ln.startswith("| q8_0")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "q8_0/q8_0 D256 gqa6 kv65536 n_kv49152" and cells[1] == "1"
    assert cells[3] == "4"  # four configurations ran eligible
    assert cells[4].startswith("fa_vec (1.0") and cells[5].startswith("fa_vec/blocks=32 (1.3")


def test_a_wrong_configuration_fails_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert attn_configs_summary.main([str(tuning(tmp_path, wrong=True))]) == 1
    assert f"- {CFGS[3]}: wrong x6" in capsys.readouterr().out


def test_a_point_where_every_candidate_is_wrong_is_listed_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every configuration, stock's own kernel among them, refused by the check at one point: the tree's
    # kernels cannot meet the declared threshold there, which is no configuration's fault
    assert attn_configs_summary.main([str(tuning(tmp_path, untunable=True))]) == 0
    out = capsys.readouterr().out
    assert "1 points untunable" in out and "- f16/f16 D256 gqa6 kv65536" in out and " M 2: " in out
    assert [ln for ln in out.splitlines() if ln.startswith("| q8_0")]
    # a configuration wrong where others are ok still fails the summary, untunable points or not
    assert attn_configs_summary.main([str(tuning(tmp_path, wrong=True, untunable=True))]) == 1


def test_report_reads_an_attention_sweep(tmp_path: Path) -> None:
    # the report names a key's two types by the key's own fields (k/v of attention, src0/src1 of a matmul)
    from click.testing import CliRunner

    from ggml_dispatch.cli import main

    res = CliRunner().invoke(main, ["report", "--tuning", str(tuning(tmp_path)), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "FLASH_ATTN_EXT" in text and "q8_0" in text
    assert list((tmp_path / "rep" / "plots").glob("*flash_attn_ext-attention-q8_0-q8_0*.png"))


def test_a_file_that_is_not_a_tuning_parquet_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert attn_configs_summary.main([str(tmp_path / "missing.parquet")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("attn_configs_summary: ") and "missing.parquet: no such file" in err
    assert err.count("\n") == 1
