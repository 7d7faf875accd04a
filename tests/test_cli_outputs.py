"""Every writing command refuses a bad output before any work: exit 2, one message naming the path, no
traceback, nothing written and nothing overwritten. Outputs never replace inputs, and a multi-file
output (codegen, report) is written whole or not at all."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import make_inputs, refused, run, snapshot
from conftest import MakeGguf

from ggml_dispatch import fileio
from ggml_dispatch.errors import InputError


@pytest.fixture
def inputs(tmp_path: Path, make_gguf: MakeGguf) -> dict[str, Path]:
    (tmp_path / "in").mkdir()
    return make_inputs(tmp_path / "in", make_gguf("in/m.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64])]))


# Every command that writes a file output, as argv with OUT where the output goes.
FILE_WRITERS: dict[str, Callable[[dict[str, Path], Path], list[str | Path]]] = {
    "census ingest": lambda i, out: ["census", "ingest", i["trace"], "--gguf", i["gguf"], "-o", out],
    "census from-gguf": lambda i, out: ["census", "from-gguf", i["gguf"], "--m", "1,8", "-o", out],
    "tune run": lambda i, out: ["tune", "run", i["census"], "--llama-cpp", i["trace"].parent, "-o", out],
    "tune merge": lambda i, out: ["tune", "merge", i["tuning"], "-o", out],
    "tune import-reference": lambda i, out: [
        "tune",
        "import-reference",
        i["tsv"],
        "--sm-count",
        "132",
        "-o",
        out,
    ],
}
# Commands whose -o is a folder of several files.
DIR_WRITERS: dict[str, Callable[[dict[str, Path], Path], list[str | Path]]] = {
    "codegen": lambda i, out: ["codegen", i["tuning"], "--census", i["census"], "-o", out],
    "report": lambda i, out: ["report", "--tuning", i["tuning"], "--census", i["census"], "-o", out],
}


@pytest.mark.parametrize("cmd", sorted(FILE_WRITERS) + sorted(DIR_WRITERS))
@pytest.mark.parametrize("where", ["file-as-folder", "proc", "proc-subfolder"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    cmd: str, where: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("not a folder\n")
    out = {
        "file-as-folder": blocker / "out",
        "proc": Path("/proc/ggml-dispatch-out"),
        "proc-subfolder": Path("/proc/ggml-dispatch-missing/sub/out"),
    }[where]
    argv = FILE_WRITERS[cmd](inputs, out) if cmd in FILE_WRITERS else DIR_WRITERS[cmd](inputs, out)
    before = snapshot(tmp_path)
    line = refused(run(*argv), "ggml-dispatch: error: ", str(out))
    assert ("not a folder" in line) if where == "file-as-folder" else ("cannot" in line)
    assert snapshot(tmp_path) == before
    assert not Path("/proc/ggml-dispatch-missing").exists()


@pytest.mark.parametrize("cmd", sorted(FILE_WRITERS))
@pytest.mark.parametrize("how", ["same path", "dot path", "symlink", "hard link"])
def test_an_output_that_names_an_input_is_refused_and_the_input_kept(
    cmd: str, how: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    victim = {
        "census ingest": "trace",
        "census from-gguf": "gguf",
        "tune run": "census",
        "tune merge": "tuning",
        "tune import-reference": "tsv",
    }[cmd]
    target = inputs[victim]
    if how == "dot path":
        out = target.parent / "." / target.name
    elif how == "symlink":
        out = tmp_path / "link"
        out.symlink_to(target)
    elif how == "hard link":
        out = tmp_path / "hard"
        os.link(target, out)
    else:
        out = target
    before = snapshot(tmp_path)
    refused(run(*FILE_WRITERS[cmd](inputs, out)), str(out), "is also an input", "never replaces an input")
    assert snapshot(tmp_path) == before


def test_ingest_refuses_an_output_naming_its_gguf(inputs: dict[str, Path]) -> None:
    before = snapshot(inputs["gguf"].parent)
    res = run("census", "ingest", inputs["trace"], "--gguf", inputs["gguf"], "-o", inputs["gguf"])
    refused(res, str(inputs["gguf"]), "is also an input")
    assert snapshot(inputs["gguf"].parent) == before


def test_tune_run_refuses_a_journal_naming_the_census_or_the_output(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    tree = str(tmp_path)
    res = run("tune", "run", inputs["census"], "--llama-cpp", tree, "-o", tmp_path / "t.parquet", "--journal",
              inputs["census"])  # fmt: skip
    refused(res, str(inputs["census"]), "is also an input")
    out = tmp_path / "t.parquet"
    res = run("tune", "run", inputs["census"], "--llama-cpp", tree, "-o", out, "--journal", out)
    refused(res, str(out), "is also an input")
    assert not out.exists()


def test_codegen_refuses_an_output_folder_holding_its_input(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "table"
    out.mkdir()
    tuning = out / "table.json"
    shutil.copy(inputs["tuning"], tuning)
    before = snapshot(tmp_path)
    refused(run("codegen", tuning, "-o", out), str(tuning), "is also an input")
    assert snapshot(tmp_path) == before


def test_report_refuses_notes_that_are_its_own_report(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "rep"
    out.mkdir()
    notes = out / "REPORT.md"
    notes.write_text("# my notes\n")
    before = snapshot(tmp_path)
    res = run("report", "--tuning", inputs["tuning"], "--notes", notes, "-o", out)
    refused(res, str(notes), "is also an input")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("cmd", sorted(DIR_WRITERS))
def test_a_folder_where_an_output_file_goes_leaves_the_whole_output_unwritten(
    cmd: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    (out / ("ggml-dispatch-table.h" if cmd == "codegen" else "REPORT.md")).mkdir(parents=True)
    before = snapshot(tmp_path)
    refused(run(*DIR_WRITERS[cmd](inputs, out)), "is a folder")
    assert snapshot(tmp_path) == before


def test_codegen_table_json_a_folder_leaves_no_header(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "table.json").mkdir(parents=True)
    refused(run("codegen", inputs["tuning"], "-o", out), str(out / "table.json"), "is a folder")
    assert sorted(p.name for p in out.iterdir()) == ["table.json"]


def test_report_a_plot_path_that_is_a_folder_leaves_no_plot_and_no_report(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "rep"
    res = run("report", "--tuning", inputs["tuning"], "-o", out)
    assert res.exit_code == 0, res.output
    pngs = sorted((out / "plots").glob("*.png"))
    assert len(pngs) >= 2
    shutil.rmtree(out)
    (out / "plots" / pngs[-1].name).mkdir(parents=True)  # the last plot written: all others come first
    before = snapshot(tmp_path)
    refused(run("report", "--tuning", inputs["tuning"], "-o", out), pngs[-1].name, "is a folder")
    assert snapshot(tmp_path) == before


# ---- the core: output_set writes all or nothing


def test_output_set_restores_what_it_renamed_when_a_later_rename_fails(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "sub" / "b.txt"
    a.write_text("old a\n")
    with pytest.raises(InputError) as e, fileio.output_set([a, b]) as outputs:
        outputs.path(a).write_text("new a\n")
        outputs.path(b).write_text("new b\n")
        b.mkdir()  # appears between the check and the rename: the rename of b fails
    assert e.value.path == str(b)
    assert a.read_text() == "old a\n"
    assert b.is_dir() and not any(b.iterdir())
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.txt", "sub"]


def test_output_set_writes_nothing_when_the_block_fails(tmp_path: Path) -> None:
    a, b = tmp_path / "new" / "a.txt", tmp_path / "new" / "b.txt"
    with pytest.raises(RuntimeError), fileio.output_set([a, b]) as outputs:
        outputs.path(a).write_text("a")
        raise RuntimeError("rendering failed")
    assert list(tmp_path.iterdir()) == []


def test_output_set_replaces_all_files_on_success(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "p" / "b.txt"
    a.write_text("old")
    with fileio.output_set([a, b]) as outputs:
        outputs.path(a).write_text("A")
        outputs.path(b).write_text("B")
    assert (a.read_text(), b.read_text()) == ("A", "B")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.txt", "p"]


def test_atomic_path_names_the_output_instead_of_an_oserror(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError) as e, fileio.atomic_path(tmp_path / "f" / "out.parquet") as tmp:
        tmp.write_text("never")
    assert e.value.path == str(tmp_path / "f" / "out.parquet") and "not a folder" in e.value.message
    with pytest.raises(InputError) as e, fileio.atomic_path("/proc/ggml-dispatch-x/out") as tmp:
        tmp.write_text("never")
    assert e.value.path == "/proc/ggml-dispatch-x/out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
