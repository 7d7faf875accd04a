"""What a census says: top shapes by estimated time, quant histogram, coverage (text or JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ggml_dispatch import schema
from ggml_dispatch.text import printable

COVERAGE_LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)
SHAPE_COLUMNS = (
    "op",
    "layout",
    "fused",
    "src0_type",
    "src1_type",
    "M",
    "N",
    "K",
    "B",
    "E",
    "U",
    "route",
    "stock_route",
)
_GPU_COLUMNS = ("gpu_name", "gpu_cc", "gpu_sm_count")


def _weight_bytes(r: Mapping[str, Any]) -> int:
    t = schema.ggml_type(r["src0_type"]) if r["src0_type"] in schema.GGML_TYPES else None
    if t is None:
        return 0
    return t.row_bytes(int(r["K"])) * int(r["N"]) * int(r["E"])


def _shapes(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[c] for c in SHAPE_COLUMNS)
        g = groups.get(k)
        if g is None:
            g = groups[k] = {c: r[c] for c in SHAPE_COLUMNS}
            g.update(calls=0, est_us=0.0, roles=set(), tensors=0, est_kinds=set(), example=r["tensor"])
        g["calls"] += r["calls"]
        g["est_us"] += r["est_us"]
        g["roles"].add(r["role"])
        g["tensors"] += 1
        g["est_kinds"].add(r["est_kind"])
    out = sorted(
        groups.values(),
        key=lambda g: (-g["est_us"], *(("" if g[c] is None else str(g[c])) for c in SHAPE_COLUMNS)),
    )
    for g in out:
        g["roles"] = sorted(g["roles"])
        g["est_kind"] = g["est_kinds"].pop() if len(g["est_kinds"]) == 1 else "mixed"
        del g["est_kinds"]
    return out


def _coverage(values: Sequence[float], total: float) -> dict[str, int]:
    """How many of the (sorted, largest first) entries it takes to reach each share of the total."""
    need: dict[str, int] = {}
    acc = 0.0
    i = 0
    for level in COVERAGE_LEVELS:
        while i < len(values) and (total <= 0 or acc < level * total - 1e-12 * total):
            acc += values[i]
            i += 1
        need[f"{round(level * 100)}%"] = i if total > 0 else 0
    return need


def _quant(rows: Iterable[Mapping[str, Any]], total_est: float) -> list[dict[str, Any]]:
    hist: dict[str, dict[str, Any]] = {}
    seen: dict[str, set[str]] = {}  # tensors counted per label
    for r in rows:
        kv = r["layout"] == schema.Layout.ATTENTION
        label = f"{r['src0_type']} (KV cache)" if kv else r["src0_type"]
        h = hist.setdefault(
            label, {"type": label, "tensors": 0, "weight_bytes": 0, "calls": 0, "est_us": 0.0}
        )
        h["calls"] += r["calls"]
        h["est_us"] += r["est_us"]
        counted = seen.setdefault(label, set())
        if not kv and r["tensor"] not in counted:
            counted.add(r["tensor"])
            h["tensors"] += 1
            h["weight_bytes"] += _weight_bytes(r)
    wtotal = sum(h["weight_bytes"] for h in hist.values())
    out = sorted(hist.values(), key=lambda h: (-h["est_us"], h["type"]))
    for h in out:
        h["weight_share"] = h["weight_bytes"] / wtotal if wtotal else 0.0
        h["est_share"] = h["est_us"] / total_est if total_est else 0.0
    return out


_BATCH_ROWS = 8192  # rows turned into dicts at a time: a census can have millions of rows


def _rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` as dicts, a batch at a time (never all of them at once)."""
    for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
        yield from batch.to_pylist()


def _gpu_rows(table: pa.Table, gkey: tuple[Any, ...]) -> Callable[[], Iterator[dict[str, Any]]]:
    """A re-iterable view of the rows of one GPU, in table order."""
    mask = None
    for c, v in zip(_GPU_COLUMNS, gkey, strict=True):
        m = pc.is_null(table[c]) if v is None else pc.equal(table[c], v)
        mask = m if mask is None else pc.and_(mask, m)
    sub = table.filter(pc.fill_null(mask, False)) if mask is not None else table
    return lambda: _rows(sub)


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    return v


def to_json(rep: Mapping[str, Any]) -> str:
    """The report as strict JSON: a value that is not a finite number is written as null, never as
    Infinity or NaN (which no JSON parser has to accept)."""
    return json.dumps(_json_safe(dict(rep)), indent=2, sort_keys=True, allow_nan=False)


def report(table: pa.Table, meta: Mapping[str, Any], path: str, top: int = 20) -> dict[str, Any]:
    """Everything ``census show`` prints, as plain data (the JSON output)."""
    gkeys: list[tuple[Any, ...]] = []
    for r in (
        table.select(list(_GPU_COLUMNS))
        .group_by(list(_GPU_COLUMNS), use_threads=False)
        .aggregate([])
        .to_pylist()
    ):
        gkeys.append(tuple(r[c] for c in _GPU_COLUMNS))
    views = {g: _gpu_rows(table, g) if len(gkeys) > 1 else (lambda: _rows(table)) for g in gkeys}
    totals = {g: sum(r["est_us"] for r in views[g]()) for g in gkeys}
    specs = {
        (s.get("name"), s.get("cc"), s.get("sm_count")): s for s in meta.get(schema.META_GPU_SPECS) or []
    }
    gpus = []
    for gkey in sorted(gkeys, key=lambda k: (-totals[k], k)):
        total_est = totals[gkey]
        n_rows = 0
        total_calls = 0
        kinds: dict[str, int] = {}
        for r in views[gkey]():
            n_rows += 1
            total_calls += r["calls"]
            kinds[r["est_kind"]] = kinds.get(r["est_kind"], 0) + 1
        shapes = _shapes(views[gkey]())
        acc = 0.0
        for rank, s in enumerate(shapes, 1):
            acc += s["est_us"]
            s["rank"] = rank
            s["share"] = s["est_us"] / total_est if total_est else 0.0
            s["cum_share"] = acc / total_est if total_est else 0.0
        by_calls = sorted((s["calls"] for s in shapes), reverse=True)
        gpus.append(
            {
                "gpu": {"name": gkey[0], "cc": gkey[1], "sm_count": gkey[2]},
                "spec": specs.get(gkey),
                "rows": n_rows,
                "calls": total_calls,
                "est_us": total_est,
                "est_kinds": kinds,
                "shape_count": len(shapes),
                "top": shapes[:top],
                "coverage": {
                    "by_est_us": _coverage([s["est_us"] for s in shapes], total_est),
                    "by_calls": _coverage(by_calls, float(total_calls)),
                },
                "quant": _quant(views[gkey](), total_est),
            }
        )
    sources = sorted(s for s in pc.unique(table["source"]).to_pylist() if s is not None)
    return {
        "file": path,
        "schema": meta.get(schema.META_SCHEMA),
        "tool_version": meta.get(schema.META_TOOL_VERSION),
        "created": meta.get(schema.META_CREATED),
        "source": sources,
        "upstream_commit": meta.get(schema.META_UPSTREAM_COMMIT) or None,
        "inputs": meta.get(schema.META_INPUT_HASHES) or {},
        "ggufs": meta.get(schema.META_GGUF_HASHES) or {},
        "declared": meta.get(schema.META_DECLARED),
        "warnings": meta.get(schema.META_WARNINGS) or [],
        "gguf_unseen": meta.get(schema.META_GGUF_UNSEEN) or {},
        "rows": table.num_rows,
        "gpus": gpus,
    }


# --------------------------------------------------------------------------------------------
# Text


def safe(s: object, width: int = 0) -> str:
    """A string from a trace or GGUF file, fit for a terminal: control characters escaped, long cut."""
    return printable(s, width)


def _fmt_table(header: Sequence[str], body: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [
        max(len(header[i]), *(len(r[i]) for r in body)) if body else len(header[i])
        for i in range(len(header))
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    return [line(header), *(line(r) for r in body)]


def _us(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"  # a sum past the float range
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _mib(b: int) -> str:
    return f"{b / (1 << 20):,.1f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}" if math.isfinite(x) else "n/a"


def render_text(rep: Mapping[str, Any], top: int = 20) -> str:
    out: list[str] = []
    src = ",".join(rep["source"]) or "-"
    out.append(f"census {safe(rep['file'])}")
    out.append(
        f"  schema {rep['schema']}, tool {rep['tool_version']}, source {src}, {rep['rows']} rows"
        + (f", upstream {safe(rep['upstream_commit'])[:12]}" if rep.get("upstream_commit") else "")
    )
    for p, h in sorted(rep["inputs"].items()):
        out.append(f"  input {safe(p)}  sha256 {h[:16]}")
    for p, h in sorted(rep["ggufs"].items()):
        out.append(f"  gguf  {safe(p)}  sha256 {h[:16]}")
    if rep.get("declared"):
        d = rep["declared"]
        kv = (
            f", attention over {d['n_kv']} of {d.get('n_ctx')} {d.get('kv_type')} KV cells"
            if d.get("n_kv")
            else ""
        )
        out.append(f"  declared workload: M = {d.get('M')}, LM head at M = {d.get('output_rows')}{kv}")
    if rep["warnings"]:
        out.append(
            f"  {len(rep['warnings'])} warning(s) while ingesting, e.g. {safe(rep['warnings'][0], 160)}"
        )
    for g in rep["gpus"]:
        gpu = g["gpu"]
        out.append("")
        out.append(f"GPU {safe(gpu['name'])} (cc {gpu['cc']}, {gpu['sm_count']} SMs)")
        spec = g.get("spec")
        kinds = ", ".join(f"{k} {v} rows" for k, v in sorted(g["est_kinds"].items()))
        if spec:
            out.append(
                f"  est_us: {kinds}; roofline from {safe(spec['source'])}: "
                f"{spec['hbm_gbs']:,.0f} GB/s, {spec['tensor_tflops']:,.0f} TFLOP/s"
            )
        else:
            out.append(f"  est_us: {kinds}")
        out.append(
            f"  {g['rows']} rows, {g['shape_count']} distinct shapes, {g['calls']:,} calls, "
            f"estimated {_us(g['est_us'])} us in all"
        )
        out.append("")
        out.append(f"  top {min(top, g['shape_count'])} shapes by estimated time")
        header = [
            "#",
            "op",
            "layout",
            "fused",
            "types",
            "M",
            "N",
            "K",
            "B",
            "E/U",
            "roles",
            "route",
            "stock",
            "calls",
            "est_us",
            "share%",
            "cum%",
        ]
        body = []
        for s in g["top"][:top]:
            body.append(
                [
                    str(s["rank"]),
                    s["op"],
                    s["layout"],
                    s["fused"] or "-",
                    f"{s['src0_type']}/{s['src1_type']}",
                    str(s["M"]),
                    str(s["N"]),
                    str(s["K"]),
                    str(s["B"]),
                    f"{s['E']}/{s['U']}" if s["op"] == schema.Op.MUL_MAT_ID else "-",
                    safe(",".join(s["roles"]) + (f" ({s['example']})" if "other" in s["roles"] else ""), 40),
                    safe(s["route"] or "-"),
                    safe(s["stock_route"] or "-"),
                    f"{s['calls']:,}",
                    _us(s["est_us"]),
                    _pct(s["share"]),
                    _pct(s["cum_share"]),
                ]
            )
        out += ["    " + x for x in _fmt_table(header, body, {0, 5, 6, 7, 8, 9, 13, 14, 15, 16})]
        cov = g["coverage"]["by_est_us"]
        covc = g["coverage"]["by_calls"]
        n = g["shape_count"]
        out.append("")
        out.append(
            "  coverage by estimated time: " + ", ".join(f"{k} in {v} of {n} shapes" for k, v in cov.items())
        )
        out.append(
            "  (by call count it would be "
            + ", ".join(f"{k} in {v}" for k, v in covc.items())
            + ": calls are not time)"
        )
        out.append("")
        out.append("  quant types")
        qh = ["type", "tensors", "weight MiB", "weight%", "calls", "est_us", "est%"]
        qb = [
            [
                safe(q["type"]),
                str(q["tensors"]) if q["tensors"] else "-",
                _mib(q["weight_bytes"]) if q["weight_bytes"] else "-",
                _pct(q["weight_share"]) if q["weight_bytes"] else "-",
                f"{q['calls']:,}",
                _us(q["est_us"]),
                _pct(q["est_share"]),
            ]
            for q in g["quant"]
        ]
        out += ["    " + x for x in _fmt_table(qh, qb, {1, 2, 3, 4, 5, 6})]
    unseen = rep.get("gguf_unseen") or {}
    for p, names in sorted(unseen.items()):
        out.append("")
        shown = ", ".join(safe(x) for x in names[:8])
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        out.append(f"  {len(names)} weight tensor(s) of {safe(p)} never appear in the trace: {shown}{more}")
    return "\n".join(out) + "\n"
