"""autotune for a speculative server (issue #50: the seed user's llama-server with MTP draft 2 on 4 slots):
the widths it verifies reach the traced workloads. The plan is printed by --dry-run on a real GGUF written by
lab.qwen35; nothing runs on a GPU here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ggml_dispatch.autotune import plan
from ggml_dispatch.cli import main
from lab import qwen35


def test_the_verify_widths_of_draft_and_slots() -> None:
    assert plan.verify_widths(0, 1) == ()
    assert plan.verify_widths(2, 1) == (2, 3)
    assert plan.verify_widths(2, 4) == (2, 3, 4, 8, 12)
    assert plan.verify_widths(0, 4) == (4,)


def test_the_widths_join_the_verify_and_depth_workloads_only() -> None:
    w = plan.verify_widths(2, 4)
    assert "-p 2,3,4,8,12,16 -n 0" in plan.bench_args("verify", (512,), (), "f16", w)
    depth = plan.bench_args(plan.DEPTH_WORKLOAD, (512,), (49152,), "q8_0", w)
    assert "-p 2,3,4,8,12 -n 32 -d 49152" in depth
    assert plan.bench_args("decode", (512,), (), "f16", w) == plan.bench_args("decode", (512,))
    assert plan.bench_args("verify", (512,)) == "-ngl 99 -fa on -p 2,3,4,8,16 -n 0 -ub 512"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("q35") / "qwen35-l4.gguf"
    qwen35.write(out, qwen35.Qwen35(layers=4, vocab=1024))
    return out


def test_the_dry_run_plans_the_seed_users_server(model: Path, tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    (tree / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(model), "--spec-draft", "2", "--slots", "4"]
    args += ["--ubatch", "1024", "--depth", "49152", "--kv-type", "q8_0"]
    args += ["--dry-run", "-o", str(tmp_path / "t")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "-p 2,3,4,8,12,16 -n 0 -ub 512" in res.output
    assert "-ctk q8_0 -ctv q8_0 -p 2,3,4,8,12 -n 32 -d 49152" in res.output
    assert "-b 2048 -ub 1024" in res.output


BAD = [("--spec-draft", "-1"), ("--spec-draft", "nan"), ("--slots", "0")]


@pytest.mark.parametrize(("flag", "value"), BAD)
def test_bad_values_are_one_usage_error(model: Path, tmp_path: Path, flag: str, value: str) -> None:
    args = ["autotune", "--llama-cpp", str(tmp_path), "--model", str(model), flag, value, "--dry-run"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert flag in res.output and "Traceback" not in res.output


def test_a_model_without_an_mtp_block_gets_one_note(model: Path, tmp_path: Path) -> None:
    # the qwen35 model has one (no note); a GGUF of the same tensors without the MTP block's key and
    # tensors is served with a separate draft model only, which the note says
    import gguf

    tree = tmp_path / "llama.cpp"
    (tree / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    plain = tmp_path / "no-mtp.gguf"
    w = gguf.GGUFWriter(plain, "qwen35")
    w.add_block_count(1)
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((64, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for path, noted in ((model, False), (plain, True)):
        args = ["autotune", "--llama-cpp", str(tree), "--model", str(path), "--spec-draft", "2"]
        res = CliRunner().invoke(main, [*args, "--dry-run", "-o", str(tmp_path / f"t-{noted}")])
        assert res.exit_code == 0, res.output
        notes = [line for line in res.output.splitlines() if "no MTP block" in line]
        assert len(notes) == int(noted), res.output
