"""``ggml-dispatch codegen`` and ``diff``: placeholders until the codegen stage lands."""

import click


@click.command("codegen")
def codegen_cmd() -> None:
    """Turn tuning results into table.json and a C header."""
    raise click.ClickException("codegen is not built yet")


@click.command("diff")
def diff_cmd() -> None:
    """Compare two dispatch tables."""
    raise click.ClickException("diff is not built yet")
