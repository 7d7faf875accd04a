"""``ggml-dispatch``: one console script, a sub-command group per pipeline stage.

This layer only parses options and prints; the work is in the stage packages' pure functions.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

import click

from ggml_dispatch.errors import InputError
from ggml_dispatch.schema import TOOL_VERSION


class _InputFailure(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"ggml-dispatch: error: {self.format_message()}", err=True)


# Sub-commands are imported only when used: `census ingest` need not load matplotlib or jinja2.
_COMMANDS: Final[dict[str, str]] = {
    "census": "ggml_dispatch.census.cli:census",
    "tune": "ggml_dispatch.tuner.cli:tune",
    "codegen": "ggml_dispatch.codegen.cli:codegen_cmd",
    "codegen-crude": "ggml_dispatch.codegen.crude:crude_cmd",
    "install": "ggml_dispatch.hook.cli:install_cmd",
    "diff": "ggml_dispatch.codegen.cli:diff_cmd",
    "report": "ggml_dispatch.report.cli:report_cmd",
    "ab": "ggml_dispatch.report.abrun:ab_cmd",
    "autotune": "ggml_dispatch.autotune.cli:autotune_cmd",
    "status": "ggml_dispatch.autotune.cli:status_cmd",
}


# Commands that live in a later stage than their group: `tune verify` scores a table with codegen's decision
# rule, and no stage imports a later one, so the root (which imports every stage) attaches it.
_ATTACHED: Final[dict[str, dict[str, str]]] = {
    "tune": {"verify": "ggml_dispatch.codegen.verify:verify_cmd"},
}


def _load(target: str) -> click.Command:
    module, attr = target.split(":")
    command = getattr(importlib.import_module(module), attr)
    assert isinstance(command, click.Command)
    return command


class _Root(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        command = _load(target)
        if isinstance(command, click.Group):
            for name, sub in _ATTACHED.get(cmd_name, {}).items():
                if name not in command.commands:
                    command.add_command(_load(sub), name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InputError as e:
            if e.path is None:  # about an option's value, not a file: a usage error naming the option
                hint = e.field if e.field is None or e.field.startswith("-") else f"--{e.field}"
                raise click.BadParameter(e.message, param_hint=hint) from None
            raise _InputFailure(e.render()) from None


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(TOOL_VERSION, prog_name="ggml-dispatch")
def main() -> None:
    """Measure which ggml-cuda matmul kernel is fastest for the shapes your models run, and
    compile the answer into ggml-cuda as a dispatch table.

    \b
    Pipeline:
      census   trace / GGUF  -> census.parquet (which shapes run, how often)
      tune     census        -> tuning.parquet (every trial of every eligible route, on the GPU)
      codegen  tuning        -> table.json + ggml-dispatch-table.h (no-harm decisions)
      codegen-crude          -> the one-threshold crude rule as a table (the A/B baseline)
      install  table         -> patched llama.cpp tree (hook, trace, lookup)
      diff     two tables    -> what changed and what it should do to time
      report   Parquet files -> Markdown + PNG plots
      ab       two builds    -> stock-vs-table A/B records with provenance (on the GPU)
      autotune GPU + model   -> every stage above in order, resumable (on the GPU)
      status   a tree        -> hooked? which table is compiled in, does it apply here
    """
