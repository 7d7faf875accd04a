"""Bad input to ``ggml-dispatch report``: one clear error naming the file (and line or field), exit 2,
and nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from ggml_dispatch import fileio, schema
from ggml_dispatch.cli import main

_ARROW = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


def tuning_row(**over: Any) -> dict[str, Any]:
    row = {
        "gpu_name": "NVIDIA H200",
        "gpu_uuid": "GPU-1",
        "gpu_cc": 900,
        "gpu_sm_count": 132,
        "driver": "580",
        "cuda_version": "13.0",
        "cublas_version": "13.0.2",
        "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
        "patch_hash": "ab" * 32,
        "harness_version": "1",
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": "q4_K",
        "src1_type": "f32",
        "M": 8,
        "N": 4096,
        "K": 4096,
        "B": 1,
        "route": "mmq",
        "trial": 0,
        "us": 10.0,
        "replays": 10,
        "weight_copies": 8,
        "anchor_us": 12.0,
        "nmse": 1e-6,
        "route_ran": "mmq",
        "status": "ok",
        "source": "measured",
    }
    row.update(over)
    return row


def write(path: Path, columns: dict[str, str], rows: list[dict[str, Any]], meta: dict[str, str]) -> Path:
    table = pa.Table.from_pylist(rows, schema=pa.schema([(c, _ARROW[t]) for c, t in columns.items()]))
    fileio.write_parquet(table, path, meta)
    return path


def good_tuning(tmp_path: Path) -> Path:
    rows = [tuning_row(trial=t) for t in range(3)]
    return write(
        tmp_path / "tuning.parquet", schema.TUNING_COLUMNS, rows, fileio.base_metadata(schema.TUNING_SCHEMA)
    )


def report(args: list[str]) -> Result:
    return CliRunner().invoke(main, ["report", *args])


def assert_input_error(result: Result, where: str, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("ggml-dispatch: error: ")]
    assert len(lines) == 1, result.output
    message = lines[0]
    assert message.startswith(f"ggml-dispatch: error: {where}"), message
    for w in words:
        assert w in message, message
    assert "Traceback" not in result.output


@pytest.fixture()
def out(tmp_path: Path) -> Path:
    return tmp_path / "report"


def test_empty_tuning_file(tmp_path: Path, out: Path) -> None:
    p = tmp_path / "tuning.parquet"
    p.write_bytes(b"")
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}:", "empty")
    assert not out.exists()


def test_missing_tuning_file(tmp_path: Path, out: Path) -> None:
    p = tmp_path / "nope.parquet"
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}:", "no such")


def test_not_parquet(tmp_path: Path, out: Path) -> None:
    p = tmp_path / "tuning.parquet"
    p.write_text("op,M\nMUL_MAT,1\n")
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}:", "not a readable Parquet file")
    assert not out.exists()


def test_parquet_without_schema_metadata(tmp_path: Path, out: Path) -> None:
    p = tmp_path / "tuning.parquet"
    pq.write_table(pa.Table.from_pylist([tuning_row()]), p)
    assert_input_error(
        report(["--tuning", str(p), "-o", str(out)]), f"{p}: {schema.META_SCHEMA}:", "not a tuning"
    )


def test_census_given_as_tuning(tmp_path: Path, out: Path) -> None:
    p = write(
        tmp_path / "c.parquet",
        {"op": "string"},
        [{"op": "MUL_MAT"}],
        fileio.base_metadata(schema.CENSUS_SCHEMA),
    )
    result = report(["--tuning", str(p), "-o", str(out)])
    assert_input_error(result, f"{p}: {schema.META_SCHEMA}:", schema.CENSUS_SCHEMA, schema.TUNING_SCHEMA)


def test_missing_column(tmp_path: Path, out: Path) -> None:
    cols = {k: v for k, v in schema.TUNING_COLUMNS.items() if k != "anchor_us"}
    rows = [{k: v for k, v in tuning_row().items() if k != "anchor_us"}]
    p = write(tmp_path / "t.parquet", cols, rows, fileio.base_metadata(schema.TUNING_SCHEMA))
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}: anchor_us:", "missing column")


def test_wrong_column_type(tmp_path: Path, out: Path) -> None:
    cols = {**schema.TUNING_COLUMNS, "M": "string"}
    p = write(tmp_path / "t.parquet", cols, [tuning_row(M="8")], fileio.base_metadata(schema.TUNING_SCHEMA))
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}: M:", "expected int64")


def test_no_rows(tmp_path: Path, out: Path) -> None:
    p = write(tmp_path / "t.parquet", schema.TUNING_COLUMNS, [], fileio.base_metadata(schema.TUNING_SCHEMA))
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}:", "no rows")


def test_unknown_status(tmp_path: Path, out: Path) -> None:
    rows = [tuning_row(), tuning_row(trial=1, status="maybe")]
    p = write(tmp_path / "t.parquet", schema.TUNING_COLUMNS, rows, fileio.base_metadata(schema.TUNING_SCHEMA))
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}: row 1: status:", "'maybe'")


def test_ok_row_without_time(tmp_path: Path, out: Path) -> None:
    rows = [tuning_row(), tuning_row(trial=1, us=None)]
    p = write(tmp_path / "t.parquet", schema.TUNING_COLUMNS, rows, fileio.base_metadata(schema.TUNING_SCHEMA))
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}: row 1: us:")


def test_mixed_gpus(tmp_path: Path, out: Path) -> None:
    rows = [tuning_row(), tuning_row(trial=1, gpu_name="NVIDIA H100 80GB HBM3")]
    p = write(tmp_path / "t.parquet", schema.TUNING_COLUMNS, rows, fileio.base_metadata(schema.TUNING_SCHEMA))
    assert_input_error(report(["--tuning", str(p), "-o", str(out)]), f"{p}: gpu_name:", "2 GPUs")


def test_bad_census(tmp_path: Path, out: Path) -> None:
    t = good_tuning(tmp_path)
    empty = tmp_path / "census.parquet"
    empty.write_bytes(b"")
    assert_input_error(
        report(["--tuning", str(t), "--census", str(empty), "-o", str(out)]), f"{empty}:", "empty"
    )
    wrong = write(
        tmp_path / "c2.parquet",
        schema.TUNING_COLUMNS,
        [tuning_row()],
        fileio.base_metadata(schema.TUNING_SCHEMA),
    )
    result = report(["--tuning", str(t), "--census", str(wrong), "-o", str(out)])
    assert_input_error(result, f"{wrong}: {schema.META_SCHEMA}:", "expected 'ggml-dispatch-census/1'")
    assert not out.exists()


def test_bad_table(tmp_path: Path, out: Path) -> None:
    t = good_tuning(tmp_path)
    table = tmp_path / "table.json"
    table.write_text("")
    assert_input_error(
        report(["--tuning", str(t), "--table", str(table), "-o", str(out)]), f"{table}:", "empty"
    )
    table.write_text('{\n  "schema": "ggml-dispatch-table/1",\n  "rules": [,]\n}\n')
    assert_input_error(report(["--tuning", str(t), "--table", str(table), "-o", str(out)]), f"{table}:3:")
    table.write_text(json.dumps({"schema": "something-else/1", "rules": []}))
    assert_input_error(
        report(["--tuning", str(t), "--table", str(table), "-o", str(out)]), f"{table}: schema:"
    )
    assert not out.exists()


AB_OK = {"model": "m", "test": "pp512", "ubatch": 512, "arm": "stock", "pair": 0, "tps": 100.0}


@pytest.mark.parametrize(
    ("lines", "where", "words"),
    [
        ([AB_OK, "{not json"], ":2:", ("invalid JSON",)),
        ([AB_OK, {k: v for k, v in AB_OK.items() if k != "tps"}], ":2: tps:", ("missing",)),
        ([{**AB_OK, "arm": "Stock"}], ":1: arm:", ("stock, table, crude",)),
        ([{**AB_OK, "ubatch": "512"}], ":1: ubatch:", ("expected a int",)),
        ([{**AB_OK, "tps": -1.0}], ":1: tps:", ("positive",)),
        ([{**AB_OK, "pair": True}], ":1: pair:", ()),
        ([AB_OK, {**AB_OK, "tps": 101.0}], ":2:", ("second run", "first is at ab.jsonl:1")),
        ([], ":", ("no A/B records",)),
        ([[1, 2]], ":1:", ("JSON object",)),
    ],
)
def test_bad_ab(tmp_path: Path, out: Path, lines: list[Any], where: str, words: tuple[str, ...]) -> None:
    t = good_tuning(tmp_path)
    ab = tmp_path / "ab.jsonl"
    ab.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    result = report(["--tuning", str(t), "--ab", str(ab), "-o", str(out)])
    assert_input_error(result, f"{ab}{where}", *words)
    assert not out.exists()


def test_ab_files_are_separate_runs(tmp_path: Path, out: Path) -> None:
    """The same (model, test, ubatch, arm, pair) in two files: two runs, reported apart, never paired
    across files; a repeat inside one file is still refused (above)."""
    t = good_tuning(tmp_path)
    a, b = tmp_path / "run1.jsonl", tmp_path / "run2.jsonl"
    a.write_text(json.dumps(AB_OK) + "\n" + json.dumps({**AB_OK, "arm": "table", "tps": 120.0}) + "\n")
    b.write_text("\n" + json.dumps({**AB_OK, "tps": 50.0}) + "\n")
    result = report(["--tuning", str(t), "--ab", str(a), "--ab", str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    md = (out / "REPORT.md").read_text()
    model = AB_OK["model"]
    summary = md[md.index("## Summary") : md.index("## Data provenance")]
    assert f"| {model} [run1] {AB_OK['test']} ub{AB_OK['ubatch']} | 1.200 n/a | n/a (<2 pairs) |" in summary
    assert "[run2]" not in summary  # its stock run has no table partner in its own file


def test_good_minimal_input_writes_report(tmp_path: Path, out: Path) -> None:
    """The control case: the same small file that the bad cases start from is accepted."""
    t = good_tuning(tmp_path)
    ab = tmp_path / "ab.jsonl"
    ab.write_text(json.dumps(AB_OK) + "\n")
    result = CliRunner().invoke(main, ["report", "--tuning", str(t), "--ab", str(ab), "-o", str(out)])
    assert result.exit_code == 0, result.output
    md = (out / "REPORT.md").read_text()
    assert "No arm has a partner (stock or crude) to compare with." in md
    # 3 trials at ratio 12/10: chosen over stock
    assert (
        "| 8 | mmq | 3 | 3 | 10.00 | 10.00–10.00 | 10.00–10.00 | 1.200 | [1.200, 1.200] | faster | chosen |"
        in md
    )
