"""``table.json`` and the rendered C header: the one reader every command uses (codegen, diff, install,
report, tune verify), so a bad file gets the same message everywhere; the canonical text (dump), the
validation, the header parsed back, and the Python lookup the C header mirrors. Pure. Building a table from
decisions is codegen's (``codegen.table.build_table``); rendering the header is ``codegen.render``.

A table is a dict:

* ``schema`` (``schema.TABLE_SCHEMA``) and ``layout_version`` (``schema.TABLE_LAYOUT_VERSION``);
* ``gpu``: ``name``, ``cc``, ``sm_count`` -- the table applies only when all three match;
* ``upstream_commit``;
* ``provenance``: source (measured / reference / none), tool version, tuning and census sha256, patch
  hashes, harness versions, drivers, CUDA and cuBLAS versions, the decision parameters, and (only with
  ``--allow-mixed``) every GPU and commit that contributed rows;
* ``rules``: the op's shape-key fields (``registry.key_class(op).fields()``; MUL_MAT: ``op, layout,
  src0_type, src1_type, N, K, B``), ``M_lo, M_hi``, ``config`` (the configuration, canonical text, e.g.
  ``cublas`` or ``cublas/out=f32,compute=f16``) and ``route`` (the config's route) plus evidence:
  ``kind`` (``measured``: M between measured neighbours that pass; ``interpolated``: M inside a gap
  between two measured M, from the fitted crossover, with ``between``, ``ci_low`` and ``crossover``;
  ``default``: the key's default fields at 0 (MUL_MAT and MUL_MAT_ID: N = K = 0), for keys without an
  exact rule; ``declared``: hand-written), ``measured_M``, ``min_ratio``, ``shapes`` (what a default was
  fitted on). A default with ``NK_lo``/``NK_hi`` is a size-class default: it applies only where the
  product of the key's default fields (N*K) lies in that range, and it is looked up after the exact
  rules and before the per-type default (default fields 0 without a range);
* ``refused``: every refused candidate with its point and reason;
* ``routing_buckets`` (only with MUL_MAT_ID tuning rows, ``codegen.moe``): per MUL_MAT_ID point (routing-0
  key, M) the winner of each measured routing bucket, whether it passes, its ratio, and the routing-0
  configuration (or why there is none); a MUL_MAT_ID rule's ``buckets`` holds the buckets it was admitted
  on, each with its smallest ratio there.

The canonical text (:func:`dumps`) has sorted keys, rules and refusals in a fixed order, one rule per
line, and a trailing newline; the table hash is the sha256 of that text.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fileio, registry, schema
from ggml_dispatch.artifacts import validators
from ggml_dispatch.errors import InputError

# MUL_MAT's rule and key fields; other ops: rule_fields(op) / registry.key_class(op).fields()
RULE_FIELDS: Final = (
    "op",
    "layout",
    "src0_type",
    "src1_type",
    "N",
    "K",
    "B",
    "M_lo",
    "M_hi",
    "route",
    "config",
)
KEY_FIELDS: Final = schema.SHAPE_KEY
# a size-class default's range of the product of its key's default fields (N*K): both or neither
CLASS_FIELDS: Final = ("NK_lo", "NK_hi")
# what a rule may carry besides its op's rule_fields and CLASS_FIELDS: the evidence build_table writes
EVIDENCE_FIELDS: Final = (
    "kind",
    "measured_M",
    "min_ratio",
    "shapes",
    "shape_types",
    "buckets",
    "between",
    "ci_low",
    "crossover",
)
# the sections a table may have (the last four only with MUL_MAT_ID tuning rows, a VRAM budget and the
# weight cache and KV shadow caps it gives); a key outside these is a mistake, not data this tool would
# carry along unread
TABLE_KEYS: Final = frozenset(
    {"schema", "layout_version", "gpu", "upstream_commit", "provenance", "rules", "refused"}
    | {"routing_buckets", "vram", "cache", "kv_shadow"}
)
VRAM_KINDS: Final = ("weight_cache", "kv_shadow")
GPU_KEYS: Final = frozenset({"name", "cc", "sm_count"})
# "declared": a hand-written rule (the crude-rule baseline), never produced by decide
RULE_KINDS: Final = ("measured", "interpolated", "default", "declared")
LEGACY_KINDS: Final = {"exact": "measured"}  # tables written before interpolation called measured rules exact
# table.json layout versions this tool reads and upgrades on load: 1 (route only, MUL_MAT; config =
# route) and 2 (config, no size classes): their rules are rules of the current layout
UPGRADABLE_LAYOUT_VERSIONS: Final = frozenset({1, 2})
SOURCE_NONE: Final = "none"
SOURCE_DECLARED: Final = "declared"  # a hand-written rule (e.g. an A/B baseline), not a measurement
TABLE_FILENAME: Final = "table.json"
HEADER_FILENAME: Final = "ggml-dispatch-table.h"
RATIO_STATISTIC: Final = "median of per-trial anchor_us/us ratios; percentile bootstrap over trials"
# provenance.decision key -> codegen.decide.Params attribute (report reads a table's parameters back)
DECISION_PARAMS: Final = {
    "theta": "theta",
    "reference_margin": "reference_margin",
    "min_trials": "min_trials",
    "bootstrap_resamples": "resamples",
    "confidence": "confidence",
    "seed": "seed",
    "min_default_shapes": "min_default_shapes",
    "interpolate": "interpolate",
    "class_defaults": "class_defaults",
    "stock_tolerance": "stock_tolerance",
    "class_gap": "class_gap",
}

_OPS: Final = {o.value: code for o, code in schema.OP_CODES.items()}
_LAYOUTS: Final = {lay.value: code for lay, code in schema.LAYOUT_CODES.items()}
_SOURCES: Final = frozenset(
    {schema.Source.MEASURED.value, schema.Source.REFERENCE.value, SOURCE_NONE, SOURCE_DECLARED}
)


def empty_table() -> dict[str, Any]:
    """The table with no rules: its header makes every lookup answer stock and no GPU match."""
    return {
        "schema": schema.TABLE_SCHEMA,
        "layout_version": schema.TABLE_LAYOUT_VERSION,
        "gpu": {"name": "", "cc": 0, "sm_count": 0},
        "upstream_commit": "",
        "provenance": {"source": SOURCE_NONE},
        "rules": [],
        "refused": [],
    }


# --------------------------------------------------------------------------------------------
# Ordering and canonical text


def rule_fields(op: str) -> tuple[str, ...]:
    """The fields the runtime sees in a rule of ``op`` (a rule without ``config`` has its plain route)."""
    return (*registry.key_class(op).fields(), "M_lo", "M_hi", "route", "config")


def key_codes(rule: Mapping[str, Any]) -> tuple[int, ...]:
    """(op, layout, type0, type1, k[0..KEY_SLOTS-1]) as the integer codes the C array is sorted by."""
    codes: tuple[int, ...] = registry.shape_key(rule).codes()
    return codes


def rule_typed_config(rule: Mapping[str, Any]) -> registry.Config:
    """The configuration of a rule or refusal dict (``config``, else its plain ``route``), parsed."""
    c = rule.get("config")
    return registry.Config.parse(str(c if c is not None else rule["route"]))


def rule_config(rule: Mapping[str, Any]) -> str:
    """The configuration of a rule or refusal (``config``, else its plain ``route``), canonical."""
    return str(rule_typed_config(rule))


def _config_order(text: Any) -> tuple[int, int]:
    try:
        return registry.Config.parse(str(text)).order
    except registry.ConfigError:
        return (99, 0)


def is_class(rule: Mapping[str, Any]) -> bool:
    """A size-class default (default fields 0 with an N*K range)."""
    return "NK_lo" in rule


def class_fields(rule: Mapping[str, Any]) -> tuple[str, ...]:
    return CLASS_FIELDS if is_class(rule) else ()


def key_size(key: Any) -> int:
    """What a size class ranges over: the product of the key's default fields (N*K)."""
    return math.prod(int(getattr(key, f)) for f in key.DEFAULT_FIELDS)


def class_codes(rule: Mapping[str, Any]) -> tuple[int, int]:
    return (int(rule["NK_lo"]), int(rule["NK_hi"])) if is_class(rule) else (0, 0)


def rule_sort_key(rule: Mapping[str, Any]) -> tuple[int, ...]:
    return (*key_codes(rule), *class_codes(rule), int(rule["M_lo"]))


def refusal_sort_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (*key_codes(r), int(r["M"]), *_config_order(r.get("config", r["route"])), str(r["reason"]))


def _round(x: Any) -> Any:
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_round(v) for v in x]
    return x


def _compact(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=True, separators=(", ", ": "), allow_nan=False)


def canonicalize(table: Mapping[str, Any]) -> dict[str, Any]:
    t = _round(dict(table))
    t["rules"] = sorted(t.get("rules", []), key=rule_sort_key)
    t["refused"] = sorted(t.get("refused", []), key=refusal_sort_key)
    if "routing_buckets" in t:
        t["routing_buckets"] = sorted(t["routing_buckets"], key=lambda p: (*key_codes(p), int(p["M"])))
    return t  # type: ignore[no-any-return]


def dumps(table: Mapping[str, Any]) -> str:
    """Canonical text: sorted keys, fixed row order, one rule/refusal per line, trailing newline."""
    t = canonicalize(table)
    parts = []
    for k in sorted(t):
        v = t[k]
        if isinstance(v, list):
            body = "[]" if not v else "[\n" + ",\n".join("    " + _compact(e) for e in v) + "\n  ]"
        else:
            body = json.dumps(v, sort_keys=True, ensure_ascii=True, indent=2, allow_nan=False).replace(
                "\n", "\n  "
            )
        parts.append(f"  {json.dumps(k)}: {body}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def table_hash(table: Mapping[str, Any]) -> str:
    return hashlib.sha256(dumps(table).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# Validation and loading


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Rule:
    """One rule of a validated table, typed: its shape key, M range, size class and configuration are
    parsed once, where the table is read (:func:`parse_table`), and travel as objects to the header."""

    key: Any  # the op's shape key (registry.key_class(op))
    M_lo: int
    M_hi: int
    config: registry.Config
    kind: str | None  # rule_kind: measured / interpolated / default / declared, None where not said
    NK: tuple[int, int] | None  # a size-class default's N*K range
    fields: Mapping[str, Any]  # the rule's JSON object, evidence included

    @property
    def is_class(self) -> bool:
        return self.NK is not None

    def codes(self) -> tuple[int, ...]:
        """(op, layout, type0, type1, k[0..KEY_SLOTS-1]): what the C array is sorted and searched by."""
        codes: tuple[int, ...] = self.key.codes()
        return codes


@dataclass(frozen=True)
class TypedTable:
    """A validated table with its rules typed (``rules[i]`` is ``data["rules"][i]``)."""

    data: dict[str, Any]
    rules: tuple[Rule, ...]

    def keeping(self, keep: Any) -> TypedTable:
        """The table with only the rules ``keep(rule)`` is true for (already valid: nothing re-parsed)."""
        kept = tuple(r for r in self.rules if keep(r))
        return TypedTable({**self.data, "rules": [dict(r.fields) for r in kept]}, kept)


def validate(table: Any, path: str | Path | None = None) -> dict[str, Any]:
    """Check a table dict; raise InputError naming the field. Returns the table."""
    return parse_table(table, path).data


def parse_table(table: Any, path: str | Path | None = None) -> TypedTable:
    """Check a table dict (InputError naming the field) and type its rules, in one pass."""
    if not isinstance(table, dict):
        raise InputError(path, "a table is a JSON object")
    sch = table.get("schema")
    if sch != schema.TABLE_SCHEMA:
        raise InputError(
            path, f"unknown table schema {sch!r}; this tool reads {schema.TABLE_SCHEMA}", field="schema"
        )
    lv = table.get("layout_version")
    if lv != schema.TABLE_LAYOUT_VERSION:
        raise InputError(
            path,
            f"table layout version {lv!r} is not known to this tool "
            f"(it knows {schema.TABLE_LAYOUT_VERSION}); regenerate the table with a matching ggml-dispatch",
            field="layout_version",
        )
    _only_known(table, TABLE_KEYS, path, "", "a table")
    gpu = table.get("gpu")
    if not isinstance(gpu, dict):
        raise InputError(path, "missing GPU identity", field="gpu")
    _only_known(gpu, GPU_KEYS, path, "gpu.", "a GPU identity")
    if not isinstance(gpu.get("name"), str) or "\0" in gpu["name"]:
        raise InputError(path, "GPU name must be a string without NUL", field="gpu.name")
    for f in ("cc", "sm_count"):
        if not _is_int(gpu.get(f)) or gpu[f] < 0:
            raise InputError(path, "must be a non-negative integer", field=f"gpu.{f}")
    commit = table.get("upstream_commit")
    if not isinstance(commit, str):
        raise InputError(path, "must be a string", field="upstream_commit")
    if commit:  # empty: no upstream (the table with no rules)
        try:
            schema.check_upstream_id(commit)
        except ValueError as e:
            raise InputError(path, str(e), field="upstream_commit") from None
    prov = table.get("provenance")
    if not isinstance(prov, dict) or prov.get("source") not in _SOURCES:
        raise InputError(path, f"provenance.source must be one of {sorted(_SOURCES)}", field="provenance")
    rules = table.get("rules")
    if not isinstance(rules, list):
        raise InputError(path, "must be a list", field="rules")
    typed = tuple(parse_rule(r, path, f"rules[{i}]") for i, r in enumerate(rules))
    if rules and (gpu["cc"] == 0 or gpu["sm_count"] == 0 or not gpu["name"]):
        raise InputError(
            path, "a table with rules needs a full GPU identity (name, cc, SM count)", field="gpu"
        )
    by_key: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}
    for i, r in enumerate(rules):
        if not is_class(r):
            by_key.setdefault(key_codes(r), []).append((r["M_lo"], r["M_hi"], i))
    classes: dict[tuple[int, ...], list[tuple[int, int, int, int, int]]] = {}
    for i, r in enumerate(rules):
        if is_class(r):
            classes.setdefault(key_codes(r), []).append((*class_codes(r), r["M_lo"], r["M_hi"], i))
    for boxes in classes.values():
        for (a_lo, a_hi, am_lo, am_hi, i), (b_lo, b_hi, bm_lo, bm_hi, j) in itertools.combinations(boxes, 2):
            if a_lo <= b_hi and b_lo <= a_hi and am_lo <= bm_hi and bm_lo <= am_hi:
                raise InputError(
                    path,
                    f"rules[{j}] overlaps rules[{i}] (same type, N*K and M ranges intersect)",
                    field="rules",
                )
    for spans in by_key.values():
        spans.sort()
        for (_, hi, i), (lo2, _, j) in itertools.pairwise(spans):
            if lo2 <= hi:
                raise InputError(
                    path, f"rules[{j}] overlaps rules[{i}] (same key, M ranges intersect)", field="rules"
                )
    refused = table.get("refused", [])
    if not isinstance(refused, list):
        raise InputError(path, "must be a list", field="refused")
    if "vram" in table:
        _validate_vram(table["vram"], path)
    if "cache" in table:
        _validate_cache(table["cache"], path)
    if "kv_shadow" in table:
        _validate_kv_shadow(table["kv_shadow"], path)
    if "routing_buckets" in table:
        _validate_routing_buckets(table["routing_buckets"], path)
    return TypedTable(table, typed)


def _validate_routing_buckets(points: Any, path: str | Path | None) -> None:
    """MUL_MAT_ID evidence (codegen.moe): per point (routing-0 key, M) the winner of each bucket."""
    if not isinstance(points, list):
        raise InputError(path, "must be a list", field="routing_buckets")
    names = set(registry.ROUTING_BUCKETS.values())
    for i, p in enumerate(points):
        where = f"routing_buckets[{i}]"
        if not isinstance(p, dict) or p.get("op") != registry.Op.MUL_MAT_ID.value:
            raise InputError(path, "a MUL_MAT_ID point is an object with op MUL_MAT_ID", field=where)
        b = p.get("buckets")
        if not isinstance(b, dict) or not set(b) <= names:
            raise InputError(path, f"buckets must be an object keyed by {sorted(names)}", field=where)
        if not _is_int(p.get("M")) or p["M"] < 1 or p.get("routing") != registry.ROUTING_ANY:
            raise InputError(path, "needs M >= 1 and routing 0", field=where)


def _check_budget(
    s: Any, section: str, extra: tuple[str, ...], path: str | Path | None, *, positive: bool = False
) -> None:
    """A section's budget in MiB and bytes (and its ``extra`` byte counts): integers, >= 0 (> 0 when
    ``positive``), the bytes exactly the MiB."""
    if not isinstance(s, dict):
        raise InputError(path, "must be an object", field=section)
    for f in ("budget_mib", "budget_bytes", *extra):
        if not _is_int(s.get(f)) or s[f] < (1 if positive else 0):
            what = "a positive" if positive else "a non-negative"
            raise InputError(path, f"must be {what} integer", field=f"{section}.{f}")
    if s["budget_bytes"] != s["budget_mib"] << 20:
        raise InputError(path, "is not budget_mib MiB", field=f"{section}.budget_bytes")


def _validate_vram(s: Any, path: str | Path | None) -> None:
    """The one VRAM budget (codegen.vram): the budget, each admitted rule's cost, never over."""
    _check_budget(s, "vram", ("planned_bytes",), path)
    admitted = s.get("admitted")
    if not isinstance(admitted, list):
        raise InputError(path, "must be a list", field="vram.admitted")
    total = 0
    for i, a in enumerate(admitted):
        where = f"vram.admitted[{i}]"
        if not isinstance(a, dict) or a.get("kind") not in VRAM_KINDS:
            raise InputError(path, f"needs kind one of {list(VRAM_KINDS)}", field=where)
        if not _is_int(a.get("bytes")) or a["bytes"] <= 0:
            raise InputError(path, "needs a positive integer bytes", field=where)
        total += a["bytes"]
    if total != s["planned_bytes"]:
        raise InputError(path, f"the admitted rules' bytes add up to {total}", field="vram.planned_bytes")
    if total > s["budget_bytes"]:
        raise InputError(path, "the admitted rules exceed the budget", field="vram.planned_bytes")
    caps = s.get("caps_mib")
    if not isinstance(caps, dict) or set(caps) != set(VRAM_KINDS):
        raise InputError(path, f"must be an object keyed by {list(VRAM_KINDS)}", field="vram.caps_mib")
    if not all(_is_int(v) and v >= 0 for v in caps.values()) or sum(caps.values()) > s["budget_mib"]:
        raise InputError(path, "non-negative integers adding up to at most the budget", field="vram.caps_mib")


def _validate_kv_shadow(s: Any, path: str | Path | None) -> None:
    """The KV shadow's run-time budget (codegen.kv_shadow): positive, in MiB and bytes."""
    _check_budget(s, "kv_shadow", (), path, positive=True)


def _validate_cache(c: Any, path: str | Path | None) -> None:
    """The weight-cache plan (codegen.cache): a budget, the chosen shapes and their bytes, never over."""
    _check_budget(c, "cache", ("bytes",), path)
    tensors = c.get("tensors")
    if not isinstance(tensors, list):
        raise InputError(path, "must be a list", field="cache.tensors")
    total = 0
    for i, t in enumerate(tensors):
        if not isinstance(t, dict) or not _is_int(t.get("bytes")) or t["bytes"] <= 0:
            raise InputError(path, "needs a positive integer bytes", field=f"cache.tensors[{i}]")
        total += t["bytes"]
    if total != c["bytes"]:
        raise InputError(path, f"the tensors' bytes add up to {total}", field="cache.bytes")
    fallback = c.get("fallback", [])
    if not isinstance(fallback, list):
        raise InputError(path, "must be a list", field="cache.fallback")
    for i, r in enumerate(fallback):
        fallback_rule = parse_rule(r, path, f"cache.fallback[{i}]")
        if fallback_rule.is_class or "weight=cached" in str(fallback_rule.config):
            raise InputError(
                path, "a fallback is an exact rule without the cache", field=f"cache.fallback[{i}]"
            )
    if c["bytes"] > c["budget_bytes"]:
        raise InputError(path, "the chosen copies exceed the budget", field="cache.bytes")


def _only_known(
    obj: Mapping[str, Any], known: Iterable[str], path: str | Path | None, where: str, what: str
) -> None:
    allowed = set(known)
    for k in obj:
        if k not in allowed:
            raise InputError(path, f"unknown key in {what}", field=f"{where}{k}")


def parse_rule(r: Any, path: str | Path | None, where: str) -> Rule:
    """Check one rule (InputError naming ``where`` and the field) and type it."""
    if not isinstance(r, dict):
        raise InputError(path, "a rule is an object", field=where)
    if r.get("op") not in _OPS:
        raise InputError(path, f"unknown op {r.get('op')!r}", field=f"{where}.op")
    spec = registry.op_spec(r["op"])
    _only_known(
        r, (*rule_fields(r["op"]), *CLASS_FIELDS, *EVIDENCE_FIELDS), path, f"{where}.", f"a {r['op']} rule"
    )
    for f in rule_fields(r["op"]):
        if f not in r and f != "config":
            raise InputError(path, f"missing {f}", field=where)
    if r["layout"] not in {lay.value for lay in spec.layouts}:
        raise InputError(
            path, f"layout {r['layout']!r} is not a layout of {spec.op.value}", field=f"{where}.layout"
        )
    for f in spec.key.TYPE_FIELDS:
        if r[f] not in schema.GGML_TYPES:
            raise InputError(path, f"unknown ggml type {r[f]!r}", field=f"{where}.{f}")
    text = r.get("config", r["route"])
    try:
        config = registry.Config.parse(text) if isinstance(text, str) else None
    except registry.ConfigError as e:
        raise InputError(path, f"{e} (stock is never a rule)", field=f"{where}.config") from None
    if config is None or str(config) != text:
        raise InputError(
            path, f"config {text!r} is not a canonical configuration string", field=f"{where}.config"
        )
    if r["route"] != config.route.value:
        raise InputError(
            path, f"route {r['route']!r} is not the route of config {text!r}", field=f"{where}.route"
        )
    if spec.op not in registry.ROUTES[config.route].ops:
        raise InputError(path, f"route {config.route} does not serve {spec.op.value}", field=f"{where}.route")
    for f in (*spec.key.INT_FIELDS, "M_lo", "M_hi"):
        if not _is_int(r[f]) or r[f] < 0 or r[f] > 2**62:
            raise InputError(path, "must be a non-negative integer", field=f"{where}.{f}")
    zeros = [r[f] == 0 for f in spec.key.DEFAULT_FIELDS]
    if zeros and any(zeros) != all(zeros):  # FLASH_ATTN_EXT keys have no default fields
        names = " and ".join(spec.key.DEFAULT_FIELDS)
        both = "both" if len(zeros) == 2 else "all"
        raise InputError(path, f"{names} are {both} 0 (a type default) or {both} positive", field=where)
    required = [f for f in spec.key.INT_FIELDS if f not in spec.key.DEFAULT_FIELDS and f != "routing"]
    if any(r[f] < 1 for f in required) or r["M_lo"] < 1 or r["M_hi"] < r["M_lo"]:
        raise InputError(path, f"needs {', '.join(required)} >= 1 and 1 <= M_lo <= M_hi", field=where)
    if "kind" in r and r["kind"] not in RULE_KINDS and r["kind"] not in LEGACY_KINDS:
        raise InputError(
            path, f"kind must be one of {', '.join(RULE_KINDS)}, got {r['kind']!r}", field=f"{where}.kind"
        )
    if ("NK_lo" in r) != ("NK_hi" in r):
        raise InputError(path, "NK_lo and NK_hi go together (a size-class default)", field=where)
    if "buckets" in r:
        bucket_names = set(registry.ROUTING_BUCKETS.values())
        b = r["buckets"]
        if r["op"] != registry.Op.MUL_MAT_ID.value or not isinstance(b, dict) or not set(b) <= bucket_names:
            raise InputError(
                path,
                f"buckets (MUL_MAT_ID only) must be an object keyed by {sorted(bucket_names)}",
                field=where,
            )
    if "NK_lo" in r:
        for f in CLASS_FIELDS:
            if not _is_int(r[f]) or r[f] < 1 or r[f] > 2**62:
                raise InputError(path, "must be a positive integer", field=f"{where}.{f}")
        names = " = ".join(spec.key.DEFAULT_FIELDS)
        if not spec.key.DEFAULT_FIELDS:
            raise InputError(path, f"{spec.op.value} has no size-class defaults", field=where)
        if r["NK_hi"] < r["NK_lo"] or not all(zeros):
            raise InputError(path, f"a size-class default has {names} = 0 and NK_lo <= NK_hi", field=where)
    return Rule(
        key=registry.shape_key(r),
        M_lo=int(r["M_lo"]),
        M_hi=int(r["M_hi"]),
        config=config,
        kind=rule_kind(r),
        NK=class_codes(r) if is_class(r) else None,
        fields=r,
    )


def upgrade(table: Any) -> Any:
    """A table of an older layout version this tool still reads, in the current layout (else as given)."""
    if not isinstance(table, dict) or table.get("layout_version") not in UPGRADABLE_LAYOUT_VERSIONS:
        return table
    out = dict(table)
    out["layout_version"] = schema.TABLE_LAYOUT_VERSION
    for name in ("rules", "refused"):
        rows = out.get(name)
        if isinstance(rows, list):
            out[name] = [
                {**row, "config": row["route"]}
                if isinstance(row, dict) and "route" in row and "config" not in row
                else row
                for row in rows
            ]
    return out


def loads(text: str, path: str | Path | None = None) -> dict[str, Any]:
    """table.json text: strict JSON (``validators.loads_json``), then :func:`validate`."""
    return validate(upgrade(validators.loads_json(text, path)), path)


def load_typed(path: str | Path) -> TypedTable:
    """A table.json file, validated, its rules typed."""
    return parse_table(upgrade(validators.loads_json(read_text(path, TABLE_WHAT), path)), path)


def load(path: str | Path) -> dict[str, Any]:
    """A table.json file: the file checks are :func:`read_text`'s."""
    return loads(read_text(path, TABLE_WHAT), path)


# --------------------------------------------------------------------------------------------
# Lookup (mirrors ggml_dispatch_table_gpu_matches / ggml_dispatch_table_lookup in the header)


def table_gpu(table: Mapping[str, Any]) -> schema.GpuId:
    g = table["gpu"]
    return schema.GpuId(g["name"], g["cc"], g["sm_count"])


def gpu_matches(table: Mapping[str, Any], gpu: schema.GpuId) -> bool:
    """A table with no rules matches no GPU (the 'no table' header)."""
    if not table["rules"]:
        return False
    g = table["gpu"]
    return bool(gpu.name == g["name"] and gpu.cc == g["cc"] and gpu.sm_count == g["sm_count"])


def _find(
    rules: Sequence[Mapping[str, Any]], key: Any, M: int, size: int | None = None
) -> registry.Config | None:
    """``size`` None: a rule without a size class; else a size-class rule whose N*K range holds it."""
    fields = key.fields()
    want = tuple(getattr(key, f) for f in fields)
    for r in rules:
        if r["op"] != key.op or registry.key_class(r["op"]) is not type(key):
            continue  # another op, or a key of another class (a MUL_MAT key asked with a MUL_MAT_ID op)
        if tuple(r[f] for f in fields) != want or not r["M_lo"] <= M <= r["M_hi"]:
            continue
        if size is None and not is_class(r):
            return rule_typed_config(r)
        if size is not None and is_class(r) and r["NK_lo"] <= size <= r["NK_hi"]:
            return rule_typed_config(r)
    return None


def lookup_config(table: Mapping[str, Any], gpu: schema.GpuId, key: Any, M: int) -> registry.Config | None:
    """The configuration the table picks for a shape key of any op at M, or None for stock."""
    if not gpu_matches(table, gpu):
        return None
    rules = table["rules"]
    config = _find(rules, key, M)
    if config is None and key.DEFAULT_FIELDS and not key.is_default:
        config = _find(rules, key.group(), M, size=key_size(key))
    if config is None and key.DEFAULT_FIELDS and not key.is_default:
        config = _find(rules, key.group(), M)
    return config


def lookup_key(table: Mapping[str, Any], gpu: schema.GpuId, key: Any, M: int) -> str | None:
    """:func:`lookup_config` as canonical text."""
    config = lookup_config(table, gpu, key, M)
    return None if config is None else str(config)


def lookup_measured_config(
    table: Mapping[str, Any], gpu: schema.GpuId, key: Any, M: int
) -> registry.Config | None:
    """What the table picks, as its measurements were taken (``registry.Config.measured``)."""
    config = lookup_config(table, gpu, key, M)
    return None if config is None else config.measured


def lookup_measured(table: Mapping[str, Any], gpu: schema.GpuId, key: Any, M: int) -> str | None:
    """:func:`lookup_measured_config` as canonical text."""
    config = lookup_measured_config(table, gpu, key, M)
    return None if config is None else str(config)


def lookup(
    table: Mapping[str, Any],
    gpu: schema.GpuId,
    op: str,
    layout: str,
    src0_type: str,
    src1_type: str,
    M: int,
    N: int,
    K: int,
    B: int,
) -> str | None:
    """MUL_MAT: the configuration the table picks (a route name for a plain config), or None for stock.
    Exact (N, K) rules win over size-class defaults, and those over per-type defaults."""
    return lookup_key(table, gpu, schema.ShapeKey(op, layout, src0_type, src1_type, N, K, B), M)


def rule_label(r: Mapping[str, Any]) -> str:
    span = f"M={r['M_lo']}" if r["M_lo"] == r["M_hi"] else f"M={r['M_lo']}..{r['M_hi']}"
    key = registry.shape_key(r)
    if not is_class(r):
        return f"{key.label()} {span}"
    hi = "inf" if r["NK_hi"] >= 2**62 else str(r["NK_hi"])
    t0, t1 = (r[f] for f in key.TYPE_FIELDS)
    parts = [f"{'*'.join(key.DEFAULT_FIELDS)}={r['NK_lo']}..{hi}"]
    parts += [f"{f}={r[f]}" for f in key.INT_FIELDS if f not in key.DEFAULT_FIELDS]
    return f"{r['op']} {r['layout']} {t0}x{t1} {' '.join(parts)} {span}"


def rule_kind(r: Mapping[str, Any]) -> str | None:
    """measured / interpolated / default; None when the source does not say (a parsed header's exact rule)."""
    k = r.get("kind")
    if isinstance(k, str):
        return LEGACY_KINDS.get(k, k)
    return "default" if registry.shape_key(r).is_default else None


def core_rules(rules: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rules reduced to the fields the runtime sees (what a header carries)."""
    return [
        {f: (rule_config(r) if f == "config" else r[f]) for f in (*rule_fields(r["op"]), *class_fields(r))}
        for r in rules
    ]


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
                **(dict(zip(CLASS_FIELDS, ints[:2], strict=True)) if len(ints) == 5 else {}),
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
            "source": strs.get("GGML_DISPATCH_TABLE_SOURCE", SOURCE_NONE),
            "tool_version": strs.get("GGML_DISPATCH_TABLE_TOOL_VERSION"),
            "tuning_sha256": strs.get("GGML_DISPATCH_TABLE_TUNING_SHA256") or None,
        },
        "rules": rules,
        "refused": [],
    }
    return validate(table, path), statics["ggml_dispatch_table_hash"]


# --------------------------------------------------------------------------------------------
# Reading files

TABLE_WHAT: Final = "a table.json"
ANY_WHAT: Final = "a table.json or a ggml-dispatch-table.h header"
HEADER_MARK: Final = "GGML_DISPATCH_TABLE_"


decode_text = validators.decode_text
read_text = validators.read_text


@dataclass(frozen=True)
class LoadedTable:
    table: dict[str, Any]
    hash: str  # sha256 of the canonical table.json (the one a header embeds)
    origin: str
    kind: str  # "json", "header" or "empty"


def loads_any(text: str, origin: str) -> LoadedTable:
    """table.json text or a rendered header (the content decides which)."""
    body = text.lstrip()
    if body.startswith("{"):
        t = loads(text, origin)
        return LoadedTable(t, table_hash(t), origin, "json")
    if HEADER_MARK not in text:
        what = "JSON" if body[:1] in ("[", '"') or body[:1].isdigit() else "text"
        raise InputError(
            origin,
            f"{what}, but neither a table.json (a JSON object) "
            "nor a header rendered by ggml-dispatch codegen",
        )
    t, h = parse_header(text, origin)
    return LoadedTable(t, h, origin, "header")


def load_any(path: str | Path) -> LoadedTable:
    """A table.json or rendered header file."""
    return loads_any(read_text(path, ANY_WHAT), str(path))


@dataclass(frozen=True)
class Table:
    """A validated table.json file, with what a provenance section says about it."""

    path: Path
    data: dict[str, Any]
    sha256: str

    def details(self) -> list[tuple[str, str]]:
        data: Mapping[str, Any] = self.data
        gpu = data["gpu"]
        prov = data.get("provenance", {})
        out = [
            ("GPU", f"{gpu['name']} (cc {gpu['cc']}, {gpu['sm_count']} SMs)"),
            ("upstream commit", str(data["upstream_commit"]) or "(none)"),
            ("rules", str(len(data["rules"]))),
            ("refused candidates", str(len(data.get("refused", [])))),
            ("table hash", table_hash(data)),
            ("source", str(prov.get("source", "(none)"))),
        ]
        if isinstance(prov.get("decision"), dict):
            out.append(("decision", json.dumps(prov["decision"], sort_keys=True)))
        return out


def read(path: str | Path) -> Table:
    p = Path(path)
    data = load(p)
    return Table(p, data, fileio.sha256_file(p))
