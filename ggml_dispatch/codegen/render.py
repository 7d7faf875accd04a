"""table.json -> ``ggml-dispatch-table.h`` (jinja2). Pure. Reading a header back into a table dict (for
``diff``) is the table reader's, ``ggml_dispatch.artifacts.table.parse_header``.

The jinja2 environment has autoescape off (this is C, not HTML) and undefined variables are errors.
Nothing from data reaches the template unfiltered: integers pass ``c_int`` (which refuses anything but an
int) and strings pass ``c_string``, which writes every byte outside a small safe set as a three-digit
octal escape -- so quotes, backslashes, ``?`` (trigraphs), ``*/``, control characters and non-ASCII can
neither end the literal nor a comment, and an escape can never swallow a following digit.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, Final

import jinja2

from ggml_dispatch import codes, registry, schema
from ggml_dispatch.artifacts.table import Rule, TypedTable, c_unescape, parse_header, parse_rule, parse_table
from ggml_dispatch.codegen import kv_shadow
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.codes import c_int, c_string

__all__ = ["c_int", "c_string", "c_unescape", "parse_header", "render_header"]

TEMPLATE: Final = "ggml-dispatch-table.h.j2"


@cache
def _env() -> jinja2.Environment:
    return codes.c_template_env(jinja2.PackageLoader("ggml_dispatch.codegen", "templates"))


def _row(rule: Rule) -> dict[str, Any]:
    codes = rule.codes()
    if rule.kind is not None and rule.kind not in tbl.RULE_KINDS:  # validated, so safe in a comment
        raise AssertionError(f"rule kind {rule.kind!r}")
    row = {
        "head": list(codes[:4]),
        "k": list(codes[4:]),
        "M_lo": rule.M_lo,
        "M_hi": rule.M_hi,
        "config": rule.config.code,
        "kind": rule.kind,
    }
    if rule.NK is not None:
        row["NK_lo"], row["NK_hi"] = rule.NK
    return row


def render_header(table: Mapping[str, Any] | TypedTable) -> str:
    """The C header for ``table``: a table dict (validated and typed first) or a table already typed by
    the reader (``artifacts.table.parse_table``: its configurations are not parsed again). ``empty_table()``
    renders the 'no table' header."""
    typed = table if isinstance(table, TypedTable) else parse_table(tbl.canonicalize(table))
    t = typed.data
    rules = sorted(typed.rules, key=lambda r: (*r.codes(), *(r.NK or (0, 0)), r.M_lo))  # canonical order
    fallback = [
        parse_rule(r, None, f"cache.fallback[{i}]")
        for i, r in enumerate(t.get("cache", {}).get("fallback", []))
    ]
    prov = t["provenance"]
    ctx = {
        "layout_version": int(t["layout_version"]),
        "rule_count": len(t["rules"]),
        "gpu_cc": int(t["gpu"]["cc"]),
        "gpu_sm_count": int(t["gpu"]["sm_count"]),
        "gpu_name": str(t["gpu"]["name"]),
        "schema": str(t["schema"]),
        "source": str(prov["source"]),
        "tool_version": str(prov.get("tool_version") or schema.TOOL_VERSION),
        "table_hash": tbl.table_hash(t),
        "tuning_sha256": str(prov.get("tuning_sha256") or ""),
        "vram_budget_bytes": int(t["vram"]["budget_bytes"]) if "vram" in t else 0,
        "vram_planned_bytes": int(t["vram"]["planned_bytes"]) if "vram" in t else 0,
        "cache_budget_bytes": int(t["cache"]["budget_bytes"]) if "cache" in t else 0,
        "kv_shadow_budget_bytes": kv_shadow.budget_bytes(t),
        "fallback_rows": [_row(r) for r in fallback],
        "upstream_commit": str(t["upstream_commit"]),
        "rows": [_row(r) for r in rules if not r.is_class],
        "class_rows": [_row(r) for r in rules if r.is_class],
        "op_codes": [(o.value, c) for o, c in schema.OP_CODES.items()],
        "key_slots": registry.KEY_SLOTS,
        "key_slots_doc": [
            (
                s.op.value,
                ", ".join(
                    [f"type0 = {s.key.TYPE_FIELDS[0]}", f"type1 = {s.key.TYPE_FIELDS[1]}"]
                    + [f"k[{i}] = {f}" for i, f in enumerate(s.key.INT_FIELDS)]
                ),
            )
            for s in sorted(registry.OPS.values(), key=lambda s: s.code)
        ],
        "default_masks": [s.default_mask for s in sorted(registry.OPS.values(), key=lambda s: s.code)],
        "layout_codes": [(lay.value, c) for lay, c in schema.LAYOUT_CODES.items()],
        "route_codes": [(r.value, c) for r, c in schema.ROUTE_CODES.items()],
    }
    return _env().get_template(TEMPLATE).render(**ctx)
