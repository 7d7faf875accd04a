"""``ggml-dispatch install``: put the hook, trace writer and table into a llama.cpp tree."""

from __future__ import annotations

from pathlib import Path

import click

from ggml_dispatch import fileio
from ggml_dispatch.text import printable
from hook import install as inst


class _Refused(click.ClickException):
    exit_code = 2

    def show(self, file: object = None) -> None:
        click.echo(f"ggml-dispatch: error: {self.format_message()}", err=True)


@click.command("install")
@click.option(
    "--llama-cpp",
    "tree",
    envvar="LLAMA_CPP_DIR",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="llama.cpp tree to patch (default: $LLAMA_CPP_DIR). It is modified in place.",
)
@click.option(
    "--table",
    "table_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="table.json to compile in (default: no table: stock dispatch, trace and overrides only).",
)
@click.option(
    "--upstream-commit",
    metavar="HEX40",
    help="upstream commit to stamp (default: the tree's UPSTREAM_COMMIT file, else git rev-parse HEAD).",
)
@click.option(
    "--allow-upstream-mismatch",
    is_flag=True,
    help="install a table measured on another upstream commit than the tree's.",
)
@click.option("--uninstall", is_flag=True, help="restore the tree exactly as it was before install.")
@click.option("--dry-run", is_flag=True, help="check that the hook applies; write nothing.")
def install_cmd(
    tree: Path,
    table_path: Path | None,
    upstream_commit: str | None,
    allow_upstream_mismatch: bool,
    uninstall: bool,
    dry_run: bool,
) -> None:
    """Install the ggml-cuda dispatch hook into a llama.cpp tree.

    \b
    Copies the native sources into ggml/src/ggml-cuda/, renders ggml-dispatch-table.h from
    --table (or the no-table header), stamps the upstream commit and patch hash, and applies the
    anchored edits to ggml-cuda.cu and mmq.cuh. Installing twice is the same as once; installing another table
    rewrites only the table header. A tree whose dispatch code differs from the pinned one is
    refused with the hunk and function that do not match.

    \b
    At run time (after rebuilding llama.cpp):
      GGML_CUDA_DISPATCH=table|off|force:<config>  route selection (default: table)
      GGML_CUDA_ROUTE_TRACE=<path>|stderr          route trace (ggml-route-trace/1)

    \b
    Example:
      ggml-dispatch install --llama-cpp ~/llama.cpp --table tables/cuda-sm90-nvidia-h200/table.json
      ggml-dispatch install --llama-cpp ~/llama.cpp --uninstall
    """
    try:
        if uninstall:
            if table_path is not None:
                raise click.UsageError("--uninstall takes no --table")
            plan = inst.plan_uninstall(tree)
        else:
            plan = inst.plan_install(
                tree,
                table_path=table_path,
                upstream_commit=upstream_commit,
                allow_upstream_mismatch=allow_upstream_mismatch,
            )
    except inst.InstallError as e:
        raise _Refused(printable(e)) from None
    for msg in plan.messages[:-1]:
        click.echo(printable(msg), err=True)
    changed = sorted(plan.writes)
    if dry_run:
        for rel in changed:
            click.echo(("remove " if plan.writes[rel] is None else "write ") + rel)
        click.echo(f"dry run: {len(changed)} file(s) would change, {len(plan.unchanged)} unchanged", err=True)
        return
    for rel in changed:
        if plan.writes[rel] is not None:
            fileio.check_output(plan.tree / rel, [table_path] if table_path else [])
    try:
        inst.execute(plan, progress=lambda rel: click.echo(rel))
    except OSError as e:
        raise _Refused(f"{e.filename or plan.tree}: cannot write: {e.strerror or e}") from None
    summary = f"{len(changed)} file(s) changed, {len(plan.unchanged)} unchanged"
    click.echo(f"{printable(plan.messages[-1])}: {summary}", err=True)
