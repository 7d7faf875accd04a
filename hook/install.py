"""Install the dispatch hook, trace writer and table into a llama.cpp tree, or take them out again.

``install`` copies the native sources of ``hook/native/`` into ``ggml/src/ggml-cuda/`` (whose
CMakeLists globs ``*.cu``), writes ``ggml-dispatch-codes.h`` rendered from the registry
(``hook/codes.py``), renders the table header (the "no table" header by default), stamps the
upstream commit and the patch hash into ``ggml-dispatch-build.h``, applies the anchored edits of each
hook spec to its target (``ggml-cuda.hook`` to ``ggml-cuda.cu``, ``mmq.cuh.hook`` to ``mmq.cuh``) and
records all of it in ``ggml-dispatch.install.json`` (per target: original and patched sha256, hunks).

* Idempotent: installing again re-derives each pristine target from the record and applies the
  hooks anew; files whose content is unchanged are not rewritten (an incremental build stays
  incremental; a new table rewrites only the table header, compiled into ``ggml-dispatch.cu`` alone).
* ``uninstall`` restores the tree byte for byte: the hook is reverted, the added files are removed.
* Every failure is an :class:`InstallError` naming the file and the hunk/function that does not match;
  nothing is written unless everything can be.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import registry, schema
from hook import codes, patch

NATIVE_DIR: Final = Path(__file__).resolve().parent / "native"
HOOK_SPEC: Final = "ggml-cuda.hook"
# Each edited file of ggml/src/ggml-cuda/ and its hook spec, in the order they are applied.
HOOK_SPECS: Final[dict[str, str]] = {
    "ggml-cuda.cu": HOOK_SPEC,
    "mmq.cuh": "mmq.cuh.hook",
    "fattn.cu": "fattn.cu.hook",
    "fattn-common.cuh": "fattn-common.cuh.hook",
}
# Copied verbatim into ggml/src/ggml-cuda/ (the patch hash covers them and the hook specs).
NATIVE_SOURCES: Final = (
    "ggml-dispatch.h",
    "ggml-dispatch-core.h",
    "ggml-dispatch-eligibility.cuh",
    "ggml-dispatch-hook.cuh",
    "ggml-dispatch-params.h",
    "ggml-dispatch.cu",
    "ggml-dispatch-cache.h",
    "ggml-dispatch-cache.cuh",
    "ggml-dispatch-cache-impl.cuh",
    "ggml-dispatch-kv.cuh",
    "ggml-dispatch-kv-impl.cuh",
    "ggml-dispatch-moe.cuh",
    "ggml-dispatch-moe-stats.h",
    "ggml-dispatch-eligibility-id.cuh",
)
TABLE_HEADER: Final = "ggml-dispatch-table.h"
BUILD_HEADER: Final = "ggml-dispatch-build.h"
MANIFEST: Final = "ggml-dispatch.install.json"
MANIFEST_SCHEMA: Final = "ggml-dispatch-install/1"
CUDA_DIR: Final = Path("ggml") / "src" / "ggml-cuda"
TARGET: Final = "ggml-cuda.cu"
HOOK_MARKER: Final = '#include "ggml-cuda/ggml-dispatch-hook.cuh"'
# Text only an installed hook puts into each target (a target carrying it without a record is refused).
HOOK_MARKERS: Final[dict[str, str]] = {
    TARGET: HOOK_MARKER,
    "mmq.cuh": '#include "ggml-dispatch-params.h"',
    "fattn.cu": '#include "ggml-dispatch-hook.cuh"',
    "fattn-common.cuh": '#include "ggml-dispatch-params.h"',
}

_HEX40: Final = re.compile(r"^[0-9a-f]{40}$")


class InstallError(Exception):
    """The tree cannot take (or give back) the hook; the message names file and hunk/function."""


@dataclass
class Plan:
    """Everything an install or uninstall writes (path relative to the tree -> bytes, None = delete)."""

    tree: Path
    writes: dict[str, bytes | None] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")  # byte-exact round trip even for stray bytes


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_hunks(native_dir: Path = NATIVE_DIR, spec_name: str = HOOK_SPEC) -> list[patch.Hunk]:
    spec = native_dir / spec_name
    return patch.parse_spec(spec.read_text(encoding="utf-8"), str(spec))


def load_specs(native_dir: Path = NATIVE_DIR) -> dict[str, list[patch.Hunk]]:
    """The hunks of every hook spec, by target file name (in :data:`HOOK_SPECS` order)."""
    return {target: load_hunks(native_dir, spec) for target, spec in HOOK_SPECS.items()}


def native_sources(native_dir: Path = NATIVE_DIR) -> dict[str, bytes]:
    """The native files install writes beside ggml-cuda.cu: the copied sources, the generated codes header."""
    files = {name: (native_dir / name).read_bytes() for name in NATIVE_SOURCES}
    files[codes.CODES_HEADER] = codes.render_codes_header().encode("utf-8")
    return files


def patch_hash(sources: Mapping[str, bytes], specs: Mapping[str, list[patch.Hunk]]) -> str:
    """sha256 over the native sources (sorted by name) and the hook edits of every target."""
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode())
        h.update(b"\0")
        h.update(sources[name])
        h.update(b"\0")
    for target in sorted(specs):
        h.update(target.encode())
        h.update(b"\0")
        h.update(patch.spec_digest(specs[target]).encode())
    return h.hexdigest()


def resolve_upstream_commit(tree: Path, given: str | None) -> str:
    """``--upstream-commit``, else the tree's ``UPSTREAM_COMMIT`` file, else ``git rev-parse HEAD``."""
    if given:
        commit = given.strip().lower()
        if not _HEX40.match(commit):
            raise InstallError(f"--upstream-commit {given!r} is not a 40-hex commit")
        return commit
    stamp = tree / "UPSTREAM_COMMIT"
    if stamp.is_file():
        commit = stamp.read_text(encoding="utf-8").strip().lower()
        if not _HEX40.match(commit):
            raise InstallError(f"{stamp}: {commit!r} is not a 40-hex commit")
        return commit
    if (tree / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError) as e:
            raise InstallError(f"{tree}: git rev-parse HEAD failed ({e}); pass --upstream-commit") from None
        if _HEX40.match(out):
            return out
    raise InstallError(
        f"{tree}: no UPSTREAM_COMMIT file and not a git checkout: pass --upstream-commit <40-hex commit>"
    )


def build_header(upstream_commit: str, phash: str) -> str:
    return (
        "/* ggml-dispatch-build.h: stamped by `ggml-dispatch install`; do not edit.\n"
        " * The route trace header carries these (upstream_commit, patch_hash). */\n"
        "#pragma once\n\n"
        f'#define GGML_DISPATCH_UPSTREAM_COMMIT "{upstream_commit}"\n'
        f'#define GGML_DISPATCH_PATCH_HASH "{phash}"\n'
        f'#define GGML_DISPATCH_TOOL_VERSION "{schema.TOOL_VERSION}"\n'
    )


def _fallback_empty_header() -> str:
    """A valid 'no table' header, used only when codegen.render is not importable."""
    return (
        "/* ggml-dispatch-table.h: no dispatch table (stock dispatch). Written by ggml-dispatch install. */\n"
        "#ifndef GGML_DISPATCH_TABLE_H\n#define GGML_DISPATCH_TABLE_H\n\n#include <stdint.h>\n\n"
        f"#define GGML_DISPATCH_TABLE_LAYOUT_VERSION {schema.TABLE_LAYOUT_VERSION}\n"
        "#define GGML_DISPATCH_TABLE_RULE_COUNT 0\n#define GGML_DISPATCH_TABLE_GPU_CC 0\n"
        "#define GGML_DISPATCH_TABLE_GPU_SM_COUNT 0\n\n"
        'static const char ggml_dispatch_table_gpu_name[] = "";\n'
        'static const char ggml_dispatch_table_hash[] = "";\n'
        'static const char ggml_dispatch_table_upstream_commit[] = "";\n\n'
        "static inline int ggml_dispatch_table_gpu_matches(const char * name, int cc, int sm_count) {\n"
        "    (void) name;\n    (void) cc;\n    (void) sm_count;\n    return 0;\n}\n\n"
        f"#define GGML_DISPATCH_TABLE_KEY_SLOTS {registry.KEY_SLOTS}\n"
        f"#define GGML_DISPATCH_TABLE_OP_COUNT {len(registry.OPS)}\n\n"
        "static inline int ggml_dispatch_table_lookup(int op, int layout, int type0, int type1, "
        "const int64_t * k, int64_t M) {\n"
        "    (void) op;\n    (void) layout;\n    (void) type0;\n    (void) type1;\n"
        "    (void) k;\n    (void) M;\n    return 0;\n}\n\n"
        "#endif /* GGML_DISPATCH_TABLE_H */\n"
    )


@dataclass(frozen=True)
class TableInfo:
    header: str
    table_hash: str | None  # None = no table
    upstream_commit: str | None
    rules: int


def table_info(table_path: Path | None) -> TableInfo:
    """Render the header for ``table_path`` (or the 'no table' header). Bad tables raise InputError."""
    try:
        from codegen import render, table
    except ImportError:
        if table_path is not None:
            raise InstallError("codegen.render is not available: cannot render a table header") from None
        return TableInfo(_fallback_empty_header(), None, None, 0)
    t = table.empty_table() if table_path is None else table.load(table_path)
    header = render.render_header(t)
    rules = len(t.get("rules", []))
    if table_path is None:
        return TableInfo(header, None, None, 0)
    return TableInfo(header, table.table_hash(t), str(t.get("upstream_commit") or "") or None, rules)


def _manifest(tree: Path) -> Path:
    return tree / CUDA_DIR / MANIFEST


def read_manifest(tree: Path) -> dict[str, Any] | None:
    p = _manifest(tree)
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InstallError(f"{p}: unreadable install record ({e}); restore the tree from upstream") from None
    if not isinstance(m, dict) or m.get("schema") != MANIFEST_SCHEMA:
        raise InstallError(f"{p}: not a {MANIFEST_SCHEMA} install record")
    return m


def _check_tree(tree: Path) -> Path:
    target = tree / CUDA_DIR / TARGET
    if not target.is_file():
        raise InstallError(f"{tree}: not a llama.cpp tree (no {CUDA_DIR / TARGET})")
    for name in HOOK_SPECS:
        if not (tree / CUDA_DIR / name).is_file():
            raise InstallError(f"{tree}: no {CUDA_DIR / name} (the hook edits it)")
    return target


def recorded_targets(manifest: Mapping[str, Any]) -> dict[str, list[patch.Hunk]]:
    """The hunks an install record says were applied, by target path relative to the tree.

    Records from before the mmq spec hold one target (``target`` + ``hunks``)."""
    targets = manifest.get("targets")
    if isinstance(targets, dict):
        return {str(rel): [patch.Hunk.from_json(h) for h in t["hunks"]] for rel, t in targets.items()}
    rel = str(manifest.get("target", CUDA_DIR / TARGET))
    return {rel: [patch.Hunk.from_json(h) for h in manifest["hunks"]]}


def _pristine(tree: Path, rel: str, current: str, manifest: Mapping[str, Any] | None) -> str:
    """A target without the hook: the current text, or it with the recorded hunks reverted."""
    marker = HOOK_MARKERS[Path(rel).name]
    recorded = recorded_targets(manifest) if manifest is not None else {}
    if rel not in recorded:
        if marker in current:
            why = "is missing" if manifest is None else "does not record it"
            raise InstallError(
                f"{tree / rel}: carries the ggml-dispatch hook but {MANIFEST} {why}; "
                f"restore {Path(rel).name} from upstream first"
            )
        return current
    try:
        return patch.revert(current, recorded[rel])
    except patch.PatchError as e:
        raise InstallError(f"{tree / rel}: cannot take the installed hook out: {e}") from None


def plan_install(
    tree: Path,
    *,
    table_path: Path | None = None,
    upstream_commit: str | None = None,
    allow_upstream_mismatch: bool = False,
    native_dir: Path = NATIVE_DIR,
) -> Plan:
    tree = tree.resolve()
    _check_tree(tree)
    commit = resolve_upstream_commit(tree, upstream_commit)
    manifest = read_manifest(tree)
    specs = load_specs(native_dir)

    targets: dict[str, tuple[str, str]] = {}  # rel -> (pristine, patched)
    for name, hunks in specs.items():
        rel = str(CUDA_DIR / name)
        current = _decode((tree / rel).read_bytes())
        pristine = _pristine(tree, rel, current, manifest)
        try:
            targets[rel] = (pristine, patch.apply(pristine, hunks))
        except patch.PatchError as e:
            raise InstallError(f"{tree / rel}: the hook does not apply: {e}") from None

    sources = native_sources(native_dir)
    phash = patch_hash(sources, specs)
    info = table_info(table_path)
    plan = Plan(tree)
    if info.upstream_commit and info.upstream_commit != commit:
        msg = (
            f"{table_path}: table measured on upstream {info.upstream_commit}, the tree is {commit}"
            " (its kernels may differ)"
        )
        if not allow_upstream_mismatch:
            raise InstallError(msg + "; pass --allow-upstream-mismatch to install it anyway")
        plan.messages.append("warning: " + msg)

    files: dict[str, bytes] = {str(CUDA_DIR / n): b for n, b in sources.items()}
    files[str(CUDA_DIR / TABLE_HEADER)] = info.header.encode("utf-8")
    files[str(CUDA_DIR / BUILD_HEADER)] = build_header(commit, phash).encode("utf-8")
    added = sorted(files)
    for rel, (_, patched) in targets.items():
        files[rel] = _encode(patched)

    if manifest is not None:  # files a previous install added that this one no longer writes
        for old in manifest.get("files_added", []):
            if old not in files and (tree / old).exists():
                plan.writes[str(old)] = None
    else:
        for rel in added:
            if (tree / rel).exists():
                raise InstallError(f"{tree / rel}: exists and is not from ggml-dispatch; remove it first")
    main_rel = str(CUDA_DIR / TARGET)
    record = {
        "schema": MANIFEST_SCHEMA,
        "tool_version": schema.TOOL_VERSION,
        "upstream_commit": commit,
        "patch_hash": phash,
        "table_hash": info.table_hash,
        "table_rules": info.rules,
        "target": main_rel,
        "target_original_sha256": sha256_bytes(_encode(targets[main_rel][0])),
        "target_patched_sha256": sha256_bytes(_encode(targets[main_rel][1])),
        "targets": {
            rel: {
                "spec": HOOK_SPECS[Path(rel).name],
                "original_sha256": sha256_bytes(_encode(pristine)),
                "patched_sha256": sha256_bytes(_encode(patched)),
                "hunks": [h.to_json() for h in specs[Path(rel).name]],
            }
            for rel, (pristine, patched) in targets.items()
        },
        "files_added": added,
        "hunks": [h.to_json() for h in specs[TARGET]],
    }
    files[str(CUDA_DIR / MANIFEST)] = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")

    for rel, data in files.items():
        p = tree / rel
        if p.is_file() and p.read_bytes() == data:
            plan.unchanged.append(rel)
        else:
            plan.writes[rel] = data
    plan.messages.append(
        f"ggml-dispatch hook in {tree} (upstream {commit[:12]}, patch {phash[:12]}, "
        + (f"table {info.table_hash[:12]}, {info.rules} rules)" if info.table_hash else "no table)")
    )
    return plan


def plan_uninstall(tree: Path) -> Plan:
    tree = tree.resolve()
    _check_tree(tree)
    manifest = read_manifest(tree)
    plan = Plan(tree)
    if manifest is None:
        for name, marker in HOOK_MARKERS.items():
            if marker in _decode((tree / CUDA_DIR / name).read_bytes()):
                raise InstallError(
                    f"{tree / CUDA_DIR / name}: has the hook but {MANIFEST} is missing; "
                    "restore it from upstream"
                )
        plan.messages.append(f"{tree}: no ggml-dispatch install found; nothing to do")
        return plan
    recorded = recorded_targets(manifest)
    targets = manifest.get("targets")
    for rel in recorded:
        current = _decode((tree / rel).read_bytes())
        data = _encode(_pristine(tree, rel, current, manifest))
        want = (
            targets[rel].get("original_sha256")
            if isinstance(targets, dict)
            else manifest.get("target_original_sha256")
        )
        if sha256_bytes(data) != want:
            plan.messages.append(
                f"warning: {tree / rel} was edited after install; the hook is out, the other edits stay"
            )
        plan.writes[rel] = data
    for rel in [*manifest.get("files_added", []), str(CUDA_DIR / MANIFEST)]:
        if (tree / rel).exists():
            plan.writes[str(rel)] = None
    plan.messages.append(f"ggml-dispatch hook removed from {tree}")
    return plan


def execute(plan: Plan, progress: Callable[[str], None] | None = None) -> None:
    """Write every new file under a temporary name first, then rename them all; then delete."""
    staged: list[tuple[Path, Path]] = []
    try:
        for rel, data in plan.writes.items():
            if data is None:
                continue
            dest = plan.tree / rel
            tmp = dest.with_name(f".{dest.name}.ggml-dispatch.tmp")
            tmp.write_bytes(data)
            if dest.exists():
                os.chmod(tmp, dest.stat().st_mode & 0o7777)
            staged.append((tmp, dest))
        for tmp, dest in staged:
            os.replace(tmp, dest)
            if progress:
                progress(str(dest.relative_to(plan.tree)))
        staged = []
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for rel, data in plan.writes.items():
        if data is None:
            (plan.tree / rel).unlink(missing_ok=True)
            if progress:
                progress(f"removed {rel}")


def install(tree: Path, **kwargs: Any) -> Plan:
    plan = plan_install(tree, **kwargs)
    execute(plan)
    return plan


def uninstall(tree: Path) -> Plan:
    plan = plan_uninstall(tree)
    execute(plan)
    return plan
