"""The CLI root: every stage command resolves, and a stage's modules load only when it is used."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from ggml_dispatch.cli import main

_LOADED = """
import sys
from click.testing import CliRunner
from ggml_dispatch.cli import main
args = sys.argv[1:]
if args:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
heavy = ("census", "tuner", "codegen", "matplotlib", "jinja2", "pandas", "pyarrow")
# a stage is ggml_dispatch.<stage>; a library is its top-level name
names = {m.split(".")[1] if m.startswith("ggml_dispatch.") else m.split(".")[0] for m in sys.modules}
print(" ".join(sorted(names & set(heavy))))
"""


def _loaded_after(*args: str) -> set[str]:
    p = subprocess.run(
        [sys.executable, "-c", _LOADED, *args], capture_output=True, text=True, check=True, timeout=300
    )
    return set(p.stdout.split())


def test_every_stage_command_resolves() -> None:
    ctx = click.Context(main)
    names = main.list_commands(ctx)
    assert names == [
        "ab",
        "autotune",
        "census",
        "codegen",
        "codegen-crude",
        "diff",
        "install",
        "report",
        "status",
        "tune",
    ]
    for name in names:
        assert isinstance(main.get_command(ctx, name), click.Command), name
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and all(name in result.output for name in names)


def test_stage_modules_load_only_when_used() -> None:
    assert _loaded_after() == set()
    loaded = _loaded_after("census", "--help")
    assert "census" in loaded and not loaded & {"tuner", "codegen", "matplotlib", "jinja2"}
