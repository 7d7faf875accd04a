"""Install the dispatch hook, trace writer and table into a llama.cpp tree, or take them out again.

``install`` copies the native sources of ``ggml_dispatch/hook/native/`` into ``ggml/src/ggml-cuda/`` (whose
CMakeLists globs ``*.cu``), writes ``ggml-dispatch-codes.h`` rendered from the registry
(``ggml_dispatch/codes.py``), renders the table header (the "no table" header by default), stamps the
upstream commit and the patch hash into ``ggml-dispatch-build.h``, applies the anchored edits of each
hook spec to its target (``ggml-cuda.hook`` to ``ggml-cuda.cu``, ``mmq.cuh.hook`` to ``mmq.cuh``) and
records all of it in ``ggml-dispatch.install.json`` (per target: original and patched sha256, hunks).

* Idempotent: installing again re-derives each pristine target from the record and applies the
  hooks anew; files whose content is unchanged are not rewritten (an incremental build stays
  incremental; a new table rewrites only the table header, compiled into ``ggml-dispatch.cu`` alone).
* ``uninstall`` restores the tree byte for byte: the hook is reverted, the added files are removed.
* Hunks are located by content (ggml_dispatch/hook/patch.py) and grouped into features
(ggml_dispatch.registry.FEATURES):
  the core seam must fit, every other feature is applied where its hunks fit and skipped with the first
  line that differs where they do not. Table rules that need a skipped feature are dropped at install with
  one message, and the native side refuses a forced configuration that needs one (``ineligible:feature``).
* Every failure is an :class:`InstallError` naming the file and the hunk/function that does not match;
  nothing is written unless everything can be.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import codes, registry, schema
from ggml_dispatch.artifacts import table as table_artifact
from ggml_dispatch.artifacts.table import Rule
from ggml_dispatch.codegen import render, table
from ggml_dispatch.hook import fit, patch, unhooked, upstream
from ggml_dispatch.registry import MmvqBuild

NATIVE_DIR: Final = Path(__file__).resolve().parent / "native"
HOOK_SPEC: Final = "ggml-cuda.hook"
# Each edited file of ggml/src/ggml-cuda/ and its hook spec, in the order they are applied.
HOOK_SPECS: Final[dict[str, str]] = {
    "ggml-cuda.cu": HOOK_SPEC,
    "mmq.cuh": "mmq.cuh.hook",
    "fattn.cu": "fattn.cu.hook",
    "fattn-common.cuh": "fattn-common.cuh.hook",
    "mmq.cu": "mmq.cu.hook",
    "mmvq.cu": "mmvq.cu.hook",
    "mmvf.cu": "mmvf.cu.hook",
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
    "ggml-dispatch-mul-mat.cuh",
    "ggml-dispatch-mul-mat-id.cuh",
    "ggml-dispatch-fattn.cuh",
    "ggml-dispatch-fattn-vec.cuh",
    "ggml-dispatch-mmq-fused.cuh",
    "ggml-dispatch-mmvq.h",
    "ggml-dispatch-mmvq.cuh",
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
    "fattn.cu": '#include "ggml-dispatch-fattn-vec.cuh"',
    "fattn-common.cuh": '#include "ggml-dispatch-params.h"',
    "mmq.cu": "// ggml-dispatch: a configuration's J",
    "mmvq.cu": '#include "ggml-dispatch-mmvq.h"',
    "mmvf.cu": "// ggml-dispatch: a configuration's block size",
}


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


def rule_not_compiled(rule: Rule, mmvq: MmvqBuild) -> bool:
    """Does a rule's mmvq configuration name a candidate this build does not compile for its weight type?"""
    config = rule.config
    values = dict(config.params)
    pair = registry.mmvq_params_pair(values) if config.route is registry.Route.MMVQ else None
    src0_type = str(rule.fields.get("src0_type", ""))
    return pair is not None and not mmvq.compiled(src0_type, pair, registry.mmvq_params_regs(values))


def build_header(
    upstream_id: str | None,
    phash: str,
    features: int = 0,
    upstream_fingerprint: str = "",
    mmvq: MmvqBuild | None = None,
) -> str:
    mmvq = mmvq or MmvqBuild()
    return (
        "/* ggml-dispatch-build.h: stamped by `ggml-dispatch install`; do not edit.\n"
        " * The route trace header carries these (upstream_commit, patch_hash). */\n"
        "#pragma once\n\n"
        f'#define GGML_DISPATCH_UPSTREAM_COMMIT "{upstream_id or ""}"\n'
        f'#define GGML_DISPATCH_UPSTREAM_FINGERPRINT "{upstream_fingerprint}"\n'
        f'#define GGML_DISPATCH_PATCH_HASH "{phash}"\n'
        f'#define GGML_DISPATCH_TOOL_VERSION "{schema.TOOL_VERSION}"\n'
        "/* The hook features applied (GGML_DISPATCH_FEATURE_* bits, ggml-dispatch-codes.h). */\n"
        f"#define GGML_DISPATCH_FEATURES {features}u\n"
        "/* mmvq's candidate instances compiled (feature mmvq_params, ggml-dispatch-mmvq.h; install\n"
        " * --mmvq-configs, --mmvq-types, --mmvq-regs). A compile definition of the same name wins. */\n"
        "#ifndef GGML_DISPATCH_MMVQ_CONFIGS\n"
        f'#define GGML_DISPATCH_MMVQ_CONFIGS "{mmvq.configs_text()}"\n'
        "#endif\n"
        "#ifndef GGML_DISPATCH_MMVQ_TYPES\n"
        f'#define GGML_DISPATCH_MMVQ_TYPES "{",".join(mmvq.types)}"\n'
        "#endif\n"
        "#ifndef GGML_DISPATCH_MMVQ_REGS\n"
        f'#define GGML_DISPATCH_MMVQ_REGS "{mmvq.regs_text()}"\n'
        "#endif\n"
    )


@dataclass(frozen=True)
class TableInfo:
    header: str
    table_hash: str | None  # None = no table
    upstream_commit: str | None
    rules: int
    dropped: dict[str, int] = field(default_factory=dict)  # skipped feature -> rules dropped for it
    not_compiled: int = 0  # rules dropped: their mmvq candidate is not compiled for their weight type


def table_info(
    table_path: Path | None, applied: frozenset[str] | None = None, mmvq: MmvqBuild | None = None
) -> TableInfo:
    """Render the header for ``table_path`` (or the 'no table' header). Bad tables raise InputError. Rules
    whose configuration needs a feature outside ``applied`` (None: all), or an mmvq candidate ``mmvq`` does
    not compile for the rule's weight type, are left out of the header."""
    if table_path is None:
        return TableInfo(render.render_header(table.empty_table()), None, None, 0)
    typed = table_artifact.load_typed(table_path)  # read and typed once; the header is rendered from it
    thash = table.table_hash(typed.data)  # the table as measured; the header says which rules it left out
    dropped: dict[str, int] = {}
    not_compiled = 0

    def keep(rule: Rule) -> bool:
        nonlocal not_compiled
        missing = sorted(registry.config_features(rule.config) - applied) if applied is not None else []
        if missing:
            dropped[missing[0]] = dropped.get(missing[0], 0) + 1
            return False
        if mmvq is not None and rule_not_compiled(rule, mmvq):
            not_compiled += 1
            return False
        return True

    if applied is not None or mmvq is not None:
        typed = typed.keeping(keep)
    header = render.render_header(typed)
    t = typed.data
    return TableInfo(
        header, thash, str(t.get("upstream_commit") or "") or None, len(t["rules"]), dropped, not_compiled
    )


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


@dataclass(frozen=True)
class TreeFit:
    """What the hook finds in a tree: pristine targets, the features' fit, its upstream id and fingerprint."""

    tree: Path
    pristine: dict[str, str]  # rel path -> text without the hook
    fit: fit.Fit
    upstream_id: str | None
    upstream_source: str
    fingerprint: str
    manifest: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        """``install --check --json``: the core seam, every feature, every launch the seam does not see."""
        core = self.fit.features[registry.CORE_FEATURE]
        return {
            "tree": str(self.tree),
            "core": core.to_json(),
            "features": {n: s.to_json() for n, s in self.fit.features.items() if n != registry.CORE_FEATURE},
            "unhooked": [u.to_json() for u in unhooked.scan(self.tree)],
            "upstream": {
                "id": self.upstream_id,
                "source": self.upstream_source,
                "fingerprint": self.fingerprint,
                "matches": sorted(c for c, f in upstream.KNOWN_FINGERPRINTS.items() if f == self.fingerprint),
            },
        }


def fit_tree(
    tree: Path,
    *,
    upstream_commit: str | None = None,
    features: frozenset[str] | None = None,
    native_dir: Path = NATIVE_DIR,
) -> TreeFit:
    """Locate every hook spec's hunks in ``tree`` (its pristine text where a hook is in). Writes nothing."""
    tree = tree.resolve()
    _check_tree(tree)
    try:
        upstream_id, source = upstream.resolve_id(tree, upstream_commit)
    except upstream.UpstreamError as e:
        raise InstallError(str(e)) from None
    manifest = read_manifest(tree)
    specs = load_specs(native_dir)
    pristine: dict[str, str] = {}
    for name in specs:
        rel = str(CUDA_DIR / name)
        pristine[rel] = _pristine(tree, rel, _decode((tree / rel).read_bytes()), manifest)
    by_name = {Path(rel).name: text for rel, text in pristine.items()}
    try:
        found = fit.fit(by_name, specs, features)
    except patch.PatchError as e:
        raise InstallError(f"{native_dir}: {e}") from None
    return TreeFit(tree, pristine, found, upstream_id, source, upstream.fingerprint(by_name, specs), manifest)


def check(tree: Path, **kwargs: Any) -> dict[str, Any]:
    """``install --check --json``: what install would apply and skip, and the launches the seam misses."""
    return fit_tree(tree, **kwargs).to_json()


def plan_install(
    tree: Path,
    *,
    table_path: Path | None = None,
    upstream_commit: str | None = None,
    allow_upstream_mismatch: bool = False,
    features: frozenset[str] | None = None,
    native_dir: Path = NATIVE_DIR,
    mmvq_configs: str | None = None,
    mmvq_types: str | None = None,
    mmvq_regs: str | None = None,
) -> Plan:
    """What install writes. ``mmvq_configs`` / ``mmvq_types`` / ``mmvq_regs`` (the --mmvq-configs /
    --mmvq-types / --mmvq-regs texts; None: what the tree's previous install compiled, else the registry's
    defaults) choose mmvq's candidate instances."""
    found = fit_tree(tree, upstream_commit=upstream_commit, features=features, native_dir=native_dir)
    tree = found.tree
    core = found.fit.features[registry.CORE_FEATURE]
    if core.status != fit.APPLIED:
        problems = "; ".join(found.fit.problems.get(registry.CORE_FEATURE, [core.reason or ""]))
        raise InstallError(f"{tree / CUDA_DIR}: the core seam does not fit this tree: {problems}")
    specs = load_specs(native_dir)
    targets: dict[
        str, tuple[str, str]
    ] = {}  # rel -> (pristine, patched); a file no applied edit touches: none
    for rel, pristine in found.pristine.items():
        if not found.fit.hunks[Path(rel).name]:
            continue
        try:
            targets[rel] = (pristine, patch.apply(pristine, found.fit.hunks[Path(rel).name]))
        except patch.PatchError as e:
            raise InstallError(f"{tree / rel}: the hook does not apply: {e}") from None

    previous = MmvqBuild.from_json(found.manifest.get("mmvq")) if found.manifest is not None else None
    try:
        mmvq = MmvqBuild.parse(mmvq_configs, mmvq_types, previous, mmvq_regs)
    except ValueError as e:
        raise InstallError(str(e)) from None
    sources = native_sources(native_dir)
    phash = patch_hash(sources, specs)
    info = table_info(table_path, found.fit.applied, mmvq)
    plan = Plan(tree)
    for name, status in found.fit.features.items():
        if status.status != fit.APPLIED:
            plan.messages.append(f"feature {name} skipped: {status.reason}")
    for name, n in sorted(info.dropped.items()):
        plan.messages.append(
            f"warning: {table_path}: {n} rule(s) dropped: they need feature {name}, skipped here"
        )
    if info.not_compiled:
        plan.messages.append(
            f"warning: {table_path}: {info.not_compiled} rule(s) dropped: their mmvq configuration is not"
            f" compiled for their weight type (--mmvq-configs {mmvq.configs_text()},"
            f" --mmvq-types {','.join(mmvq.types)})"
        )
    if info.upstream_commit and info.upstream_commit != found.upstream_id:
        known = upstream.KNOWN_FINGERPRINTS.get(info.upstream_commit)
        if known and known == found.fingerprint:
            plan.messages.append(
                f"{table_path}: measured on upstream {info.upstream_commit[:12]}; the tree's hooked"
                f" regions are the same (fingerprint {found.fingerprint[:12]})"
            )
        else:
            msg = (
                f"{table_path}: table measured on upstream {info.upstream_commit}, the tree is"
                f" {found.upstream_id or 'of unknown id'} and its hooked regions differ"
                f" (fingerprint {found.fingerprint[:12]}; its kernels may differ)"
            )
            if not allow_upstream_mismatch:
                raise InstallError(msg + "; pass --allow-upstream-mismatch to install it anyway")
            plan.messages.append("warning: " + msg)

    files: dict[str, bytes] = {str(CUDA_DIR / n): b for n, b in sources.items()}
    files[str(CUDA_DIR / TABLE_HEADER)] = info.header.encode("utf-8")
    files[str(CUDA_DIR / BUILD_HEADER)] = build_header(
        found.upstream_id, phash, found.fit.mask, found.fingerprint, mmvq
    ).encode("utf-8")
    added = sorted(files)
    for rel, (_, patched) in targets.items():
        files[rel] = _encode(patched)

    manifest = found.manifest
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
        "upstream_commit": found.upstream_id,
        "upstream_fingerprint": found.fingerprint,
        "patch_hash": phash,
        "table_hash": info.table_hash,
        "table_rules": info.rules,
        "features": {n: s.to_json() for n, s in found.fit.features.items()},
        "mmvq": mmvq.to_json(),
        "target": main_rel,
        "target_original_sha256": sha256_bytes(_encode(targets[main_rel][0])),
        "target_patched_sha256": sha256_bytes(_encode(targets[main_rel][1])),
        "targets": {
            rel: {
                "spec": HOOK_SPECS[Path(rel).name],
                "original_sha256": sha256_bytes(_encode(pristine)),
                "patched_sha256": sha256_bytes(_encode(patched)),
                "hunks": [h.to_json() for h in found.fit.hunks[Path(rel).name]],
            }
            for rel, (pristine, patched) in targets.items()
        },
        "files_added": added,
        "hunks": [h.to_json() for h in found.fit.hunks[TARGET]],
    }
    files[str(CUDA_DIR / MANIFEST)] = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")

    for rel, data in files.items():
        p = tree / rel
        if p.is_file() and p.read_bytes() == data:
            plan.unchanged.append(rel)
        else:
            plan.writes[rel] = data
    applied = sorted(found.fit.applied - {registry.CORE_FEATURE})
    plan.messages.append(
        f"ggml-dispatch hook in {tree} (upstream "
        f"{found.upstream_id or 'by content ' + found.fingerprint[:12]},"
        f" patch {phash[:12]}, features core+{len(applied)}/{len(registry.FEATURES) - 1}, "
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
