"""Bad traces at ``census ingest`` and what ``census show`` prints: an absurd ``t_us``, traces of
several upstream commits, call counts past int64, and strict JSON from ``show --json``. Every refusal
goes through the real CLI root: exit 2, one message naming the file (and line or field), no traceback,
no output file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from conftest import TraceBuilder

from ggml_dispatch import fileio, schema
from ggml_dispatch.artifacts import census as census_artifact
from ggml_dispatch.cli import main

OTHER_COMMIT = "f" * 40


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(res: Result, out: Path) -> str:
    """The one error line (without the prefix); asserts exit 2, no traceback and no output."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("ggml-dispatch: error: ")]
    assert len(lines) == 1, res.stderr
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    return lines[0].removeprefix("ggml-dispatch: error: ")


@pytest.mark.parametrize("t_us", ["1e308", "3.7e9", "1e400", "-1"])
@pytest.mark.parametrize("seen_before", [False, True])
def test_absurd_t_us_is_refused_with_its_line(make_trace: TraceBuilder, t_us: str, seen_before: bool) -> None:
    """1e308 once gave est_us = inf; a line of a key already seen goes through the fast path first."""
    b = make_trace
    good = b.line(b.route(count=1, t_us=5.0))
    bad = good.replace(b'"t_us":5.0', b'"t_us":' + t_us.encode())
    recs = [b.header(), *([good] if seen_before else []), bad, b.footer()]
    trace = b.write("t.jsonl", recs)
    out = b.folder / "census.parquet"
    msg = refused(cli("census", "ingest", trace, "-o", out), out)
    line = 3 if seen_before else 2
    assert msg.startswith(f"{trace}:{line}: route record: ")
    assert "t_us" in msg


def test_largest_allowed_t_us_gives_a_finite_census(make_trace: TraceBuilder) -> None:
    b = make_trace
    trace = b.write("t.jsonl", [b.header(), b.route(count=(1 << 62), t_us=3.6e9), b.footer()])
    out = b.folder / "census.parquet"
    res = cli("census", "ingest", trace, "-o", out)
    assert res.exit_code == 0, res.output
    est = census_artifact.read(out).table.column("est_us").to_pylist()
    assert est == [pytest.approx((1 << 62) * 3.6e9)] and all(math.isfinite(x) for x in est)


def test_traces_of_two_upstream_commits_need_allow_mixed(make_trace: TraceBuilder) -> None:
    b = make_trace
    one = b.write("a.jsonl", [b.header(), b.route(M=1), b.footer()])
    two = b.write("b.jsonl", [b.header(upstream_commit=OTHER_COMMIT), b.route(M=2), b.footer()])
    out = b.folder / "census.parquet"
    msg = refused(cli("census", "ingest", one, two, "-o", out), out)
    assert msg.startswith(f"{two}:1: upstream_commit: traces come from 2 upstream commits")
    assert f"{schema.PINNED_UPSTREAM_COMMIT} ({one}:1)" in msg and f"{OTHER_COMMIT} ({two}:1)" in msg
    assert "--allow-mixed" in msg

    res = cli("census", "ingest", one, two, "-o", out, "--allow-mixed")
    assert res.exit_code == 0, res.output
    meta = census_artifact.read(out).raw_meta
    assert meta[schema.META_UPSTREAM_COMMIT] == f"{schema.PINNED_UPSTREAM_COMMIT},{OTHER_COMMIT}"


def test_two_commits_in_one_trace_file_are_mixed_too(make_trace: TraceBuilder) -> None:
    b = make_trace
    recs = [b.header(), b.route(M=1), b.footer(), b.header(upstream_commit=OTHER_COMMIT), b.route(M=2)]
    trace = b.write("t.jsonl", [*recs, b.footer()])
    out = b.folder / "census.parquet"
    msg = refused(cli("census", "ingest", trace, "-o", out), out)
    assert msg.startswith(f"{trace}:4: upstream_commit: traces come from 2 upstream commits")


def test_a_header_without_a_commit_does_not_count_as_mixed(make_trace: TraceBuilder) -> None:
    b = make_trace
    one = b.write("a.jsonl", [b.header(), b.route(M=1), b.footer()])
    two = b.write("b.jsonl", [b.header(upstream_commit=None), b.route(M=2), b.footer()])
    out = b.folder / "census.parquet"
    res = cli("census", "ingest", one, two, "-o", out)
    assert res.exit_code == 0, res.output


def test_calls_past_int64_name_the_trace_file(make_trace: TraceBuilder) -> None:
    """Each count is in range (<= 2^62); their sum is not: the error names the file, never <input>."""
    b = make_trace
    big = 1 << 62
    trace = b.write("t.jsonl", [b.header(), b.route(count=big), b.route(count=big), b.footer()])
    out = b.folder / "census.parquet"
    msg = refused(cli("census", "ingest", trace, "-o", out), out)
    assert msg.startswith(f"{trace}: tensor 'blk.0.attn_q.weight': {2 * big} calls")
    assert "do not fit in int64" in msg and "<input>" not in msg


def test_show_json_is_strict_json(make_trace: TraceBuilder) -> None:
    """Shares of a census whose estimated time sums past the float range are null, never Infinity/NaN."""
    b = make_trace
    trace = b.write("t.jsonl", [b.header(), b.route(M=1), b.route(M=2), b.footer()])
    out = b.folder / "census.parquet"
    assert cli("census", "ingest", trace, "-o", out).exit_code == 0
    c = census_artifact.read(out)
    est = pa.array([1.5e308] * c.table.num_rows, pa.float64())
    huge = c.table.set_column(c.table.schema.get_field_index("est_us"), "est_us", est)
    path = b.folder / "huge.parquet"
    fileio.write_parquet(huge, path, c.raw_meta)
    res = cli("census", "show", path, "--json")
    assert res.exit_code == 0, res.output
    assert "Infinity" not in res.stdout and "NaN" not in res.stdout
    rep = json.loads(res.stdout, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert rep["gpus"][0]["est_us"] is None  # the sum overflowed: no number to give
    text = cli("census", "show", path)
    assert text.exit_code == 0 and "inf" not in text.stdout and "nan" not in text.stdout


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_show_refuses_a_census_with_a_non_finite_estimate(make_trace: TraceBuilder, bad: float) -> None:
    b = make_trace
    trace = b.write("t.jsonl", [b.header(), b.route(M=1), b.footer()])
    out = b.folder / "census.parquet"
    assert cli("census", "ingest", trace, "-o", out).exit_code == 0
    c = census_artifact.read(out)
    table = c.table.set_column(
        c.table.schema.get_field_index("est_us"), "est_us", pa.array([bad], pa.float64())
    )
    path = b.folder / "bad.parquet"
    fileio.write_parquet(table, path, c.raw_meta)
    for args in (("census", "show", path), ("census", "show", path, "--json")):
        res = cli(*args)
        assert res.exit_code == 2 and "Traceback" not in res.output
        expect = f"ggml-dispatch: error: {path}: row 0: est_us: est_us must be a time >= 0"
        assert res.stderr.startswith(expect)
