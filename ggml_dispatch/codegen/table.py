"""Building ``table.json`` from ``codegen.decide.Decisions``. The format itself (canonical text, validation,
loading, the Python lookup the C header mirrors) is the core's ``ggml_dispatch.artifacts.table``, which
every stage reads tables with; its names are re-exported here for codegen's own modules. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ggml_dispatch import schema
from ggml_dispatch.artifacts.table import (
    CLASS_FIELDS,
    DECISION_PARAMS,
    EVIDENCE_FIELDS,
    GPU_KEYS,
    HEADER_FILENAME,
    KEY_FIELDS,
    LEGACY_KINDS,
    RATIO_STATISTIC,
    RULE_FIELDS,
    RULE_KINDS,
    SOURCE_DECLARED,
    SOURCE_NONE,
    TABLE_FILENAME,
    TABLE_KEYS,
    UPGRADABLE_LAYOUT_VERSIONS,
    VRAM_KINDS,
    Rule,
    TypedTable,
    canonicalize,
    class_codes,
    class_fields,
    core_rules,
    dumps,
    empty_table,
    gpu_matches,
    is_class,
    key_codes,
    key_size,
    load,
    load_typed,
    loads,
    lookup,
    lookup_config,
    lookup_key,
    lookup_measured,
    lookup_measured_config,
    parse_rule,
    parse_table,
    refusal_sort_key,
    rule_config,
    rule_fields,
    rule_kind,
    rule_label,
    rule_sort_key,
    rule_typed_config,
    table_gpu,
    table_hash,
    upgrade,
    validate,
)

__all__ = [
    "CLASS_FIELDS",
    "DECISION_PARAMS",
    "EVIDENCE_FIELDS",
    "GPU_KEYS",
    "HEADER_FILENAME",
    "KEY_FIELDS",
    "LEGACY_KINDS",
    "RATIO_STATISTIC",
    "RULE_FIELDS",
    "RULE_KINDS",
    "SOURCE_DECLARED",
    "SOURCE_NONE",
    "TABLE_FILENAME",
    "TABLE_KEYS",
    "UPGRADABLE_LAYOUT_VERSIONS",
    "VRAM_KINDS",
    "Rule",
    "TypedTable",
    "build_table",
    "canonicalize",
    "class_codes",
    "class_fields",
    "core_rules",
    "dumps",
    "empty_table",
    "gpu_matches",
    "inputs_sha256",
    "is_class",
    "key_codes",
    "key_size",
    "load",
    "load_typed",
    "loads",
    "lookup",
    "lookup_config",
    "lookup_key",
    "lookup_measured",
    "lookup_measured_config",
    "parse_rule",
    "parse_table",
    "refusal_sort_key",
    "rule_config",
    "rule_fields",
    "rule_kind",
    "rule_label",
    "rule_sort_key",
    "rule_typed_config",
    "table_gpu",
    "table_hash",
    "upgrade",
    "validate",
]


def inputs_sha256(hashes: Sequence[str]) -> str:
    """The sha256 a table names for its tuning (or census) input: the file's own for one file; for several,
    the sha256 of their sha256s, one per line in the order given (the files are listed beside it)."""
    if len(hashes) == 1:
        return hashes[0]
    return hashlib.sha256("".join(f"{h}\n" for h in hashes).encode()).hexdigest()


def build_table(
    decisions: Any,
    *,
    tuning_sha256: str,
    census_sha256: str | None = None,
    tuning_files: Sequence[tuple[str, str]] | None = None,
    census_files: Sequence[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """``codegen.decide.Decisions`` -> table dict (not yet canonical text). Several input files: each
    one's name and sha256 under ``tuning_files`` / ``census_files``."""
    ident = decisions.identity
    p = decisions.params
    prov: dict[str, Any] = {
        "source": ident.source,
        "tool": schema.TOOL_NAME,
        "tool_version": schema.TOOL_VERSION,
        "tuning_sha256": tuning_sha256,
        "census_sha256": census_sha256,
        **({"tuning_files": [{"name": n, "sha256": h} for n, h in tuning_files]} if tuning_files else {}),
        **({"census_files": [{"name": n, "sha256": h} for n, h in census_files]} if census_files else {}),
        "patch_hashes": ident.patch_hashes,
        "harness_versions": ident.harness_versions,
        "drivers": ident.drivers,
        "cuda_versions": ident.cuda_versions,
        "cublas_versions": ident.cublas_versions,
        "rows": decisions.n_rows,
        "ok_rows": decisions.n_ok,
        "decision": {
            **{key: getattr(p, attr) for key, attr in DECISION_PARAMS.items()},
            "ratio_statistic": RATIO_STATISTIC,
            # only when asked, so tables decided over every op keep their bytes (and hashes)
            **({"ops": list(p.ops)} if p.ops is not None else {}),
        },
        "mixed": None,
    }
    if ident.mixed:
        prov["mixed"] = {
            "gpus": [{"name": g.name, "cc": g.cc, "sm_count": g.sm_count, "rows": n} for g, n in ident.gpus],
            "upstream_commits": [{"commit": c, "rows": n} for c, n in ident.upstream_commits],
        }
    rules = []
    for r in decisions.rules:
        row = {
            **r.key.as_dict(),
            "M_lo": r.M_lo,
            "M_hi": r.M_hi,
            **r.route.fields(),
            "kind": r.kind,
            "measured_M": list(r.measured_M),
            "min_ratio": r.min_ratio,
        }
        if r.shapes:
            row["shapes"] = [list(s) for s in r.shapes]
        if r.shape_types:
            row["shape_types"] = list(r.shape_types)
        if r.NK is not None:
            row["NK_lo"], row["NK_hi"] = r.NK
        if r.buckets:
            row["buckets"] = {name: ratio for name, ratio in r.buckets}
        if r.between is not None:
            row["between"] = list(r.between)
            row["ci_low"] = r.ci_low
            row["crossover"] = list(r.crossover) if r.crossover is not None else None
        rules.append(row)
    refused = [
        {
            **f.key.as_dict(),
            "M": f.M,
            **f.route.fields(),
            "kind": f.kind,
            "reason": f.reason,
        }
        for f in decisions.refusals
    ]
    table = {
        "schema": schema.TABLE_SCHEMA,
        "layout_version": schema.TABLE_LAYOUT_VERSION,
        "gpu": {"name": ident.gpu.name, "cc": ident.gpu.cc, "sm_count": ident.gpu.sm_count},
        "upstream_commit": ident.upstream_commit,
        "provenance": prov,
        "rules": rules,
        "refused": refused,
    }
    if decisions.routing_buckets:  # MUL_MAT_ID: per point and routing bucket, the winner (codegen.moe)
        table["routing_buckets"] = [p.as_dict() for p in decisions.routing_buckets]
    return validate(canonicalize(table))
