"""The hook's compatibility matrix: which of its features apply to which real llama.cpp tree.

The trees are sdists on PyPI, one a line in ``ggml_dispatch/hook/compat.tsv`` (releases around the pinned
one) and
``ggml_dispatch/hook/compat-span.tsv`` (a llama.cpp build every ~200 from b9760 to b11434). Each is
downloaded once,
sha256-checked, into the fetch cache (``.cache/`` or ``$GGML_DISPATCH_CACHE``), and the part of it that
an install and a compile of ggml-cuda read (``ggml/`` and the tree's top CMake files) is extracted beside
it. :func:`hook.install.check` runs on each (it writes nothing) and the results render as Markdown and
JSON::

    python -m ggml_dispatch.hook.compat              # docs/compat.md, docs/compat.json
    python -m ggml_dispatch.hook.compat --span       # docs/compat-span.md, docs/compat-span.json (fetches 10
    sdists)

Parsing and rendering are pure functions of their inputs; only :func:`fetch_tree` and :func:`main`
touch the network or the disk.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import sys
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fetch, schema
from ggml_dispatch.hook import install as inst
from ggml_dispatch.hook import upstream as up

HERE: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = fetch.REPO_ROOT
TREES_TSV: Final = HERE / "compat.tsv"
SPAN_TSV: Final = HERE / "compat-span.tsv"
DOCS_DIR: Final = REPO_ROOT / "docs"
COLUMNS: Final = ("name", "project", "version", "sha256", "prefix", "upstream")
JSON_SCHEMA: Final = "ggml-dispatch-compat/1"
# What is extracted of a tree (relative to its folder in the sdist): ggml/ is all that install edits and
# nvcc compiles; the top CMake files let a ggml-only CMake build find its way.
KEEP_DIRS: Final = ("ggml/", "cmake/")
KEEP_FILES: Final = ("CMakeLists.txt", "LICENSE")
CUDA_MAIN: Final = Path("ggml") / "src" / "ggml-cuda" / "ggml-cuda.cu"

_PROJECT: Final = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")


class CompatError(Exception):
    """A trees file that does not parse (the message names file:line), or a tree that cannot be had."""


@dataclass(frozen=True)
class Tree:
    """One line of a trees file."""

    name: str
    project: str
    version: str
    sha256: str
    prefix: str  # the tree's folder inside the sdist, no trailing slash
    upstream: str | None  # a 40-hex commit or a build number (b11434), as install reads it; None: not known
    where: str  # file:line, for messages


@dataclass(frozen=True)
class Result:
    """What :func:`hook.install.check` said about one tree, or why it could not say anything."""

    tree: Tree
    check: Mapping[str, Any] | None
    error: str | None = None


def parse_trees(text: str, source: str) -> list[Tree]:
    """The trees of a trees file: ``#`` comments and blank lines, then the header line (:data:`COLUMNS`,
    tab-separated), then one tree a line. Any other line is a :class:`CompatError` naming source:line."""
    trees: list[Tree] = []
    names: dict[str, int] = {}
    header_seen = False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{source}:{n}"
        fields = line.split("\t")
        if not header_seen:
            if tuple(fields) != COLUMNS:
                raise CompatError(
                    f"{where}: the header line must be {chr(9).join(COLUMNS)!r} (tab-separated)"
                )
            header_seen = True
            continue
        if len(fields) != len(COLUMNS):
            cols = ", ".join(COLUMNS)
            raise CompatError(
                f"{where}: {len(fields)} tab-separated columns, expected {len(COLUMNS)} ({cols})"
            )
        for col, value in zip(COLUMNS, fields, strict=True):
            if value != value.strip() or not value:
                raise CompatError(f"{where}: column {col} is empty or has spaces around it: {value!r}")
        name, project, version, sha256, prefix, upstream = fields
        if "|" in name or "`" in name:
            raise CompatError(f"{where}: name {name!r} has a | or ` (it goes into a Markdown table)")
        if name in names:
            raise CompatError(f"{where}: name {name!r} is already on line {names[name]}")
        if not _PROJECT.match(project):
            raise CompatError(f"{where}: project {project!r} is not a PyPI project name")
        if not _VERSION.match(version):
            raise CompatError(f"{where}: version {version!r} is not a release version")
        if not _SHA256.match(sha256):
            raise CompatError(f"{where}: sha256 {sha256!r} is not 64 lowercase hex digits")
        parts = prefix.split("/")
        if (
            prefix.startswith("/")
            or any(p in ("", ".", "..") for p in parts)
            or any(c.isspace() for c in prefix)
        ):
            raise CompatError(f"{where}: prefix {prefix!r} is not a relative folder inside the archive")
        if upstream != "-" and not _upstream_ok(upstream):
            raise CompatError(
                f"{where}: upstream {upstream!r} is not -, a 40-hex commit or a build number (b11434)"
            )
        names[name] = n
        trees.append(
            Tree(name, project, version, sha256, prefix, None if upstream == "-" else upstream, where)
        )
    if not header_seen:
        raise CompatError(f"{source}: no header line ({chr(9).join(COLUMNS)!r})")
    if not trees:
        raise CompatError(f"{source}: lists no tree")
    return trees


def _upstream_ok(text: str) -> bool:
    """The ids install accepts in UPSTREAM_COMMIT, spelled as it keeps them (lower-case hex)."""
    try:
        return up.parse_id(text) == text
    except up.UpstreamError:
        return False


def load_trees(path: Path) -> list[Tree]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CompatError(f"{path}: cannot read the trees file ({e})") from None
    return parse_trees(text, _display(path))


# ---- fetch -------------------------------------------------------------------------------------------


def tree_dir(tree: Tree) -> Path:
    """The tree's extracted folder in the cache: keyed by archive, prefix and upstream, so a changed line
    gets a folder of its own."""
    key = hashlib.sha256(f"{tree.sha256}\0{tree.prefix}\0{tree.upstream or ''}".encode()).hexdigest()
    return fetch.CACHE / "compat" / f"{tree.project}-{tree.version}-{key[:12]}"


def _ready(dest: Path) -> bool:
    return (dest / CUDA_MAIN).is_file()


def fetch_tree(tree: Tree) -> Path:
    """The tree, extracted into the cache on first use (a staged folder renamed into place, so a failed
    or concurrent fetch never leaves a half tree). Read-only for callers: install into a copy."""
    dest = tree_dir(tree)
    if _ready(dest):
        return dest
    with fetch._fetch_lock("compat"):
        if _ready(dest):
            return dest
        # The pinned sdist is also what fetch.llama_cpp_dir() downloads, under its own lock: holding that
        # one too keeps two processes from writing the same partial download at once.
        pinned = tree.sha256 == schema.PINNED_SDIST_SHA256
        try:
            with fetch._fetch_lock("llama.cpp") if pinned else contextlib.nullcontext():
                sdist = fetch._download(
                    tree.project, tree.version, ".tar.gz", tree.sha256, fetch.CACHE / "dl"
                )
        except fetch.FetchError as e:
            raise CompatError(f"{tree.where}: {e}") from None
        with fetch._staged_dir(dest, f".{dest.name}.") as tmp:
            _extract(sdist, tree, tmp)
    return dest


def _keep(rel: str) -> bool:
    return rel in KEEP_FILES or any(rel == d.rstrip("/") or rel.startswith(d) for d in KEEP_DIRS)


def _extract(sdist: Path, tree: Tree, out: Path) -> None:
    prefix = tree.prefix + "/"
    try:
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                rel = m.name[len(prefix) :] if m.name.startswith(prefix) else ""
                # links are left out: nothing under ggml/ that a build reads is one
                if rel and _keep(rel) and (m.isfile() or m.isdir()):
                    m.name = rel
                    members.append(m)
            tar.extractall(out, members=members, filter="data")
    except (OSError, tarfile.TarError) as e:
        raise CompatError(f"{tree.where}: cannot extract {sdist.name}: {e}") from None
    if not (out / CUDA_MAIN).is_file():
        raise CompatError(f"{tree.where}: {sdist.name} has no {prefix}{CUDA_MAIN.as_posix()} (wrong prefix?)")
    if tree.upstream:
        (out / "UPSTREAM_COMMIT").write_text(tree.upstream + "\n", encoding="utf-8")


def _portable(value: Any, path: str) -> Any:
    """``value`` with the cache path of the tree spelled ``<tree>`` (the results are committed)."""
    if isinstance(value, str):
        return value.replace(path, "<tree>")
    if isinstance(value, list):
        return [_portable(v, path) for v in value]
    if isinstance(value, dict):
        return {k: _portable(v, path) for k, v in value.items()}
    return value


def check_tree(tree: Tree) -> Result:
    """Fetch the tree and run install's check on it; a tree install refuses outright is a result too."""
    path = fetch_tree(tree).resolve()
    try:
        found = inst.check(path)
    except inst.InstallError as e:
        return Result(tree, None, _portable(str(e), str(path)))
    found = {k: v for k, v in found.items() if k != "tree"}  # the cache path: the line names the tree
    return Result(tree, _portable(found, str(path)))


# ---- rendering (pure) --------------------------------------------------------------------------------


def feature_names(results: Iterable[Result]) -> list[str]:
    """The features the checks report, in the order they first appear."""
    seen: dict[str, None] = {}
    for r in results:
        if r.check is not None:
            seen.update(dict.fromkeys(r.check.get("features", {})))
    return list(seen)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _cell(text: object) -> str:
    return _one_line(text).replace("|", "\\|")


def _core_cell(check: Mapping[str, Any]) -> str:
    core = check.get("core", {})
    if core.get("status") == "applied":
        return f"applied, {core.get('lines', 0)} lines"
    return str(core.get("status", "?"))


def _feature_cell(check: Mapping[str, Any], feature: str) -> str:
    entry = check.get("features", {}).get(feature)
    return "—" if entry is None else str(entry.get("status", "?"))


def _short(upstream: str | None) -> str:
    return f"`{upstream[:12]}`" if upstream else "unknown"


def _reason(entry: Mapping[str, Any]) -> str:
    return _one_line(entry.get("reason") or "no reason given")


def _notes(results: Sequence[Result], features: Sequence[str]) -> list[str]:
    """The lists under a table: skip reasons, calls the seam does not reach, trees install refuses.

    Unhooked calls are grouped by file and reason (one line each, with every tree's line numbers): most
    are the same few GEMMs inside other ops in every tree."""
    skipped: list[str] = []
    failed: list[str] = []
    unhooked: dict[tuple[str, str], dict[str, list[str]]] = {}
    for r in results:
        if r.check is None:
            failed.append(f"- **{r.tree.name}**: {_one_line(r.error)}")
            continue
        core = r.check.get("core", {})
        if core.get("status") != "applied":
            skipped.append(f"- **{r.tree.name}** · core: {_reason(core)}")
        for f in features:
            entry = r.check.get("features", {}).get(f)
            if entry is not None and entry.get("status") != "applied":
                skipped.append(f"- **{r.tree.name}** · `{f}`: {_reason(entry)}")
        for u in r.check.get("unhooked", []):
            key = (str(u.get("file", "?")), _one_line(u.get("why", "")))
            unhooked.setdefault(key, {}).setdefault(r.tree.name, []).append(str(u.get("line", "?")))
    calls = [
        f"- `{file}`: {why} — "
        + "; ".join(
            f"{name} line{'s' * (len(lines) > 1)} {', '.join(lines)}" for name, lines in trees.items()
        )
        for (file, why), trees in unhooked.items()
    ]
    out: list[str] = []
    for title, items in (
        ("Skipped, and why", skipped),
        ("Calls the seam does not reach", calls),
        ("Trees install refuses", failed),
    ):
        if items:
            out += ["", f"## {title}", "", *items]
    return out


def _header(title: str, source: str, command: str) -> list[str]:
    return [
        f"# {title}",
        "",
        f"Generated by `{command}` from `{source}` (ggml-dispatch {schema.TOOL_VERSION}); do not edit.",
        "Each tree is the sdist's llama.cpp as published on PyPI; `ggml-dispatch install --check --json`",
        "ran on it. *applied*: the feature's edits match the tree and would be installed; *skipped*: they",
        "would not, for the reason listed below the table (the rest of the hook installs without them).",
        "The core seam's count is the lines it inserts into ggml-cuda. Install refuses a tree whose core is",
        "skipped: there the other columns say only whether those edits would match.",
    ]


def render_matrix(
    results: Sequence[Result], source: str, command: str = "python -m ggml_dispatch.hook.compat"
) -> str:
    """docs/compat.md: tree x feature."""
    features = feature_names(results)
    lines = _header("Compatibility matrix", source, command)
    lines += ["", *_table_head(["tree", "sdist", "upstream"], features)]
    for r in results:
        t = r.tree
        row = [_cell(t.name), _cell(f"{t.project} {t.version}"), _short(t.upstream), *_cells(r, features)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines + _notes(results, features)) + "\n"


def _table_head(lead: Sequence[str], features: Sequence[str]) -> list[str]:
    """A tree x feature table's head: ``lead`` columns, then the core, each feature, the unhooked calls."""
    columns = [*lead, "core", *features, "unhooked calls"]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _cells(r: Result, features: Sequence[str]) -> list[str]:
    """A tree's core, feature and unhooked cells (the launches inside other ops counted apart)."""
    if r.check is None:
        return ["refused", *(["—"] * len(features)), "—"]
    unseen = r.check.get("unhooked", [])
    other = sum(1 for u in unseen if u.get("kind") == "other_op")
    count = f"{len(unseen) - other} (+{other} in other ops)"
    return [_core_cell(r.check), *(_feature_cell(r.check, f) for f in features), count]


def _works(r: Result, feature: str) -> bool:
    if r.check is None:
        return False
    entry = r.check.get("core", {}) if feature == "core" else r.check.get("features", {}).get(feature, {})
    if feature != "core" and not _works(r, "core"):
        return False  # install refuses the tree: the feature is not installed there
    return bool(entry.get("status") == "applied")


def applied_from(results: Sequence[Result], feature: str) -> str:
    """From which tree of an ordered span the feature is installed (it and the core apply) on every later
    one, in words."""
    if not results:
        return "—"
    if not _works(results[-1], feature):
        return f"not at {results[-1].tree.name}"
    i = len(results) - 1
    while i > 0 and _works(results[i - 1], feature):
        i -= 1
    return f"{results[0].tree.name} or earlier" if i == 0 else results[i].tree.name


def render_span(
    results: Sequence[Result], source: str, command: str = "python -m ggml_dispatch.hook.compat --span"
) -> str:
    """docs/compat-span.md: build x feature (oldest first), then from which build each feature works."""
    features = feature_names(results)
    columns = ["core", *features]
    lines = _header("Compatibility across llama.cpp builds", source, command)
    lines += ["", *_table_head(["build"], features)]
    for r in results:
        lines.append("| " + " | ".join([_cell(r.tree.name), *_cells(r, features)]) + " |")
    lines += ["", "## From which build each feature works", ""]
    lines += ["A feature works where it and the core apply.", "", "| feature | works from | not in |"]
    lines.append("|---|---|---|")
    for f in columns:
        skipped = [r.tree.name for r in results if not _works(r, f)]
        lines.append(f"| {f} | {applied_from(results, f)} | {', '.join(skipped) or '—'} |")
    return "\n".join(lines + _notes(results, features)) + "\n"


def to_json(results: Sequence[Result], source: str) -> dict[str, Any]:
    """docs/compat*.json: every tree's line of the trees file and its check result, as check gave it."""
    return {
        "schema": JSON_SCHEMA,
        "tool_version": schema.TOOL_VERSION,
        "source": source,
        "trees": [
            {
                "name": r.tree.name,
                "project": r.tree.project,
                "version": r.tree.version,
                "sha256": r.tree.sha256,
                "prefix": r.tree.prefix,
                "upstream": r.tree.upstream,
                "check": r.check,
                "error": r.error,
            }
            for r in results
        ],
    }


# ---- CLI ---------------------------------------------------------------------------------------------


def _display(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ggml_dispatch.hook.compat",
        description="Fetch llama.cpp trees from PyPI, run `install --check` on each, write the matrix.",
    )
    p.add_argument(
        "--trees",
        type=Path,
        help="trees file (default: compat.tsv beside this module, with --span compat-span.tsv)",
    )
    p.add_argument("-o", "--out", type=Path, default=DOCS_DIR, help="output folder (default: docs/)")
    p.add_argument("--span", action="store_true", help="the build span: compat-span.md, build x feature")
    args = p.parse_args(argv)
    trees_file: Path = args.trees or (SPAN_TSV if args.span else TREES_TSV)
    stem = "compat-span" if args.span else "compat"
    command = "python -m ggml_dispatch.hook.compat" + (" --span" if args.span else "")
    try:
        trees = load_trees(trees_file)
        results = []
        for t in trees:
            print(f"{t.name}: {t.project} {t.version}", file=sys.stderr, flush=True)
            results.append(check_tree(t))
    except (CompatError, OSError) as e:
        print(f"compat: error: {e}", file=sys.stderr)
        return 1
    source = _display(trees_file)
    render = render_span if args.span else render_matrix
    md, js = args.out / f"{stem}.md", args.out / f"{stem}.json"
    _write(md, render(results, source, command))
    _write(js, json.dumps(to_json(results, source), indent=2, sort_keys=False) + "\n")
    print(md)
    print(js)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
