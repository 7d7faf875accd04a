"""lab/route_match.py and lab/stock_wrong.py on a recorded H200 sweep (real rows, S10 below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_dispatch import archive
from lab import route_match, stock_wrong

ROOT = Path(__file__).resolve().parents[1]
S10 = archive.path("evidence/h200-2026-12-02-s10/configs")


def test_classify() -> None:
    assert route_match.classify("cublas", "cublas") == "same"
    assert route_match.classify("stock", "stock") == "same"
    assert route_match.classify("cublas", "cublas/out=f32,compute=f16") == "config"
    assert route_match.classify("mmq", "cublas/out=f32,compute=bf16") == "displaced"
    assert route_match.classify("cublas", "stock") == "plain differs"
    assert route_match.classify("cublas", "mmq") == "plain differs"


def test_the_configurations_table_matches_the_route_only_table_where_no_configuration_is_involved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = route_match.main(
        [
            "--old",
            str(archive.path("tables/cuda-sm90-nvidia-h200-routes/table.json")),
            "--new",
            str(S10 / "table/table.json"),
            "--tuning",
            str(S10 / "tuning.parquet"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "171 MUL_MAT points" in out
    assert "| plain differs | 0 |" in out and "| same | 97 |" in out
    # against itself every point is the same
    route_match.main(["--old", str(S10 / "table/table.json"), "--new", str(S10 / "table/table.json"),
                      "--tuning", str(S10 / "tuning.parquet")])  # fmt: skip
    assert "| same | 171 |" in capsys.readouterr().out


def test_stock_wrong_lists_the_five_q4_1_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert stock_wrong.main([str(S10 / "tuning.journal.jsonl.gz")]) == 0
    out = capsys.readouterr().out
    assert "5 case(s)." in out
    assert "| MUL_MAT:weight:q4_1:f32:N1536:K576:B1:M32 | GPU-ae8024d7 | 0,1,2 of 7 | 0.0715 |" in out
    body = out.split("\n", 1)[1]  # after the title, which names the path as given
    assert (S10 / "STOCK-WRONG.md").read_text().split("\n", 1)[1] == body


def test_predecessor_spread_of_the_recorded_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    stock_wrong.main([str(S10 / "tuning.journal.jsonl.gz")])
    out = capsys.readouterr().out
    assert "394 (case, candidate) pairs ran after more than one predecessor" in out
    assert "max 1.401; 48 above 1.05, 11 above 1.10." in out
    rec = {
        "trials": [
            {"trial": t, "route": r, "t_end_s": 1 + i + 10 * t, "status": "ok", "us": us}
            for t, seq in enumerate([[("a", 1.0), ("b", 2.0)], [("c", 1.0), ("b", 3.0)]])
            for i, (r, us) in enumerate(seq)
        ]
    }
    ((spread, route, meds),) = list(stock_wrong.predecessor_spread(rec))
    assert route == "b" and meds == {"a": 2.0, "c": 3.0} and spread == 1.5


def test_stock_wrong_answers_a_damaged_journal_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "tuning.journal.jsonl"
    bad.write_text('{"kind": "journal"}\n{"kind": "case", "trials": [\n{"kind": "case"}\n')
    assert stock_wrong.main([str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"stock_wrong: {bad}:2: not a JSON object (the journal is damaged)\n"
