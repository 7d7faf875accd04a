"""Property tests: random lines and bytes never give a traceback, and the fast path never disagrees
with a full parse of every line."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
from conftest import TraceBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggml_dispatch.census import aggregate, gguf_meta, trace
from ggml_dispatch.errors import InputError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)


def outcome(path: Path, fast: bool) -> tuple[str, Any]:
    """What reading a file gives: the error (rendered) or the tallies and warnings."""
    agg = aggregate.Aggregator()
    try:
        rep = trace.read_trace(path, agg.sink, fast=fast)
    except InputError as e:
        assert e.path == str(path)
        return "error", e.render()
    tallies = sorted((repr(k), t.calls, t.timed_calls, round(t.time_us, 6)) for k, t in agg.tallies.items())
    return "ok", (tallies, rep.warnings, rep.route_lines, rep.calls)


@FUZZ
@given(data=st.binary(max_size=2000), gz=st.booleans())
def test_random_bytes_give_a_result_or_an_input_error(tmp_path: Path, data: bytes, gz: bool) -> None:
    p = tmp_path / "random.bin"
    p.write_bytes(gzip.compress(data) if gz else data)
    outcome(p, fast=True)


def _base_lines(b: TraceBuilder) -> list[bytes]:
    keys = [b.route(M=1), b.route(M=512), b.route(M=1, tensor='t */ "count":1'), b.route(M=2, t_us=3.5)]
    lines = [b.line(b.header())]
    for i in range(12):
        r = dict(keys[i % len(keys)])
        r["count"] = i + 1
        lines.append(b.line(r))
    lines.append(b.line(b.footer()))
    return lines


mutation = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 400), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 400), st.integers(1, 30)),
    st.tuples(
        st.just("count"),
        st.sampled_from(
            ["0", "-1", "1.5", "01", '"3"', "true", "1e3", "99999999999999999999", " 4", "4 ", ""]
        ),
    ),
    st.tuples(st.just("tus"), st.sampled_from(["-1", "NaN", "1e999", '"x"', "1.", ".5", "2e-3", "0"])),
    st.tuples(st.just("truncate"), st.integers(0, 400)),
)


def _mutate(line: bytes, m: tuple[Any, ...]) -> bytes:
    kind = m[0]
    if kind == "insert":
        pos = m[1] % (len(line) + 1)
        return line[:pos] + m[2] + line[pos:]
    if kind == "delete":
        pos = m[1] % (len(line) + 1)
        return line[:pos] + line[pos + m[2] :]
    if kind == "count":
        cut = trace.cut_member(line, b'"count":')
        if cut is None:
            return line
        i = line.find(b'"count":') + 8
        return line[:i] + m[1].encode() + line[i + len(cut[1]) :]
    if kind == "tus":
        i = line.find(b'"t_us":')
        if i < 0:
            return line
        j = i + 7
        k = line.find(b",", j)
        k = len(line) - 1 if k < 0 else k
        return line[:j] + m[1].encode() + line[k:]
    return line[: m[1] % (len(line) + 1)]


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, 13), mutation), min_size=1, max_size=4),
    newline_at_end=st.booleans(),
    prefix=st.booleans(),
)
def test_fast_path_agrees_with_full_parse_on_mutated_traces(
    make_trace: TraceBuilder, edits: list[tuple[int, tuple[Any, ...]]], newline_at_end: bool, prefix: bool
) -> None:
    lines = _base_lines(make_trace)
    for i, m in edits:
        lines[i] = _mutate(lines[i], m)
    lines = [x.replace(b"\n", b"") for x in lines]
    p = make_trace.write(
        "m.log" if prefix else "m.jsonl", lines, newline_at_end=newline_at_end, prefix=prefix
    )
    assert outcome(p, fast=True) == outcome(p, fast=False)


@FUZZ
@given(field=st.sampled_from(sorted(TraceBuilder(Path()).route())), value=json_values)
def test_any_value_in_any_route_field(make_trace: TraceBuilder, field: str, value: Any) -> None:
    b = make_trace
    bad = {**b.route(), field: value}
    p = b.write("f.jsonl", [b.header(), b.route(), bad, b.footer()])
    fast = outcome(p, fast=True)
    assert fast == outcome(p, fast=False)


@FUZZ
@given(field=st.sampled_from(sorted(TraceBuilder(Path()).header())), value=json_values)
def test_any_value_in_any_header_field(make_trace: TraceBuilder, field: str, value: Any) -> None:
    b = make_trace
    p = b.write("h.jsonl", [{**b.header(), field: value}, b.route(), b.footer()])
    outcome(p, fast=True)


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_as_gguf(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(data)
    with pytest.raises(InputError):
        gguf_meta.read_gguf(p)


@FUZZ
@given(cut=st.integers(min_value=0, max_value=4000), flip=st.integers(min_value=0, max_value=4000))
def test_damaged_real_gguf_header(tmp_path: Path, make_gguf: Any, cut: int, flip: int) -> None:
    """A real GGUF file cut short or with one byte changed: read or InputError, never a traceback."""
    src = tmp_path / "base.gguf"
    if not src.exists():
        make_gguf(
            "base.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64]), ("output.weight", "f16", [64, 32])]
        )
    data = bytearray(src.read_bytes())
    p = tmp_path / "damaged.gguf"
    if flip < len(data):
        data[flip] ^= 0xFF
    p.write_bytes(bytes(data[: len(data) - cut]))
    try:
        gguf_meta.read_gguf(p)
    except InputError as e:
        assert e.path == str(p)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    trace_bytes=st.binary(max_size=400),
    gguf_bytes=st.binary(max_size=200),
    lines=st.lists(json_values, max_size=4),
)
def test_cli_never_shows_a_traceback(
    tmp_path: Path, trace_bytes: bytes, gguf_bytes: bytes, lines: list[Any]
) -> None:
    import json

    from click.testing import CliRunner

    from ggml_dispatch.cli import main

    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(trace_bytes)
    js = tmp_path / "values.jsonl"
    js.write_text("".join(json.dumps(v) + "\n" for v in lines))
    model = tmp_path / "m.gguf"
    model.write_bytes(gguf_bytes)
    out = tmp_path / "c.parquet"
    for args in (
        ["census", "ingest", str(raw), "-o", str(out)],
        ["census", "ingest", str(js), "-o", str(out)],
        ["census", "ingest", str(js), "--gguf", str(model), "-o", str(out)],
        ["census", "from-gguf", str(model), "--m", "1", "-o", str(out)],
        ["census", "show", str(raw)],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        assert isinstance(res.exception, SystemExit), res.exception
        assert "ggml-dispatch: error: " in res.stderr or "Error: Invalid value" in res.stderr
        assert not out.exists()
