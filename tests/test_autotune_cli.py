"""``ggml-dispatch autotune`` (plan, dry-run, refusals, resumable stages) and ``ggml-dispatch status``.

On the pinned llama.cpp tree and the real SmolLM2 GGUF. Nothing here has a GPU: the GPU check is made
to see none through CUDA_VISIBLE_DEVICES="" (what a GPU-less machine's nvidia-smi amounts to); a
stand-in nvcc (a script printing what nvcc 12.9 / 13.0 print for --version) stands for the toolkit
a V100 user has, since no CUDA 12 nvcc driver can be installed here (PyPI's CUDA 12 wheels hold ptxas
but no nvcc; tests/test_native_volta.py compiles the sm_70 device code with clang instead).
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggml_dispatch import archive, fetch
from ggml_dispatch.autotune import env as env_mod
from ggml_dispatch.autotune import plan as plan_mod
from ggml_dispatch.autotune import run as run_mod
from ggml_dispatch.autotune import status as status_mod
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import table as table_mod
from ggml_dispatch.hook import install as inst

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "tables" / "cuda-sm90-nvidia-h200" / "table.json"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def tree() -> Path:
    return fetch.llama_cpp_dir()


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fetch.smollm2_gguf()


def fake_nvcc(tmp_path: Path, release: str) -> Path:
    p = tmp_path / f"nvcc-{release}"
    p.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.0'\n"
    )
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def test_dry_run_prints_the_plan_and_touches_nothing(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables" / "mine"
    build = tmp_path / "build"
    before = sorted(p.name for p in (tree / inst.CUDA_DIR).iterdir())
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "--build-dir", str(build)]
    res = CliRunner().invoke(main, [*args, "-o", str(out), "--dry-run"], env=NO_GPU)
    assert res.exit_code == 0, res.output
    text = res.output
    for i, name in enumerate(plan_mod.STAGES, start=1):
        assert f"[{i}/10] {name}:" in text
    assert "GPU none visible" in text and "estimated total: ~" in text
    assert (
        "-DGGML_CUDA=ON" in text
        and "-DGGML_CUDA_FA=ON" in text
        and "-DCMAKE_CUDA_ARCHITECTURES=native" in text
    )
    assert f"GGML_CUDA_ROUTE_TRACE={out}/.autotune/traces/SmolLM2-135M-Instruct.Q4_1.decode.jsonl" in text
    assert f"--gguf {smollm2}" in text and "tune run" in text and "--arm stock=" in text
    assert " ab --arm stock=" in text and ":off --arm table=" in text and "--pairs 5 --reps 3 --vram" in text
    assert not out.exists() and not build.exists()
    assert sorted(p.name for p in (tree / inst.CUDA_DIR).iterdir()) == before


def test_dry_run_options_shape_the_plan(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(tmp_path / "o")]
    extra = ["--workload", "decode,prefill", "--ubatch", "512", "--pairs", "2", "--reps", "1"]
    skips = [
        "--skip",
        "hook",
        "--skip",
        "build",
        "--tune-seconds",
        "120",
        "--trials",
        "3",
        "--case-timeout",
        "90",
    ]
    res = CliRunner().invoke(main, [*args, *extra, *skips, "--dry-run"], env=NO_GPU)
    assert res.exit_code == 0, res.output
    assert "hook: install" in res.output and "(skipped)" in res.output
    assert "verify" not in res.output.split("[3/10]")[1].split("[4/10]")[0]
    assert (
        "-ub 512 -r 1" in res.output
        and "--case-timeout 90.0 --max-seconds 120.0" in res.output
        and "--trials 3" in res.output
    )
    assert "--pairs 2 --reps 1" in res.output


def test_dry_run_with_depths_tunes_attention_too(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(tmp_path / "o")]
    res = CliRunner().invoke(
        main, [*args, "--depth", "4096,49152,4096", "--kv-type", "q8_0", "--dry-run"], env=NO_GPU
    )
    assert res.exit_code == 0, res.output
    assert "decode, verify, prefill, depth on 1 model" in res.output
    assert "-ctk q8_0 -ctv q8_0 -p 2,3,4 -n 32 -d 4096,49152 -r 1" in res.output  # each depth once
    # the A/B adds a shallower control depth no tuned depth reaches (a quarter of the smallest)
    (ab,) = [ln for ln in res.output.splitlines() if " ab --arm " in ln]
    assert "--bench '-ngl 99 -fa on -ctk q8_0 -ctv q8_0 -p 2,3,4 -n 32 -d 1024,4096,49152'" in ab
    assert "census attention" in res.output and "--max-m 16" in res.output
    assert "--coverage 1 --configs all" in res.output
    assert "tune merge" in res.output
    bad = CliRunner().invoke(main, [*args, "--depth", "0", "--dry-run"], env=NO_GPU)
    assert bad.exit_code == 2 and "each depth must be between 1 and" in bad.output
    bad = CliRunner().invoke(main, [*args, "--depth", "4096", "--kv-type", "q9", "--dry-run"], env=NO_GPU)
    assert bad.exit_code == 2 and "--kv-type" in bad.output


def test_vram_budget_reaches_codegen(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    """A quantized --depth KV cache measures kv=shadow configurations; codegen admits them only under a
    budget, so autotune says so without one and passes it on with one; a budget has the matmul sweep time
    the weight cache's configurations too, with or without --depth."""
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "--dry-run"]
    runner = CliRunner()
    q8 = ["--depth", "49152", "--kv-type", "q8_0"]
    res = runner.invoke(main, [*args, "-o", str(tmp_path / "a"), *q8], env=NO_GPU)
    assert res.exit_code == 0, res.output
    assert "without --vram-budget" in res.stderr and "--vram-budget" not in res.stdout
    assert "--configs cache" not in res.stdout
    res = runner.invoke(
        main,
        [*args, "-o", str(tmp_path / "b"), *q8, "--vram-budget", "4096"],
        env=NO_GPU,
    )
    assert res.exit_code == 0, res.output
    codegen = [ln for ln in res.stdout.splitlines() if " codegen " in ln]
    assert len(codegen) == 1 and codegen[0].endswith("--vram-budget 4096"), codegen
    assert "VRAM budget 4096 MiB" in res.stdout and "note:" not in res.stderr
    res = runner.invoke(main, [*args, "-o", str(tmp_path / "d"), "--vram-budget", "64"], env=NO_GPU)
    assert res.exit_code == 0, res.output
    tune = [ln for ln in res.stdout.splitlines() if " tune run " in ln]
    assert len(tune) == 1 and "--configs cache" in tune[0], tune
    bad = runner.invoke(main, [*args, "-o", str(tmp_path / "c"), "--kv-shadow-budget", "64"], env=NO_GPU)
    assert bad.exit_code == 2 and "--kv-shadow-budget is replaced by --vram-budget" in bad.output
    assert not (tmp_path / "c").exists()


def test_depth_fill_adds_each_depths_last_fill_point_to_the_attention_census(
    tree: Path, smollm2: Path, tmp_path: Path
) -> None:
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "--dry-run"]
    runner = CliRunner()
    res = runner.invoke(
        main, [*args, "-o", str(tmp_path / "a"), "--depth", "16384,49152", "--depth-fill"], env=NO_GPU
    )
    assert res.exit_code == 0, res.output
    census = [ln for ln in res.stdout.splitlines() if " census attention " in ln]
    assert len(census) == 1 and "--max-m 16 --fill-kv 16384,49152 -o" in census[0], census
    res = runner.invoke(main, [*args, "-o", str(tmp_path / "b"), "--depth", "16384"], env=NO_GPU)
    assert res.exit_code == 0 and "--fill-kv" not in res.stdout
    bad = runner.invoke(main, [*args, "-o", str(tmp_path / "c"), "--depth-fill"], env=NO_GPU)
    assert bad.exit_code == 2 and "--depth-fill needs --depth" in bad.stderr and not (tmp_path / "c").exists()


def test_a_kv_shadow_budget_tunes_the_fill_unless_told_not_to(
    tree: Path, smollm2: Path, tmp_path: Path
) -> None:
    # the shadow is made by the first node whose rule reads it: a rule at the fill makes it before the
    # first timed decode step (evidence/h100-2026-12-06-s25/README.md), so a budget brings the fill along
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "--dry-run"]
    shadow = ["--depth", "16384", "--kv-type", "q8_0", "--vram-budget", "64"]
    runner = CliRunner()

    def census_line(out: str, *extra: str) -> str:
        res = runner.invoke(main, [*args, "-o", str(tmp_path / out), *shadow, *extra], env=NO_GPU)
        assert res.exit_code == 0, res.output
        (line,) = [ln for ln in res.stdout.splitlines() if " census attention " in ln]
        return line

    assert "--max-m 16 --fill-kv 16384 -o" in census_line("a")
    assert "--fill-kv" not in census_line("b", "--no-depth-fill")
    assert "--fill-kv 16384" in census_line("c", "--depth-fill")


def test_a_new_vram_budget_redoes_codegen_onward_not_the_sweep(
    tree: Path, smollm2: Path, tmp_path: Path
) -> None:
    def keys(budget: int) -> dict[str, str]:
        opts = plan_mod.Options(
            llama_cpp=tree,
            models=(smollm2,),
            out=tmp_path / "o",
            build_dir=tmp_path / "b",
            depths=(49152,),
            kv_type="q8_0",
            vram_budget=budget,
        )
        return {s.name: run_mod.stage_key(s) for s in plan_mod.plan(opts)}

    before, after = keys(1024), keys(2048)
    changed = [n for n in before if before[n] != after[n]]
    assert changed == ["codegen"]  # done_stages stops at the first changed stage: codegen and all after it


def test_a_model_that_is_not_a_gguf_is_refused_first(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    """--model is a GGUF whose header parses, checked before the GPU, the toolkit or the plan: a text
    file (the H200 table's README) or a GGUF cut short is one error naming it, and nothing is written."""
    cut = tmp_path / "cut.gguf"
    with smollm2.open("rb") as f:
        cut.write_bytes(f.read(4096))
    readme = REPO / "tables" / "cuda-sm90-nvidia-h200" / "README.md"
    out = tmp_path / "o"
    for model, why in (
        (readme, "not a GGUF file (magic b'# NV', expected b'GGUF')"),
        (cut, "truncated or corrupt GGUF file ("),
    ):
        for args in (
            ["autotune", "--llama-cpp", str(tree), "--model", str(model), "-o", str(out), "--dry-run"],
            ["status", "--llama-cpp", str(tree), "--model", str(model)],
        ):
            res = CliRunner().invoke(main, args, env=NO_GPU)
            assert res.exit_code == 2 and "Traceback" not in res.output, res.output
            (line,) = res.stderr.splitlines()
            assert line.startswith(f"ggml-dispatch: error: {model}: {why}"), line
            assert not out.exists()


def test_refuses_without_a_gpu(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = CliRunner().invoke(
        main, ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(out)], env=NO_GPU
    )
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "ggml-dispatch: error: no GPU visible (nvidia-smi lists none): autotune traces and times on the GPU; "
        "--dry-run prints the plan without one"
    ]
    assert not out.exists()


def test_volta_refuses_a_cuda13_nvcc_and_takes_a_cuda12_one(
    tree: Path, smollm2: Path, tmp_path: Path
) -> None:
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(tmp_path / "o")]
    res = CliRunner().invoke(
        main,
        [*args, "--cuda-arch", "70", "--nvcc", str(fake_nvcc(tmp_path, "13.0")), "--dry-run"],
        env=NO_GPU,
    )
    assert res.exit_code == 2
    assert "is CUDA 13.0, which cannot target sm_70 (CUDA 13 dropped Volta" in res.output
    nvcc12 = fake_nvcc(tmp_path, "12.9")
    res = CliRunner().invoke(
        main, [*args, "--cuda-arch", "70", "--nvcc", str(nvcc12), "--dry-run"], env=NO_GPU
    )
    assert res.exit_code == 0, res.output
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in res.output and f"-DCMAKE_CUDA_COMPILER={nvcc12}" in res.output
    # with build and rebuild skipped (prebuilt binaries), no toolkit is needed
    prebuilt = ["--skip", "build", "--skip", "rebuild"]
    res = CliRunner().invoke(
        main,
        [*args, "--cuda-arch", "70", "--nvcc", str(fake_nvcc(tmp_path, "13.0")), *prebuilt, "--dry-run"],
        env=NO_GPU,
    )
    assert res.exit_code == 0, res.output


def fake_cuda_home(tmp_path: Path, release: str) -> Path:
    home = tmp_path / f"cuda-{release}"
    (home / "bin").mkdir(parents=True)
    fake_nvcc(tmp_path, release).rename(home / "bin" / "nvcc")
    return home


def test_volta_finds_a_cuda12_toolkit_by_cuda_home_cudacxx_or_cuda_home_env(
    tree: Path, smollm2: Path, tmp_path: Path
) -> None:
    """The toolkit a V100 build needs, named three ways; the plan builds with the one it checked."""
    home = fake_cuda_home(tmp_path, "12.9")
    nvcc12 = home / "bin" / "nvcc"
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(tmp_path / "o")]
    args += ["--cuda-arch", "70", "--dry-run"]
    # a PATH without any nvcc (a distribution's CUDA toolkit puts one in /usr/bin)
    (bare := tmp_path / "bare-bin").mkdir()
    no_path_nvcc = {**NO_GPU, "PATH": str(bare), "CUDACXX": "", "CUDA_HOME": "", "CUDA_PATH": ""}
    for extra, env in (
        (["--cuda-home", str(home)], no_path_nvcc),
        ([], {**no_path_nvcc, "CUDACXX": str(nvcc12)}),
        ([], {**no_path_nvcc, "CUDA_HOME": str(home)}),  # CMake does not read CUDA_HOME: it is told
    ):
        res = CliRunner().invoke(main, [*args, *extra], env=env)
        assert res.exit_code == 0, (extra, env, res.output)
        assert f"nvcc {nvcc12} (CUDA 12.9)" in res.output, res.output
        assert "-DCMAKE_CUDA_ARCHITECTURES=70" in res.output
        assert f"-DCMAKE_CUDA_COMPILER={nvcc12}" in res.output, res.output
    # a CUDA 13 toolkit named the same way is refused for sm_70, and a folder without bin/nvcc is no root
    res = CliRunner().invoke(main, [*args, "--cuda-home", str(fake_cuda_home(tmp_path, "13.0"))], env=NO_GPU)
    assert res.exit_code == 2 and "is CUDA 13.0, which cannot target sm_70" in res.output
    res = CliRunner().invoke(main, [*args, "--cuda-home", str(tmp_path)], env=NO_GPU)
    assert res.exit_code == 2 and f"{tmp_path}: no bin/nvcc" in res.output
    res = CliRunner().invoke(main, [*args, "--cuda-home", str(home), "--nvcc", str(nvcc12)], env=NO_GPU)
    assert res.exit_code == 2 and "--nvcc or --cuda-home, not both" in res.output


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_volta_with_the_installed_nvcc(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    nvcc = Path(shutil.which("nvcc") or "nvcc")
    version = env_mod.nvcc_version(nvcc)
    assert version is not None
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(tmp_path / "o")]
    res = CliRunner().invoke(main, [*args, "--cuda-arch", "70", "--dry-run"], env=NO_GPU)
    assert res.exit_code == (2 if version[0] >= 13 else 0), res.output


def test_arch_and_gpu_parsing() -> None:
    assert env_mod.parse_archs("70;90") == [70, 90] and env_mod.parse_archs("86-real,90a") == [86, 90]
    assert env_mod.parse_archs("native") is None
    with pytest.raises(ValueError):
        env_mod.parse_archs("sm_70")
    assert env_mod.parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88") == (13, 0)
    gpus = env_mod.parse_gpu_csv("NVIDIA H200, GPU-ae22a032-9aed-577c-49c1-4f90a60643f7, 580.159.04, 9.0\n")
    assert gpus == [
        env_mod.GpuInfo("NVIDIA H200", "GPU-ae22a032-9aed-577c-49c1-4f90a60643f7", "580.159.04", 900)
    ]
    assert env_mod.table_folder_name(gpus[0]) == "cuda-sm90-nvidia-h200"
    v100 = env_mod.GpuInfo("Tesla V100-SXM2-32GB", "GPU-1", "550", 700)
    assert "cannot target sm_70" in (env_mod.arch_problem("native", (13, 0), Path("nvcc"), v100.cc) or "")
    assert env_mod.arch_problem("90", (13, 0), Path("nvcc"), 900) is None


def _stage(name: str, *code: str) -> plan_mod.Stage:
    steps = tuple(plan_mod.Step((sys.executable, "-c", c)) for c in code)
    return plan_mod.Stage(name, f"stage {name}", steps, 0.0)


def test_stages_resume_after_a_failure(tmp_path: Path) -> None:
    out = tmp_path / "o"
    count = tmp_path / "count"
    bump = (
        f"import pathlib; p = pathlib.Path({str(count)!r}); "
        "p.write_text(p.read_text() + 'x' if p.exists() else 'x')"
    )
    gate = tmp_path / "gate"
    fail_until_gate = f"import pathlib, sys; sys.exit(0 if pathlib.Path({str(gate)!r}).exists() else 3)"
    stages = [_stage("hook", bump), _stage("build", fail_until_gate), _stage("trace", bump)]
    opts = plan_mod.Options(llama_cpp=tmp_path, models=(), out=out, build_dir=tmp_path / "b")
    lines: list[str] = []
    with pytest.raises(run_mod.StageFailed) as exc:
        run_mod.execute(stages, opts, echo=lines.append)
    assert exc.value.stage == "build" and "resume from build" in str(exc.value)
    assert count.read_text() == "x"
    state = json.loads((out / plan_mod.STATE_FILE).read_text())
    assert state["stages"]["hook"]["status"] == "done" and state["stages"]["build"]["status"] == "failed"
    gate.write_text("")
    lines.clear()
    assert run_mod.execute(stages, opts, echo=lines.append) == ["build", "trace"]
    assert "[1/3] hook: done earlier (resumed past)" in lines and count.read_text() == "xx"
    # all done: a third run runs nothing; a skipped stage is reported as skipped
    assert run_mod.execute(stages, opts, echo=lines.append) == []
    skipping = plan_mod.Options(
        llama_cpp=tmp_path, models=(), out=out, build_dir=tmp_path / "b", skip=frozenset({"hook"})
    )
    lines.clear()
    assert (
        run_mod.execute([_stage("hook", "import sys; sys.exit(1)"), *stages[1:]], skipping, echo=lines.append)
        == []
    )
    assert lines[0] == "[1/3] hook: skipped"


def test_a_changed_stage_reruns_with_the_stages_after_it(tmp_path: Path) -> None:
    out = tmp_path / "o"
    opts = plan_mod.Options(llama_cpp=tmp_path, models=(), out=out, build_dir=tmp_path / "b")
    ok = "pass"
    run_mod.execute([_stage("hook", ok), _stage("build", ok), _stage("trace", ok)], opts, echo=lambda s: None)
    ran = run_mod.execute(
        [_stage("hook", ok), _stage("build", ok, ok), _stage("trace", ok)], opts, echo=lambda s: None
    )
    assert ran == ["build", "trace"]


def test_a_foreign_state_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / plan_mod.STATE_FILE).write_text('{"schema": "something-else"}')
    opts = plan_mod.Options(llama_cpp=tmp_path, models=(), out=out, build_dir=tmp_path / "b")
    with pytest.raises(run_mod.StageFailed, match="not a ggml-dispatch-autotune/1 state file"):
        run_mod.execute([_stage("hook", "pass")], opts, echo=lambda s: None)


# --------------------------------------------------------------------------------------------
# status


@pytest.fixture()
def tree_copy(tree: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "llama.cpp"
    copy.mkdir()
    shutil.copytree(tree / "ggml", copy / "ggml", symlinks=True)
    shutil.copy2(tree / "UPSTREAM_COMMIT", copy / "UPSTREAM_COMMIT")
    return copy


def test_status_of_an_unhooked_tree(tree_copy: Path) -> None:
    res = CliRunner().invoke(main, ["status", "--llama-cpp", str(tree_copy)], env=NO_GPU)
    assert res.exit_code == 0, res.output
    assert f"hook: not installed in {tree_copy}" in res.output
    assert "GPU: none visible" in res.output and "build: none at" in res.output


def test_status_of_a_hooked_tree_with_the_h200_table(tree_copy: Path, tmp_path: Path) -> None:
    inst.install(tree_copy)
    res = CliRunner().invoke(main, ["status", "--llama-cpp", str(tree_copy)], env=NO_GPU)
    assert res.exit_code == 0, res.output
    assert (
        "hook: installed (upstream" in res.output and "table: none in the tree (stock dispatch)" in res.output
    )
    inst.install(tree_copy, table_path=TABLE)
    header = status_mod.parse_table_header((tree_copy / inst.CUDA_DIR / inst.TABLE_HEADER).read_text())
    n_rules = len(table_mod.load(TABLE)["rules"])
    assert header is not None and header.rules == n_rules
    table_hash = header.table_hash
    assert table_hash == table_mod.table_hash(table_mod.load(TABLE))
    # a build folder whose libggml-cuda.so holds the old (no-table) build: the table is not compiled in.
    # The library is a stand-in (building ggml-cuda takes an hour here); status only reads its bytes.
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "libggml-cuda.so").write_bytes(b"\x7fELF ... ggml_cuda_dispatch ...")
    res = CliRunner().invoke(
        main, ["status", "--llama-cpp", str(tree_copy), "--build-dir", str(build)], env=NO_GPU
    )
    assert res.exit_code == 0, res.output
    assert (
        f"table: {table_hash[:12]} in the tree ({n_rules} rules, measured on NVIDIA H200, cc 900, 132 SMs)"
        in res.output
    )
    assert f"build: table {table_hash[:12]} NOT compiled in" in res.output
    assert "run: skipped (no GPU visible)" in res.output
    (build / "bin" / "libggml-cuda.so").write_bytes(b"\x7fELF ... " + table_hash.encode() + b" ...")
    res = CliRunner().invoke(
        main, ["status", "--llama-cpp", str(tree_copy), "--build-dir", str(build)], env=NO_GPU
    )
    assert f"build: table {table_hash[:12]} compiled in" in res.output


def test_status_says_where_the_table_applies() -> None:
    header = status_mod.HeaderTable(20, "e" * 64, "NVIDIA H200", 900, 132)
    h200 = env_mod.GpuInfo("NVIDIA H200", "GPU-1", "580", 900)
    v100 = env_mod.GpuInfo("Tesla V100-SXM2-32GB", "GPU-2", "550", 700)
    lines = status_mod.applies_lines(header, [h200, v100])
    assert "the table applies" in lines[0] and "does not apply here" in lines[1]


def test_never_writes_into_a_table_folder_it_did_not_make(tree: Path, smollm2: Path) -> None:
    committed = REPO / "tables" / "cuda-sm90-nvidia-h200"
    before = sorted(p.name for p in committed.iterdir())
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(committed), "--dry-run"]
    res = CliRunner().invoke(main, args, env=NO_GPU)
    assert res.exit_code == 2
    assert "exists and was not written by autotune" in res.output and "Traceback" not in res.output
    assert sorted(p.name for p in committed.iterdir()) == before


def test_a_tune_stopped_by_its_budget_is_reported(tmp_path: Path) -> None:
    opts = plan_mod.Options(llama_cpp=tmp_path, models=(), out=tmp_path / "o", build_dir=tmp_path / "b")
    say = "print('stopped by --max-seconds with 12 cases left; re-run the same command to continue')"
    lines: list[str] = []
    assert run_mod.execute([_stage("tune", say)], opts, echo=lines.append) == ["tune"]
    assert any("12 cases left" in ln for ln in lines) and any("--tune-seconds" in ln for ln in lines)
    state = json.loads((tmp_path / "o" / plan_mod.STATE_FILE).read_text())
    assert state["stages"]["tune"]["partial"] is True


@pytest.mark.parametrize("depths", [(), (4096, 16384)])
def test_every_planned_command_parses_with_its_stage_cli(
    tree: Path, smollm2: Path, tmp_path: Path, depths: tuple[int, ...]
) -> None:
    """Each ggml-dispatch step of the plan is a valid invocation of that stage's CLI (options and
    arguments parse; the files earlier stages write are laid down empty first). With --depth the plan
    adds the depth workload, the attention census, its sweep and the merge."""
    import click

    out = tmp_path / "o"
    opts = plan_mod.Options(
        llama_cpp=tree,
        models=(smollm2, smollm2),
        out=out,
        build_dir=tmp_path / "b",
        tune_seconds=60.0,
        depths=depths,
        kv_type="q8_0",
        vram_budget=1024 if depths else 0,
    )
    stages = plan_mod.plan(opts)
    # the announced tune time: --tune-seconds bounds each sweep (the matmul one, and the attention one)
    tune = next(s for s in stages if s.name == "tune")
    assert tune.minutes == pytest.approx(60.0 / 60 * (2 if depths else 1))
    for s in stages:
        for p in s.outputs:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    checked = 0
    for s in stages:
        for step in s.steps:
            if step.argv[0] != "ggml-dispatch":
                assert step.argv[0] in ("cmake", str(tmp_path / "b" / "bin" / "llama-bench")), step.argv
                continue
            args = list(step.argv[1:])
            cmd: click.Command = main
            ctx = None
            while isinstance(cmd, click.Group):
                name, sub, args = cmd.resolve_command(click.Context(cmd), args)
                assert sub is not None, step.argv
                cmd = sub
            ctx = cmd.make_context(str(name), args)
            assert ctx.params, step.argv
            checked += 1
    # install x2, census x3, tune, codegen, ab, report; with depths census attention, tune run, tune merge
    assert checked == (9 if not depths else 12)
    argvs = [" ".join(st.argv) for s in stages for st in s.steps]
    depth_bench = "-ngl 99 -fa on -ctk q8_0 -ctv q8_0 -p 2,3,4 -n 32 -d"
    assert sum(f"{depth_bench} 4096,16384 " in a for a in argvs) == (0 if not depths else 2)  # 2 traces
    assert sum(f"{depth_bench} 1024,4096,16384" in a for a in argvs) == (0 if not depths else 1)  # the A/B
    assert any(" census attention " in a for a in argvs) == bool(depths)
    assert any(" tune merge " in a and a.endswith(str(out / "tuning.parquet")) for a in argvs) == bool(depths)


def test_prebuilt_binaries_need_the_build_stages_skipped(tree: Path, smollm2: Path, tmp_path: Path) -> None:
    bins = tmp_path / "prebuilt" / "bin"
    bins.mkdir(parents=True)
    (bins / "llama-bench").write_text("")  # a bin folder as lab/prebuilt.sh unpacks it (no CMake build)
    args = ["autotune", "--llama-cpp", str(tree), "--model", str(smollm2), "-o", str(tmp_path / "o")]
    args += ["--build-dir", str(tmp_path / "prebuilt"), "--dry-run"]
    res = CliRunner().invoke(main, args, env=NO_GPU)
    assert res.exit_code == 2 and "cannot be rebuilt; pass --skip build --skip rebuild" in res.output
    res = CliRunner().invoke(main, [*args, "--skip", "build", "--skip", "rebuild"], env=NO_GPU)
    assert res.exit_code == 0, res.output
    assert f"--build-dir {tmp_path / 'prebuilt'} -o" in res.output  # tune links the prebuilt libraries
    assert f"LD_LIBRARY_PATH={bins}" in res.output


def test_hook_trace_census_stages_compose(tree_copy: Path, smollm2: Path, tmp_path: Path) -> None:
    """The real plan's first stages run with the real stage CLIs: the hook goes into a copy of the pinned
    tree and the census is ingested from the traces against the real SmolLM2 GGUF. llama-bench needs a GPU:
    a stand-in writes the real H200 route trace of SmolLM2 (samples/) where GGML_CUDA_ROUTE_TRACE says
    and prints a real llama-bench JSON line."""
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    (build / "CMakeCache.txt").write_text("# a configured build\n")
    bench_line = (
        (archive.path("evidence/h200-2026-11-30/integration/bench.jsonl")).read_text().splitlines()[0]
    )
    (tmp_path / "bench.jsonl").write_text(bench_line + "\n")
    fake = build / "bin" / "llama-bench"
    fake.write_text(
        f'#!/bin/sh\ncp "{REPO / "samples/trace-smollm2.jsonl"}" "$GGML_CUDA_ROUTE_TRACE"\n'
        f'cat "{tmp_path / "bench.jsonl"}"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    later = frozenset(plan_mod.STAGES) - {"hook", "trace", "census"}
    tool = (sys.executable, "-c", "import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])")
    opts = plan_mod.Options(
        llama_cpp=tree_copy,
        models=(smollm2,),
        out=out,
        build_dir=build,
        workloads=("decode", "prefill"),
        skip=frozenset({"build"} | later),
        tool=tool,
        built=True,
    )
    lines: list[str] = []
    ran = run_mod.execute(plan_mod.plan(opts), opts, echo=lines.append)
    assert ran == ["hook", "trace", "census"], lines
    assert inst.read_manifest(tree_copy) is not None
    import pyarrow.parquet as pq

    census = pq.read_table(out / "census.parquet")
    assert census.num_rows > 0
    traces = sorted(p.name for p in (out / plan_mod.WORK_DIR / "traces").iterdir())
    assert "SmolLM2-135M-Instruct.Q4_1.decode.jsonl" in traces
    assert "SmolLM2-135M-Instruct.Q4_1.prefill.bench.jsonl" in traces
    # a re-run resumes past all three
    assert run_mod.execute(plan_mod.plan(opts), opts, echo=lines.append) == []


def test_stages_without_the_gpu_run_without_one(tree_copy: Path, smollm2: Path, tmp_path: Path) -> None:
    """With trace, tune and ab skipped (e.g. the report of a table folder made on a GPU machine), no GPU
    is needed: here only the hook stage runs, into a copy of the pinned tree."""
    out = tmp_path / "o"
    skips = [f"--skip={s}" for s in plan_mod.STAGES if s != "hook"]
    args = ["autotune", "--llama-cpp", str(tree_copy), "--model", str(smollm2), "-o", str(out), *skips]
    res = CliRunner().invoke(main, args, env=NO_GPU)
    assert res.exit_code == 0, res.output
    assert inst.read_manifest(tree_copy) is not None
    state = json.loads((out / plan_mod.STATE_FILE).read_text())
    assert list(state["stages"]) == ["hook"] and state["stages"]["hook"]["status"] == "done"


def test_the_ab_control_depth_is_a_quarter_of_the_smallest_on_the_256_grid() -> None:
    assert plan_mod.ab_depths(()) == ()
    assert plan_mod.ab_depths((16384, 49152)) == (4096, 16384, 49152)
    assert plan_mod.ab_depths((5000,)) == (1024, 5000)  # 1250 down to the 256 grid
    assert plan_mod.ab_depths((1024,)) == (512, 1024)  # at least 512
    assert plan_mod.ab_depths((512, 2048)) == (512, 2048)  # the control is a tuned depth already


def test_status_shows_the_vram_budget_its_planned_use_and_the_hooks_run_time_use(tmp_path: Path) -> None:
    """status reads the budget, what the admitted rules cost and the two caps from the header codegen
    renders, and the run-time use from the hook's store lines (ggml-dispatch-cache-impl.cuh's format)."""
    from ggml_dispatch import registry
    from ggml_dispatch.codegen import render
    from ggml_dispatch.codegen import vram as vram_mod

    # a table without memory rules of its own (the dense-route table): the plan below is all it trades
    t = table_mod.load(archive.path("tables/cuda-sm90-nvidia-h200-routes/table.json"))
    key = next(registry.shape_key(r) for r in t["rules"] if r["op"] == "MUL_MAT" and r["N"] > 0)
    c = vram_mod.Candidate(vram_mod.WEIGHT_CACHE, key, 300 << 20, 900.0, 2, 3)
    plan = vram_mod.choose([c], 1024)
    header = status_mod.parse_table_header(render.render_header(vram_mod.attach(dict(t), plan)))
    assert header is not None and header.vram_budget == 1024 << 20 and header.vram_planned == 300 << 20
    line = header.budget_line()
    assert line == (
        "table: VRAM budget 1024.0 MiB, 300.0 MiB planned by its rules; "
        "caps: weight cache 1024.0 MiB, KV shadow 0.0 MiB"
    )
    old = status_mod.parse_table_header(render.render_header(t))
    assert old is not None and old.budget_line() is None
    log = (
        "ggml_cuda_dispatch: weight cache: 2 tensors, 1048576 bytes (1.0 MiB) cached "
        "of a budget of 1024.0 MiB; "
        "0 requests over budget, 0 failed allocations\n"
        "ggml_cuda_dispatch: weight cache: 3 tensors, 3145728 bytes (3.0 MiB) cached "
        "of a budget of 1024.0 MiB; "
        "1 requests over budget, 0 failed allocations\n"
    )
    assert status_mod.store_use_lines(log) == [
        "weight cache: 3 tensors, 3.0 MiB in use of 1024.0 MiB; 1 requests over budget, 0 failed allocations"
    ]
    assert status_mod.store_use_lines("no such line") == []
