"""``ggml-dispatch census ingest | from-gguf | show`` end to end through the real CLI root, and the
committed sample trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from conftest import H200_DEVICE, MakeGguf, TraceBuilder

from ggml_dispatch import archive, fileio, schema
from ggml_dispatch.census import build, gguf_meta
from ggml_dispatch.cli import main

REPO = Path(__file__).resolve().parent.parent
# A real capture: the patched ggml-cuda's route trace of llama-bench -p 512 -n 128 -r 5 -b 2048 -ub 512
# -fa off on an NVIDIA H200 (lab/integration.sh), SmolLM2-135M Q4_1 rebuilt on the GPU machine from
# the real file's metadata (same tensor names, types and shapes; random weights).
SAMPLE = REPO / "samples" / "trace-smollm2.jsonl"
# what that llama-bench run processes, warm-up included: 6 prompt runs of 512 tokens (one ubatch, one
# output each), a 1-token decode warm-up and 5 x 128 decoded tokens (one ubatch and output each)
BENCH_TOKENS = 6 * 512 + 1 + 5 * 128
BENCH_OUTPUTS = BENCH_UBATCHES = 6 + 1 + 5 * 128


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def meta_of(path: Path) -> dict[str, Any]:
    return build.read(path)[1]


# --------------------------------------------------------------------------------------------
# the demo: ingest and show the committed sample


def test_ingest_the_sample_trace(tmp_path: Path) -> None:
    out = tmp_path / "census.parquet"
    res = cli("census", "ingest", SAMPLE, "-o", out)
    assert res.exit_code == 0, res.output
    assert "warning" not in res.stderr
    t = pq.read_table(out)
    assert t.column_names == list(schema.CENSUS_COLUMNS)
    for name, kind in schema.CENSUS_COLUMNS.items():
        assert (
            str(t.schema.field(name).type)
            == {"string": "string", "int64": "int64", "float64": "double", "bool": "bool"}[kind]
        )
    recs = records(SAMPLE)
    routes = [r for r in recs if r["kind"] == "route"]
    rows = t.to_pylist()
    assert sum(r["calls"] for r in rows) == sum(r["count"] for r in routes) == 175_337
    # keys that appear in more than one flush became one row each
    keys = {json.dumps({k: v for k, v in r.items() if k != "count"}, sort_keys=True) for r in routes}
    assert len(rows) == len(keys) == 538 < len(routes) == 542
    head = [r for r in rows if r["role"] == "lm_head"]
    # tied embeddings: token_embd.weight is the LM head, once per output row of the bench
    assert len(head) == 1 and (head[0]["tensor"], head[0]["M"], head[0]["calls"]) == (
        "token_embd.weight",
        1,
        BENCH_OUTPUTS,
    )
    assert {r["source"] for r in rows} == {"trace"} and {r["est_kind"] for r in rows} == {"roofline"}
    weights = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
    assert {r["role"] for r in rows} == weights | {"attn_kq", "attn_kqv", "lm_head"}
    kq = [r for r in rows if r["role"] == "attn_kq"]
    assert all(r["layout"] == "attention" and r["B"] == 9 and not r["src0_contiguous"] for r in kq)
    # what stock ran on the H200 (no table compiled in): prompt ubatches on mmq and cuBLAS, decode on
    # mmvq and mmvf, the fused decode groups on mmvq
    assert {(r["layout"], r["M"], r["route"]) for r in rows if r["fused"] is None} == {
        ("weight", 1, "mmvq"),
        ("weight", 512, "mmq"),
        ("attention", 1, "mmvf"),
        ("attention", 512, "cublas"),
    }
    assert {(r["fused"], r["M"], r["route"]) for r in rows if r["fused"]} == {
        ("glu", 1, "mmvq"),
        ("bias", 1, "mmvq"),
    }
    assert all(r["route"] == r["stock_route"] for r in rows)
    # est_us order: the file is sorted by estimated time
    est = [r["est_us"] for r in rows]
    assert est == sorted(est, reverse=True) and all(e > 0 for e in est)

    meta = meta_of(out)
    assert meta[schema.META_SCHEMA] == schema.CENSUS_SCHEMA
    assert meta[schema.META_TOOL_VERSION] == schema.TOOL_VERSION
    assert meta[schema.META_INPUT_HASHES] == {str(SAMPLE): fileio.sha256_file(SAMPLE)}
    assert meta[schema.META_UPSTREAM_COMMIT] == schema.PINNED_UPSTREAM_COMMIT
    (header,) = meta[schema.META_TRACE_HEADERS]
    assert header["devices"][0]["name"] == "NVIDIA H200" and header["patch_hash"] == recs[0]["patch_hash"]
    (spec,) = meta[schema.META_GPU_SPECS]
    assert spec["hbm_gbs"] == 4800 and spec["source"] == "datasheet (NVIDIA H200)"
    assert meta[schema.META_WARNINGS] == []


def test_show_the_sample_census(tmp_path: Path) -> None:
    out = tmp_path / "census.parquet"
    assert cli("census", "ingest", SAMPLE, "-o", out).exit_code == 0
    res = cli("census", "show", out, "--top", "5")
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "GPU NVIDIA H200 (cc 900, 132 SMs)" in text
    assert "top 5 shapes by estimated time" in text
    header = next(line for line in text.splitlines() if line.strip().startswith("#  op"))
    for col in ("M", "N", "K", "B", "types", "layout", "route", "calls", "est_us", "cum%"):
        assert col in header.split()
    assert "coverage by estimated time: 50% in" in text
    assert "quant types" in text and "q4_1" in text and "f16 (KV cache)" in text

    js = cli("census", "show", out, "--json")
    assert js.exit_code == 0
    rep = json.loads(js.stdout)
    (gpu,) = rep["gpus"]
    top = gpu["top"]
    assert [s["rank"] for s in top] == list(range(1, len(top) + 1))
    assert top[-1]["cum_share"] == pytest.approx(1.0)
    assert sum(s["est_us"] for s in top) == pytest.approx(gpu["est_us"])
    assert gpu["calls"] == sum(r["count"] for r in records(SAMPLE) if r["kind"] == "route")
    assert sum(q["est_share"] for q in gpu["quant"]) == pytest.approx(1.0)
    # coverage is by est_us: the shapes needed for 50% of the time, counted from the top of the list
    need = gpu["coverage"]["by_est_us"]["50%"]
    assert top[need - 1]["cum_share"] >= 0.5 > (top[need - 2]["cum_share"] if need > 1 else 0)


def test_ingest_with_the_real_gguf(tmp_path: Path, smollm2_gguf: Path) -> None:
    out = tmp_path / "census.parquet"
    res = cli("census", "ingest", SAMPLE, "--gguf", smollm2_gguf, "-o", out)
    assert res.exit_code == 0, res.output
    assert "GGUF weight types: q4_1 210 tensors" in res.stderr
    assert "never in the trace" not in res.stderr
    meta = meta_of(out)
    assert meta[schema.META_GGUF_HASHES] == {str(smollm2_gguf): fileio.sha256_file(smollm2_gguf)}
    assert meta[schema.META_GGUF_UNSEEN] == {}
    # the trace (captured with a model rebuilt from this file's metadata) names the file's own weights
    model = gguf_meta.read_gguf(smollm2_gguf)
    tensors = model.tensors
    weights = [r for r in pq.read_table(out).to_pylist() if r["layout"] == "weight"]
    assert {r["tensor"] for r in weights} == {t.name for t in model.matmul_weights()}
    for r in weights:
        t = tensors[r["tensor"]]
        assert (t.type_name, t.ne[0], t.ne[1]) == (r["src0_type"], r["K"], r["N"]), r["tensor"]


def test_sample_trace_is_the_real_capture() -> None:
    assert SAMPLE.stat().st_size < 200_000
    recs = records(SAMPLE)
    head, foot = recs[0], recs[-1]
    assert head["kind"] == "header" and head["schema"] == schema.TRACE_SCHEMA and "note" not in head
    assert head["upstream_commit"] == schema.PINNED_UPSTREAM_COMMIT
    assert len(head["patch_hash"]) == 64 and head["table_hash"] is None
    assert head["dispatch"]["mode"] == "table" and head["dispatch"]["table_rules"] == 0
    (dev,) = head["devices"]
    assert (dev["name"], dev["cc"], dev["sm_count"], dev["smpbo"]) == ("NVIDIA H200", 900, 132, 232448)
    assert foot["kind"] == "footer" and foot["records"] == len(recs) - 2 and foot["dropped"] == 0
    assert [r["kind"] for r in recs[1:-1]] == ["route"] * (len(recs) - 2)

    # the counts are the bench's work: every weight of layers 0..28 multiplies every token, the last
    # layer's FFN only the output rows, the LM head every output row, attention once per ubatch
    rows: dict[str, int] = {}
    attention: dict[str, int] = {}
    for r in recs[1:-1]:
        if r["layout"] == "weight":
            rows[r["tensor"]] = rows.get(r["tensor"], 0) + r["count"] * r["src1_ne"][1]
        else:
            attention[r["tensor"]] = attention.get(r["tensor"], 0) + r["count"]
    assert rows.pop("token_embd.weight") == BENCH_OUTPUTS
    assert len(rows) == 7 * 30
    assert {t: n for t, n in rows.items() if n != BENCH_TOKENS} == {
        f"blk.29.ffn_{w}.weight": BENCH_OUTPUTS for w in ("gate", "up", "down")
    }
    assert len(attention) == 2 * 30 and set(attention.values()) == {BENCH_UBATCHES}


# --------------------------------------------------------------------------------------------
# measured times, several GPUs, hostile strings


def test_measured_times_replace_the_estimate(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    p = b.write(
        "t.jsonl",
        [
            b.header(),
            b.route(count=10, t_us=4.0),
            b.route(count=30, t_us=8.0),
            # a table route ran: its time is not the stock time, so this row keeps the roofline
            b.route(M=512, count=5, t_us=50.0, route="cublas", reason="table"),
            b.footer(),
        ],
    )
    out = tmp_path / "c.parquet"
    assert cli("census", "ingest", p, "-o", out).exit_code == 0
    rows = {r["M"]: r for r in pq.read_table(out).to_pylist()}
    assert rows[1]["est_kind"] == "measured" and rows[1]["est_us"] == pytest.approx(10 * 4.0 + 30 * 8.0)
    assert rows[512]["est_kind"] == "roofline" and rows[512]["est_us"] != pytest.approx(250.0)


def test_two_gpus_show_apart(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    v100 = {**H200_DEVICE, "id": 1, "name": "Tesla V100-SXM2-32GB", "cc": 700, "sm_count": 80}
    p = b.write(
        "t.jsonl",
        [b.header(devices=[H200_DEVICE, v100]), b.route(count=4), b.route(device=1, count=4), b.footer()],
    )
    out = tmp_path / "c.parquet"
    assert cli("census", "ingest", p, "-o", out).exit_code == 0
    rows = pq.read_table(out).to_pylist()
    assert {(r["gpu_name"], r["gpu_cc"], r["gpu_sm_count"]) for r in rows} == {
        ("NVIDIA H200", 900, 132),
        ("Tesla V100-SXM2-32GB", 700, 80),
    }
    slow, fast = sorted(rows, key=lambda r: -r["est_us"])
    assert slow["gpu_name"].startswith("Tesla") and slow["est_us"] == pytest.approx(
        fast["est_us"] * 4800 / 900
    )
    text = cli("census", "show", out).stdout
    assert "GPU NVIDIA H200 (cc 900, 132 SMs)" in text and "GPU Tesla V100-SXM2-32GB (cc 700, 80 SMs)" in text


def test_hostile_names_are_kept_and_escaped_on_the_terminal(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    name = 'evil */ \x1b[2J "quoted" \u202e'
    gpu = {**H200_DEVICE, "name": "NVIDIA H200 */ \x07"}
    p = b.write("t.jsonl", [b.header(devices=[gpu]), b.route(tensor=name, count=2), b.footer()])
    out = tmp_path / "c.parquet"
    assert cli("census", "ingest", p, "-o", out).exit_code == 0
    (row,) = pq.read_table(out).to_pylist()
    assert row["tensor"] == name and row["gpu_name"] == gpu["name"] and row["role"] == "other"
    text = cli("census", "show", out).stdout
    assert "\x1b" not in text and "\x07" not in text and "\\x1b" in text and "\\u202e" in text
    rep = json.loads(cli("census", "show", out, "--json").stdout)
    assert rep["gpus"][0]["gpu"]["name"] == gpu["name"]


# --------------------------------------------------------------------------------------------
# bad input through the CLI: exit 2, one message, nothing written


def _assert_failed_cleanly(res: Result, out: Path, needle: str, before: bytes | None = None) -> None:
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("ggml-dispatch: error:")]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit)
    if before is None:
        assert not out.exists()
    else:
        assert out.read_bytes() == before
    if out.parent.exists():
        assert [p.name for p in out.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_bad_trace_leaves_the_old_output_alone(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    out = tmp_path / "census.parquet"
    assert cli("census", "ingest", SAMPLE, "-o", out).exit_code == 0
    before = out.read_bytes()
    good = b.write("good.jsonl", [b.header(), b.route(), b.footer()])
    bad = b.write("bad.jsonl", [b.header(), b.route(), b.route(src0_ne=[576, 0, 1, 1]), b.footer()])
    res = cli("census", "ingest", good, bad, "-o", out)
    _assert_failed_cleanly(res, out, f"{bad}:3: route record: field 'src0_ne' has a zero", before)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty file"),
        (b'{"kind":"header","schema":"ggml-route-trace/9"}\n', ":1: header: unknown schema version"),
        (b'{"kind":"header"\n{"kind":"route"}\n', ":1: malformed JSON line"),
    ],
)
def test_bad_trace_files(tmp_path: Path, content: bytes, needle: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    out = tmp_path / "o" / "census.parquet"
    _assert_failed_cleanly(cli("census", "ingest", p, "-o", out), out, needle)


def test_missing_trace_file(tmp_path: Path) -> None:
    out = tmp_path / "census.parquet"
    _assert_failed_cleanly(
        cli("census", "ingest", tmp_path / "nope.jsonl", "-o", out), out, "cannot read trace"
    )


def test_header_only_trace_has_nothing_to_census(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    p = b.write("t.jsonl", [b.header(), b.footer()])
    out = tmp_path / "census.parquet"
    _assert_failed_cleanly(cli("census", "ingest", p, "-o", out), out, "no route records")


def test_gguf_that_disagrees_with_the_trace(make_gguf: MakeGguf, tmp_path: Path) -> None:
    g = make_gguf(
        "other.gguf", [("blk.0.attn_q.weight", "q8_0", [576, 576]), ("token_embd.weight", "q8_0", [576, 64])]
    )
    out = tmp_path / "census.parquet"
    res = cli("census", "ingest", SAMPLE, "--gguf", g, "-o", out)
    _assert_failed_cleanly(
        res,
        out,
        f"{g}: tensor 'token_embd.weight': GGUF has q8_0 [576, 64, 1, 1], but {SAMPLE}:2 multiplies by it as "
        "q8_0 [576, 49152, 1, 1]: this trace is not from this model",
    )


def test_bad_gguf_files(tmp_path: Path, make_gguf: MakeGguf) -> None:
    out = tmp_path / "census.parquet"
    notg = tmp_path / "x.gguf"
    notg.write_text("not a model")
    _assert_failed_cleanly(cli("census", "ingest", SAMPLE, "--gguf", notg, "-o", out), out, "not a GGUF file")
    good = make_gguf("g.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64])])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:-100])
    _assert_failed_cleanly(cli("census", "from-gguf", cut, "--m", "1", "-o", out), out, "truncated")


def test_warnings_go_to_stderr_and_into_the_metadata(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    torn = b.line(b.route())[:30]
    p = b.write("t.jsonl", [b.header(), b.route(count=2), torn], newline_at_end=False)
    out = tmp_path / "c.parquet"
    res = cli("census", "ingest", p, "-o", out)
    assert res.exit_code == 0
    assert f"ggml-dispatch: warning: {p}:3: torn last line" in res.stderr
    assert any("no footer" in w for w in meta_of(out)[schema.META_WARNINGS])


def test_layout_that_disagrees_with_the_shape_is_a_warning(make_trace: TraceBuilder, tmp_path: Path) -> None:
    b = make_trace
    p = b.write("t.jsonl", [b.header(), b.route(layout="attention"), b.footer()])
    res = cli("census", "ingest", p, "-o", tmp_path / "c.parquet")
    assert res.exit_code == 0 and "layout other than their shape's class" in res.stderr


# --------------------------------------------------------------------------------------------
# from-gguf and show


def test_from_gguf_cli(make_gguf: MakeGguf, tmp_path: Path) -> None:
    g = make_gguf(
        "m.gguf",
        [
            ("token_embd.weight", "q8_0", [64, 256]),
            ("blk.0.attn_q.weight", "q8_0", [64, 64]),
            ("blk.0.ffn_down.weight", "f16", [128, 64]),
            ("blk.0.attn_norm.weight", "f32", [64]),
        ],
    )
    out = tmp_path / "d.parquet"
    res = cli(
        "census", "from-gguf", g, "--m", "1,8,512", "--output-rows", "2", "--gpu", "rtx 4090", "-o", out
    )
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out).to_pylist()
    assert {(r["tensor"], r["M"]) for r in rows} == {
        ("blk.0.attn_q.weight", 1),
        ("blk.0.attn_q.weight", 8),
        ("blk.0.attn_q.weight", 512),
        ("blk.0.ffn_down.weight", 1),
        ("blk.0.ffn_down.weight", 8),
        ("blk.0.ffn_down.weight", 512),
        ("token_embd.weight", 2),
    }
    assert {r["gpu_name"] for r in rows} == {"NVIDIA GeForce RTX 4090"} and {r["source"] for r in rows} == {
        "declared"
    }
    meta = meta_of(out)
    assert meta[schema.META_DECLARED]["M"] == [1, 8, 512] and meta[schema.META_DECLARED]["output_rows"] == 2
    assert meta[schema.META_INPUT_HASHES] == {} and str(g) in meta[schema.META_GGUF_HASHES]
    text = cli("census", "show", out).stdout
    assert "declared workload: M = [1, 8, 512], LM head at M = 2" in text


def test_from_gguf_option_errors(make_gguf: MakeGguf, tmp_path: Path) -> None:
    g = make_gguf("m.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64])])
    out = tmp_path / "d.parquet"
    for args, needle in [
        (["--m", "1,x"], "'x' is not an integer"),
        (["--m", "0"], "not a positive token count"),
        (["--m", "1", "--gpu", "Voodoo 3"], "unknown GPU 'Voodoo 3'"),
        (["--m", "1", "--cc", "900"], "--cc and --sm-count together"),
    ]:
        res = cli("census", "from-gguf", g, *args, "-o", out)
        assert res.exit_code == 2 and needle in res.stderr, (args, res.output)
        assert not out.exists()
    res = cli(
        "census",
        "from-gguf",
        g,
        "--m",
        "1",
        "--gpu",
        "Voodoo 3",
        "--cc",
        "890",
        "--sm-count",
        "20",
        "-o",
        out,
    )
    assert res.exit_code == 0
    assert "fallback" in meta_of(out)[schema.META_GPU_SPECS][0]["source"]
    empty = make_gguf("norms.gguf", [("blk.0.attn_norm.weight", "f32", [64])])
    _assert_failed_cleanly(cli("census", "from-gguf", empty, "--m", "1", "-o", tmp_path / "e.parquet"),
                           tmp_path / "e.parquet", "no matmul weight tensors")  # fmt: skip


def test_show_refuses_what_is_not_a_census(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("nope")
    res = cli("census", "show", junk)
    assert res.exit_code == 2 and "not a readable Parquet file" in res.stderr
    other = tmp_path / "other.parquet"
    fileio.write_parquet(pa.table({"x": [1]}), other, fileio.base_metadata(schema.TUNING_SCHEMA))
    res = cli("census", "show", other)
    assert res.exit_code == 2 and "not a census file" in res.stderr
    res = cli("census", "show", tmp_path / "missing.parquet")
    assert res.exit_code == 2 and "no such file" in res.stderr


def test_declared_and_traced_census_agree_on_weight_shapes(tmp_path: Path, smollm2_gguf: Path) -> None:
    """Cross-check: every weight shape the sample trace runs at M = 512 or 1 is in the declared census."""
    traced = tmp_path / "t.parquet"
    declared = tmp_path / "d.parquet"
    assert cli("census", "ingest", SAMPLE, "-o", traced).exit_code == 0
    assert cli("census", "from-gguf", smollm2_gguf, "--m", "1,512", "-o", declared).exit_code == 0
    key = ("tensor", "src0_type", "M", "N", "K")
    t = {tuple(r[k] for k in key) for r in pq.read_table(traced).to_pylist() if r["layout"] == "weight"}
    d = {tuple(r[k] for k in key) for r in pq.read_table(declared).to_pylist()}
    # the last layer's FFN runs at M = 1 only in the prompt pass (only the output row goes on)
    assert t <= d
    assert len(d - t) == 3 and all(x[0].startswith("blk.29.ffn_") and x[2] == 512 for x in d - t)
    assert len(gguf_meta.read_gguf(smollm2_gguf).tensors) == 272


def test_the_same_trace_twice_is_added_twice_with_a_warning(tmp_path: Path) -> None:
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(SAMPLE.read_bytes())
    out = tmp_path / "c.parquet"
    res = cli("census", "ingest", SAMPLE, copy, "-o", out)
    assert res.exit_code == 0 and f"{copy}: same content as {SAMPLE}" in res.stderr
    calls = sum(r["calls"] for r in pq.read_table(out).to_pylist())
    assert calls == 2 * sum(r["count"] for r in records(SAMPLE) if r["kind"] == "route")
    assert len(meta_of(out)[schema.META_INPUT_HASHES]) == 2


def test_declared_attention_matches_the_traced_views(tmp_path: Path, smollm2_gguf: Path) -> None:
    traced = tmp_path / "t.parquet"
    assert cli("census", "ingest", SAMPLE, "-o", traced).exit_code == 0
    key = ("tensor", "role", "layout", "src0_type", "M", "N", "K", "B", "src0_contiguous", "src0_nb_aligned")

    def attention(p: Path) -> set[tuple[Any, ...]]:
        return {tuple(r[k] for k in key) for r in pq.read_table(p).to_pylist() if r["layout"] == "attention"}

    # llama-bench gives each test its own context: pp512 n_ctx 512, all 512 cells in view; tg128 n_ctx
    # 128, which llama-context.cpp pads to 256 cells, all 256 in view
    for M, n_kv in ((512, 512), (1, 256)):
        declared = tmp_path / f"d{M}.parquet"
        res = cli(
            "census", "from-gguf", smollm2_gguf, "--m", str(M), "--n-kv", str(n_kv), "--n-ctx", str(n_kv),
            "-o", declared,
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        got = attention(declared)
        assert len(got) == 2 * 30
        assert got == {x for x in attention(traced) if x[4] == M}
        # a cache exactly n_kv cells long makes the transposed V view contiguous; the K view never is
        assert {(x[1], x[8]) for x in got} == {("attn_kq", False), ("attn_kqv", True)}
        assert f"attention over {n_kv} of {n_kv} f16 KV cells" in cli("census", "show", declared).stdout
    # a longer cache than the cells in use leaves the V view strided
    longer = tmp_path / "l.parquet"
    assert (
        cli(
            "census", "from-gguf", smollm2_gguf, "--m", "1", "--n-kv", "512", "--n-ctx", "4096", "-o", longer
        ).exit_code
        == 0
    )
    v = [r for r in pq.read_table(longer).to_pylist() if r["role"] == "attn_kqv"]
    assert v and not any(r["src0_contiguous"] for r in v)
    small = tmp_path / "s.parquet"
    res = cli("census", "from-gguf", smollm2_gguf, "--m", "1", "--n-kv", "512", "--n-ctx", "256", "-o", small)
    assert res.exit_code == 2 and "cannot hold n_kv = 512" in res.stderr


def test_declared_attention_needs_head_counts(make_gguf: MakeGguf, tmp_path: Path) -> None:
    g = make_gguf("m.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64])])
    out = tmp_path / "d.parquet"
    res = cli("census", "from-gguf", g, "--m", "1", "--n-kv", "256", "-o", out)
    _assert_failed_cleanly(res, out, "attention rows need scalar head_count")


# a real depth trace: llama-bench -p 2,3,4,512 -n 32 -d 4096,16384,49152 -fa on -ctk q8_0 on the H200
# (lab/attn.sh PART=trace): decode and verify, pp512, and the KV fill at every depth
DEPTH_TRACE = archive.path("evidence/h200-2026-12-01-s6/attn/attn-trace/qwen3-seed-L4-q8_0.jsonl.gz")


def test_census_attention_max_m_keeps_decode_and_verify(tmp_path: Path) -> None:
    from ggml_dispatch.tuner.attention import read_attention_census

    full = cli("census", "attention", DEPTH_TRACE, "-o", tmp_path / "all.parquet")
    assert full.exit_code == 0, full.output
    rows = read_attention_census(tmp_path / "all.parquet")
    small = cli("census", "attention", DEPTH_TRACE, "--max-m", "8", "-o", tmp_path / "dv.parquet")
    assert small.exit_code == 0, small.output
    kept = read_attention_census(tmp_path / "dv.parquet")
    want = [r for r in rows if r["M"] <= 8]
    assert {r["M"] for r in rows} == {1, 2, 3, 4, 512} and len(want) < len(rows) / 4  # the fill dominates
    assert [(r["M"], r["n_kv"], r["calls"]) for r in kept] == [(r["M"], r["n_kv"], r["calls"]) for r in want]
    assert f"--max-m 8: {len(want)} of {len(rows)} attention points kept" in small.output
    bad = cli("census", "attention", DEPTH_TRACE, "--max-m", "0", "-o", tmp_path / "x.parquet")
    assert bad.exit_code == 2 and not (tmp_path / "x.parquet").exists()


def test_census_attention_fill_kv_keeps_each_depths_last_fill_point(tmp_path: Path) -> None:
    """The trace's M = 512 rows are the KV fill (one point per KV length on the way, in steps of the
    ubatch) and the pp512 tests (n_kv = depth + 512): --fill-kv keeps the fill's point at each depth."""
    from ggml_dispatch.tuner.attention import read_attention_census

    res = cli(
        "census", "attention", DEPTH_TRACE, "--max-m", "16", "--fill-kv", "16384,49152,10000",
        "-o", tmp_path / "f.parquet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = read_attention_census(tmp_path / "f.parquet")
    fill = sorted(r["n_kv"] for r in rows if r["M"] > 16)
    assert fill == [10240, 16384, 49152]  # 10000 rounded up to the KV padding (256) and down to a step
    assert len([r for r in rows if r["M"] <= 16]) == 16
    assert "--fill-kv: 3 point(s) of the KV fill kept too" in res.output
    est = [r["est_us"] for r in rows]
    assert est == sorted(est, reverse=True)
    for extra in (
        ["--fill-kv", "16384"],
        ["--max-m", "16", "--fill-kv", "0"],
        ["--max-m", "16", "--fill-kv", "x"],
    ):
        bad = cli("census", "attention", DEPTH_TRACE, *extra, "-o", tmp_path / "x.parquet")
        assert bad.exit_code == 2 and "--fill-kv" in bad.output and not (tmp_path / "x.parquet").exists()
