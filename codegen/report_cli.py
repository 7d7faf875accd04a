"""``ggml-dispatch report``: placeholder until the report lands."""

import click


@click.command("report")
def report_cmd() -> None:
    """Build a Markdown + PNG report from census and tuning Parquet files."""
    raise click.ClickException("report is not built yet")
