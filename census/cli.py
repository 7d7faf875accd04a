"""``ggml-dispatch census``: placeholder until the census stage lands."""

import click


@click.group()
def census() -> None:
    """Build and inspect the census of matmul shapes (trace or GGUF -> Parquet)."""
