"""``ggml-dispatch install``: placeholder until the ggml-cuda integration lands."""

import click


@click.command("install")
def install_cmd() -> None:
    """Install the hook, trace writer and table into a llama.cpp tree."""
    raise click.ClickException("install is not built yet")
