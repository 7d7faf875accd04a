"""The A/B record format (ggml_dispatch/report/ab.py) and the llama-bench runner's pure parts
(ggml_dispatch/report/abrun.py).

Real inputs: llama-bench JSONL written on the H200 (evidence/), the committed legacy A/B files and the
committed table. The llama-bench process itself needs a GPU: the runner test uses a stand-in script
that prints what a real llama-bench printed (its stdout from evidence/, a start-up line the hook prints).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import MakeGguf

from ggml_dispatch import archive
from ggml_dispatch.artifacts import ab
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as table_mod
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import ab as report_ab
from ggml_dispatch.report import abrun, analysis, markdown

REPO = Path(__file__).resolve().parent.parent
TABLES = archive.path("tables/cuda-sm90-nvidia-h200-routes")  # the dense-route table and its legacy A/Bs
BENCH_JSONL = archive.path("evidence/h200-2026-11-30/integration/bench.jsonl")
TABLE_HASH = table_mod.table_hash(table_mod.load(TABLES / "table.json"))
TABLE_LINE = f"table {TABLE_HASH[:12]} (NVIDIA H200, cc 900, 132 SMs, 20 rules): applied on CUDA0"
OFF_LINE = "GGML_CUDA_DISPATCH=off: stock dispatch"


def provenance(line: str, **kw: object) -> ab.Provenance:
    parsed = ab.parse_dispatch_line(line)
    base = dict(
        command=("build/bin/llama-bench", "-m", "m.gguf", "-r", "3", "-o", "jsonl", "-v"),
        env=(("GGML_CUDA_DISPATCH", "table"),),
        dispatch_line=parsed.text,
        table_hash=parsed.table_hash,
        table_applied=parsed.applied,
        lib_path="/x/libggml-cuda.so",
        lib_sha256="a" * 64,
        gpu_name="NVIDIA H200",
        gpu_uuid="GPU-ae22a032-9aed-577c-49c1-4f90a60643f7",
        driver="580.159.04",
        started="2026-12-01T09:00:00Z",
        build_commit="e86f4e1",
    )
    base.update(kw)
    return ab.Provenance(**base)  # type: ignore[arg-type]


def test_dispatch_lines_as_the_hook_prints_them() -> None:
    t = ab.parse_dispatch_line("ggml_cuda_dispatch: " + TABLE_LINE + "; route trace -> /tmp/t.jsonl")
    assert (t.mode, t.table_hash, t.applied) == ("table", TABLE_HASH[:12], True)
    r = ab.parse_dispatch_line(
        f"table {TABLE_HASH[:12]} (NVIDIA H200, cc 900, 132 SMs, 20 rules): refused on CUDA0 "
        "(Tesla V100-SXM2-32GB, cc 700, 80 SMs: GPU mismatch, stock dispatch)"
    )
    assert (r.mode, r.table_hash, r.applied) == ("table", TABLE_HASH[:12], False)
    assert ab.parse_dispatch_line(OFF_LINE).mode == "off"
    assert ab.parse_dispatch_line("no dispatch table compiled in: stock dispatch").mode == "none"
    # the first start-up line of a real run's stderr (evidence/: the harness' process)
    log = (archive.path("evidence/h200-2026-11-30/cost/run.log")).read_text()
    found = ab.find_dispatch_line(log)
    assert found is not None and found.mode == "none" and found.table_hash is None


def test_round_trip_with_provenance(tmp_path: Path) -> None:
    recs = [
        ab.Record("smollm2", "pp512", 512, "table", 1, 45902.5, (52431.6, 52263.2), provenance(TABLE_LINE)),
        ab.Record("smollm2", "pp512", 512, "stock", 1, 40000.0, (40000.0,), provenance(OFF_LINE)),
    ]
    out = tmp_path / "ab.jsonl"
    ab.write_records(out, recs[:1])
    ab.write_records(out, recs[1:], append=True)
    back = [r for _, r in ab.read_file(out)]
    assert back == recs and not any(r.legacy for r in back)
    assert json.loads(out.read_text().splitlines()[0])["schema"] == ab.SCHEMA
    # report's own reader reads the new records too (extra keys ignored)
    recs2, _ = report_ab.load_ab([out])
    assert [(r.arm, r.tps) for r in recs2] == [("table", 45902.5), ("stock", 40000.0)]


def test_committed_records_read_as_legacy() -> None:
    for path in sorted(TABLES.glob("ab-*.jsonl")):
        numbered = ab.read_file(path)
        assert numbered and all(r.legacy for _, r in numbered), path
        check = ab.check_records(numbered, path, TABLE_HASH)
        assert check.legacy == len(numbered) and check.checked == 0
        assert "legacy" in check.notes[0]


def _write_line(tmp_path: Path, obj: dict[str, object]) -> Path:
    p = tmp_path / "ab.jsonl"
    p.write_text(json.dumps(obj) + "\n")
    return p


def test_reader_refuses_inconsistent_provenance(tmp_path: Path) -> None:
    good = ab.Record("m", "tg128", 512, "table", 1, 50.0, (), provenance(TABLE_LINE)).to_json()
    # a table hash the start-up line does not name
    with pytest.raises(InputError, match=r"ab.jsonl:1: table_hash: .*start-up line"):
        ab.read_file(_write_line(tmp_path, good | {"table_hash": "b" * 12}))
    with pytest.raises(InputError, match=r"ab.jsonl:1: lib.sha256"):
        ab.read_file(_write_line(tmp_path, good | {"lib": {"path": "x", "sha256": "xyz"}}))
    with pytest.raises(InputError, match=r"ab.jsonl:1: env: only GGML_"):
        ab.read_file(_write_line(tmp_path, good | {"env": {"HOME": "/root"}}))
    with pytest.raises(InputError, match=r"ab.jsonl:1: command"):
        ab.read_file(_write_line(tmp_path, {k: v for k, v in good.items() if k != "command"}))
    with pytest.raises(InputError, match=r"unknown schema"):
        ab.read_file(_write_line(tmp_path, good | {"schema": "ggml-dispatch-ab/9"}))
    with pytest.raises(InputError, match=r"ab.jsonl:1: started"):
        ab.read_file(_write_line(tmp_path, good | {"started": "yesterday"}))


def test_table_check_refuses_other_tables(tmp_path: Path) -> None:
    other = "table 0123456789ab (NVIDIA H200, cc 900, 132 SMs, 3 rules): applied on CUDA0"
    p = tmp_path / "ab.jsonl"
    ok = [(1, ab.Record("m", "tg128", 512, "table", 1, 50.0, (), provenance(TABLE_LINE)))]
    assert ab.check_records(ok, p, TABLE_HASH).checked == 1
    bad = [(3, ab.Record("m", "tg128", 512, "table", 1, 50.0, (), provenance(other)))]
    with pytest.raises(InputError, match=r"ab.jsonl:3: table arm applied table 0123456789ab"):
        ab.check_records(bad, p, TABLE_HASH)
    stock_with_table = [(2, ab.Record("m", "tg128", 512, "stock", 1, 50.0, (), provenance(TABLE_LINE)))]
    with pytest.raises(InputError, match=r"ab.jsonl:2: stock arm ran with table"):
        ab.check_records(stock_with_table, p, TABLE_HASH)
    table_off = [(1, ab.Record("m", "tg128", 512, "table", 1, 50.0, (), provenance(OFF_LINE)))]
    with pytest.raises(InputError, match=r"table arm ran without a table applied"):
        ab.check_records(table_off, p, TABLE_HASH)


def test_report_refuses_ab_records_of_another_table(tmp_path: Path) -> None:
    other = "table 0123456789ab (NVIDIA H200, cc 900, 132 SMs, 3 rules): applied on CUDA0"
    p = tmp_path / "ab-new.jsonl"
    ab.write_records(
        p,
        [
            ab.Record("m", "pp512", 512, "stock", 1, 40.0, (), provenance(OFF_LINE)),
            ab.Record("m", "pp512", 512, "table", 1, 50.0, (), provenance(other)),
        ],
    )
    args = ["report", "--tuning", str(TABLES / "tuning.parquet"), "--table", str(TABLES / "table.json")]
    res = CliRunner().invoke(main, [*args, "--ab", str(p), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 2, res.output
    assert "ab-new.jsonl:2: table arm applied table 0123456789ab" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "rep").exists()


def test_report_input_entries_note_legacy_records() -> None:
    paths = sorted(TABLES.glob("ab-*.jsonl"))
    _, files = report_ab.load_ab(paths)
    out = report_ab.provenance_details(paths, files, TABLES / "table.json")
    assert len(out) == len(paths)
    for f in out:
        assert dict(f.details)["provenance"].endswith("the applied table is not checked)")


def test_llama_bench_jsonl_of_a_real_run() -> None:
    results = abrun.parse_bench_output(BENCH_JSONL.read_text(), str(BENCH_JSONL))
    assert len(results) == 26
    first = results[0]
    assert (first.test, first.ubatch, first.build_commit) == ("pp512", 512, "e86f4e1")
    assert first.tps == pytest.approx(45902.512432) and len(first.samples_tps) == 5
    assert {r.test for r in results} >= {"pp512", "tg128"}
    # the same results as llama-bench's -o json (one array)
    arr = "[\n" + ",\n".join(BENCH_JSONL.read_text().splitlines()) + "\n]\n"
    assert abrun.parse_bench_output(arr) == results
    with pytest.raises(InputError, match=r"bench.jsonl:1: avg_ts"):
        abrun.parse_bench_output('{"n_prompt": 1, "n_gen": 0, "n_ubatch": 1}\n', "bench.jsonl")


def test_rotation_interleaves_arms() -> None:
    arms = [abrun.Arm(n, Path("b"), "off" if n == "stock" else "table") for n in ("stock", "table", "crude")]
    orders = [[a.name for a in abrun.rotation(arms, p)] for p in (1, 2, 3)]
    assert orders == [["table", "crude", "stock"], ["crude", "stock", "table"], ["stock", "table", "crude"]]
    two = arms[:2]
    assert [[a.name for a in abrun.rotation(two, p)] for p in (1, 2)] == [
        ["table", "stock"],
        ["stock", "table"],
    ]


def test_gpu_query_parsing() -> None:
    g = abrun.parse_gpu_query("NVIDIA H200, GPU-ae22a032-9aed-577c-49c1-4f90a60643f7, 580.159.04\n")
    assert g == abrun.Gpu("NVIDIA H200", "GPU-ae22a032-9aed-577c-49c1-4f90a60643f7", "580.159.04")
    assert abrun.parse_gpu_query("No devices were found\n") is None


def fake_llama_bench(tmp_path: Path) -> Path:
    """A stand-in for llama-bench (no GPU here): prints a real run's JSONL and the hook's start-up line
    for the GGML_CUDA_DISPATCH it is given, with a libggml-cuda beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = BENCH_JSONL.read_text().splitlines()[:2]
    (bin_dir / "out.jsonl").write_text("\n".join(lines) + "\n")
    (bin_dir / abrun.LIB_NAME).write_bytes(b"\x7fELF not really")
    fake = bin_dir / "llama-bench"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$GGML_CUDA_DISPATCH" = off ]; then echo "ggml_cuda_dispatch: ' + OFF_LINE + '" >&2;\n'
        'else echo "ggml_cuda_dispatch: ' + TABLE_LINE + '" >&2; fi\n'
        f'cat "{bin_dir / "out.jsonl"}"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def test_runner_records_each_runs_provenance(tmp_path: Path) -> None:
    fake = fake_llama_bench(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runner = abrun.Runner(
        abrun.Gpu("NVIDIA H200", "GPU-1", "580"), reps=3, clock=lambda: "2026-12-01T09:00:00Z"
    )
    arms = [abrun.Arm("stock", fake, "off"), abrun.Arm("table", fake, "table")]
    out = tmp_path / "ab.jsonl"
    os.environ.pop("GGML_CUDA_ROUTE_TRACE", None)
    n = abrun.run_ab(runner, arms, [("smollm2", model)], ["-p 512 -n 0"], 2, out)
    assert n == 2 * 2 * 2
    recs = [r for _, r in ab.read_file(out)]
    assert [(r.pair, r.arm) for r in recs[::2]] == [(1, "table"), (1, "stock"), (2, "stock"), (2, "table")]
    for r in recs:
        assert r.provenance is not None
        assert r.provenance.command[-5:] == ("-r", "3", "-o", "jsonl", "-v")
        assert dict(r.provenance.env)["GGML_CUDA_DISPATCH"] == ("off" if r.arm == "stock" else "table")
        assert r.provenance.table_applied == (r.arm == "table")
        assert r.provenance.lib_path.endswith(abrun.LIB_NAME)
    check = ab.check_records(ab.read_file(out), out, TABLE_HASH)
    assert check.checked == len(recs) and check.legacy == 0


def test_ab_command_refusals(tmp_path: Path, make_gguf: MakeGguf) -> None:
    bench = tmp_path / "llama-bench"
    bench.write_text("#!/bin/sh\nexit 1\n")
    model = make_gguf("m.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64])])
    args = ["ab", "--arm", f"stock={bench}", "--arm", f"table={bench}", "--model", str(model)]
    # no GPU visible (CUDA_VISIBLE_DEVICES="" hides every device, as on a machine without one)
    res = CliRunner().invoke(
        main, [*args, "-o", str(tmp_path / "ab.jsonl")], env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert res.exit_code == 2 and "no GPU visible" in res.output
    assert not (tmp_path / "ab.jsonl").exists()
    existing = tmp_path / "old.jsonl"
    existing.write_text("keep\n")
    res = CliRunner().invoke(main, [*args, "-o", str(existing)], env={"CUDA_VISIBLE_DEVICES": ""})
    assert res.exit_code == 2 and "old.jsonl: exists" in res.output and existing.read_text() == "keep\n"
    res = CliRunner().invoke(main, ["ab", "--arm", "fast=x", "--model", str(model), "-o", "o.jsonl"])
    assert res.exit_code == 2 and "NAME one of stock, table, crude" in res.output
    # a model is a GGUF, checked before the GPU is looked for
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    args = ["ab", "--arm", f"stock={bench}", "--arm", f"table={bench}", "--model", str(text)]
    res = CliRunner().invoke(
        main, [*args, "-o", str(tmp_path / "ab.jsonl")], env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert res.exit_code == 2 and res.stderr == (
        f"ggml-dispatch: error: {text}: not a GGUF file (magic b'not ', expected b'GGUF')\n"
    )
    assert not (tmp_path / "ab.jsonl").exists()


def test_runner_stops_at_a_run_of_another_table(tmp_path: Path) -> None:
    fake = fake_llama_bench(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runner = abrun.Runner(
        abrun.Gpu("NVIDIA H200", "GPU-1", "580"), reps=1, clock=lambda: "2026-12-01T09:00:00Z"
    )
    arms = [abrun.Arm("stock", fake, "off"), abrun.Arm("table", fake, "table")]
    out = tmp_path / "ab.jsonl"
    with pytest.raises(
        abrun.RunError, match=r"table arm applied table .*, the report's table is 0123456789ab"
    ):
        abrun.run_ab(
            runner, arms, [("m", model)], ["-p 512 -n 0"], 2, out, expect_table="0123456789ab" + "0" * 52
        )
    assert not out.exists()  # pair 1 runs the table arm first: nothing measured was kept
    assert abrun.run_ab(runner, arms, [("m", model)], ["-p 512 -n 0"], 1, out, expect_table=TABLE_HASH) == 4


def test_the_runners_own_timestamps_are_read(tmp_path: Path) -> None:
    """The runner stamps records with fileio.now_iso (+00:00); the reader takes that and Z alike."""
    for i, stamp in enumerate(("2026-12-01T10:49:37+00:00", "2026-12-01T10:49:37Z")):
        rec = ab.Record("m", "pp512", 512, "stock", 1, 1.0, (1.0,), provenance(OFF_LINE, started=stamp))
        out = tmp_path / f"ab-{i}.jsonl"
        ab.write_records(out, [rec])
        got = ab.read_file(out)[0][1].provenance
        assert got is not None and got.started == stamp


def test_table_check_of_a_cached_table_holds_the_cached_arm(tmp_path: Path) -> None:
    # a table with a weight-cache budget runs in the "cached" arm; its "table" arm is the table without
    # the cache, another table by design
    other = "table 0123456789ab (NVIDIA H200, cc 900, 132 SMs, 3 rules): applied on CUDA0"
    p = tmp_path / "ab.jsonl"
    numbered = [
        (1, ab.Record("m", "tg128", 512, "cached", 1, 50.0, (), provenance(TABLE_LINE))),
        (2, ab.Record("m", "tg128", 512, "table", 1, 49.0, (), provenance(other))),
    ]
    assert ab.check_records(numbered, p, TABLE_HASH, table_arm="cached").checked == 2
    with pytest.raises(InputError, match=r"ab.jsonl:2: table arm applied table 0123456789ab"):
        ab.check_records(numbered, p, TABLE_HASH)
    swapped = [(4, ab.Record("m", "tg128", 512, "cached", 1, 50.0, (), provenance(other)))]
    with pytest.raises(InputError, match=r"ab.jsonl:4: cached arm applied table 0123456789ab"):
        ab.check_records(swapped, p, TABLE_HASH, table_arm="cached")


ATTN_TRACE = archive.path("evidence/h200-2026-12-01-s6/attn/attn-trace")
ATTN_AB = archive.path("evidence/h200-2026-12-01-s7/attn/table-d86e5132/ab-llama8b-q8_0-f16.jsonl")


def test_test_names_carry_the_kv_cache_types_of_a_real_run() -> None:
    for kv, suffix in (("q8_0", " kv q8_0"), ("f16", "")):
        path = ATTN_TRACE / f"qwen3-seed-L4-{kv}.bench.jsonl.gz"
        names = {
            r.test for r in abrun.parse_bench_output(gzip.decompress(path.read_bytes()).decode(), str(path))
        }
        assert names >= {f"tg32 @ d49152{suffix}", f"pp2 @ d16384{suffix}", f"pp512 @ d4096{suffix}"}
    assert abrun.test_name(2, 0, 0, "q8_0", "f16") == "pp2 kv q8_0/f16"
    assert ab.kv_from_command(["llama-bench", "--cache-type-k", "q4_0", "-ctv", "q4_0"]) == " kv q4_0"
    assert ab.kv_from_command(["llama-bench", "-m", "x.gguf"]) == ""


def test_records_named_before_the_kv_types_keep_their_caches_apart() -> None:
    # one A/B file of both caches, its test names without the KV types: the command's -ctk/-ctv say it
    records, _ = report_ab.load_ab([ATTN_AB])
    per_test: dict[tuple[str, str], int] = {}
    for r in records:
        per_test[(r.test, r.arm)] = per_test.get((r.test, r.arm), 0) + 1
    assert per_test[("tg32 @ d49152", "table")] == 8 and per_test[("tg32 @ d49152 kv q8_0", "table")] == 8
    assert len(per_test) == 2 * 2 * 13  # 13 tests (4 at 3 depths + pp512), two caches, two arms


ATTN_TABLE = archive.path("tables/cuda-sm90-nvidia-h200-attn")
ATTN_AB_V1 = archive.path("evidence/h200-2026-12-01-s8/attn/ab-warmup-v1")  # the first attention A/B


def test_losses_of_the_first_repetition_alone_are_told_apart() -> None:
    # the first attention A/B: pp3 @ d4096 on the 8B model loses 0.79 over llama-bench's means of
    # 3 repetitions; repetitions 2-3 alone are within noise (the one-off cost is in repetition 1)
    records, _ = report_ab.load_ab([ATTN_AB_V1 / "ab-llama8b-q8_0-f16.jsonl"])
    assert all(r.later_tps is not None for r in records)
    comps = {(c.test, c.arm): c for c in analysis.ab_comparisons(records, decide.Params())}
    pp3 = comps[("pp3 @ d4096", "table")]
    assert pp3.ratio.below and pp3.later is not None and not pp3.later.below and pp3.later.point > 0.95
    tg = comps[("tg32 @ d49152 kv q8_0", "table")]
    assert tg.later is not None and tg.later.above and tg.ratio.above
    # a legacy record without samples: no repetitions-2.. ratio
    one = [dataclasses.replace(r, later_tps=None) for r in records]
    assert all(c.later is None for c in analysis.ab_comparisons(one, decide.Params()))


AB_NAMES = ("qwen3-seed-q8_0", "qwen3-seed-f16", "llama8b-q8_0-f16")


def test_report_summary_names_what_repetition_1_alone_carries() -> None:
    records, _ = report_ab.load_ab([ATTN_AB_V1 / f"ab-{n}.jsonl" for n in AB_NAMES])
    notes = markdown.repetition_notes(analysis.ab_comparisons(records, decide.Params()))
    line = next(ln for ln in notes if "losses are in repetition 1 alone" in ln)
    assert line.startswith("- 5 of these 7 losses") and "pp3 @ d4096 ub512 table/stock 1.031" in line
    assert "pp3 @ d16384 kv q8_0" not in line  # still slower over repetitions 2-3
    gains = next(ln for ln in notes if "repetitions 2.. alone do not show" in ln)
    assert "1 of 12" in gains and "pp512 @ d16384 ub512" in gains


def test_the_committed_attention_report_says_what_its_records_show() -> None:
    records, _ = report_ab.load_ab([ATTN_TABLE / f"ab-{n}.jsonl" for n in AB_NAMES])
    notes = markdown.repetition_notes(analysis.ab_comparisons(records, decide.Params()))
    # the second A/B (the build that also warms stock's displaced kernels) has one loss, pp3 @ d4096
    # kv q8_0 on the 8B model, and it is in repetition 1 alone
    one = "- This loss is in repetition 1 alone"
    assert any(ln.startswith(one) and "pp3 @ d4096 kv q8_0" in ln for ln in notes)
    report = (ATTN_TABLE / "REPORT.md").read_text()
    assert all(report.count(ln) == 1 for ln in notes)


HOOK_LINE = "no dispatch table compiled in: stock dispatch"


def test_hook_arm_must_run_the_hook_without_a_table(tmp_path: Path) -> None:
    # the hook arm measures the hook's own cost: dispatch on (not off), no table compiled in
    p = tmp_path / "ab.jsonl"
    ok = [(1, ab.Record("m", "pp2", 512, "hook", 1, 50.0, (), provenance(HOOK_LINE)))]
    assert ab.check_records(ok, p, TABLE_HASH).checked == 1
    for lineno, line in ((2, OFF_LINE), (3, TABLE_LINE)):
        bad = [(lineno, ab.Record("m", "pp2", 512, "hook", 1, 50.0, (), provenance(line)))]
        with pytest.raises(
            InputError, match=rf"ab.jsonl:{lineno}: hook arm must run a hooked build with no table"
        ):
            ab.check_records(bad, p, TABLE_HASH)


def test_hook_arm_splits_table_over_stock_into_the_hook_and_the_rules() -> None:
    tps = {"stock": 100.0, "hook": 95.0, "table": 104.5}
    records = [
        report_ab.AbRecord("m", "pp2 @ d16384", 512, arm, pair, tps[arm] * (1 + 0.001 * pair))
        for pair in range(1, 9)
        for arm in tps
    ]
    comps = analysis.ab_comparisons(records, decide.Params())
    by = {(c.arm, c.baseline): c.ratio.point for c in comps}
    assert by[("hook", "stock")] == pytest.approx(0.95)
    assert by[("table", "hook")] == pytest.approx(1.1)
    assert by[("table", "stock")] == pytest.approx(1.045)
    (w,) = analysis.workloads(comps)
    assert (
        w.hook is not None
        and w.hook.ratio.below
        and w.table_vs_hook is not None
        and w.table_vs_hook.ratio.above
    )


S14 = archive.path("evidence/h200-2026-12-03-s14")


def test_pooled_calls_make_one_comparison_per_workload_with_pairs_kept_per_file() -> None:
    calls = [S14 / "ab-qwen3-seed-f16-hook-call1.jsonl", S14 / "ab-qwen3-seed-f16-hook-call2.jsonl"]
    apart, _ = report_ab.load_ab(calls)
    pooled, _ = report_ab.load_ab(calls, pool=True)
    assert {r.run for r in apart} == {c.stem for c in calls} and {r.run for r in pooled} == {""}
    comps = {
        (c.model, c.test, c.arm, c.baseline): c for c in analysis.ab_comparisons(pooled, decide.Params())
    }
    c = comps[("qwen3-seed", "pp3 @ d49152", "table", "stock")]
    assert len(c.pairs) == 15  # 7 complete pairs in call 1, 8 in call 2
    # every pooled pair is a pair of one file: its ratio is that file's pair's ratio
    by_file = {
        (r.run, r.pair, r.arm): r.tps
        for r in apart
        if r.test == "pp3 @ d49152" and r.arm in ("table", "stock")
    }
    for p, ratio in c.pairs:
        f, n = divmod(p, report_ab.POOL_PAIR_STRIDE)
        run = calls[f - 1].stem
        assert ratio == pytest.approx(by_file[(run, n, "table")] / by_file[(run, n, "stock")])
    assert report_ab.pair_label(2 * report_ab.POOL_PAIR_STRIDE + 7) == "2.7"
    assert report_ab.pair_label(7) == "7"


def test_pooling_refuses_calls_of_another_table(tmp_path: Path) -> None:
    other = archive.path("evidence/h200-2026-12-02-s13/ab-qwen3-seed-f16-attn-table.jsonl")
    calls = [S14 / "ab-qwen3-seed-f16-hook-call1.jsonl", other]
    with pytest.raises(InputError, match="A/Bs of different tables are not pooled") as e:
        report_ab.load_ab(calls, pool=True)
    assert other.name in str(e.value) and ":1" in str(e.value)
    report_ab.load_ab(calls)  # apart, they are two A/Bs
    res = CliRunner().invoke(
        main,
        [
            "report",
            "--tuning",
            str(REPO / "tables" / "cuda-sm90-nvidia-h200" / "tuning" / "attention.parquet"),
            "--ab",
            str(calls[0]),
            "--ab",
            str(other),
            "--pool-ab",
            "-o",
            str(tmp_path / "r"),
        ],
    )
    assert res.exit_code != 0 and "different tables" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r").exists()


def test_summary_says_how_many_losses_chance_alone_gives() -> None:
    calls = [S14 / "ab-qwen3-seed-f16-hook-call1.jsonl", S14 / "ab-qwen3-seed-f16-hook-call2.jsonl"]
    pooled, _ = report_ab.load_ab(calls, pool=True)
    comps = analysis.ab_comparisons(pooled, decide.Params())
    # 13 tests x (table/stock, hook/stock, table/hook), every one with 15 pairs
    (line,) = markdown.chance_note(comps)
    found = sum(c.ratio.below for c in comps)
    assert f"about 1.0 of these 39 comparisons would show a loss ({found} do)" in line
    assert markdown.chance_note(comps[:9]) == []


def test_a_depth_test_is_predicted_at_its_own_M(tmp_path: Path) -> None:
    """An H100 autotune table (matmul rules matmul rules at M 256-1024 only) with its
    A/B at depth: a pp2-pp4 / tg32 test at a depth gets the matmul prediction at its M (1.000: no rule
    there), pp512 @ d16384 the one at M = 512, and no test the whole census' figure (1.491x)."""
    import io
    import tarfile

    s22 = archive.path("evidence/h100-2026-12-06-s22")
    with tarfile.open(s22 / "call2" / "1-attn-autotune.tar.gz") as outer:
        inner = outer.extractfile("1-attn-autotune/autotune-attn.tar.gz")
        assert inner is not None
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as t:
            for name in ("tuning.parquet", "census.parquet", "table.json"):
                f = t.extractfile(f"autotune-attn/{name}")
                assert f is not None
                (tmp_path / name).write_bytes(f.read())
    res = CliRunner().invoke(
        main,
        [
            "report",
            *("--tuning", str(tmp_path / "tuning.parquet"), "--census", str(tmp_path / "census.parquet")),
            *("--table", str(tmp_path / "table.json"), "--ab", str(s22 / "ab-qwen3-seed-q8_0-d4096.jsonl")),
            "-o",
            str(tmp_path / "r"),
        ],
    )
    assert res.exit_code == 0, res.output
    rows = {
        line.split(" | ")[0].removeprefix("| qwen3-seed "): line.rstrip(" |").rsplit(" | ", 1)[1]
        for line in (tmp_path / "r" / "REPORT.md").read_text().splitlines()
        if line.startswith("| qwen3-seed ") and "kv q8_0 ub512" in line
    }
    assert {
        t: rows[f"{t} kv q8_0 ub512"] for t in ("pp2 @ d4096", "pp4 @ d4096", "tg32 @ d4096")
    } == dict.fromkeys(("pp2 @ d4096", "pp4 @ d4096", "tg32 @ d4096"), "1.000")
    assert float(rows["pp512 @ d16384 kv q8_0 ub512"]) > 1.2
    assert "1.491" not in rows.values()


S23 = archive.path("evidence/h100-2026-12-06-s23")


def test_a_gain_the_last_repetition_does_not_show_is_named() -> None:
    # an autotune shadow table on an H100 (16 pairs): pp2 @ d4096 kv q8_0 is the first
    # test of each llama-bench process; stock's repetition 1 took 7.3 ms against the table's 1.6, and the last
    # repetition (a replay) is within noise, so the 1.38 over the means is flagged
    calls = [S23 / "ab-qwen3-seed-call3.jsonl", S23 / "ab-qwen3-seed-call5.jsonl"]
    records, _ = report_ab.load_ab(calls, pool=True)
    assert all(r.last_tps is not None for r in records)
    comps = {(c.test, c.arm): c for c in analysis.ab_comparisons(records, decide.Params())}
    first = comps[("pp2 @ d4096 kv q8_0", "table")]
    assert first.ratio.above and first.ratio.point > 1.3 and first.last is not None and not first.last.above
    steady = comps[("tg32 @ d49152 kv q8_0", "table")]
    assert steady.last is not None and steady.last.above and steady.ratio.above
    notes = markdown.repetition_notes(list(comps.values()))
    line = next(ln for ln in notes if "the last repetition alone does not show" in ln)
    assert "1 of 9" in line and "pp2 @ d4096 kv q8_0 ub512 table/stock 0.984" in line
    # two repetitions: no last-repetition ratio (repetition 2 is not yet the steady state)
    two = [dataclasses.replace(r, last_tps=None) for r in records]
    assert all(c.last is None for c in analysis.ab_comparisons(two, decide.Params()))
