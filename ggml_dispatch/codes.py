"""The registry (``ggml_dispatch/registry.py``) -> ``ggml-dispatch-codes.h`` (jinja2). Pure.
Core, not the hook's: the tuner harness, codegen's table header (its C filters) and install all emit the
registry through it.

Install writes the header into the tree beside the other native files; the harness build writes the
same text into its build folder. The C filters refuse anything but their type, and every string goes
out as a C literal with unsafe bytes octal-escaped (so a name can end neither a literal nor a comment).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any, Final

import jinja2

from ggml_dispatch import registry as reg

CODES_HEADER: Final = "ggml-dispatch-codes.h"
TEMPLATE: Final = CODES_HEADER + ".j2"
# the template lives beside the hook sources that include the header it renders
TEMPLATE_DIR: Final = Path(__file__).resolve().parent / "hook" / "native"
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


def c_template_env(loader: jinja2.BaseLoader) -> jinja2.Environment:
    """A jinja2 environment for generated C: no escaping, undefined names fail, the C literal filters."""
    env = jinja2.Environment(
        loader=loader,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["c_string"] = c_string
    env.filters["c_int"] = c_int
    return env


@cache
def _env() -> jinja2.Environment:
    return c_template_env(jinja2.FileSystemLoader(str(TEMPLATE_DIR)))


def registry_context() -> dict[str, Any]:
    """Everything the header spells, as plain data (also hashed into GGML_DISPATCH_REGISTRY_SHA256)."""
    ops = [
        {
            "name": s.op.value,
            "code": s.code,
            "ggml_op": s.ggml_op,
            "type_fields": list(s.key.TYPE_FIELDS),
            "int_fields": list(s.key.INT_FIELDS),
            "default_mask": s.default_mask,
        }
        for s in sorted(reg.OPS.values(), key=lambda s: s.code)
    ]
    routes = [
        {
            "name": s.route.value,
            "code": s.code,
            "op_mask": sum(1 << reg.OP_CODES[o] for o in s.ops),
            "feature_mask": 1 << reg.FEATURES[s.feature].bit,
        }
        for s in sorted(reg.ROUTES.values(), key=lambda s: s.code)
    ]
    params = []
    for s in sorted(reg.ROUTES.values(), key=lambda s: s.code):
        for p, shift in zip(s.params, reg.param_shifts(s), strict=True):
            params.append(
                {
                    "route": s.route.value,
                    "code": s.code,
                    "name": p.name,
                    "shift": shift,
                    "bits": p.bits,
                    "legal": list(p.values),
                    "op_mask": sum(1 << reg.OP_CODES[o] for o in (p.ops or s.ops)),
                    "feature_mask": 1 << reg.FEATURES[p.feature].bit,
                }
            )
    longest = max(
        len(s.route.value) + sum(len(p.name) + 2 + max(len(v) for v in p.values) for p in s.params)
        for s in reg.ROUTES.values()
    )
    return {
        "ops": ops,
        "key_slots": reg.KEY_SLOTS,
        "layouts": [
            {"name": lay.value, "code": c} for lay, c in sorted(reg.LAYOUT_CODES.items(), key=lambda x: x[1])
        ],
        "fused": [
            {"name": f.value, "code": c} for f, c in sorted(reg.FUSED_CODES.items(), key=lambda x: x[1])
        ],
        "reasons": list(reg.REASONS),
        "features": [{"name": f.name, "bit": f.bit, "doc": f.doc} for f in reg.FEATURES.values()],
        "whys": [{"name": n, "doc": d} for n, d in reg.INELIGIBLE.items()],
        "routes": routes,
        "route_count": reg.ROUTE_COUNT,
        "trace_routes": [
            {"name": n, "code": reg.TRACE_ROUTE_CODES[n], "doc": doc}
            for n, doc in reg.TRACE_ONLY_ROUTES.items()
        ],
        "trace_route_count": len(reg.TRACE_ROUTE_CODES) + 1,
        "all_route_names": reg.route_names_by_code(),
        "route_bits": reg.ROUTE_CODE_BITS,
        "route_mask": reg.ROUTE_CODE_MASK,
        "params": params,
        "mmq_fused_j": list(reg.MMQ_FUSED_J),
        "mmvq_configs": [
            {"index": i + 1, "nwarps": w, "rows": r, "regs": g}
            for i, (w, r, g) in enumerate(reg.MMVQ_CANDIDATES)
        ],
        "mmvq_regs": list(reg.MMVQ_REGS),
        "mmvq_default_regs": ",".join(map(str, reg.MMVQ_DEFAULT_REGS)),
        "mmvq_max_cols": reg.MMVQ_MAX_COLS,
        "mmvq_warp_size": reg.MMVQ_WARP_SIZE,
        "mmvq_types": [{"id": reg.GGML_TYPES[t].id, "name": t} for t in reg.MMVQ_TYPES],
        "mmvq_default_configs": ",".join(reg.mmvq_pair_text(p) for p in reg.MMVQ_DEFAULT_CONFIGS),
        "mmvq_default_types": ",".join(reg.MMVQ_DEFAULT_TYPES),
        "max_values": max((len(p["legal"]) for p in params), default=1),  # type: ignore[arg-type]
        "max_config_len": max(longest, len("stock")),
    }


def registry_sha256() -> str:
    return hashlib.sha256(json.dumps(registry_context(), sort_keys=True).encode()).hexdigest()


def render_codes_header() -> str:
    ctx = registry_context()
    return _env().get_template(TEMPLATE).render(**ctx, registry_sha256=registry_sha256())


def write_codes_header(folder: Path) -> Path:
    """Writes ``ggml-dispatch-codes.h`` into ``folder`` (created if needed; same text: not rewritten)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CODES_HEADER
    text = render_codes_header()
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path


if (
    __name__ == "__main__"
):  # python -m ggml_dispatch.codes FOLDER (the harness CMake project without tuner/build.py)
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m ggml_dispatch.codes FOLDER")
    print(write_codes_header(Path(sys.argv[1])))
