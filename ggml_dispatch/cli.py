"""``ggml-dispatch``: one console script, a sub-command group per pipeline stage.

This layer only parses options and prints; the work is in the stage packages' pure functions.
"""

from __future__ import annotations

from typing import Any

import click

from ggml_dispatch.errors import InputError
from ggml_dispatch.schema import TOOL_VERSION


class _InputFailure(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"ggml-dispatch: error: {self.format_message()}", err=True)


class _Root(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InputError as e:
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
      install  table         -> patched llama.cpp tree (hook, trace, lookup)
      diff     two tables    -> what changed and what it should do to time
      report   Parquet files -> Markdown + PNG plots
    """


def _register() -> None:
    from census.cli import census
    from codegen.cli import codegen_cmd, diff_cmd
    from codegen.install_cli import install_cmd
    from codegen.report_cli import report_cmd
    from tuner.cli import tune

    main.add_command(census)
    main.add_command(tune)
    main.add_command(codegen_cmd)
    main.add_command(install_cmd)
    main.add_command(diff_cmd)
    main.add_command(report_cmd)


_register()
