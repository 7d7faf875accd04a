"""Route-trace reading: aggregation, the fast path, file forms, and every kind of bad input."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import H200_DEVICE, TraceBuilder

from ggml_dispatch import schema
from ggml_dispatch.census import aggregate, trace
from ggml_dispatch.errors import InputError

H100 = {**H200_DEVICE, "id": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1"}


def ingest(*paths: Path) -> tuple[aggregate.Aggregator, list[trace.FileReport]]:
    agg = aggregate.Aggregator()
    reports = [trace.read_trace(p, agg.sink) for p in paths]
    return agg, reports


def calls_by(agg: aggregate.Aggregator, field: str = "tensor") -> dict[Any, int]:
    out: dict[Any, int] = {}
    for k, t in agg.tallies.items():
        v = getattr(k, field)
        out[v] = out.get(v, 0) + t.calls
    return out


def oracle(lines: list[bytes]) -> dict[tuple[Any, ...], int]:
    """Independent aggregation: json.loads every line, key = every field but count/t_us."""
    out: dict[tuple[Any, ...], int] = {}
    devices: dict[int, tuple[Any, ...]] = {}
    for raw in lines:
        obj = json.loads(raw)
        if obj["kind"] == "header":
            devices = {d["id"]: (d["name"], d["cc"], d["sm_count"]) for d in obj["devices"]}
        if obj["kind"] != "route":
            continue
        key = (
            devices[obj["device"]],
            *(json.dumps(obj[f]) for f in schema.TRACE_ROUTE_FIELDS if f not in ("count", "device")),
        )
        out[key] = out.get(key, 0) + obj["count"]
    return out


def as_oracle(agg: aggregate.Aggregator) -> dict[tuple[Any, ...], int]:
    out: dict[tuple[Any, ...], int] = {}
    for k, t in agg.tallies.items():
        vals = {
            "op": k.op,
            "tensor": k.tensor,
            "src0_type": k.src0_type,
            "src1_type": k.src1_type,
            "src0_ne": list(k.src0_ne),
            "src0_nb": list(k.src0_nb),
            "src1_ne": list(k.src1_ne),
            "layout": k.layout,
            "fused": k.fused,
            "route": k.route,
            "stock_route": k.stock_route,
            "reason": k.reason,
        }
        key = (
            (k.gpu.name, k.gpu.cc, k.gpu.sm_count),
            *(json.dumps(vals[f]) for f in schema.TRACE_ROUTE_FIELDS if f not in ("count", "device")),
        )
        out[key] = out.get(key, 0) + t.calls
    return out


# --------------------------------------------------------------------------------------------
# aggregation


def test_identical_keys_add_up_and_footer_is_read(make_trace: TraceBuilder) -> None:
    b = make_trace
    p = b.write(
        "t.jsonl",
        [b.header(), b.route(count=3), b.route(M=512, count=1), b.route(count=4), b.footer(records=3)],
    )
    agg, (rep,) = ingest(p)
    assert len(agg.tallies) == 2
    by_m = {k.src1_ne[1]: t.calls for k, t in agg.tallies.items()}
    assert by_m == {1: 7, 512: 1}
    assert rep.warnings == []
    assert rep.route_lines == 3 and rep.calls == 8 and rep.mode == "jsonl" and len(rep.footers) == 1


def test_several_traces_merge_and_gpus_stay_apart(make_trace: TraceBuilder) -> None:
    b = make_trace
    two = b.header(devices=[H200_DEVICE, H100])
    p1 = b.write("a.jsonl", [two, b.route(count=2), b.route(device=1, count=5), b.footer()])
    p2 = b.write("b.jsonl", [b.header(), b.route(count=10), b.footer()])
    agg, _ = ingest(p1, p2)
    by_gpu = calls_by(agg, "gpu")
    assert by_gpu == {
        schema.GpuId("NVIDIA H200", 900, 132): 12,
        schema.GpuId("NVIDIA H100 80GB HBM3", 900, 132): 5,
    }


def test_same_gpu_model_on_two_device_ids_is_one_gpu(make_trace: TraceBuilder) -> None:
    b = make_trace
    second = {**H200_DEVICE, "id": 1, "uuid": "GPU-2"}
    p = b.write(
        "t.jsonl",
        [b.header(devices=[H200_DEVICE, second]), b.route(count=1), b.route(device=1, count=2), b.footer()],
    )
    agg, _ = ingest(p)
    assert [t.calls for t in agg.tallies.values()] == [3]


def test_fast_path_agrees_with_a_full_parse_of_every_line(make_trace: TraceBuilder) -> None:
    b = make_trace
    rng = random.Random(7)
    keys = [
        b.route(M=m, tensor=f"blk.{i}.ffn_up.weight", fused=f, reason="fused" if f else "stock")
        for i in range(5)
        for m in (1, 2, 512)
        for f in (None, "glu")
    ]
    lines = [b.line(b.header(devices=[H200_DEVICE, H100]))]
    for _ in range(3000):
        r = dict(rng.choice(keys))
        r["count"] = rng.randrange(1, 10**6)
        r["device"] = rng.choice((0, 1))
        if rng.random() < 0.2:  # member order is not fixed by the schema
            r = dict(sorted(r.items()))
        lines.append(b.line(r))
    lines.append(b.line(b.footer()))
    p = b.write("t.jsonl", lines)
    agg, (rep,) = ingest(p)
    assert as_oracle(agg) == oracle(lines)
    assert rep.route_lines == 3000


def test_keys_that_differ_only_in_count_position_or_extra_members_still_aggregate(
    make_trace: TraceBuilder,
) -> None:
    b = make_trace
    r = b.route()
    count_first = {"count": 2, **{k: v for k, v in r.items() if k != "count"}}
    extra = {**r, "count": 3, "future_member": {"count": 99, "x": [1, 2]}}
    p = b.write("t.jsonl", [b.header(), r, count_first, extra, count_first, extra, b.footer()])
    agg, _ = ingest(p)
    assert [t.calls for t in agg.tallies.values()] == [1 + 2 + 3 + 2 + 3]


# --------------------------------------------------------------------------------------------
# file forms


def test_gzip_gives_the_same_result_as_plain(make_trace: TraceBuilder) -> None:
    b = make_trace
    recs = [b.header(), *(b.route(M=m, count=m) for m in (1, 2, 3, 512)), b.footer()]
    plain, _ = ingest(b.write("t.jsonl", recs))
    gz, (rep,) = ingest(b.write("t.jsonl.gz", recs, gz=True))
    assert rep.compressed
    assert as_oracle(plain) == as_oracle(gz)


def test_concatenated_gzip_members_are_one_stream(make_trace: TraceBuilder) -> None:
    b = make_trace
    part1 = b"\n".join(b.line(r) for r in [b.header(), b.route(count=2)]) + b"\n"
    part2 = b"\n".join(b.line(r) for r in [b.route(count=3), b.footer()]) + b"\n"
    p = b.folder / "cat.jsonl.gz"
    p.write_bytes(gzip.compress(part1) + gzip.compress(part2))
    agg, (rep,) = ingest(p)
    assert [t.calls for t in agg.tallies.values()] == [5] and rep.warnings == []


def test_truncated_gzip_is_read_with_a_warning(make_trace: TraceBuilder) -> None:
    b = make_trace
    recs = [b.header(), *(b.route(M=1, count=1) for _ in range(2000)), b.footer()]
    p = b.write("t.jsonl.gz", recs, gz=True)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    agg, (rep,) = ingest(p)
    text = "\n".join(rep.warnings)
    assert "truncated .gz" in text and "no footer" in text
    assert 0 < sum(t.calls for t in agg.tallies.values()) < 2000


def test_corrupt_gzip_is_an_error(make_trace: TraceBuilder) -> None:
    p = make_trace.folder / "bad.gz"
    good = gzip.compress(b'{"kind":"header"}\n' * 100)
    p.write_bytes(good[:20] + bytes(x ^ 0x5A for x in good[20:40]) + good[40:])
    with pytest.raises(InputError, match="gzip"):
        ingest(p)


def test_llama_log_with_prefixed_lines(make_trace: TraceBuilder) -> None:
    b = make_trace
    lines: list[bytes] = [
        b"build: 1 (0c1e570) with cc (GCC) 12.2 for x86_64-linux-gnu",
        b"llama_model_loader: loaded meta data with 33 key-value pairs",
        b"ggml-route-trace: " + b.line(b.header()),
        b'{"this": "is a log line that happens to be JSON, not a trace record"}',
        b"ggml-route-trace: " + b.line(b.route(count=2)),
        b"main: prompt eval time = 10.00 ms",
        b"[1764496800] ggml-route-trace: " + b.line(b.route(count=3)),  # a decorated log line
        b"ggml-route-trace: " + b.line(b.footer()),
        b"llama_perf_context_print: total time = 20 ms",
    ]
    agg, (rep,) = ingest(b.write("run.log", lines))
    assert rep.mode == "log" and rep.warnings == []
    assert [t.calls for t in agg.tallies.values()] == [5]


def test_crlf_line_endings(make_trace: TraceBuilder) -> None:
    b = make_trace
    recs = [b.header(), b.route(count=2), b.route(count=2), b.footer()]
    p = b.folder / "crlf.jsonl"
    p.write_bytes(b"".join(b.line(r) + b"\r\n" for r in recs))
    agg, (rep,) = ingest(p)
    assert [t.calls for t in agg.tallies.values()] == [4] and rep.warnings == []


def test_measured_times_take_the_timed_fast_path(make_trace: TraceBuilder) -> None:
    b = make_trace
    recs: list[Any] = [b.header()]
    recs += [b.route(count=2, t_us=10.0 + i) for i in range(50)]
    recs += [b.route(count=1, t_us=7)]
    recs.append(b.footer())
    agg, _ = ingest(b.write("t.jsonl", recs))
    (t,) = agg.tallies.values()
    assert t.calls == 101 and t.timed_calls == 101
    assert t.time_us == pytest.approx(sum(2 * (10.0 + i) for i in range(50)) + 7)


def test_a_second_run_in_the_same_file_maps_device_ids_anew(make_trace: TraceBuilder) -> None:
    b = make_trace
    p = b.write(
        "t.jsonl",
        [
            b.header(),
            b.route(count=1),
            b.header(devices=[{**H100, "id": 0}]),  # previous run had no footer
            b.route(count=2),
            b.footer(),
        ],
    )
    agg, (rep,) = ingest(p)
    assert set(calls_by(agg, "gpu").values()) == {1, 2}
    assert any("no footer" in w for w in rep.warnings)
    assert len(rep.headers) == 2


def test_hostile_strings_are_data(make_trace: TraceBuilder) -> None:
    b = make_trace
    names = [
        "evil */ #include <stdlib.h> /*",
        'quote" , "count":5, "x":"',
        "back\\slash\n\tcontrol\x1b[31m",
        "ünïcödé 名前",
        "ggml-route-trace: {}",
    ]
    recs: list[Any] = [b.header()]
    for n in names:
        recs += [b.route(tensor=n, count=2), b.route(tensor=n, count=3)]
    recs.append(b.footer())
    agg, _ = ingest(b.write("t.jsonl", recs))
    assert calls_by(agg) == dict.fromkeys(names, 5)


def test_stderr_prefix_inside_a_tensor_name_in_a_log(make_trace: TraceBuilder) -> None:
    b = make_trace
    r = b.route(tensor="x ggml-route-trace: y", count=4)
    pre = b"ggml-route-trace: "
    lines = [b"log start", pre + b.line(b.header()), pre + b.line(r), pre + b.line(b.footer())]
    agg, _ = ingest(b.write("t.log", lines))
    assert calls_by(agg) == {"x ggml-route-trace: y": 4}


def test_streaming_memory_does_not_grow_with_file_size(
    make_trace: TraceBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "CHUNK", 1 << 18)  # files much larger than a read
    b = make_trace
    keys = [b.line(b.route(M=m, tensor=f"blk.{i}.ffn_down.weight"))[:-2] for i in range(4) for m in (1, 512)]

    def write(name: str, n: int) -> Path:
        p = b.folder / name
        with p.open("wb") as f:
            f.write(b.line(b.header()) + b"\n")
            for i in range(n):
                f.write(keys[i % len(keys)] + b"%d}\n" % (i % 97 + 1))
            f.write(b.line(b.footer()) + b"\n")
        return p

    small = write("small.jsonl", 10_000)
    big = write("big.jsonl", 100_000)
    peaks = []
    for p in (small, big):
        tracemalloc.start()
        agg, _ = ingest(p)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert len(agg.tallies) == len(keys)
    assert big.stat().st_size > 25 << 20
    # bounded by the read chunk, not by the file (the big file is 10x the small one)
    assert peaks[1] < 1.2 * peaks[0] + (256 << 10)
    assert peaks[1] < 16 * trace.CHUNK


# --------------------------------------------------------------------------------------------
# warnings, not errors


def test_torn_last_line_is_ingested_with_a_warning(make_trace: TraceBuilder) -> None:
    b = make_trace
    torn = b.line(b.route(count=9))[:57]
    p = b.write("t.jsonl", [b.header(), b.route(count=2), torn], newline_at_end=False)
    agg, (rep,) = ingest(p)
    assert [t.calls for t in agg.tallies.values()] == [2]
    assert any(":3: torn last line" in w for w in rep.warnings)
    assert any("no footer" in w for w in rep.warnings)


def test_torn_last_trace_line_in_a_log(make_trace: TraceBuilder) -> None:
    b = make_trace
    lines = [
        b"ggml-route-trace: " + b.line(b.header()),
        b"ggml-route-trace: " + b.line(b.route(count=2)),
        b"ggml-route-trace: " + b.line(b.route(count=2))[:40] + b"Segmentation fault (core dumped)",
        b"bash: exit 139",
    ]
    agg, (rep,) = ingest(b.write("t.log", lines))
    assert [t.calls for t in agg.tallies.values()] == [2]
    assert any(":3: the last trace line is not valid JSON (torn)" in w for w in rep.warnings)


def test_missing_footer_and_dropped_records_warn(make_trace: TraceBuilder) -> None:
    b = make_trace
    _, (rep,) = ingest(b.write("a.jsonl", [b.header(), b.route()]))
    assert len(rep.warnings) == 1 and "no footer" in rep.warnings[0]
    _, (rep,) = ingest(b.write("b.jsonl", [b.header(), b.route(), b.footer(dropped=12)]))
    assert len(rep.warnings) == 1 and "dropped 12 records" in rep.warnings[0]


# --------------------------------------------------------------------------------------------
# bad input: one error naming file and line


def _error(b: TraceBuilder, records: list[Any], **kw: Any) -> InputError:
    p = b.write("bad.jsonl", records, **kw)
    with pytest.raises(InputError) as ei:
        ingest(p)
    assert ei.value.path == str(p)
    return ei.value


@pytest.mark.parametrize(
    ("override", "line", "needle"),
    [
        ({"count": 0}, 3, "count must be a positive integer"),
        ({"count": -4}, 3, "count must be a positive integer"),
        ({"count": 1.5}, 3, "field 'count' must be an integer"),
        ({"count": "3"}, 3, "field 'count' must be an integer"),
        ({"count": True}, 3, "field 'count' must be an integer"),
        ({"device": 7}, 3, "device 7 is not in the header's devices (0)"),
        ({"src0_ne": [576, 0, 1, 1]}, 3, "zero or negative dimension"),
        ({"src1_ne": [576, -1, 1, 1]}, 3, "zero or negative dimension"),
        ({"src0_ne": [576, 576, 1]}, 3, "field 'src0_ne' must be a list of 4 integers"),
        ({"src0_nb": [20, 360, 207360, "x"]}, 3, "field 'src0_nb' must be a list of 4 integers"),
        ({"src0_type": "q4_2"}, 3, 'unknown src0_type "q4_2"'),
        ({"src1_type": 0}, 3, "field 'src1_type' must be a string"),
        ({"op": "MUL"}, 3, "unknown op"),
        ({"layout": "dense"}, 3, "unknown layout"),
        ({"fused": "add"}, 3, "unknown fused"),
        ({"route": "magic"}, 3, "unknown route"),
        ({"reason": "ineligible:"}, 3, "unknown reason"),
        ({"t_us": -1}, 3, "t_us must be a time per call in [0, 3.6e+09] us, got -1"),
        ({"t_us": "fast"}, 3, "field 't_us' must be a number"),
        ({"src1_ne": [64, 1, 1, 1]}, 3, "must agree (K)"),
        ({"tensor": None}, 3, "field 'tensor' must be a string"),
    ],
)
def test_bad_route_fields_on_a_seen_key_are_caught(
    make_trace: TraceBuilder, override: dict[str, Any], line: int, needle: str
) -> None:
    """The bad line comes after a good line of the same key, so it is read on the fast path first."""
    b = make_trace
    err = _error(b, [b.header(), b.route(count=2), b.route(**{**override}), b.footer()])
    assert err.line == line
    assert needle in err.message


def test_missing_field(make_trace: TraceBuilder) -> None:
    b = make_trace
    r = b.route()
    del r["stock_route"]
    err = _error(b, [b.header(), r, b.footer()])
    assert err.line == 2 and "missing field 'stock_route'" in err.message


def test_malformed_json_in_the_middle(make_trace: TraceBuilder) -> None:
    b = make_trace
    err = _error(b, [b.header(), b.route(), '{"kind":"route",', b.route(), b.footer()])
    assert err.line == 3 and "malformed JSON" in err.message


def test_malformed_last_line_that_ends_with_a_newline_is_not_torn(make_trace: TraceBuilder) -> None:
    b = make_trace
    err = _error(b, [b.header(), b.route(), "{oops}"])
    assert err.line == 3 and "malformed JSON" in err.message


def test_a_malformed_trace_line_in_a_log_followed_by_more_is_an_error(make_trace: TraceBuilder) -> None:
    b = make_trace
    err = _error(b, [b.header(), "{not json", b.route(), b.footer()], prefix=True)
    assert err.line == 2


@pytest.mark.parametrize(
    ("records", "line", "needle"),
    [
        (
            [{"kind": "header", "schema": "ggml-route-trace/2"}],
            1,
            'unknown schema version "ggml-route-trace/2"',
        ),
        ([{"kind": "header"}], 1, "unknown schema version null"),
        ([{"kind": "route"}], 1, "route record before the header"),
        ([{"kind": "footer", "records": 0, "dropped": 0, "ended": ""}], 1, "footer before any header"),
        (["[1, 2]"], 1, "must be a JSON object"),
        (['{"kind":"header","kind":"route"}'], 1, "duplicate key 'kind'"),
        (['{"kind":"route","count":NaN}'], 1, "NaN is not a JSON number"),
        (['{"kind":"nope"}'], 1, "unknown record kind"),
        ([b'{"kind":"header","x":"\xff"}'], 1, "malformed JSON line: not valid UTF-8"),
    ],
)
def test_bad_records(make_trace: TraceBuilder, records: list[Any], line: int, needle: str) -> None:
    b = make_trace
    err = _error(b, [*records, b.footer()])
    assert err.line == line and needle in err.message


def test_bad_headers(make_trace: TraceBuilder) -> None:
    b = make_trace
    cases = [
        (b.header(devices=[{**H200_DEVICE, "cc": "900"}]), "devices[0]: field 'cc' must be an integer"),
        (b.header(devices=[H200_DEVICE, H200_DEVICE]), "device id 0 appears twice"),
        (b.header(devices=[{**H200_DEVICE, "sm_count": 0}]), "'sm_count' must be positive"),
        ({**b.header(), "devices": ["H200"]}, "devices[0] must be an object"),
        (b.header(upstream_commit="0c1e570"), "upstream_commit: '0c1e570' is not an upstream id"),
        (b.header(pid="1"), "field 'pid' must be an integer"),
        ({k: v for k, v in b.header().items() if k != "env"}, "missing field 'env'"),
    ]
    for header, needle in cases:
        err = _error(b, [header, b.route(), b.footer()])
        assert err.line == 1 and needle in err.message, (needle, err.message)


def test_structure_errors(make_trace: TraceBuilder) -> None:
    b = make_trace
    err = _error(b, [b.header(), b.footer(), b.route()])
    assert err.line == 3 and "after the footer" in err.message
    err = _error(b, [b.header(), b.footer(), b.footer()])
    assert err.line == 3 and "second footer" in err.message
    err = _error(b, [b.header(), b.footer(dropped=-1)])
    assert err.line == 2 and "'dropped' must not be negative" in err.message


def test_empty_inputs(make_trace: TraceBuilder) -> None:
    b = make_trace
    for name, data, needle in [
        ("empty.jsonl", b"", "empty file"),
        ("blank.jsonl", b"\n\n  \n", "no trace records"),
        ("plain.log", b"llama_model_loader: nothing to see\nmain: done\n", "no line carries the"),
    ]:
        p = b.folder / name
        p.write_bytes(data)
        with pytest.raises(InputError, match=needle) as ei:
            ingest(p)
        assert ei.value.path == str(p)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read trace"):
        ingest(tmp_path / "nope.jsonl")


def test_overlong_line_is_refused(make_trace: TraceBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory stays bounded even for a file without newlines."""
    monkeypatch.setattr(trace, "CHUNK", 1024)
    monkeypatch.setattr(trace, "MAX_LINE", 2000)
    b = make_trace
    err = _error(b, [b.header(), "x" * 5000, b.footer()])
    assert "longer than" in err.message


def test_cut_member_matches_the_hot_loop() -> None:
    raw = b'{"a":1,"count":12,"b":"x"}'
    assert trace.cut_member(raw, b'"count":') == (b'{"a":1,,"b":"x"}', b"12")
    assert trace.cut_member(b'{"a":1,"count":7}', b'"count":') == (b'{"a":1,}', b"7")
    assert trace.cut_member(b'{"a":1,"count":7} ', b'"count":') is None
    assert trace.cut_member(b'{"a":1}', b'"count":') is None


def test_a_count_member_moved_elsewhere_is_not_taken_on_the_fast_path(make_trace: TraceBuilder) -> None:
    """Same key bytes once ``"count":<n>`` is cut, but the member sits elsewhere: invalid JSON."""
    b = make_trace
    good = b.line(b.route(count=1))
    i = good.find(b'"count":')
    prefix = good[:i]  # ends with a comma
    j = prefix.find(b",")  # right after {"kind":"route"
    moved = prefix[:j] + b'"count":7' + prefix[j:] + b"}"
    assert trace.cut_member(moved, b'"count":')[0] == trace.cut_member(good, b'"count":')[0]  # type: ignore[index]
    err = _error(b, [b.header(), good, moved, b.footer()])
    assert err.line == 3 and "malformed JSON" in err.message


def test_timed_lines_with_a_moved_member_are_checked_too(make_trace: TraceBuilder) -> None:
    b = make_trace
    good = b.line(b.route(count=1, t_us=5.0))  # ...,"count":1,"t_us":5.0}
    prefix = good[: good.find(b'"count":')]
    j = prefix.find(b",")
    moved = prefix[:j] + b'"t_us":6.0' + prefix[j:] + b'"count":1,}'
    key = trace.cut_member(good, b'"count":')[0]  # type: ignore[index]
    key_moved = trace.cut_member(moved, b'"count":')[0]  # type: ignore[index]
    assert trace.cut_member(key, b'"t_us":')[0] == trace.cut_member(key_moved, b'"t_us":')[0]  # type: ignore[index]
    err = _error(b, [b.header(), good, moved, b.footer()])
    assert err.line == 3 and "malformed JSON" in err.message


def test_the_configuration_that_ran_is_read_in_canonical_form(make_trace: TraceBuilder) -> None:
    b = make_trace
    p = b.write(
        "t.jsonl",
        [
            b.header(),
            b.route(M=512, route="cublas", reason="forced", config="cublas/compute=bf16,out=f32", count=2),
            b.route(M=512, route="cublas", reason="forced", config="cublas/out=f32,compute=bf16", count=1),
            b.route(M=512, route="mmq", config="mmq", count=1),
            b.route(M=1, count=1),  # older traces carry no config
            b.footer(records=4),
        ],
    )
    agg, _ = ingest(p)
    assert calls_by(agg, "config") == {"cublas/out=f32,compute=bf16": 3, "mmq": 1, None: 1}


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("cublas/out=f64", "is not one of f16, f32"),
        ("mmq/j=12", "is not one of"),
        ("mmq/j=64", "is not a configuration of route 'mmvq'"),
        (7, "must be a string or null"),
    ],
)
def test_a_bad_config_field_names_the_line(make_trace: TraceBuilder, config: Any, needle: str) -> None:
    b = make_trace
    err = _error(b, [b.header(), b.route(route="mmvq", config=config), b.footer()])
    assert err.line == 2 and needle in err.message, err.message
