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

from codegen import table as tbl
from ggml_dispatch import schema
from ggml_dispatch.errors import InputError

TEMPLATE: Final = "ggml-dispatch-table.h.j2"
_SAFE: Final = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.,:;()[]{}<>+=@#%&!~^|/"
)


def c_string(value: Any) -> str:
    """A C string literal (with quotes) for ``value``; unsafe bytes as octal escapes."""
    if not isinstance(value, str):
        raise TypeError(f"c_string needs a str, got {type(value).__name__}")
    out = ['"']
    for b in value.encode("utf-8"):
        out.append(chr(b) if b in _SAFE else f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def c_int(value: Any) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"c_int needs an int, got {type(value).__name__}")
    return str(value)


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("codegen", "templates"),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["c_string"] = c_string
    env.filters["c_int"] = c_int
    return env


def _row(rule: Mapping[str, Any]) -> list[int]:
    return [
        *tbl.key_codes(rule)[:4],
        *(int(rule[f]) for f in ("N", "K", "B", "M_lo", "M_hi")),
        schema.ROUTE_CODES[schema.Route(rule["route"])],
    ]


def _class_row(rule: Mapping[str, Any]) -> list[int]:
    return [
        *tbl.key_codes(rule)[:4],
        *(int(rule[f]) for f in ("NK_lo", "NK_hi", "B", "M_lo", "M_hi")),
        schema.ROUTE_CODES[schema.Route(rule["route"])],
    ]


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
        "upstream_commit": str(t["upstream_commit"]),
        "rows": [_row(r) for r in t["rules"] if not tbl.is_class(r)],
        "class_rows": [_class_row(r) for r in t["rules"] if tbl.is_class(r)],
        "op_codes": [(o.value, c) for o, c in schema.OP_CODES.items()],
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
_ROW: Final = re.compile(r"^\s*\{ ([-\d, ]+) \},\s*$", re.M)
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
    ops = {c: o.value for o, c in schema.OP_CODES.items()}
    layouts = {c: lay.value for lay, c in schema.LAYOUT_CODES.items()}
    routes = {c: r.value for r, c in schema.ROUTE_CODES.items()}
    rules: list[dict[str, Any]] = []
    m = _RULES.search(text)
    for row in _ROW.finditer(m.group(1) if m else ""):
        v = [int(x) for x in row.group(1).split(",")]
        if len(v) != 10:
            raise InputError(path, f"rule row with {len(v)} values: {row.group(0).strip()}")
        try:
            rules.append(
                {
                    "op": ops[v[0]],
                    "layout": layouts[v[1]],
                    "src0_type": schema.GGML_TYPES_BY_ID[v[2]].name,
                    "src1_type": schema.GGML_TYPES_BY_ID[v[3]].name,
                    "N": v[4],
                    "K": v[5],
                    "B": v[6],
                    "M_lo": v[7],
                    "M_hi": v[8],
                    "route": routes[v[9]],
                }
            )
        except KeyError as e:
            raise InputError(path, f"unknown code {e} in rule row {row.group(0).strip()}") from None
    m = _CLASS_RULES.search(text)
    for row in _ROW.finditer(m.group(1) if m else ""):
        v = [int(x) for x in row.group(1).split(",")]
        if len(v) != 10:
            raise InputError(path, f"class rule row with {len(v)} values: {row.group(0).strip()}")
        try:
            rules.append(
                {
                    "op": ops[v[0]],
                    "layout": layouts[v[1]],
                    "src0_type": schema.GGML_TYPES_BY_ID[v[2]].name,
                    "src1_type": schema.GGML_TYPES_BY_ID[v[3]].name,
                    "N": 0,
                    "K": 0,
                    "NK_lo": v[4],
                    "NK_hi": v[5],
                    "B": v[6],
                    "M_lo": v[7],
                    "M_hi": v[8],
                    "route": routes[v[9]],
                }
            )
        except KeyError as e:
            raise InputError(path, f"unknown code {e} in class rule row {row.group(0).strip()}") from None
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
