"""``ggml-dispatch tune``: placeholder until the tuner stage lands."""

import click

from tuner.reference_cli import import_reference_cmd


@click.group()
def tune() -> None:
    """Time every eligible route for the census shapes on the GPU."""


tune.add_command(import_reference_cmd)
