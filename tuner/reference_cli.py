"""``ggml-dispatch tune import-reference``: placeholder until reference conversion lands."""

import click


@click.command("import-reference")
def import_reference_cmd() -> None:
    """Convert shared/reference/h200-mul-mat-routes.tsv rows into tuning rows (source = reference)."""
    raise click.ClickException("import-reference is not built yet")
