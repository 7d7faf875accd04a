"""Read route traces (``ggml-route-trace/1``): JSON Lines, gzip, or llama.cpp logs with prefixed lines.

A trace has millions of lines but few distinct keys, so lines are not all JSON-parsed. A line is keyed
by its bytes with the ``"count":<n>`` member cut out; the first line of each key gets the full parse and
validation, and only a line whose key bytes equal an already-validated line's is taken on the fast path,
which then checks just that the count is a positive integer. Replacing one positive integer literal by
another in a valid record gives a valid record with the same fields, so every line is validated. Only
lines with exactly one ``"count":`` member are keyed (inside a JSON string the closing quote of
``"count"`` would have to be escaped, so the cut always hits the record's own member), and a line
only matches a key when its cut is at the same position (the same key bytes with the member moved
elsewhere would be invalid JSON). Lines with a measured ``"t_us":<x>`` get the same treatment with
both members cut.

Memory is proportional to the distinct keys, not to the file: the file is read in chunks. The fast
path's cache holds the first ``CACHE_KEYS`` keys of a header (a cached key costs its line's bytes
again); repeated lines of later keys are parsed in full: slower, the same result. Traces with that
many distinct keys (attention at every KV length) repeat each key only a few times.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import registry, schema
from ggml_dispatch.artifacts import validators
from ggml_dispatch.errors import InputError

PREFIX: Final = schema.TRACE_STDERR_PREFIX.encode()
_PLEN: Final = len(PREFIX)
_COUNT: Final = b'"count":'
_TUS: Final = b'"t_us":'
CHUNK: Final = 4 << 20
CACHE_KEYS: Final = 1 << 16
MAX_LINE: Final = 64 << 20  # a record is < 1 KiB; a longer "line" means this is not a trace
MAX_DIM: Final = 1 << 62
MAX_T_US: Final = 3.6e9  # one hour for one matmul call: a larger t_us is not a timing
INT64_MAX: Final = (1 << 63) - 1
_GZIP_MAGIC: Final = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"
_JSON_NUMBER: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")

Dims = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class AttnInfo:
    """The ``attn`` member of a FLASH_ATTN_EXT route record (src0 = K, src1 = Q in the record's fields)."""

    d_k: int
    d_v: int
    q_heads: int
    kv_heads: int
    q_cols: int
    n_kv: int
    seqs: int
    k_type: str
    v_type: str
    v_nb: Dims
    mask: bool
    sinks: bool
    softcap: float
    max_bias: float
    scale: float


@dataclass(frozen=True, slots=True)
class RouteKey:
    """Every field of a route record except ``count`` and ``t_us``; the device resolved to its GPU."""

    gpu: schema.GpuId
    op: str
    tensor: str
    src0_type: str
    src1_type: str
    src0_ne: Dims
    src0_nb: Dims
    src1_ne: Dims
    layout: str
    fused: str | None
    route: str
    stock_route: str
    reason: str
    config: str | None = None  # the configuration that ran (canonical text), where the trace records it
    attn: AttnInfo | None = None  # FLASH_ATTN_EXT records only


@dataclass(slots=True)
class Experts:
    """Tokens-per-expert statistics of a MUL_MAT_ID key summed over its sampled calls (records add up)."""

    sampled: int = 0
    picks: float = 0.0  # sums of per-call values; divide by ``sampled`` for the means
    nonempty: float = 0.0
    max: float = 0.0
    mean: float = 0.0
    cv: float = 0.0
    max_max: float = 0.0
    routing: list[int] = field(default_factory=lambda: [0, 0, 0])  # calls per bucket 1..3

    def add(self, other: Experts) -> None:
        self.sampled += other.sampled
        self.picks += other.picks
        self.nonempty += other.nonempty
        self.max += other.max
        self.mean += other.mean
        self.cv += other.cv
        self.max_max = max(self.max_max, other.max_max)
        self.routing = [a + b for a, b in zip(self.routing, other.routing, strict=True)]

    def means(self) -> dict[str, float]:
        n = max(self.sampled, 1)
        return {
            "picks": self.picks / n,
            "nonempty": self.nonempty / n,
            "max": self.max / n,
            "mean": self.mean / n,
            "cv": self.cv / n,
        }

    def bucket(self) -> int:
        """The routing bucket most sampled calls fell in (ties: the more concentrated), 0 if none."""
        if self.sampled == 0:
            return registry.ROUTING_ANY
        best = max(range(3), key=lambda i: (self.routing[i], i))
        return best + 1


class Tally:
    """Calls of one key; ``timed_calls``/``time_us`` from records that carry ``t_us`` (mean per call);
    ``experts`` from MUL_MAT_ID records that carry tokens-per-expert statistics."""

    __slots__ = ("calls", "experts", "line", "path", "time_us", "timed_calls")

    def __init__(self, path: str, line: int) -> None:
        self.experts: Experts | None = None
        self.calls = 0
        self.timed_calls = 0
        self.time_us = 0.0
        self.path = path  # where the key was first seen (for messages)
        self.line = line


# The aggregator: returns the tally of a key, creating it on first sight.
Sink = Callable[[RouteKey, str, int], Tally]


@dataclass
class FileReport:
    path: str
    sha256: str = ""
    compressed: bool = False
    mode: str = ""  # "jsonl" or "log"
    lines: int = 0
    route_lines: int = 0
    calls: int = 0
    headers: list[dict[str, Any]] = field(default_factory=list)
    header_lines: list[int] = field(default_factory=list)
    footers: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# JSON and field validation (pure)


class RecordError(ValueError):
    """A record that parsed as JSON but breaks the schema."""


class _Malformed(ValueError):
    """A line that is not one JSON value (a torn last line looks like this)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise RecordError(f"duplicate key {k!r}")
        d[k] = v
    return d


def _no_constant(name: str) -> Any:
    raise _Malformed(f"{name} is not a JSON number")


def loads_record(raw: bytes) -> Any:
    """Parse one line: strict UTF-8, strict JSON (no NaN/Infinity, no duplicate keys)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Malformed(f"not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except RecordError:
        raise
    except json.JSONDecodeError as e:
        raise _Malformed(f"{e.msg} at column {e.colno}") from None
    except RecursionError:
        raise _Malformed("nesting too deep") from None
    except ValueError as e:  # e.g. an integer literal longer than Python's digit limit
        raise _Malformed(str(e).split("\n")[0]) from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _describe(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=True)
    return s if len(s) <= 80 else s[:77] + "..."


def _check_fields(obj: dict[str, Any], spec: dict[str, str], what: str, optional: bool = False) -> None:
    for name, kind in spec.items():
        if name not in obj:
            if optional:
                continue
            raise RecordError(f"{what}: missing field {name!r}")
        v = obj[name]
        ok: bool
        if kind == "str":
            ok = isinstance(v, str)
            need = "a string"
        elif kind == "str|null":
            ok = v is None or isinstance(v, str)
            need = "a string or null"
        elif kind == "int":
            ok = _is_int(v)
            need = "an integer"
        elif kind == "num":
            ok = (_is_int(v) or isinstance(v, float)) and math.isfinite(v)
            need = "a number"
        elif kind == "obj":
            ok = isinstance(v, dict)
            need = "an object"
        elif kind == "list":
            ok = isinstance(v, list)
            need = "a list"
        elif kind in ("ne", "nb"):
            ok = isinstance(v, list) and len(v) == 4 and all(_is_int(x) for x in v)
            need = "a list of 4 integers"
        else:  # pragma: no cover - the spec tables are fixed
            raise AssertionError(kind)
        if not ok:
            raise RecordError(f"{what}: field {name!r} must be {need}, got {_describe(v)}")


def _dims(obj: dict[str, Any], name: str, what: str) -> Dims:
    v = obj[name]
    if any(x <= 0 for x in v):
        raise RecordError(f"{what}: field {name!r} has a zero or negative dimension: {_describe(v)}")
    if (math.prod(v) if name.endswith("_ne") else max(v)) > MAX_DIM:
        raise RecordError(f"{what}: field {name!r} is too large: {_describe(v)}")
    return (v[0], v[1], v[2], v[3])


def _enum(obj: dict[str, Any], name: str, allowed: frozenset[str] | set[str], what: str) -> str:
    v: str = obj[name]
    if v not in allowed:
        raise RecordError(f"{what}: unknown {name} {_describe(v)} (known: {', '.join(sorted(allowed))})")
    return v


_OPS: Final = frozenset(o.value for o in schema.TRACE_OPS) | {schema.Op.FLASH_ATTN_EXT.value}

_ATTN_INTS: Final = ("d_k", "d_v", "q_heads", "kv_heads", "q_cols", "n_kv", "seqs")
_ATTN_FIELDS: Final[dict[str, str]] = {
    **{f: "int" for f in _ATTN_INTS},
    "k_type": "str",
    "v_type": "str",
    "v_nb": "nb",
    "mask": "bool",
    "sinks": "bool",
    "softcap": "num",
    "max_bias": "num",
    "scale": "num",
}


def parse_attn(obj: Any, src0_type: str, src0_ne: Dims, src1_ne: Dims, what: str) -> AttnInfo:
    """The ``attn`` member of a FLASH_ATTN_EXT record, checked against the record's K (src0) and Q (src1)."""
    what = f"{what}: attn"
    if not isinstance(obj, dict):
        raise RecordError(f"{what} must be an object, got {_describe(obj)}")
    for name, kind in _ATTN_FIELDS.items():
        if name not in obj:
            raise RecordError(f"{what}: missing field {name!r}")
        if kind == "bool" and not isinstance(obj[name], bool):
            raise RecordError(f"{what}: field {name!r} must be true or false, got {_describe(obj[name])}")
    _check_fields(obj, {k: v for k, v in _ATTN_FIELDS.items() if v != "bool"}, what)
    for name in _ATTN_INTS:
        if not 0 < obj[name] <= MAX_DIM:
            raise RecordError(f"{what}: {name} must be a positive integer, got {obj[name]}")
    k_type = _enum(obj, "k_type", _TYPES, what)
    v_type = _enum(obj, "v_type", _TYPES, what)
    a = AttnInfo(
        d_k=int(obj["d_k"]),
        d_v=int(obj["d_v"]),
        q_heads=int(obj["q_heads"]),
        kv_heads=int(obj["kv_heads"]),
        q_cols=int(obj["q_cols"]),
        n_kv=int(obj["n_kv"]),
        seqs=int(obj["seqs"]),
        k_type=k_type,
        v_type=v_type,
        v_nb=_dims(obj, "v_nb", what),
        mask=obj["mask"],
        sinks=obj["sinks"],
        softcap=float(obj["softcap"]),
        max_bias=float(obj["max_bias"]),
        scale=float(obj["scale"]),
    )
    expect = {
        "k_type": (k_type, src0_type),
        "d_k": (a.d_k, src0_ne[0]),
        "n_kv": (a.n_kv, src0_ne[1]),
        "kv_heads": (a.kv_heads, src0_ne[2]),
        "q_cols": (a.q_cols, src1_ne[1]),
        "q_heads": (a.q_heads, src1_ne[2]),
        "seqs": (a.seqs, src1_ne[3]),
    }
    for name, (got, want) in expect.items():
        if got != want:
            raise RecordError(f"{what}: {name} = {got} disagrees with the record's K/Q dimensions ({want})")
    if a.q_heads % a.kv_heads:
        raise RecordError(f"{what}: q_heads = {a.q_heads} is not a multiple of kv_heads = {a.kv_heads}")
    return a


_LAYOUTS: Final = frozenset(x.value for x in schema.Layout)
_FUSED: Final = frozenset(x.value for x in schema.Fused)
_TYPES: Final = frozenset(schema.GGML_TYPES)


def parse_header(obj: dict[str, Any]) -> dict[int, schema.GpuId]:
    """Validate a header record; return its devices by id."""
    sch = obj.get("schema")
    if sch != schema.TRACE_SCHEMA:
        raise RecordError(
            f"header: unknown schema version {_describe(sch)} (this tool reads {schema.TRACE_SCHEMA!r})"
        )
    _check_fields(obj, schema.TRACE_HEADER_FIELDS, "header")
    commit = obj["upstream_commit"]
    if commit is not None:
        try:
            schema.check_upstream_id(commit)
        except ValueError as e:
            raise RecordError(f"header: upstream_commit: {e}") from None
    devices: dict[int, schema.GpuId] = {}
    for n, dev in enumerate(obj["devices"]):
        what = f"header: devices[{n}]"
        if not isinstance(dev, dict):
            raise RecordError(f"{what} must be an object, got {_describe(dev)}")
        _check_fields(dev, schema.TRACE_DEVICE_FIELDS, what)
        if dev["id"] < 0:
            raise RecordError(f"{what}: negative id {dev['id']}")
        if dev["id"] in devices:
            raise RecordError(f"{what}: device id {dev['id']} appears twice")
        for k in ("cc", "sm_count"):
            if dev[k] <= 0:
                raise RecordError(f"{what}: field {k!r} must be positive, got {dev[k]}")
        for k in ("smpbo", "vram_mib"):
            if dev[k] < 0:
                raise RecordError(f"{what}: field {k!r} must not be negative, got {dev[k]}")
        devices[dev["id"]] = schema.GpuId(dev["name"], dev["cc"], dev["sm_count"])
    return devices


def parse_footer(obj: dict[str, Any]) -> None:
    _check_fields(obj, schema.TRACE_FOOTER_FIELDS, "footer")
    for k in ("records", "dropped"):
        if obj[k] < 0:
            raise RecordError(f"footer: field {k!r} must not be negative, got {obj[k]}")


def parse_route(obj: dict[str, Any], devices: dict[int, schema.GpuId]) -> tuple[RouteKey, int, float | None]:
    """Validate a route record against the current header's devices; return (key, count, t_us)."""
    what = "route record"
    _check_fields(obj, schema.TRACE_ROUTE_FIELDS, what)
    _check_fields(obj, schema.TRACE_ROUTE_OPTIONAL, what, optional=True)
    op = _enum(obj, "op", _OPS, what)
    device = obj["device"]
    gpu = devices.get(device)
    if gpu is None:
        known = ", ".join(str(d) for d in sorted(devices)) or "none"
        raise RecordError(f"{what}: device {device} is not in the header's devices ({known})")
    src0_type = _enum(obj, "src0_type", _TYPES, what)
    src1_type = _enum(obj, "src1_type", _TYPES, what)
    src0_ne = _dims(obj, "src0_ne", what)
    src0_nb = _dims(obj, "src0_nb", what)
    src1_ne = _dims(obj, "src1_ne", what)
    layout = _enum(obj, "layout", _LAYOUTS, what)
    fused = obj["fused"]
    if fused is not None:
        fused = _enum(obj, "fused", _FUSED, what)
    route = _enum(obj, "route", schema.TRACE_ROUTES, what)
    stock_route = _enum(obj, "stock_route", schema.TRACE_ROUTES, what)
    reason = obj["reason"]
    if not schema.is_valid_reason(reason):
        raise RecordError(f"{what}: unknown reason {_describe(reason)}")
    count = obj["count"]
    if not 0 < count <= MAX_DIM:
        raise RecordError(f"{what}: count must be a positive integer, got {count}")
    config = obj.get("config")
    if config is not None:
        try:
            parsed = registry.Config.parse(config)
        except registry.ConfigError as e:
            raise RecordError(f"{what}: config {_describe(config)}: {e}") from None
        if parsed.route.value != route:
            raise RecordError(f"{what}: config {_describe(config)} is not a configuration of route {route!r}")
        config = str(parsed)
    if "experts" in obj and op != schema.Op.MUL_MAT_ID:
        raise RecordError(f"{what}: only MUL_MAT_ID records carry 'experts'")
    t_us = obj.get("t_us")
    if t_us is not None and not 0 <= t_us <= MAX_T_US:
        raise RecordError(f"{what}: t_us must be a time per call in [0, {MAX_T_US:g}] us, got {t_us!r}")
    if src0_ne[0] != src1_ne[0]:
        raise RecordError(f"{what}: src0_ne[0] = {src0_ne[0]} and src1_ne[0] = {src1_ne[0]} must agree (K)")
    if op == schema.Op.MUL_MAT and (src1_ne[2] % src0_ne[2] or src1_ne[3] % src0_ne[3]):
        raise RecordError(f"{what}: src1_ne[2:] {list(src1_ne[2:])} does not broadcast src0_ne[2:]")
    attn = None
    if op == schema.Op.FLASH_ATTN_EXT:
        if "attn" not in obj:
            raise RecordError(f"{what}: a FLASH_ATTN_EXT record needs its attn member")
        attn = parse_attn(obj["attn"], src0_type, src0_ne, src1_ne, what)
        if not registry.route_allowed(op, route) or not registry.route_allowed(op, stock_route):
            raise RecordError(
                f"{what}: route {route!r} / stock_route {stock_route!r}: not FlashAttention kernels"
            )
    elif "attn" in obj:
        raise RecordError(f"{what}: an attn member on a {op} record")
    key = RouteKey(
        gpu=gpu,
        op=op,
        tensor=obj["tensor"],
        src0_type=src0_type,
        src1_type=src1_type,
        src0_ne=src0_ne,
        src0_nb=src0_nb,
        src1_ne=src1_ne,
        layout=layout,
        fused=fused,
        route=route,
        stock_route=stock_route,
        reason=reason,
        config=config,
        attn=attn,
    )
    return key, count, None if t_us is None else float(t_us)


def parse_experts(obj: dict[str, Any], n_experts: int) -> Experts:
    """Validate a MUL_MAT_ID record's ``experts`` member; return it as sums over its sampled calls."""
    what = "route record: experts"
    _check_fields(obj, schema.TRACE_EXPERTS_FIELDS, what)
    n = obj["sampled"]
    if not 0 < n <= MAX_DIM:
        raise RecordError(f"{what}: sampled must be a positive integer, got {n}")
    r = obj["routing"]
    if len(r) != 3 or not all(_is_int(x) and x >= 0 for x in r) or sum(r) != n:
        raise RecordError(
            f"{what}: routing must be 3 counts that add up to sampled ({n}), got {_describe(r)}"
        )
    for k in ("picks", "nonempty", "max", "max_max", "mean", "cv"):
        if obj[k] < 0:
            raise RecordError(f"{what}: {k} must not be negative, got {obj[k]}")
    if obj["nonempty"] > n_experts:
        raise RecordError(f"{what}: nonempty {obj['nonempty']} is more than the {n_experts} experts")
    return Experts(
        sampled=n,
        picks=obj["picks"] * n,
        nonempty=obj["nonempty"] * n,
        max=obj["max"] * n,
        mean=obj["mean"] * n,
        cv=obj["cv"] * n,
        max_max=float(obj["max_max"]),
        routing=list(r),
    )


def cut_member(raw: bytes, name: bytes) -> tuple[bytes, bytes] | None:
    """``raw`` with the first ``name<value>`` member cut out, and the value's bytes (exactly the hot
    loop's cut; the value runs to the next comma, or to a closing brace that ends the line)."""
    i = raw.find(name)
    if i < 0:
        return None
    j = i + len(name)
    k = raw.find(b",", j)
    if k < 0:
        k = len(raw) - 1
        if k < j or raw[k:] != b"}":
            return None
    return raw[:i] + raw[k:], raw[j:k]


def _count_ok(d: bytes) -> bool:
    return d.isdigit() and d[0] != 48 and len(d) < 19


def _t_us_of(d: bytes) -> float | None:
    if not _JSON_NUMBER.fullmatch(d):
        return None
    v = float(d)
    return v if 0 <= v <= MAX_T_US else None


# --------------------------------------------------------------------------------------------
# Streaming one file


class _TraceFile:
    def __init__(self, path: Path, sink: Sink, progress: Callable[[int], None] | None, fast: bool) -> None:
        self.fast = fast
        self.path = str(path)
        self.file = path
        self.sink = sink
        self.progress = progress
        self.report = FileReport(path=self.path)
        self.mode: str | None = None
        self.lineno = 0
        # key bytes (count cut) -> (tally, where the cut was); the position must match too, or a count
        # member moved elsewhere (into invalid JSON) could give the same key bytes
        self.cache: dict[bytes, tuple[Tally, int]] = {}
        # key bytes (count and t_us cut) -> (tally, count cut position, t_us cut position)
        self.tcache: dict[bytes, tuple[Tally, int, int]] = {}
        self.devices: dict[int, schema.GpuId] | None = None
        self.footer_seen = False
        self.header_line = 0
        self.pending: InputError | None = None  # log mode: a malformed trace line, fatal if one follows
        self.records = 0  # non-blank record lines seen (header, route, footer)
        self.truncated_gz = False
        self.first_line = b""

    def error(self, message: str, line: int | None = None) -> InputError:
        return InputError(self.path, message, line=line)

    def warn(self, message: str, line: int | None = None) -> None:
        self.report.warnings.append(InputError(self.path, message, line=line).render())

    # -- reading ------------------------------------------------------------------------------
    def run(self) -> FileReport:
        hasher = hashlib.sha256()
        try:
            f = self.file.open("rb")
        except OSError as e:
            raise self.error(f"cannot read trace: {e.strerror or e}") from None
        with f:
            first = f.read(CHUNK)
            if not first:
                raise self.error("empty file: no trace records")
            gz = first.startswith(_GZIP_MAGIC)
            self.report.compressed = gz
            carry = b""
            for data in self._chunks(f, first, hasher, gz):
                if carry:
                    data = carry + data
                if self.mode is None:
                    data = self._decide_mode(data)
                parts = data.split(b"\n")
                carry = parts.pop()
                if len(carry) > MAX_LINE:
                    raise self.error(
                        f"a line longer than {MAX_LINE >> 20} MiB: not a trace", line=self.lineno + 1
                    )
                if parts:
                    self._lines(parts)
        if self.truncated_gz:
            self.warn("compressed stream ends early (truncated .gz): read what was there")
        if carry:
            self._final_line(carry)
        self._finish()
        self.report.sha256 = hasher.hexdigest()
        self.report.lines = self.lineno
        self.report.mode = self.mode or "jsonl"
        return self.report

    def _chunks(self, f: Any, first: bytes, hasher: Any, gz: bool) -> Iterator[bytes]:
        """The file's content in pieces, gunzipped if compressed; the raw bytes are hashed on the way.
        Sets ``self.truncated_gz`` when the last gzip member has no end."""
        raw = first
        d = zlib.decompressobj(wbits=31) if gz else None
        fed = False
        while raw:
            hasher.update(raw)
            if self.progress is not None:
                self.progress(len(raw))
            if d is None:
                yield raw
            else:
                buf = raw
                while True:
                    try:
                        out = d.decompress(buf, CHUNK)
                    except zlib.error as e:
                        raise self.error(f"corrupt gzip data ({e})") from None
                    fed = True
                    if out:
                        yield out
                    if d.eof:  # concatenated gzip members: go on with the next one
                        buf = d.unused_data
                        d = zlib.decompressobj(wbits=31)
                        fed = False
                        if not buf:
                            break
                    else:
                        buf = d.unconsumed_tail
                        if not buf and len(out) < CHUNK:
                            break
            raw = f.read(CHUNK)
        if d is not None:
            tail = d.flush()
            if tail:
                yield tail
            self.truncated_gz = fed and not d.eof

    def _decide_mode(self, data: bytes) -> bytes:
        """JSON Lines if the first non-blank byte opens an object, else a log with prefixed lines."""
        if self.lineno == 0 and data.startswith(_BOM):
            data = data[len(_BOM) :]
        stripped = data.lstrip()
        if stripped:
            self.mode = "jsonl" if stripped[:1] in (b"{", b"[") else "log"
            self.first_line = stripped.split(b"\n", 1)[0][:40]
        return data

    def _lines(self, parts: list[bytes]) -> None:
        if self.mode is None:
            self.mode = "jsonl"  # only blank lines so far
        cache = self.cache
        lineno = self.lineno
        log = self.mode == "log"
        fast_lines = 0
        fast_calls = 0
        for raw in parts:
            lineno += 1
            if log:
                p = raw.find(PREFIX)
                if p < 0:
                    continue
                raw = raw[p + _PLEN :]
                if self.pending is not None:
                    raise self.pending
            # hot path: the same logic as cut_member(raw, _COUNT) and _count_ok, inlined
            i = raw.find(_COUNT)
            if i > 0:
                j = i + 8
                k = raw.find(b",", j)
                if k < 0:
                    k = len(raw) - 1
                d = raw[j:k]
                e = cache.get(raw[:i] + raw[k:])
                if e is not None and e[1] == i and d.isdigit() and d[0] != 48 and len(d) < 19:
                    n = int(d)
                    e[0].calls += n
                    fast_calls += n
                    fast_lines += 1
                    continue
            self.lineno = lineno
            self._slow(raw, lineno, terminated=True)
        self.lineno = lineno
        self.report.route_lines += fast_lines
        self.report.calls += fast_calls

    def _final_line(self, raw: bytes) -> None:
        """The last line had no newline (a killed writer leaves one like that)."""
        self.lineno += 1
        if self.mode == "log":
            p = raw.find(PREFIX)
            if p < 0:
                return
            raw = raw[p + _PLEN :]
            if self.pending is not None:
                raise self.pending
        self._slow(raw, self.lineno, terminated=False)

    # -- one record, the full way -----------------------------------------------------------------
    def _slow(self, raw: bytes, lineno: int, terminated: bool) -> None:
        if self.mode != "log":
            if raw.startswith(PREFIX):
                raw = raw[_PLEN:]
            if not raw.strip():
                return
        if self.tcache and self._timed_fast(raw):
            return
        try:
            obj = loads_record(raw)
        except _Malformed as e:
            err = self.error(f"malformed JSON line: {e}", line=lineno)
            if not terminated:
                self.warn("torn last line (no newline at the end, not valid JSON): ignored", line=lineno)
                return
            if self.mode == "log":
                self.pending = err  # fatal only if another trace line follows
                return
            raise err from None
        except RecordError as e:
            raise self.error(str(e), line=lineno) from None
        self.records += 1
        try:
            self._record(obj, raw, lineno)
        except RecordError as e:
            raise self.error(str(e), line=lineno) from None

    def _record(self, obj: Any, raw: bytes, lineno: int) -> None:
        if not isinstance(obj, dict):
            raise RecordError(f"a record must be a JSON object, got {_describe(obj)}")
        kind = obj.get("kind")
        if kind == "route":
            self._route(obj, raw, lineno)
        elif kind == "header":
            devices = parse_header(obj)
            if self.devices is not None and not self.footer_seen:
                self.warn(
                    f"a new header while the run from line {self.header_line} had no footer "
                    "(that run did not exit normally): counts since its last flush are lost",
                    line=lineno,
                )
            self.devices = devices
            self.footer_seen = False
            self.header_line = lineno
            self.cache.clear()  # device ids may mean other GPUs now
            self.tcache.clear()
            self.report.headers.append(obj)
            self.report.header_lines.append(lineno)
        elif kind == "footer":
            if self.devices is None:
                raise RecordError("footer before any header")
            if self.footer_seen:
                raise RecordError("a second footer for the same header")
            parse_footer(obj)
            self.footer_seen = True
            self.report.footers.append(obj)
            if obj["dropped"] > 0:
                self.warn(f"the writer dropped {obj['dropped']} records (its buffer was full)", line=lineno)
        else:
            raise RecordError(f"unknown record kind {_describe(kind)} (known: header, route, footer)")

    def _route(self, obj: dict[str, Any], raw: bytes, lineno: int) -> None:
        if self.devices is None:
            raise RecordError("route record before the header (the first record must be the header)")
        if self.footer_seen:
            raise RecordError("route record after the footer")
        key, count, t_us = parse_route(obj, self.devices)
        experts = parse_experts(obj["experts"], key.src0_ne[2]) if "experts" in obj else None
        tally = self.sink(key, self.path, lineno)
        tally.calls += count
        self.report.route_lines += 1
        self.report.calls += count
        if t_us is not None:
            tally.timed_calls += count
            tally.time_us += t_us * count
        if experts is not None:
            if tally.experts is None:
                tally.experts = experts
            else:
                tally.experts.add(experts)
            return  # statistics differ from record to record: never the fast path
        # make later lines of this key take the fast path
        if not self.fast or raw.count(_COUNT) != 1:
            return
        cut = cut_member(raw, _COUNT)
        if cut is None or cut[1] != str(count).encode():
            return
        if t_us is None:
            if _TUS not in raw and len(self.cache) < CACHE_KEYS:
                self.cache[cut[0]] = (tally, raw.find(_COUNT))
            return
        if raw.count(_TUS) != 1:
            return
        cut2 = cut_member(cut[0], _TUS)
        if cut2 is not None and _t_us_of(cut2[1]) == t_us and len(self.tcache) < CACHE_KEYS:
            self.tcache[cut2[0]] = (tally, raw.find(_COUNT), cut[0].find(_TUS))

    def _timed_fast(self, raw: bytes) -> bool:
        cut = cut_member(raw, _COUNT)
        if cut is None or not _count_ok(cut[1]):
            return False
        cut2 = cut_member(cut[0], _TUS)
        if cut2 is None:
            return False
        e = self.tcache.get(cut2[0])
        if e is None or e[1] != raw.find(_COUNT) or e[2] != cut[0].find(_TUS):
            return False
        t = e[0]
        t_us = _t_us_of(cut2[1])
        if t_us is None:
            return False
        count = int(cut[1])
        t.calls += count
        t.timed_calls += count
        t.time_us += t_us * count
        self.records += 1
        self.report.route_lines += 1
        self.report.calls += count
        return True

    def _finish(self) -> None:
        if self.pending is not None:
            self.warn("the last trace line is not valid JSON (torn): ignored", line=self.pending.line)
        if self.devices is None:
            if self.records == 0 and self.pending is None:
                if self.mode == "log":
                    raise self.error(
                        f"no trace records: not JSON Lines (the first line starts {self.first_line!r}) "
                        f"and no line carries the {schema.TRACE_STDERR_PREFIX!r} prefix"
                    )
                raise self.error("no trace records (empty trace)")
            raise self.error("no valid header record")
        if not self.footer_seen:
            self.warn(
                f"no footer after the header at line {self.header_line}: the run did not exit normally "
                "(killed?); counts since its last flush are lost"
            )


def read_trace(
    path: str | Path, sink: Sink, progress: Callable[[int], None] | None = None, *, fast: bool = True
) -> FileReport:
    """Stream one trace file into ``sink``. Raises :class:`InputError` on bad input; warnings (torn last
    line, missing footer, dropped records) are in the report. ``fast=False`` parses every line in full
    (slow; the reference the fast path is tested against)."""
    return _TraceFile(Path(path), sink, progress, fast).run()


def check_counts(tallies: Mapping[RouteKey, Tally], path: str | Path) -> None:
    """After reading ``path``: a key whose calls no longer fit the census' int64 is refused, naming the
    file whose counts took it over."""
    for key, t in tallies.items():
        if t.calls > INT64_MAX:
            raise InputError(
                path,
                f"tensor {key.tensor!r}: {t.calls} calls (the key first seen at {t.path}:{t.line}) "
                "do not fit in int64",
            )


def check_commits(reports: Sequence[FileReport], *, allow_mixed: bool) -> None:
    """Traces of several upstream commits are one census only with ``allow_mixed`` (as tuning and
    codegen inputs are); a header without a commit says nothing either way."""
    first: dict[str, tuple[str, int]] = {}
    for r in reports:
        for h, line in zip(r.headers, r.header_lines, strict=True):
            commit = h.get("upstream_commit")
            if commit:
                first.setdefault(str(commit), (r.path, line))
    if len(first) > 1:
        path, line = list(first.values())[1]  # where the second commit first shows up
        validators.check_one_commit(
            {c: f"{p}:{n}" for c, (p, n) in first.items()},
            path,
            allow_mixed=allow_mixed,
            what="traces",
            line=line,
        )
