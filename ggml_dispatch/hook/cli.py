"""``ggml-dispatch install``: put the hook, trace writer and table into a llama.cpp tree."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ggml_dispatch import fileio, registry
from ggml_dispatch.hook import fit
from ggml_dispatch.hook import install as inst
from ggml_dispatch.text import printable


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
    metavar="ID",
    help="upstream to stamp: a 40-hex commit, a build number (b11549) or a registry version"
    " (llama-cpp-python==0.3.36). Default: the tree's UPSTREAM_COMMIT file, else git rev-parse HEAD, else"
    " none (the tree installs on its content alone).",
)
@click.option(
    "--allow-upstream-mismatch",
    is_flag=True,
    help="install a table measured on another upstream commit than the tree's.",
)
@click.option(
    "--features",
    "features_text",
    metavar="LIST",
    help="features to install, comma-separated (core is always in), or 'all' (default). Features: "
    + ", ".join(registry.FEATURES)
    + ".",
)
@click.option(
    "--mmvq-configs",
    metavar="LIST",
    help="mmvq candidate launch shapes to compile (feature mmvq_params): warps x rows per block, e.g."
    " 4x1,8x1,4x2, or 'all' ("
    + ",".join(registry.mmvq_pair_text(p) for p in registry.MMVQ_CONFIGS)
    + ") or 'none'. Each costs 8 kernels per type in mmvq.cu. Default: the previous install's, else "
    + ",".join(registry.mmvq_pair_text(p) for p in registry.MMVQ_DEFAULT_CONFIGS)
    + ".",
)
@click.option(
    "--mmvq-types",
    metavar="LIST",
    help="weight types the mmvq candidates are compiled for, comma-separated, or 'all'. Default: the"
    " previous install's, else " + ",".join(registry.MMVQ_DEFAULT_TYPES) + ".",
)
@click.option(
    "--mmvq-regs",
    metavar="LIST",
    help="register caps the mmvq candidates are compiled under besides uncapped ("
    + ",".join(map(str, registry.MMVQ_REGS))
    + ", 'all' or 'none'): each doubles the candidates' kernels. Default: the previous install's, else "
    + (",".join(map(str, registry.MMVQ_DEFAULT_REGS)) or "none")
    + ".",
)
@click.option(
    "--check",
    is_flag=True,
    help="say which features apply and which launches the seam misses; write nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="with --check: print the result as JSON.")
@click.option("--uninstall", is_flag=True, help="restore the tree exactly as it was before install.")
@click.option("--dry-run", is_flag=True, help="check that the hook applies; write nothing.")
def install_cmd(
    tree: Path,
    table_path: Path | None,
    upstream_commit: str | None,
    allow_upstream_mismatch: bool,
    features_text: str | None,
    mmvq_configs: str | None,
    mmvq_types: str | None,
    mmvq_regs: str | None,
    check: bool,
    as_json: bool,
    uninstall: bool,
    dry_run: bool,
) -> None:
    """Install the ggml-cuda dispatch hook into a llama.cpp tree.

    \b
    Copies the native sources into ggml/src/ggml-cuda/, renders ggml-dispatch-table.h from
    --table (or the no-table header), stamps the upstream id, patch hash and applied features, and
    applies the anchored edits (located by content: whitespace, blank lines and CRLF do not matter).
    The core seam must fit; every other feature is applied where it fits and skipped, with the first
    line that differs, where it does not. Table rules that need a skipped feature are dropped with a
    message. Installing twice is the same as once; installing another table rewrites only the table
    header.

    \b
    At run time (after rebuilding llama.cpp):
      GGML_CUDA_DISPATCH=table|off|force:<config>  route selection (default: table)
      GGML_CUDA_ROUTE_TRACE=<path>|stderr          route trace (ggml-route-trace/1)

    \b
    Example:
      ggml-dispatch install --llama-cpp ~/llama.cpp --check
      ggml-dispatch install --llama-cpp ~/llama.cpp --check --json
      ggml-dispatch install --llama-cpp ~/llama.cpp --table tables/cuda-sm90-nvidia-h200/table.json
      ggml-dispatch install --llama-cpp ~/llama.cpp --features core
      ggml-dispatch install --llama-cpp ~/llama.cpp --mmvq-configs 4x1,8x1,4x2 --mmvq-types q4_K,q6_K
      ggml-dispatch install --llama-cpp ~/llama.cpp --uninstall
    """
    try:
        wanted = fit.parse_features(features_text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--features") from None
    if as_json and not check:
        raise click.UsageError("--json goes with --check")
    if (mmvq_configs is not None or mmvq_types is not None or mmvq_regs is not None) and (check or uninstall):
        raise click.UsageError("--mmvq-configs, --mmvq-types and --mmvq-regs go with an install")
    if check:
        if uninstall or table_path is not None:
            raise click.UsageError("--check takes neither --uninstall nor --table")
        try:
            report = inst.check(tree, upstream_commit=upstream_commit, features=wanted)
        except inst.InstallError as e:
            raise _Refused(printable(e)) from None
        click.echo(json.dumps(report, indent=2) if as_json else _check_text(report))
        return
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
                features=wanted,
                mmvq_configs=mmvq_configs,
                mmvq_types=mmvq_types,
                mmvq_regs=mmvq_regs,
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


def _check_text(report: dict[str, object]) -> str:
    """The short form of ``--check``: one line per feature, then the launches the seam does not see."""
    core = report["core"]
    features = report["features"]
    unseen = report["unhooked"]
    assert isinstance(core, dict) and isinstance(features, dict) and isinstance(unseen, list)
    lines = [f"core           {core['status']} ({core['lines']} lines into upstream files)"]
    for name, st in features.items():
        lines.append(f"{name:<14} {st['status']}" + (f": {st['reason']}" if st["reason"] else ""))
    matmul = [u for u in unseen if u.get("kind") != "other_op"]
    lines.append(
        f"unhooked: {len(matmul)} matmul/attention launch(es) the seam does not see"
        f" (+{len(unseen) - len(matmul)} GEMMs inside other ops)"
    )
    lines += [f"  {u['file']}:{u['line']} {u['function']}: {u['call']}" for u in matmul]
    return "\n".join(printable(x) for x in lines)
