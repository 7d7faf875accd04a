"""The KV-shadow sweep (lab/attn.sh PART=shadow, q8_0 points only) merged with the committed attention
sweep's other points, so one table covers both: every point's decision still comes from one run.

    python lab/attn_shadow_merge.py COMMITTED_TUNING SHADOW_TUNING -o MERGED

The committed file's rows at the shadow sweep's K/V types are dropped (the new sweep measured those
points again, shadow configurations included); the rest are merged with ``tune merge``'s rules (one GPU
model and upstream commit, no trial twice).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from ggml_dispatch import fileio, schema
from ggml_dispatch.artifacts import tuning as artifact
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import results


def merge(committed: Path, shadow: Path, out: Path) -> int:
    new = artifact.read(shadow)
    types = set(new.frame()["src0_type"])
    old = artifact.read(committed)
    df = old.frame()
    kept = df[~df["src0_type"].isin(types)]
    if kept.empty:
        raise InputError(committed, f"no rows other than {sorted(types)}", field="src0_type")
    with tempfile.TemporaryDirectory() as d:
        rest = Path(d) / "rest.parquet"
        meta = fileio.base_metadata(
            schema.TUNING_SCHEMA,
            upstream_commit=old.provenance.upstream_commit,
            input_hashes={str(committed): old.sha256},
            tuner={"filtered": f"rows other than {sorted(types)}"},
            tuner_cases=old.cases,
        )
        artifact.write(artifact.from_frame(kept, committed), rest, meta)
        return results.merge_tuning([rest, shadow], out)


@click.command()
@click.argument("committed", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("shadow", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
def main(committed: Path, shadow: Path, output: Path) -> None:
    """Merge the shadow sweep with the committed sweep's other K/V types."""
    fileio.check_output(output, [committed, shadow])
    try:
        n = merge(committed, shadow, output)
    except InputError as e:
        click.echo(f"attn_shadow_merge: {e}", err=True)
        sys.exit(2)
    click.echo(f"{n} rows -> {output}")


if __name__ == "__main__":
    main()
