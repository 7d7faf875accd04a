"""table.json -> ``ggml-dispatch-table.h`` (jinja2), and a header back -> table dict (for ``diff``). Pure.

The jinja2 environment has autoescape off (this is C, not HTML) and undefined variables are errors.
Nothing from data reaches the template unfiltered: integers pass ``c_int`` (which refuses anything but an
int) and strings pass ``c_string``, which writes every byte outside a small safe set as a three-digit
octal escape -- so quotes, backslashes, ``?`` (trigraphs), ``*/``, control characters and non-ASCII can
neither end the literal nor a comment, and an escape can never swallow a following digit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

import jinja2

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import kv_shadow
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError
from ggml_dispatch.hook.codes import c_int, c_string

__all__ = ["c_int", "c_string", "c_unescape", "parse_header", "render_header"]

TEMPLATE: Final = "ggml-dispatch-table.h.j2"


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ggml_dispatch.codegen", "templates"),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["c_string"] = c_string
    env.filters["c_int"] = c_int
    return env


def _kind(rule: Mapping[str, Any]) -> str | None:
    """The rule's kind for the row comment (validated to one of table.RULE_KINDS, so safe in a comment)."""
    kind = tbl.rule_kind(rule)
    if kind is not None and kind not in tbl.RULE_KINDS:
        raise AssertionError(f"rule kind {kind!r}")
    return kind


def _row(rule: Mapping[str, Any]) -> dict[str, Any]:
    codes = tbl.key_codes(rule)
    config = registry.Config.parse(tbl.rule_config(rule))
    row = {
        "head": list(codes[:4]),
        "k": list(codes[4:]),
        "M_lo": int(rule["M_lo"]),
        "M_hi": int(rule["M_hi"]),
        "config": config.code,
        "kind": _kind(rule),
    }
    if tbl.is_class(rule):
        row["NK_lo"], row["NK_hi"] = (int(rule[f]) for f in tbl.CLASS_FIELDS)
    return row


def render_header(table: Mapping[str, Any]) -> str:
    """The C header for ``table`` (validated first). ``empty_table()`` renders the 'no table' header."""
    t = tbl.validate(tbl.canonicalize(table))
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
        "fallback_rows": [_row(r) for r in t.get("cache", {}).get("fallback", [])],
        "upstream_commit": str(t["upstream_commit"]),
        "rows": [_row(r) for r in t["rules"] if not tbl.is_class(r)],
        "class_rows": [_row(r) for r in t["rules"] if tbl.is_class(r)],
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


# --------------------------------------------------------------------------------------------
# Parsing a rendered header back (only headers this module renders)

_DEFINE_INT: Final = re.compile(r"^#define (GGML_DISPATCH_TABLE_[A-Z0-9_]+) (-?\d+)\s*$", re.M)
_DEFINE_STR: Final = re.compile(r'^#define (GGML_DISPATCH_TABLE_[A-Z0-9_]+) ("(?:[^"\\\n]|\\.)*")\s*$', re.M)
_STATIC_STR: Final = re.compile(
    r'^static const char (ggml_dispatch_table_[a-z_]+)\[\] = ("(?:[^"\\\n]|\\.)*");$', re.M
)
_RULES: Final = re.compile(
    r"ggml_dispatch_table_rules\[GGML_DISPATCH_TABLE_(?:KEY_)?RULE_COUNT\] = \{(.*?)\n\};", re.S
)
_CLASS_RULES: Final = re.compile(
    r"ggml_dispatch_table_class_rules\[GGML_DISPATCH_TABLE_CLASS_RULE_COUNT\] = \{(.*?)\n\};", re.S
)
_KIND_COMMENT: Final = r"(?: /\* ([a-z]+) \*/)?"
_ROW: Final = re.compile(
    r"^\s*\{ (-?\d+), (-?\d+), (-?\d+), (-?\d+), \{ ([-\d, ]+) \}, (-?\d+), (-?\d+), (-?\d+) \},"
    + _KIND_COMMENT
    + r"\s*$",
    re.M,
)
_CLASS_ROW: Final = re.compile(
    r"^\s*\{ (-?\d+), (-?\d+), (-?\d+), (-?\d+), \{ ([-\d, ]+) \}, (-?\d+), (-?\d+), (-?\d+), (-?\d+), "
    r"(-?\d+) \}," + _KIND_COMMENT + r"\s*$",
    re.M,
)
_ESCAPE: Final = re.compile(rb"\\([0-7]{1,3}|x[0-9a-fA-F]+|.)", re.S)
_SIMPLE: Final = {
    b"n": b"\n",
    b"t": b"\t",
    b"r": b"\r",
    b"\\": b"\\",
    b'"': b'"',
    b"'": b"'",
    b"?": b"?",
    b"0": b"\0",
}


def c_unescape(literal: str) -> str:
    """Inverse of :func:`c_string` (also takes the usual simple escapes)."""
    body = literal[1:-1].encode("ascii", "strict")

    def sub(m: re.Match[bytes]) -> bytes:
        e = m.group(1)
        if e[:1].isdigit() and all(c in b"01234567" for c in e):
            return bytes([int(e, 8) & 0xFF])
        if e[:1] == b"x":
            return bytes([int(e[1:], 16) & 0xFF])
        return _SIMPLE.get(e, e)

    return _ESCAPE.sub(sub, body).decode("utf-8")


def _parse_rows(body: str, pattern: re.Pattern[str], what: str, path: str | None) -> list[dict[str, Any]]:
    """Rule rows of one array: (op, layout, type0, type1, {k}, [NK_lo, NK_hi,] M_lo, M_hi, config) and the
    kind comment."""
    ops = {s.code: s for s in registry.OPS.values()}
    layouts = {c: lay.value for lay, c in schema.LAYOUT_CODES.items()}
    n_rows = sum(1 for line in body.splitlines() if line.strip().startswith("{"))
    found = list(pattern.finditer(body))
    if len(found) != n_rows:
        raise InputError(path, f"{n_rows - len(found)} {what} rows are not in the layout this tool reads")
    rules = []
    for row in found:
        g = row.groups()
        head = [int(x) for x in g[:4]]
        k = [int(x) for x in g[4].split(",")]
        ints = [int(x) for x in g[5:-1]]
        kind = g[-1]
        if len(k) != registry.KEY_SLOTS:
            raise InputError(path, f"{what} row with {len(k)} key slots: {row.group(0).strip()}")
        try:
            spec = ops[head[0]]
            key = spec.key
            config = registry.Config.from_code(ints[-1])
            rule: dict[str, Any] = {
                "op": spec.op.value,
                "layout": layouts[head[1]],
                key.TYPE_FIELDS[0]: schema.GGML_TYPES_BY_ID[head[2]].name,
                key.TYPE_FIELDS[1]: schema.GGML_TYPES_BY_ID[head[3]].name,
                **dict(zip(key.INT_FIELDS, k, strict=False)),
                **(dict(zip(tbl.CLASS_FIELDS, ints[:2], strict=True)) if len(ints) == 5 else {}),
                "M_lo": ints[-3],
                "M_hi": ints[-2],
                "config": str(config),
                "route": config.route.value,
            }
        except (KeyError, registry.ConfigError) as e:
            raise InputError(path, f"unknown code {e} in {what} row {row.group(0).strip()}") from None
        if kind is not None:
            rule["kind"] = kind
        rules.append(rule)
    return rules


def parse_header(text: str, path: str | None = None) -> tuple[dict[str, Any], str]:
    """A header rendered by :func:`render_header` -> (table dict with the runtime fields, embedded hash)."""
    ints = {m[1]: int(m[2]) for m in _DEFINE_INT.finditer(text)}
    strs = {m[1]: c_unescape(m[2]) for m in _DEFINE_STR.finditer(text)}
    statics = {m[1]: c_unescape(m[2]) for m in _STATIC_STR.finditer(text)}
    needed = (
        "GGML_DISPATCH_TABLE_LAYOUT_VERSION",
        "GGML_DISPATCH_TABLE_RULE_COUNT",
        "GGML_DISPATCH_TABLE_GPU_CC",
        "GGML_DISPATCH_TABLE_GPU_SM_COUNT",
    )
    if any(n not in ints for n in needed) or "ggml_dispatch_table_hash" not in statics:
        raise InputError(path, "not a header rendered by ggml-dispatch codegen (provenance block not found)")
    if ints["GGML_DISPATCH_TABLE_LAYOUT_VERSION"] != schema.TABLE_LAYOUT_VERSION:
        raise InputError(
            path,
            f"table layout version {ints['GGML_DISPATCH_TABLE_LAYOUT_VERSION']} is not known to this tool "
            f"(it knows {schema.TABLE_LAYOUT_VERSION})",
            field="GGML_DISPATCH_TABLE_LAYOUT_VERSION",
        )
    rules: list[dict[str, Any]] = []
    m = _RULES.search(text)
    rules += _parse_rows(m.group(1) if m else "", _ROW, "rule", path)
    m = _CLASS_RULES.search(text)
    rules += _parse_rows(m.group(1) if m else "", _CLASS_ROW, "class rule", path)
    if len(rules) != ints["GGML_DISPATCH_TABLE_RULE_COUNT"]:
        raise InputError(
            path,
            f"RULE_COUNT says {ints['GGML_DISPATCH_TABLE_RULE_COUNT']} but {len(rules)} rule rows were found",
        )
    table = {
        "schema": strs.get("GGML_DISPATCH_TABLE_SCHEMA", schema.TABLE_SCHEMA),
        "layout_version": ints["GGML_DISPATCH_TABLE_LAYOUT_VERSION"],
        "gpu": {
            "name": statics.get("ggml_dispatch_table_gpu_name", ""),
            "cc": ints["GGML_DISPATCH_TABLE_GPU_CC"],
            "sm_count": ints["GGML_DISPATCH_TABLE_GPU_SM_COUNT"],
        },
        "upstream_commit": statics.get("ggml_dispatch_table_upstream_commit", ""),
        "provenance": {
            "source": strs.get("GGML_DISPATCH_TABLE_SOURCE", tbl.SOURCE_NONE),
            "tool_version": strs.get("GGML_DISPATCH_TABLE_TOOL_VERSION"),
            "tuning_sha256": strs.get("GGML_DISPATCH_TABLE_TUNING_SHA256") or None,
        },
        "rules": rules,
        "refused": [],
    }
    return tbl.validate(table, path), statics["ggml_dispatch_table_hash"]
