"""lab.serve_ab (the seed workload through llama-server) and report.attribution (its Amdahl table): the pure
parts, on a real kernel timeline (the committed H200 profile: llama-bench processes) and a real GGUF written
by lab.qwen35 with the synthetic vocabulary. The server runs themselves need a GPU (lab/qwen35.sh)."""

from __future__ import annotations

import fnmatch
import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import MakeGguf

from ggml_dispatch import registry
from ggml_dispatch.cli import main
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import attribution
from ggml_dispatch.report import timeline as tl
from lab import qwen35, qwen35_attrib, serve_ab, serve_summary

PROFILE = Path(__file__).resolve().parents[1] / "tables" / "cuda-sm90-nvidia-h200" / "profile.tar.xz"


def _ktl(name: str) -> list[str]:
    with tarfile.open(PROFILE) as tar:
        f = tar.extractfile(f"./{name}")
        assert f is not None
        return io.TextIOWrapper(f).read().splitlines(keepends=True)


@pytest.fixture(scope="module")
def tg_timeline() -> tl.Timeline:
    return tl.timeline_artifact.parse_ktl(_ktl("stock.tg128.ktl"), PROFILE, attribution.label)


def test_test_names_say_mtp_and_pp1024() -> None:
    w = serve_ab.Workload(depth=48000, slots=1, gen=128)
    assert w.tests("mtp") == ("pp1024 d48000 s1", "mtp2 tg128 d48000 s1")
    assert w.tests("plain") == ("pp1024 d48000 s1", "tg128 d48000 s1")


def test_a_group_rate_is_its_tokens_over_the_longest_request() -> None:
    t = [
        serve_ab.Timings(12000, 4000.0, 128, 2000.0, 100, 60),
        serve_ab.Timings(12000, 3000.0, 128, 1600.0, 90, 45),
    ]
    pre, gen = serve_ab.group_tps(t)
    assert pre == pytest.approx(24000 / 4.0)
    assert gen == pytest.approx(256 / 2.0)
    assert serve_ab.acceptance(t) == pytest.approx(105 / 190)
    assert serve_ab.acceptance([serve_ab.Timings(10, 1.0, 5, 1.0, 0, 0)]) is None


def test_timings_come_from_the_servers_response() -> None:
    body = {"timings": {"prompt_n": 7, "prompt_ms": 2.5, "predicted_n": 3, "predicted_ms": 9.0}}
    assert serve_ab.Timings.from_response(body) == serve_ab.Timings(7, 2.5, 3, 9.0, 0, 0)
    body["timings"] |= {"draft_n": 4, "draft_n_accepted": 2}
    assert serve_ab.Timings.from_response(body).draft_accepted == 2


def test_prompts_are_ordinary_words_of_the_vocabulary_and_repeatable() -> None:
    p = serve_ab.prompt_ids(5000, seed=3, vocab=248320)
    assert p == serve_ab.prompt_ids(5000, seed=3, vocab=248320)
    assert min(p) >= qwen35.SPM_FIRST_WORD and max(p) < 248320
    body = serve_ab.payload(p[:4], 16)
    assert body["ignore_eos"] is True and body["temperature"] == 0.0 and body["n_predict"] == 16


def test_the_server_command_is_the_seed_users() -> None:
    s = serve_ab.Server(Path("llama-server"), Path("m.gguf"), 8190, "mtp", {}, Path("log"))
    cmd = " ".join(s.command())
    for flag in ("-c 50000", "-np 4", "-kvu", "-b 2048", "-ub 1024", "-ctk q8_0", "-ctv q8_0", "-fa on"):
        assert flag in cmd
    assert "--spec-type draft-mtp --spec-draft-n-max 2" in cmd
    plain = serve_ab.Server(Path("llama-server"), Path("m.gguf"), 8190, "plain", {}, Path("log"))
    assert "--spec-type" not in plain.command()


def test_kernels_are_attributed_to_ops_and_routes(tg_timeline: tl.Timeline) -> None:
    labels = {lab for _, _, lab in tg_timeline.kernels}
    assert "MUL_MAT mmvq" in labels  # decode on the H200 profile: quantized weights, M = 1
    assert "FLASH_ATTN_EXT" in labels
    assert "RMS_NORM" in labels or "RMS_NORM+ROPE" in labels
    assert attribution.label("_Z20gated_delta_net_cudaILi128EEvPKf") == "GATED_DELTA_NET"
    assert attribution.label("_Z12ssm_conv_f32ILm4EEvPKf") == "SSM_CONV"
    assert attribution.label("_Z15some_new_kernelv") == "?some_new_kernel"


def test_a_timeline_cuts_at_idle_gaps_and_keeps_every_kernel(tg_timeline: tl.Timeline) -> None:
    whole = attribution.segments(tg_timeline, gap_ns=10**15)
    assert len(whole) == 1
    events = sorted([*((s, e) for s, e, _ in tg_timeline.kernels), *tg_timeline.copies])
    gaps, end = [], events[0][1]
    for s, e in events[1:]:
        gaps.append(s - end)
        end = max(end, e)
    widest = max(gaps)
    cut = attribution.segments(tg_timeline, gap_ns=widest)
    assert len(cut) == 1 + sum(g >= widest for g in gaps) >= 2
    assert len(attribution.segments(tg_timeline, gap_ns=widest + 1)) == 1
    assert sum(len(s.kernels) for s in cut) == len(tg_timeline.kernels)
    ms = attribution.attribute(whole[0])
    kernel_ms = sum(e - s for s, e, _ in tg_timeline.kernels) / 1e6
    assert sum(v for k, v in ms.items() if k != "copy") == pytest.approx(kernel_ms)


def test_phases_are_matched_to_the_last_segments(tmp_path: Path, tg_timeline: tl.Timeline) -> None:
    (tmp_path / "plain.ktl").write_text("".join(_ktl("stock.tg128.ktl")))
    segs = attribution.segments(tg_timeline, gap_ns=1_000_000_000)
    timings = [{"prompt_n": 1, "prompt_ms": 1.0, "predicted_n": 128, "predicted_ms": 1.0}]
    row = {"mode": "plain", "phase": "decode", "depth": 0, "slots": 1, "gen": 128, "timings": timings}
    (tmp_path / "phases-plain.jsonl").write_text(json.dumps(row) + "\n")
    (p,) = attribution.load(tmp_path, ["plain"])
    assert p.name == "plain decode d0 s1" and p.committed == 128
    assert p.total == pytest.approx(sum(attribution.attribute(segs[-1]).values()))
    assert p.coverage > 0.95
    text = attribution.markdown([p])
    assert text.startswith("| phase |") and "MUL_MAT mmvq" in text
    (tmp_path / "phases-plain.jsonl").write_text((json.dumps(row) + "\n") * (len(segs) + 1))
    with pytest.raises(InputError, match="busy segments"):
        attribution.load(tmp_path, ["plain"])


def test_a_missing_profile_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert qwen35_attrib.main([str(tmp_path)]) == 2
    assert "mtp.ktl" in capsys.readouterr().err


def test_the_synthetic_vocabulary_reads_back(tmp_path: Path) -> None:
    v = qwen35.synthetic_vocab(300)
    assert v["tokenizer.ggml.model"] == "llama" and len(v["tokenizer.ggml.tokens"]) == 300
    assert v["tokenizer.ggml.tokens"][3] == "<0x00>" and v["tokenizer.ggml.token_type"][3] == 6
    with pytest.raises(ValueError, match="SPM vocabulary"):
        qwen35.synthetic_vocab(100)
    out = tmp_path / "q.gguf"
    d = qwen35.Qwen35(layers=4, vocab=1024, tokenizer="spm")
    qwen35.write(out, d)
    kv, shapes, _ = qwen35.read(out)
    assert len(kv["tokenizer.ggml.tokens"]) == 1024 and kv["tokenizer.ggml.bos_token_id"] == 1
    assert shapes["output.weight"] == (5120, 1024)


EVIDENCE = Path(__file__).resolve().parents[1] / "evidence" / "h200-2026-12-07-s33-qwen35"


def test_the_seed_workloads_attribution_reproduces_from_its_timelines(tmp_path: Path) -> None:
    """The committed H200 profile of the qwen35 server (lab/qwen35.sh): the Amdahl table is recomputed
    from the raw kernel timelines and covers at least 95% of GPU time in every phase."""
    with tarfile.open(EVIDENCE / "profile.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    phases = [p for m in ("mtp", "plain") for p in attribution.load(tmp_path, [m])]
    assert [p.name for p in phases] == [
        "prefill d48000 s1 (MTP server)", "MTP decode d48000 s1", "prefill d48000 s1",
        "plain decode d48000 s1",
    ]  # fmt: skip
    assert all(p.coverage >= 0.95 for p in phases)
    committed = json.loads((EVIDENCE / "attribution.json").read_text())
    for p, c in zip(phases, committed, strict=True):
        assert p.total == pytest.approx(c["gpu_ms"]) and p.coverage == pytest.approx(c["coverage"])
    prefill, plain = phases[2], phases[3]
    assert max(prefill.ms, key=prefill.ms.__getitem__) == "MUL_MAT mmq"
    assert prefill.ms["GATED_DELTA_NET"] / prefill.total > 0.1
    assert max(plain.ms, key=plain.ms.__getitem__) == "MUL_MAT mmvq"
    assert plain.committed == 128 and phases[1].acceptance == 0.0  # random weights: no draft accepted


def test_the_seed_workloads_census_has_the_verify_widths() -> None:
    import pandas as pd

    c = pd.read_parquet(EVIDENCE / "census.parquet")
    calls = c[c.op == "MUL_MAT"].groupby("M").calls.sum()
    for m in (1, 3, 4, 12, 1024):  # decode, one slot's verify, 4 slots plain, 4 slots verifying, prefill
        assert calls.get(m, 0) > 1000, m


# A llama-server log of a model it could not load (the pinned tree's server, CPU build, a GGUF of
# architecture "foo"): the lines before the error, verbatim.
FAILED_LOAD_LOG = """\
0.00.004.998 I main: loading model
0.00.005.163 E llama_model_load: error loading model: unknown model architecture: 'foo'
0.00.005.189 E llama_model_load_from_file_impl: failed to load model
0.00.005.786 E srv  llama_server: exiting due to model loading error
"""


def test_a_server_that_exits_says_why_from_its_log() -> None:
    reason = serve_ab.log_reason(FAILED_LOAD_LOG)
    assert reason is not None and "unknown model architecture: 'foo'" in reason
    assert serve_ab.log_reason("0.00.001 I main: loading model\n") is None


@pytest.mark.parametrize(
    ("arch", "kv", "tensors", "modes", "message"),
    [
        ("qwen35", {}, [], ["mtp", "plain"], "no MTP block (qwen35.nextn_predict_layers is 0 or absent)"),
        ("qwen35", {"qwen35.nextn_predict_layers": 1}, [], ["mtp"], "has no blk.N.nextn.* tensor"),
        ("qwen35", {}, [], ["plain"], None),
        ("qwen35", {"qwen35.nextn_predict_layers": 1}, [("blk.1.nextn.eh_proj.weight", "q8_0", [64, 32])],
         ["mtp"], None),
    ],
)  # fmt: skip
def test_a_model_that_cannot_serve_a_mode_is_refused_before_any_server_starts(
    make_gguf: MakeGguf,
    arch: str,
    kv: dict[str, int],
    tensors: list[tuple[str, str, list[int]]],
    modes: list[str],
    message: str | None,
) -> None:
    path = make_gguf("m.gguf", [("token_embd.weight", "q8_0", [32, 64]), *tensors], arch=arch, kv=kv)
    problem = serve_ab.model_problem(path, modes)
    assert problem == message if message is None else (problem is not None and message in problem)


def test_the_command_line_refuses_a_model_without_mtp_with_one_message(
    make_gguf: MakeGguf, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_gguf("m.gguf", [("token_embd.weight", "q8_0", [32, 64])], arch="qwen35")
    with pytest.raises(SystemExit) as e:
        serve_ab.main(["ab", "--server", "/bin/false", "--model", str(path), "-o", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if "error:" in line] == [err[-1]]  # argparse's usage, then one error
    assert "no MTP block" in err[-1] and "--modes plain" in err[-1]
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit):
        serve_ab.main(["ab", "--server", "/bin/false", "--model", str(tmp_path / "none.gguf"), "-o", "x"])
    assert "none.gguf" in capsys.readouterr().err


def _planned(array: str, census: Path, tmp_path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The candidate arguments lab/qwen35.sh passes to `tune run` (a bash array of the script, read by
    bash) and the cases `tune run --dry-run` plans with them on a committed census."""
    script = Path(__file__).resolve().parents[1] / "lab" / "qwen35.sh"
    read = f'eval "$(sed -n "/^{array}=(/,/)$/p" {script})"; printf "%s\\n" "${{{array}[@]}}"'
    out = subprocess.run(["bash", "-c", read], capture_output=True, text=True, check=True).stdout
    args = [a for a in out.split("\n") if a]
    assert "--only" in args and len(args) > 10
    cmd = ["tune", "run", str(census), "--llama-cpp", str(tmp_path), "-o", str(tmp_path / "t.parquet")]
    res = CliRunner().invoke(main, [*cmd, "--dry-run", *args])
    assert res.exit_code == 0, res.output
    cases = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    patterns = [args[i + 1] for i, a in enumerate(args) if a == "--only"]
    routes = {r for c in cases for r in c["routes"]}
    assert all(any(fnmatch.fnmatchcase(r, p) for r in routes) for p in patterns)  # no pattern matches nothing
    return args, cases


def test_the_pruned_sweep_of_lab_qwen35_sh_plans_the_verify_widths_with_compiled_candidates(
    tmp_path: Path,
) -> None:
    # the decode / verify widths the seed workload runs stay in the pruned matmul sweep, with the build's
    # compiled mmvq pairs and no other
    _, cases = _planned("TUNE_PRUNED", EVIDENCE / "census.parquet", tmp_path)
    assert {1, 3, 4, 12, 1024} <= {c["M"] for c in cases}
    # (no hooked tree here, so every capped pair the glob names; a default install compiles the default
    # pairs' only, which select keeps)
    compiled = {f"mmvq/nwarps={w},rows={r}" for w, r in registry.MMVQ_DEFAULT_CONFIGS}
    compiled |= {f"mmvq/nwarps={w},rows={r},regs=64" for w, r in registry.MMVQ_CONFIGS}
    small = next(c for c in cases if c["M"] == 3)
    assert {r for r in small["routes"] if r.startswith("mmvq/")} == compiled


def test_the_pruned_attention_sweep_plans_decode_verify_and_the_depth_fill(tmp_path: Path) -> None:
    # FLASH_ATTN_EXT of the committed attention census (the s33 traces): the seed's D 256 / GQA 6 over the
    # Q8_0 cache at one-slot decode and verify (M 1, 3), four slots (4, 12) and the depth fill (1024),
    # with shadowed and reused KV candidates, within one call's device time
    args, cases = _planned("TUNE_ATTN_PRUNED", EVIDENCE / "census-attention.parquet", tmp_path)
    assert {c["op"] for c in cases} == {"FLASH_ATTN_EXT"}
    q8 = [c for c in cases if c["k_type"] == "q8_0"]
    assert {(c["D_K"], c["gqa"]) for c in q8} == {(256, 6)}
    assert {1, 3, 4, 12, 1024} <= {c["M"] for c in q8}
    assert 20 <= len(cases) <= 40
    patterns = [args[i + 1] for i, a in enumerate(args) if a == "--only"]
    timed = {r for c in cases for r in c["routes"] if any(fnmatch.fnmatchcase(r, p) for p in patterns)}
    assert {"fa_mma/kv=shadow", "fa_vec/kv=shadow", "fa_tile/kv=shadow"} <= timed
    assert not any("sparse=on" in r or "stream_k=off" in r for r in timed)
    assert 25 <= len(timed) <= 45  # about 37 candidates a case


def test_the_dispatch_line_comes_from_a_listing_start_when_the_servers_log_hides_it(tmp_path: Path) -> None:
    """A stand-in for a hooked CUDA llama-server (none runs on this machine): like the 0.3.36 tree's, it
    prints ggml's INFO lines only at -lv 4, so the timed server's log has no hook line (the H100 run's
    records came back with an empty dispatch_line)."""
    fake = tmp_path / "llama-server"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-lv" ] && [ "$2" = "4" ] && [ "$3" = "--list-devices" ]; then\n'
        '  echo "ggml_cuda_init: found 1 CUDA devices"\n'
        '  if [ "$GGML_CUDA_DISPATCH" = "off" ]; then\n'
        '    echo "ggml_cuda_dispatch: GGML_CUDA_DISPATCH=off: stock dispatch"\n'
        "  else\n"
        '    echo "ggml_cuda_dispatch: table 92ddcc7e9392 (NVIDIA H100 80GB HBM3, cc 900, 132 SMs, 20 rules):'
        ' applied on CUDA0"\n'
        "  fi\n"
        "  exit 0\n"
        "fi\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    log = tmp_path / "server.log"
    log.write_text("0.00.015 I srv  llama_server: initializing ...\n")
    table = serve_ab.Server(fake, tmp_path / "m.gguf", 8190, "plain", {"GGML_CUDA_DISPATCH": "table"}, log)
    line = table.dispatch_line()
    assert line is not None and line.mode == "table" and line.table_hash == "92ddcc7e9392" and line.applied
    stock = serve_ab.Server(fake, tmp_path / "m.gguf", 8190, "plain", {"GGML_CUDA_DISPATCH": "off"}, log)
    assert stock.dispatch_line().mode == "off"
    log.write_text("ggml_cuda_dispatch: GGML_CUDA_DISPATCH=off: stock dispatch\n")  # the log's own line wins
    assert serve_ab.Server(fake, tmp_path / "m.gguf", 8190, "plain", {}, log).dispatch_line().mode == "off"
    fake.write_text("#!/bin/sh\nexit 1\n")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert serve_ab.Server(fake, tmp_path / "m.gguf", 8190, "plain", {}, empty).dispatch_line() is None


H100_AB = Path(__file__).resolve().parents[1] / "tables" / "cuda-sm90-nvidia-h100" / "ab"


def test_the_h100_seed_workload_summary_pools_both_calls(capsys: pytest.CaptureFixture[str]) -> None:
    """The committed H100 A/B of the qwen35 table (two calls, 3 + 4 pairs): the numbers its README quotes."""
    files = [str(H100_AB / f"qwen35-27b-L16-serve-call{c}.jsonl") for c in (1, 2)]
    assert serve_summary.main(files) == 0
    out = capsys.readouterr().out
    assert "| plain | pp1024 d48000 s1 | 7 | **1.625** | [1.595, 1.628] |" in out
    assert "| mtp | mtp2 tg128 d48000 s1 | 7 | **1.019** | [1.007, 1.033] |" in out
    assert "| plain | tg128 d48000 s1 | 7 | **1.005** | [0.993, 1.059] |" in out
    assert "112 of 112 records have no hook start-up line" in out


def test_the_summary_refuses_what_is_not_an_ab_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "ab.jsonl"
    bad.write_text('{"test": "pp1024 d1 s1", "arm": "stock"}\n')
    assert serve_summary.main([str(bad)]) == 2
    assert f"{bad}:1: not an A/B record" in capsys.readouterr().err
    assert serve_summary.main([str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl" in capsys.readouterr().err


def test_the_summary_reports_mtp_acceptance_per_arm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Both arms of the H100 A/B drafted 251 tokens per 128 generated and accepted none (random weights);
    a table that changed what the model computes would show as acceptance differing between arms."""
    files = [str(H100_AB / f"qwen35-27b-L16-serve-call{c}.jsonl") for c in (1, 2)]
    evidence = Path(__file__).resolve().parents[1] / "evidence" / "h100-2026-12-07-s35-qwen35"
    reqs = [a for c in ("ab1", "ab2") for a in ("--requests", str(evidence / c / "requests.jsonl"))]
    assert serve_summary.main([*files, *reqs]) == 0
    out = capsys.readouterr().out
    assert "| 1 | stock | 7 | 1757 | 0 | 0.000 |" in out and "| 1 | table | 7 | 1757 | 0 | 0.000 |" in out
    assert "Acceptance equal across arms." in out
    changed = tmp_path / "requests.jsonl"
    rows = [json.loads(ln) for ln in (evidence / "ab1" / "requests.jsonl").read_text().splitlines()]
    for r in rows:
        if r["arm"] == "table" and r["mode"] == "mtp":
            r["timings"][0]["draft_accepted"] = 1
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert serve_summary.main([*files, "--requests", str(changed)]) == 0
    assert "**differs between arms**" in capsys.readouterr().out
