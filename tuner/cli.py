"""``ggml-dispatch tune``: placeholder until the tuner stage lands."""

import click


@click.group()
def tune() -> None:
    """Time every eligible route for the census shapes on the GPU."""
