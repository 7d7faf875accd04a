"""One reader per pipeline file: a bad census or tuning file is refused by every command that reads it,
with the same one message naming the file and the field (exit 2, no traceback, nothing written), and
a good one is accepted by all of them. Through the real CLI root; the trial times are synthetic
(they stand in for GPU measurements)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from test_codegen_support import H200, census_row, trials, tuning_row, write_census, write_tuning

from ggml_dispatch import archive, fileio, schema
from ggml_dispatch.artifacts import tuning as tuning_artifact
from ggml_dispatch.artifacts import validators
from ggml_dispatch.cli import main

H100 = schema.GpuId("NVIDIA H100", 900, 132)
# the H200 dense-route table and the tuning file it was decided from (archived: the product table decides
# these rows together with the other sweeps): the bad files below are these, changed in one place
H200_DIR = archive.path("tables/cuda-sm90-nvidia-h200-routes")
H200_TABLE = H200_DIR / "table.json"
H200_TUNING = H200_DIR / "tuning.parquet"


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(res: Result, *outputs: Path) -> str:
    """The one error line (without the prefix); asserts exit 2, no traceback, no output written."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("ggml-dispatch: error: ")]
    assert len(lines) == 1, res.stderr
    for out in outputs:
        assert not out.exists(), out
    return lines[0].removeprefix("ggml-dispatch: error: ")


def good_tuning(path: Path, gpu: schema.GpuId = H200) -> Path:
    rows = trials(speed={"mmq": 1.0, "cublas": 1.5}, M=512, gpu=gpu)
    rows += trials(speed={"mmq": 1.0, "cublas": 1.5}, M=1024, gpu=gpu)
    return write_tuning(rows, path)


def good_census(path: Path) -> Path:
    return write_census([census_row(M=512), census_row(M=1024, tensor="blk.0.ffn_gate.weight")], path)


def _tuning_with(tmp: Path, **change: Any) -> Path:
    rows = trials(speed={"mmq": 1.0, "cublas": 1.5}, M=512)
    rows[1].update(change)
    return write_tuning(rows, tmp / "bad-tuning.parquet")


def _census_with(tmp: Path, **change: Any) -> Path:
    rows = [census_row(M=512), census_row(M=1024)]
    rows[1].update(change)
    return write_census(rows, tmp / "bad-census.parquet")


def _raw(tmp: Path, data: bytes) -> Path:
    p = tmp / "bad.parquet"
    p.write_bytes(data)
    return p


def _folder(tmp: Path) -> Path:
    p = tmp / "a-folder.parquet"
    p.mkdir()
    (p / "part-0.parquet").write_bytes(good_tuning(tmp / "x.parquet").read_bytes())
    return p


def _no_schema_key(tmp: Path, columns: dict[str, str], row: dict[str, Any]) -> Path:
    p = tmp / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=validators.arrow_schema(columns)), p)
    return p


def _without_column(tmp: Path, kind: str, column: str) -> Path:
    src = good_tuning(tmp / "t.parquet") if kind == "tuning" else good_census(tmp / "c.parquet")
    t = pq.read_table(src)
    meta = fileio.read_parquet_metadata(src)
    p = tmp / "short.parquet"
    fileio.write_parquet(t.drop_columns([column]), p, meta)
    return p


def _without_tool_version(tmp: Path, kind: str) -> Path:
    src = good_tuning(tmp / "t.parquet") if kind == "tuning" else good_census(tmp / "c.parquet")
    t = pq.read_table(src)
    meta = {k: v for k, v in (t.schema.metadata or {}).items() if k != schema.META_TOOL_VERSION.encode()}
    p = tmp / "no-version.parquet"
    pq.write_table(t.replace_schema_metadata(meta), p)
    return p


def _real_tuning_with(tmp: Path, change: Callable[[pa.Table], pa.Table]) -> Path:
    """The committed H200 tuning file with ``change`` made to its rows (its metadata kept)."""
    p = tmp / "bad-tuning.parquet"
    fileio.write_parquet(change(pq.read_table(H200_TUNING)), p, fileio.read_parquet_metadata(H200_TUNING))
    return p


def _set(name: str, row: int, value: Any) -> Callable[[pa.Table], pa.Table]:
    def change(t: pa.Table) -> pa.Table:
        values = t.column(name).to_pylist()
        values[row] = value
        return t.set_column(t.column_names.index(name), name, pa.array(values, t.schema.field(name).type))

    return change


def _first_ineligible_row() -> int:
    return int(
        pq.read_table(H200_TUNING, columns=["status"]).column("status").to_pylist().index("ineligible")
    )


UPSTREAM_HELP = (
    "is not an upstream id (a 40-hex commit, a build number like b11549 or a registry version like "
    "llama-cpp-python==0.3.36)"
)

BAD_TUNING: dict[str, tuple[Callable[[Path], Path], str]] = {
    "unknown status": (lambda t: _tuning_with(t, status="great"), "row 1: status: unknown status 'great'"),
    "null status": (lambda t: _tuning_with(t, status=None), "row 1: status: unknown status None"),
    "bare failed": (lambda t: _tuning_with(t, status="failed:"), "row 1: status: unknown status 'failed:'"),
    "NaN us in an ok row": (lambda t: _tuning_with(t, us=math.nan), "row 1: us: ok trial with time nan"),
    "inf us in an ok row": (lambda t: _tuning_with(t, us=math.inf), "row 1: us: ok trial with time inf"),
    "NaN anchor in an ok row": (
        lambda t: _tuning_with(t, anchor_us=math.nan),
        "row 1: anchor_us: ok trial with stock anchor nan",
    ),
    "unknown route": (lambda t: _tuning_with(t, route="magic"), "row 1: route: unknown route 'magic'"),
    "no GPU name": (lambda t: _tuning_with(t, gpu_name=None), "row 1: gpu_name: empty GPU name"),
    "no commit": (lambda t: _tuning_with(t, upstream_commit=""), "row 1: upstream_commit: empty upstream"),
    "no harness version": (
        lambda t: _tuning_with(t, harness_version=None),
        "row 1: harness_version: empty harness version",
    ),
    "negative SM count": (
        lambda t: _tuning_with(t, gpu_sm_count=-1),
        "row 1: gpu_sm_count: must be an integer >= 0",
    ),
    "no tool version": (
        lambda t: _without_tool_version(t, "tuning"),
        f"{schema.META_TOOL_VERSION}: no tool version: not a tuning file written by ggml-dispatch",
    ),
    "no schema key": (
        lambda t: _no_schema_key(t, schema.TUNING_COLUMNS, tuning_row(route="mmq", M=1, us=1, anchor_us=1)),
        f"{schema.META_SCHEMA}: no '{schema.META_SCHEMA}' key-value metadata: not a tuning file",
    ),
    "a census": (
        lambda t: good_census(t / "c.parquet"),
        f"{schema.META_SCHEMA}: not a tuning file: its schema is '{schema.CENSUS_SCHEMA}'",
    ),
    "missing column": (lambda t: _without_column(t, "tuning", "anchor_us"), "anchor_us: missing column"),
    "random bytes": (lambda t: _raw(t, bytes(range(256)) * 4), "not a readable Parquet file"),
    "empty": (lambda t: _raw(t, b""), "empty file (expected a tuning Parquet file)"),
    "folder": (_folder, "is a folder (expected a tuning Parquet file)"),
    # the committed H200 file: row 3 is its first ineligible row (stock timed, the route not)
    "real: NaN stock time in an ineligible row": (
        lambda t: _real_tuning_with(t, _set("anchor_us", 3, math.nan)),
        "row 3: anchor_us: not a finite number: nan (null says not measured)",
    ),
    "real: infinite time in an ineligible row": (
        lambda t: _real_tuning_with(t, _set("us", 3, math.inf)),
        "row 3: us: not a finite number: inf (null says not measured)",
    ),
    "real: NaN nmse": (
        lambda t: _real_tuning_with(t, _set("nmse", 0, math.nan)),
        "row 0: nmse: not a finite number: nan",
    ),
    "real: trials twice": (
        lambda t: _real_tuning_with(t, lambda x: pa.concat_tables([x, x.slice(0, 5)])),
        "row 6090: trial: repeats row 0 (same GPU and uuid, upstream commit, shape, configuration and trial)",
    ),
    "real: a short upstream commit": (
        lambda t: _real_tuning_with(t, _set("upstream_commit", 7, "0c1e570")),
        f"row 7: upstream_commit: '0c1e570' {UPSTREAM_HELP}",
    ),
}

BAD_CENSUS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "NaN est_us": (lambda t: _census_with(t, est_us=math.nan), "row 1: est_us: est_us must be a time >= 0"),
    "unknown op": (lambda t: _census_with(t, op="CONV"), "row 1: op: unknown op 'CONV'"),
    "zero M": (lambda t: _census_with(t, M=0), "row 1: M: must be a positive integer, got 0"),
    "null calls": (lambda t: _census_with(t, calls=None), "row 1: calls: null in a required column"),
    "no schema key": (
        lambda t: _no_schema_key(t, schema.CENSUS_COLUMNS, census_row(M=1)),
        f"{schema.META_SCHEMA}: no '{schema.META_SCHEMA}' key-value metadata: not a census file",
    ),
    "a tuning file": (
        lambda t: good_tuning(t / "t.parquet"),
        f"{schema.META_SCHEMA}: not a census file: its schema is '{schema.TUNING_SCHEMA}'",
    ),
    "missing column": (lambda t: _without_column(t, "census", "stock_route"), "stock_route: missing column"),
    "random bytes": (lambda t: _raw(t, b"\x00\xff" * 300), "not a readable Parquet file"),
    "folder": (_folder, "is a folder (expected a census Parquet file)"),
    "no tool version": (
        lambda t: _without_tool_version(t, "census"),
        f"{schema.META_TOOL_VERSION}: no tool version: not a census file written by ggml-dispatch",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TUNING))
def test_a_bad_tuning_file_is_refused_alike_by_every_reader(case: str, tmp_path: Path) -> None:
    make, expect = BAD_TUNING[case]
    bad = make(tmp_path)
    census = good_census(tmp_path / "census.parquet")
    out = tmp_path / "out"
    messages = {
        "codegen": refused(cli("codegen", bad, "-o", out), out),
        "codegen --allow-mixed": refused(cli("codegen", bad, "--allow-mixed", "-o", out), out),
        "tune merge": refused(cli("tune", "merge", bad, "-o", out / "m.parquet"), out),
        "diff --tuning": refused(cli("diff", "empty", "empty", "--census", census, "--tuning", bad)),
    }
    assert len(set(messages.values())) == 1, messages
    msg = messages["codegen"]
    assert msg.startswith(f"{bad}: ") and expect in msg, msg


@pytest.mark.parametrize("case", sorted(BAD_CENSUS))
def test_a_bad_census_file_is_refused_alike_by_every_reader(case: str, tmp_path: Path) -> None:
    make, expect = BAD_CENSUS[case]
    bad = make(tmp_path)
    tuning = good_tuning(tmp_path / "tuning.parquet")
    out = tmp_path / "out"
    tree = tmp_path / "tree"  # tune run refuses the census before it looks at the tree
    tree.mkdir()
    messages = {
        "census show": refused(cli("census", "show", bad)),
        "census show --json": refused(cli("census", "show", bad, "--json")),
        "tune run": refused(
            cli("tune", "run", bad, "--llama-cpp", tree, "-o", out / "t.parquet", "--dry-run"), out
        ),
        "codegen --census": refused(cli("codegen", tuning, "--census", bad, "-o", out), out),
        "diff --census": refused(cli("diff", "empty", "empty", "--census", bad, "--tuning", tuning)),
    }
    assert len(set(messages.values())) == 1, messages
    msg = messages["census show"]
    assert msg.startswith(f"{bad}: ") and expect in msg, msg


def test_good_files_are_accepted_by_every_reader(tmp_path: Path) -> None:
    tuning = good_tuning(tmp_path / "tuning.parquet")
    census = good_census(tmp_path / "census.parquet")
    out = tmp_path / "out"
    assert cli("census", "show", census).exit_code == 0
    res = cli("codegen", tuning, "--census", census, "-o", out)
    assert res.exit_code == 0, res.output
    assert cli("tune", "merge", tuning, "-o", tmp_path / "m.parquet").exit_code == 0
    res = cli("diff", "empty", out / "table.json", "--census", census, "--tuning", tuning)
    assert res.exit_code == 0, res.output


def test_pruned_trials_are_accepted_and_skipped_like_drifted(tmp_path: Path) -> None:
    rows = trials(speed={"mmq": 1.0, "cublas": 1.5}, M=512)
    plain = write_tuning(rows, tmp_path / "plain.parquet")
    extra = [
        {**r, "trial": r["trial"] + 100, "status": s, "us": 1e-3}
        for r in rows
        if r["route"] == "mmq"
        for s in ("pruned",)
    ]
    pruned = write_tuning(rows + extra, tmp_path / "pruned.parquet")
    drifted = write_tuning(rows + [{**r, "status": "drifted"} for r in extra], tmp_path / "drifted.parquet")
    tables = []
    for p in (plain, pruned, drifted):
        out = tmp_path / p.stem
        res = cli("codegen", p, "-o", out)
        assert res.exit_code == 0, res.output
        tables.append((out / "table.json").read_text().count('"route": "cublas"'))
    assert tables[0] == tables[1] == tables[2] >= 1  # the 1e-3 us pruned rows changed nothing
    t = tuning_artifact.read(pruned)
    assert "pruned" in t.table.column("status").to_pylist()
    assert validators.status_kind("pruned") == "pruned" and "pruned" in validators.STATUS_KINDS


def test_merge_of_two_gpus_tunings_of_the_same_shapes(tmp_path: Path) -> None:
    """The duplicate check keys trials by GPU (and commit): the same shapes on two GPUs are two sets of
    trials, refused as mixed without --allow-mixed, merged with it."""
    a = good_tuning(tmp_path / "h200.parquet", H200)
    b = good_tuning(tmp_path / "h100.parquet", H100)
    out = tmp_path / "merged.parquet"
    msg = refused(cli("tune", "merge", a, b, "-o", out), out)
    assert msg.startswith(f"{b}: gpu_name: inputs come from 2 GPUs")
    assert f"NVIDIA H100 cc 900 132 SMs ({b})" in msg and "--allow-mixed" in msg
    res = cli("tune", "merge", a, b, "--allow-mixed", "-o", out)
    assert res.exit_code == 0, res.output
    n = pq.read_table(a).num_rows
    assert tuning_artifact.read(out, allow_mixed=True).table.num_rows == 2 * n
    # the same GPU's file twice is still a duplicate
    again = tmp_path / "again.parquet"
    again.write_bytes(a.read_bytes())
    msg = refused(cli("tune", "merge", a, again, "-o", tmp_path / "m2.parquet", "--allow-mixed"))
    assert msg.startswith(f"{again}: route: row 0 duplicates a row of {a}")


def test_merge_refuses_two_commits_unless_allowed(tmp_path: Path) -> None:
    a = write_tuning(trials(speed={"mmq": 1.0, "cublas": 1.5}, M=512), tmp_path / "a.parquet")
    b = write_tuning(
        trials(speed={"mmq": 1.0, "cublas": 1.5}, M=512, commit="f" * 40), tmp_path / "b.parquet"
    )
    out = tmp_path / "m.parquet"
    msg = refused(cli("tune", "merge", a, b, "-o", out), out)
    assert msg.startswith(f"{b}: upstream_commit: inputs come from 2 upstream commits")
    assert cli("tune", "merge", a, b, "--allow-mixed", "-o", out).exit_code == 0


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b"hello, not a table\n", "text, but neither a table.json (a JSON object) nor a header"),
        (b"[1, 2, 3]\n", "JSON, but neither a table.json"),
        (b"", "empty file (expected a table.json or a ggml-dispatch-table.h header)"),
        (b"   \n", "empty file (expected a table.json or a ggml-dispatch-table.h header)"),
        (bytes(range(256)), "a binary file (NUL byte at offset 0)"),
        (b"\xff\xfe{}", "not UTF-8 text (byte 0)"),
        (b'{"schema": 1,\n', ":2: not JSON"),
        (b"PAR1....", "a Parquet file, expected a table.json"),
    ],
)
def test_diff_names_what_a_bad_table_file_is(content: bytes, expect: str, tmp_path: Path) -> None:
    bad = tmp_path / "table.json"
    bad.write_bytes(content)
    for args in (("diff", bad, "empty"), ("diff", "empty", bad)):
        msg = refused(cli(*args))
        assert msg.startswith(f"{bad}") and expect in msg, msg


def _table_text_with(tmp: Path, change: Callable[[str], str]) -> Path:
    """The committed H200 table.json with ``change`` made to its text."""
    p = tmp / "table.json"
    p.write_text(change(H200_TABLE.read_text()))
    return p


def _table_with(tmp: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    t = json.loads(H200_TABLE.read_text())
    change(t)
    p = tmp / "table.json"
    p.write_text(json.dumps(t, indent=1))
    return p


def _first_rule_line() -> int:
    text = H200_TABLE.read_text()
    return text[: text.index('"measured_M": [')].count("\n") + 1


def _nested(text: str) -> str:
    """rules[0].measured_M wrapped in 100,000 lists (the decoder recursed out of stack on it)."""
    start = text.index('"measured_M": [') + len('"measured_M": ')
    end = text.index("]", start) + 1
    return text[:start] + "[" * 100_000 + text[start:end] + "]" * 100_000 + text[end:]


def _rule_key_twice(text: str) -> str:
    """rules[0] with its M_hi given a second time (json.loads kept the last one)."""
    return re.sub(r'("M_hi": \d+)', r"\1, \1", text, count=1)


def _set_table(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(t: dict[str, Any]) -> None:
        t[key] = value

    return change


BAD_TABLES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], str]]] = {
    "nested 100,000 deep": (
        lambda t: _table_text_with(t, _nested),
        lambda p: f"{p}:{_first_rule_line()}: not JSON this tool reads: nested deeper than 64 levels",
    ),
    "a rule's key twice": (
        lambda t: _table_text_with(t, _rule_key_twice),
        lambda p: f"{p}: rules[0].M_hi: key given twice in one JSON object",
    ),
    "a top-level key twice": (
        lambda t: _table_text_with(t, lambda x: x.replace('"rules": [', '"rules": [],\n  "rules": [', 1)),
        lambda p: f"{p}: rules: key given twice in one JSON object",
    ),
    "NaN": (
        lambda t: _table_text_with(
            t, lambda x: re.sub(r'"min_ratio": [0-9.]+', '"min_ratio": NaN', x, count=1)
        ),
        lambda p: f"{p}:{_first_rule_line()}: not JSON: NaN is not a JSON number",
    ),
    "an unknown key in a rule": (
        lambda t: _table_with(t, lambda x: x["rules"][3].update(note="hand-tuned")),
        lambda p: f"{p}: rules[3].note: unknown key in a MUL_MAT rule",
    ),
    "an unknown top-level key": (
        lambda t: _table_with(t, _set_table("rule", [])),
        lambda p: f"{p}: rule: unknown key in a table",
    ),
    "upstream commit zz": (
        lambda t: _table_with(t, _set_table("upstream_commit", "zz")),
        lambda p: f"{p}: upstream_commit: 'zz' {UPSTREAM_HELP}",
    ),
    "upstream commit of 39 hex digits": (
        lambda t: _table_with(t, _set_table("upstream_commit", schema.PINNED_UPSTREAM_COMMIT[:39])),
        lambda p: f"{p}: upstream_commit: '{schema.PINNED_UPSTREAM_COMMIT[:39]}' {UPSTREAM_HELP}",
    ),
    "upstream commit in upper case": (
        lambda t: _table_with(t, _set_table("upstream_commit", schema.PINNED_UPSTREAM_COMMIT.upper())),
        lambda p: f"{p}: upstream_commit: '{schema.PINNED_UPSTREAM_COMMIT.upper()}' {UPSTREAM_HELP}",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_a_bad_table_is_refused_alike_by_every_reader(case: str, tmp_path: Path) -> None:
    make, expect = BAD_TABLES[case]
    bad = make(tmp_path)
    out = tmp_path / "out"
    messages = {
        "diff A": refused(cli("diff", bad, "empty")),
        "diff B": refused(cli("diff", "empty", bad)),
        "report --table": refused(cli("report", "--tuning", H200_TUNING, "--table", bad, "-o", out), out),
        "tune verify": refused(cli("tune", "verify", bad, "--shape", "q4_K:8x8", "--m", "8", "--dry-run")),
    }
    assert set(messages.values()) == {expect(bad)}, messages


@pytest.mark.parametrize("commit", ["b11549", "llama-cpp-python==0.3.36"])
def test_a_table_of_a_build_number_or_registry_version_is_read(commit: str, tmp_path: Path) -> None:
    good = _table_with(tmp_path, _set_table("upstream_commit", commit))
    res = cli("diff", H200_TABLE, good)
    assert res.exit_code == 0, res.output
    assert f"identity upstream_commit: '{schema.PINNED_UPSTREAM_COMMIT}' -> '{commit}'" in res.output


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (schema.PINNED_UPSTREAM_COMMIT, True),
        ("b11549", True),
        ("llama-cpp-python==0.3.36", True),
        ("llama_cpp_python==0.3.37rc1", True),
        ("zz", False),
        (schema.PINNED_UPSTREAM_COMMIT[:39], False),
        (schema.PINNED_UPSTREAM_COMMIT.upper(), False),
        (" b11549", False),
        ("b0", False),
        ("llama-cpp-python>=0.3.36", False),
        ("llama-cpp-python==", False),
        ("", False),
        (None, False),
    ],
)
def test_check_upstream_id(text: Any, ok: bool) -> None:
    if ok:
        assert schema.check_upstream_id(text) == text
    else:
        with pytest.raises(ValueError, match="is not an upstream id"):
            schema.check_upstream_id(text)


def test_row_3_of_the_h200_tuning_is_ineligible_with_a_stock_time() -> None:
    """What the 'real: ... ineligible row' cases of BAD_TUNING change."""
    assert _first_ineligible_row() == 3
    assert pq.read_table(H200_TUNING).slice(3, 1).to_pylist()[0]["anchor_us"] > 0


def test_diff_on_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "tables"
    folder.mkdir()
    msg = refused(cli("diff", folder, "empty"))
    assert msg == f"{folder}: is a folder (expected a table.json or a ggml-dispatch-table.h header)"


def test_an_ok_row_without_a_stock_anchor_is_accepted(tmp_path: Path) -> None:
    """Null (not NaN) anchor_us: stock was not measured there (reference rows have that)."""
    rows = trials(speed={"mmq": 1.0, "cublas": 1.5}, M=512)
    rows[1]["anchor_us"] = None
    t = tuning_artifact.read(write_tuning(rows, tmp_path / "t.parquet"))
    assert t.table.column("anchor_us").null_count == 1


@pytest.mark.parametrize(
    ("option", "value", "expect"),
    [
        ("--shard", "3/2", "Invalid value for --shard: --shard 3/2: need 0 <= i < n"),
        ("--layouts", "bogus", "Invalid value for --layouts: layouts must be among"),
        ("--routes", "mmq,bogus", "Invalid value for --routes: unknown route(s) bogus"),
    ],
)
def test_an_error_about_an_option_names_the_option_not_a_file(
    option: str, value: str, expect: str, tmp_path: Path
) -> None:
    """No message reads ``<input>: ...``: what is not about a file is a usage error naming the option."""
    census = good_census(tmp_path / "census.parquet")
    out = tmp_path / "t.parquet"
    res = cli("tune", "run", census, "--llama-cpp", tmp_path, "-o", out, option, value, "--dry-run")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert expect in res.stderr and "<input>" not in res.output
    assert not out.exists()


def test_cpu_backend_trials_are_read_but_make_no_table(tmp_path: Path) -> None:
    """The harness runs on ggml's CPU backend too (cc 0, 0 SMs): its files merge, codegen refuses them."""
    cpu = schema.GpuId("CPU", 0, 0)
    a = good_tuning(tmp_path / "cpu.parquet", gpu=cpu)
    res = cli("tune", "merge", a, "-o", tmp_path / "merged.parquet")
    assert res.exit_code == 0, res.output
    out = tmp_path / "out"
    msg = refused(cli("codegen", a, "-o", out), out)
    assert "without a GPU identity (cc 0, 0 SMs)" in msg, msg
