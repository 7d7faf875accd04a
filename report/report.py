"""The report: tuning (+ census, table, A/B runs) -> REPORT.md and PNG plots.

Everything here is a pure function of its inputs except the ``load_*`` readers, which validate a file
and turn bad input into one :class:`~ggml_dispatch.errors.InputError` naming the file. The same inputs
give byte-identical Markdown: stable ordering, fixed bootstrap seeds, no clock.

The statistics are the decision code's own (:mod:`codegen.decide`), so the report and the table agree
on every verdict:

- a *point* is (shape key, M), the shape key being ``schema.SHAPE_KEY``;
- a route at a point: the median ``us`` of its ok trials; its speed-up over stock is the median of the
  per-trial ratios ``anchor_us / us`` with a 95% percentile bootstrap CI over trials;
  "beyond noise" means that CI lies entirely on one side of 1;
- stock at a point: the median ``anchor_us`` of the point's ok rows;
- A/B: per pair, arm t/s / baseline t/s; the median of those ratios with the same bootstrap.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from census import estimate
from codegen import decide
from codegen import table as table_mod
from ggml_dispatch import fileio, schema
from ggml_dispatch.errors import InputError
from report import analysis, timeline

PLOTS_DIR: Final = "plots"
REPORT_NAME: Final = "REPORT.md"

STATUS_KINDS: Final = ("ok", "ineligible", "wrong", "drifted", "failed", "pruned")
AB_ARMS: Final = ("stock", "table", "crude")
# (arm, baseline) pairs compared per (model, test, ubatch); a table must beat the crude rule too.
AB_COMPARISONS: Final = (("table", "stock"), ("crude", "stock"), ("table", "crude"))

_ROUTE_ORDER: Final = tuple(r.value for r in schema.ROUTE_CODES)
_ROUTE_COLORS: Final = {
    "mmvf": "#1f77b4",
    "mmf": "#ff7f0e",
    "mmvq": "#2ca02c",
    "mmq": "#d62728",
    "cublas": "#9467bd",
}
_OTHER_COLORS: Final = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_STOCK_COLOR: Final = "#000000"
_TOP_BARS: Final = 20
_DPI: Final = 100

ShapeKey = decide.ShapeKey


# ============================================================================================
# Small statistics


@dataclass(frozen=True)
class Spread:
    """Median, quartiles (linear interpolation) and min/max of a sample; NaNs when empty."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float


def spread(xs: Sequence[float]) -> Spread:
    a = np.asarray(xs, dtype=np.float64)
    if not a.size:
        return Spread(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    q1, med, q3 = np.quantile(a, [0.25, 0.5, 0.75])
    return Spread(int(a.size), float(med), float(q1), float(q3), float(a.min()), float(a.max()))


def weighted_speedup(weights: Sequence[float], speedups: Sequence[float]) -> float:
    """Speed-up of a workload whose parts take ``weights`` time and speed up by ``speedups`` (Amdahl):
    sum(w) / sum(w / s). NaN when the weights sum to 0."""
    total = float(sum(weights))
    if total <= 0.0:
        return math.nan
    return total / float(sum(w / s for w, s in zip(weights, speedups, strict=True)))


@dataclass(frozen=True)
class Ratio:
    """A paired ratio: median of the per-pair ratios, bootstrap CI (None with fewer than 2 pairs)."""

    point: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def below(self) -> bool:
        return self.hi is not None and self.hi < 1.0

    @property
    def above(self) -> bool:
        return self.lo is not None and self.lo > 1.0


def paired_ratio(numer: Sequence[float], denom: Sequence[float], params: decide.Params) -> Ratio:
    """Median of numer_i/denom_i with the decision code's percentile bootstrap (fixed seed)."""
    ratios = [a / b for a, b in zip(numer, denom, strict=True)]
    if not ratios:
        return Ratio(math.nan, None, None, 0)
    point = float(np.median(ratios))
    if len(ratios) < 2:
        return Ratio(point, None, None, len(ratios))
    lo, hi = decide.bootstrap_ci(ratios, params, params.seed)
    return Ratio(point, lo, hi, len(ratios))


# ============================================================================================
# Data model


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _route_key(route: str) -> tuple[int, str]:
    return (_ROUTE_ORDER.index(route), "") if route in _ROUTE_ORDER else (len(_ROUTE_ORDER), route)


def shape_sort_key(key: ShapeKey) -> tuple[Any, ...]:
    """The C rules array's order (op, layout, type ids, N, K, B); unknown names after known ones."""
    ops = {o.value: c for o, c in schema.OP_CODES.items()}
    layouts = {x.value: c for x, c in schema.LAYOUT_CODES.items()}

    def tid(name: str) -> int:
        t = schema.GGML_TYPES.get(name)
        return t.id if t is not None else 1 << 20

    return (
        ops.get(key.op, 99),
        layouts.get(key.layout, 99),
        tid(key.src0_type),
        tid(key.src1_type),
        key.N,
        key.K,
        key.B,
        key.op,
        key.layout,
        key.src0_type,
        key.src1_type,
    )


def shape_label(key: ShapeKey) -> str:
    return key.label()


def shape_slug(key: ShapeKey) -> str:
    raw = f"{key.op}-{key.layout}-{key.src0_type}-{key.src1_type}-n{key.N}-k{key.K}-b{key.B}"
    return _safe_name(raw.lower())


def type_key(key: ShapeKey) -> tuple[str, str, str, str]:
    return (key.op, key.layout, key.src0_type, key.src1_type)


@dataclass(frozen=True)
class RouteAtPoint:
    route: str
    ev: decide.RouteEval
    counts: Mapping[str, int]  # status kind -> trials
    times: Spread  # us of the ok trials
    check: decide.Verdict  # may it replace stock here (the decision rule, ignoring who is fastest)
    slower: bool  # slower than stock beyond noise

    @property
    def trials(self) -> int:
        return sum(self.counts.values())

    @property
    def faster(self) -> bool:
        return self.ev.ci_low is not None and self.ev.ci_low > 1.0

    def verdict(self) -> str:
        if self.ev.n_ok == 0:
            return "no ok trial"
        if self.ev.ratio is None:
            return "no stock anchor"
        if self.slower:
            return "slower"
        if self.faster:
            return "faster"
        if self.ev.is_anchor:
            return "stock's own route"
        if self.ev.reference:
            return "reference (no CI)"
        if self.ev.ci_low is None:
            return "n/a (<2 trials)"
        return "within noise"


@dataclass(frozen=True)
class Point:
    shape: ShapeKey
    M: int
    stock: Spread  # anchor_us of the point's ok rows
    stock_trials: int  # distinct trials with a stock anchor
    routes: tuple[RouteAtPoint, ...]
    winner: str | None  # lowest median among routes with ok trials
    chosen: str | None  # the winner if it passes the decision rule, else None (stock stays)

    def route(self, name: str | None) -> RouteAtPoint | None:
        for r in self.routes:
            if r.route == name:
                return r
        return None


@dataclass(frozen=True)
class TableView:
    """A validated table.json (``codegen.table``), looked up as the runtime would on its own GPU."""

    data: Mapping[str, Any]

    @property
    def rules(self) -> list[dict[str, Any]]:
        return list(self.data["rules"])

    def route_at(self, key: ShapeKey, M: int) -> str | None:
        return table_mod.lookup(
            self.data,
            table_mod.table_gpu(self.data),
            key.op,
            key.layout,
            key.src0_type,
            key.src1_type,
            M,
            key.N,
            key.K,
            key.B,
        )

    def rules_for(self, key: ShapeKey) -> list[dict[str, Any]]:
        """The shape key's own rules, then the per-type defaults (N = K = 0) that can apply to it."""
        own = [r for r in self.rules if tuple(r[f] for f in table_mod.KEY_FIELDS) == _key_tuple(key)]
        default = _key_tuple(ShapeKey(key.op, key.layout, key.src0_type, key.src1_type, 0, 0, key.B))
        defaults = [r for r in self.rules if tuple(r[f] for f in table_mod.KEY_FIELDS) == default]
        return sorted(own, key=lambda r: int(r["M_lo"])) + sorted(defaults, key=lambda r: int(r["M_lo"]))


def _key_tuple(key: ShapeKey) -> tuple[Any, ...]:
    return (key.op, key.layout, key.src0_type, key.src1_type, key.N, key.K, key.B)


def _is_default(rule: Mapping[str, Any]) -> bool:
    return bool(rule["N"] == 0 and rule["K"] == 0)


@dataclass(frozen=True)
class AbRecord:
    model: str
    test: str
    ubatch: int
    arm: str
    pair: int
    tps: float
    run: str = ""  # which A/B file: runs of different files are never paired


@dataclass(frozen=True)
class AbComparison:
    model: str
    test: str
    ubatch: int
    arm: str  # numerator
    baseline: str  # denominator
    ratio: Ratio
    unpaired: int  # runs of either arm without a partner in the other
    pairs: tuple[tuple[int, float], ...]  # (pair id, arm/baseline) for every complete pair


@dataclass(frozen=True)
class InputFile:
    """What the provenance section says about one input file."""

    role: str
    name: str
    sha256: str
    details: tuple[tuple[str, str], ...]


@dataclass
class Inputs:
    tuning: pd.DataFrame
    files: list[InputFile]
    params: decide.Params = field(default_factory=decide.Params)
    census: list[dict[str, Any]] | None = None
    table: TableView | None = None
    ab: list[AbRecord] | None = None
    profile: timeline.Profile | None = None
    notes: str | None = None


@dataclass
class Report:
    markdown: str
    figures: dict[str, bytes] = field(default_factory=dict)  # file name under plots/ -> PNG bytes


# ============================================================================================
# Loading and validation (the only impure part)


def _type_ok(kind: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True  # a column of nulls only; the row checks decide whether nulls are allowed there
    if kind == "string":
        return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t))
    if kind == "int64":
        return bool(pa.types.is_integer(t))
    if kind == "float64":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "bool":
        return bool(pa.types.is_boolean(t))
    return True


def _read_parquet(
    path: Path, schema_name: str, columns: Mapping[str, str], what: str
) -> tuple[pa.Table, dict[str, str]]:
    if not path.is_file():
        raise InputError(path, f"no such {what} file")
    if path.stat().st_size == 0:
        raise InputError(path, f"empty file (expected a {what} Parquet file)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(path, f"not a readable Parquet file: {e}") from None
    meta: dict[str, str] = {}
    for k, v in (table.schema.metadata or {}).items():
        key = k.decode("utf-8", "replace")
        if key.startswith(schema.META_PREFIX):
            meta[key] = v.decode("utf-8", "replace")
    got = meta.get(schema.META_SCHEMA)
    if got is None:
        raise InputError(
            path,
            f"no '{schema.META_SCHEMA}' key-value metadata: not a {what} file written by ggml-dispatch",
            field=schema.META_SCHEMA,
        )
    if got != schema_name:
        raise InputError(
            path, f"schema is {got!r}, expected {schema_name!r} (a {what} file)", field=schema.META_SCHEMA
        )
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)}", field=missing[0])
    for col, kind in columns.items():
        t = table.schema.field(col).type
        if not _type_ok(kind, t):
            raise InputError(path, f"column has type {t}, expected {kind}", field=col)
    if table.num_rows == 0:
        raise InputError(path, f"no rows: an empty {what} file")
    return table.select(list(columns)), meta


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in df.to_dict("records")]


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _describe(meta: Mapping[str, str], keys: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(label, meta[key]) for label, key in keys if meta.get(key)]


def _distinct(rows: Iterable[Mapping[str, Any]], *cols: str) -> str:
    values = sorted({" / ".join(str(r[c]) for c in cols) for r in rows if all(_present(r[c]) for c in cols)})
    return ", ".join(values) if values else "(none)"


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def status_kind(status: str) -> str | None:
    """The kind of a tuning status (one of STATUS_KINDS); None if invalid."""
    if status in ("ok", "ineligible", "wrong", "drifted", "pruned"):
        return status
    if status.startswith(schema.FAILED_PREFIX):
        return "failed"
    return None


def load_tuning(path: Path, params: decide.Params) -> tuple[pd.DataFrame, InputFile]:
    """Read and validate tuning.parquet (the decision code's row checks, plus schema and status)."""
    table, meta = _read_parquet(path, schema.TUNING_SCHEMA, schema.TUNING_COLUMNS, "tuning")
    df = table.to_pandas()
    for i, status in enumerate(df["status"]):
        if not isinstance(status, str) or status_kind(status) is None:
            raise InputError(
                path,
                f"unknown status {status!r} (ok, ineligible, wrong, drifted, pruned or failed:<msg>)",
                field=f"row {i}: status",
            )
    decide.check_rows(df, path, params)
    rows = _records(df)
    details = [
        ("GPU", _distinct(rows, "gpu_name")),
        ("cc / SMs", _distinct(rows, "gpu_cc", "gpu_sm_count")),
        ("GPU uuid", _distinct(rows, "gpu_uuid")),
        ("driver / CUDA / cuBLAS", _distinct(rows, "driver", "cuda_version", "cublas_version")),
        ("upstream commit", _distinct(rows, "upstream_commit")),
        ("patch hash", _distinct(rows, "patch_hash")),
        ("harness version", _distinct(rows, "harness_version")),
        ("source", _distinct(rows, "source")),
        ("rows", str(len(rows))),
    ]
    details += _describe(
        meta,
        (
            ("schema", schema.META_SCHEMA),
            ("tool version", schema.META_TOOL_VERSION),
            ("metadata upstream commit", schema.META_UPSTREAM_COMMIT),
            ("metadata patch hash", schema.META_PATCH_HASH),
        ),
    )
    return df, InputFile("tuning", path.name, fileio.sha256_file(path), tuple(details))


def load_census(path: Path) -> tuple[list[dict[str, Any]], InputFile]:
    table, meta = _read_parquet(path, schema.CENSUS_SCHEMA, schema.CENSUS_COLUMNS, "census")
    rows: list[dict[str, Any]] = table.to_pylist()
    ops = {o.value for o in schema.Op}
    layouts = {x.value for x in schema.Layout}
    for i, row in enumerate(rows):
        where = f"row {i}"
        for col in ("op", "layout", "src0_type", "src1_type", "M", "N", "K", "B", "calls", "est_us"):
            if row[col] is None:
                raise InputError(path, "null in a required column", field=f"{where}: {col}")
        if row["op"] not in ops:
            raise InputError(path, f"unknown op {row['op']!r}", field=f"{where}: op")
        if row["layout"] not in layouts:
            raise InputError(path, f"unknown layout {row['layout']!r}", field=f"{where}: layout")
        for col in ("M", "N", "K", "B"):
            if row[col] < 1:
                raise InputError(
                    path, f"must be a positive integer, got {row[col]!r}", field=f"{where}: {col}"
                )
        if not (_finite(row["est_us"]) and row["est_us"] >= 0):
            raise InputError(
                path, f"est_us must be a time >= 0, got {row['est_us']!r}", field=f"{where}: est_us"
            )
    details = [
        ("GPU", _distinct(rows, "gpu_name")),
        ("cc / SMs", _distinct(rows, "gpu_cc", "gpu_sm_count")),
        ("source", _distinct(rows, "source")),
        ("estimate", _distinct(rows, "est_kind")),
        ("rows", str(len(rows))),
    ]
    details += _describe(
        meta,
        (
            ("schema", schema.META_SCHEMA),
            ("tool version", schema.META_TOOL_VERSION),
            ("upstream commit", schema.META_UPSTREAM_COMMIT),
            ("patch hash", schema.META_PATCH_HASH),
            ("GGUF hashes", schema.META_GGUF_HASHES),
        ),
    )
    return rows, InputFile("census", path.name, fileio.sha256_file(path), tuple(details))


def load_table(path: Path) -> tuple[TableView, InputFile]:
    """Read table.json through ``codegen.table`` (the same validation codegen and install use)."""
    if path.is_file() and not path.read_bytes().strip():
        raise InputError(path, "empty file (expected table.json)")
    data = table_mod.load(path)
    gpu = data["gpu"]
    prov = data.get("provenance", {})
    details = [
        ("GPU", f"{gpu['name']} (cc {gpu['cc']}, {gpu['sm_count']} SMs)"),
        ("upstream commit", str(data["upstream_commit"]) or "(none)"),
        ("rules", str(len(data["rules"]))),
        ("refused candidates", str(len(data.get("refused", [])))),
        ("table hash", table_mod.table_hash(data)),
        ("source", str(prov.get("source", "(none)"))),
    ]
    if isinstance(prov.get("decision"), dict):
        details.append(("decision", json.dumps(prov["decision"], sort_keys=True)))
    return TableView(data), InputFile("table", path.name, fileio.sha256_file(path), tuple(details))


def params_from_table(table: TableView | None, reference_margin: float | None = None) -> decide.Params:
    """Decision parameters the table was made with (so verdicts match it), else the defaults."""
    base = decide.Params(reference_margin=reference_margin)
    if table is None:
        return base
    dec = table.data.get("provenance", {}).get("decision")
    if not isinstance(dec, dict):
        return base
    known = table_mod.DECISION_PARAMS
    kwargs: dict[str, Any] = {known[k]: v for k, v in dec.items() if k in known and v is not None}
    if reference_margin is not None:
        kwargs["reference_margin"] = reference_margin
    return decide.Params(**kwargs)


_AB_FIELDS: Final[dict[str, str]] = {
    "model": "str",
    "test": "str",
    "ubatch": "int",
    "arm": "str",
    "pair": "int",
    "tps": "number",
}


def _ab_type_ok(kind: str, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "str":
        return isinstance(value, str) and value != ""
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, int | float)


def parse_ab_lines(lines: Iterable[str], path: Path) -> list[tuple[int, AbRecord]]:
    """JSON Lines -> (line number, record); blank lines skipped, extra keys ignored."""
    out: list[tuple[int, AbRecord]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, f"invalid JSON: {e.msg}", line=lineno) from None
        if not isinstance(obj, dict):
            raise InputError(path, "each line must be a JSON object", line=lineno)
        for name, kind in _AB_FIELDS.items():
            if name not in obj:
                raise InputError(path, "missing field", line=lineno, field=name)
            if not _ab_type_ok(kind, obj[name]):
                raise InputError(path, f"expected a {kind}, got {obj[name]!r}", line=lineno, field=name)
        if obj["arm"] not in AB_ARMS:
            raise InputError(path, f"arm must be one of {', '.join(AB_ARMS)}", line=lineno, field="arm")
        if not (math.isfinite(obj["tps"]) and obj["tps"] > 0):
            raise InputError(path, "tps must be a positive number", line=lineno, field="tps")
        if obj["ubatch"] < 1:
            raise InputError(path, "ubatch must be >= 1", line=lineno, field="ubatch")
        rec = AbRecord(obj["model"], obj["test"], obj["ubatch"], obj["arm"], obj["pair"], float(obj["tps"]))
        out.append((lineno, rec))
    return out


def load_ab(paths: Sequence[Path]) -> tuple[list[AbRecord], list[InputFile]]:
    """Each file is one interleaved run: with several files, a record's ``run`` is its file's stem and
    pairs are formed within a run only."""
    records: list[AbRecord] = []
    files: list[InputFile] = []
    seen: dict[tuple[str, str, str, int, str, int], str] = {}
    for path in paths:
        if not path.is_file():
            raise InputError(path, "no such A/B file")
        numbered = parse_ab_lines(path.read_text(encoding="utf-8", errors="replace").splitlines(), path)
        if not numbered:
            raise InputError(path, "no A/B records (empty file)")
        run = path.stem if len(paths) > 1 else ""
        for lineno, old in numbered:
            rec = dataclasses.replace(old, run=run)
            key = (rec.run, rec.model, rec.test, rec.ubatch, rec.arm, rec.pair)
            if key in seen:
                raise InputError(
                    path,
                    f"a second run of model {rec.model!r} {rec.test} ubatch {rec.ubatch} arm {rec.arm} "
                    f"pair {rec.pair} (the first is at {seen[key]})",
                    line=lineno,
                )
            seen[key] = f"{path.name}:{lineno}"
            records.append(rec)
        files.append(InputFile("A/B", path.name, fileio.sha256_file(path), (("runs", str(len(numbered))),)))
    return records, files


# ============================================================================================
# Analysis (pure)


def _good(x: Any) -> bool:
    return _finite(x) and x > 0


def analyse_tuning(df: pd.DataFrame, params: decide.Params) -> list[Point]:
    """Points sorted by shape key (C order) then M; routes in route-code order."""
    evals, _stock = decide.evaluate(df, params)
    rows_at: dict[tuple[ShapeKey, int], list[dict[str, Any]]] = defaultdict(list)
    for row in _records(df):
        rows_at[(ShapeKey.of(row), int(row["M"]))].append(row)
    points: list[Point] = []
    for key in sorted(evals, key=shape_sort_key):
        for M in sorted(evals[key]):
            prow = rows_at[(key, M)]
            ok = [r for r in prow if r["status"] == "ok"]
            anchors = [float(r["anchor_us"]) for r in ok if _good(r["anchor_us"])]
            stock_trials = len({int(r["trial"]) for r in ok if _good(r["anchor_us"])})
            routes: list[RouteAtPoint] = []
            for route in sorted(evals[key][M], key=_route_key):
                ev = evals[key][M][route]
                rrows = [r for r in prow if r["route"] == route]
                counts = Counter(status_kind(str(r["status"])) or "failed" for r in rrows)
                routes.append(
                    RouteAtPoint(
                        route=route,
                        ev=ev,
                        counts={k: counts.get(k, 0) for k in STATUS_KINDS},
                        times=spread([float(r["us"]) for r in rrows if r["status"] == "ok"]),
                        check=decide.verdict(ev, params),
                        slower=decide.slower_beyond_noise(ev, params),
                    )
                )
            points.append(
                Point(
                    shape=key,
                    M=M,
                    stock=spread(anchors),
                    stock_trials=stock_trials,
                    routes=tuple(routes),
                    winner=decide.winner(evals[key][M]),
                    chosen=decide.passing_route(evals[key][M], params),
                )
            )
    return points


def failure_messages(df: pd.DataFrame) -> list[tuple[str, int, str]]:
    """(message, trials, first point) for every distinct ``failed:<msg>``, most frequent first."""
    counts: Counter[str] = Counter()
    first: dict[str, tuple[Any, ...]] = {}
    for row in _records(df):
        status = str(row["status"])
        if status_kind(status) != "failed":
            continue
        msg = status[len(schema.FAILED_PREFIX) :].strip() or "(no message)"
        counts[msg] += 1
        key = ShapeKey.of(row)
        where = (shape_sort_key(key), int(row["M"]), _route_key(str(row["route"])), int(row["trial"]))
        label = f"{shape_label(key)}, M={row['M']}, {row['route']}"
        if msg not in first or where < first[msg][0]:
            first[msg] = (where, label)
    return sorted(((m, c, str(first[m][1])) for m, c in counts.items()), key=lambda t: (-t[1], t[0]))


@dataclass(frozen=True)
class CensusPoint:
    shape: ShapeKey
    M: int
    fused: bool
    calls: int
    est_us: float


def census_points(rows: Sequence[Mapping[str, Any]]) -> list[CensusPoint]:
    """Census rows summed per (shape key, M, fused or not)."""
    acc: dict[tuple[ShapeKey, int, bool], list[float]] = {}
    for r in rows:
        key = (ShapeKey.of(r), int(r["M"]), bool(r["fused"]))
        a = acc.setdefault(key, [0.0, 0.0])
        a[0] += float(r["calls"])
        a[1] += float(r["est_us"])
    order = sorted(acc, key=lambda k: (shape_sort_key(k[0]), k[1], k[2]))
    return [CensusPoint(s, m, f, int(acc[(s, m, f)][0]), acc[(s, m, f)][1]) for s, m, f in order]


def census_shares(
    rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]
) -> list[tuple[str, float]]:
    """(group, est_us) sorted by est_us descending, then name."""
    acc: dict[str, float] = defaultdict(float)
    for r in rows:
        acc[key(r)] += float(r["est_us"])
    return sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass(frozen=True)
class Prediction:
    point: CensusPoint
    measured: Point | None  # None: no tuning data at this (shape key, M)
    table_route: str | None  # None without a table or where the table keeps stock

    @property
    def covered(self) -> bool:
        """Tunable and measured: not fused, and stock plus at least one route timed here."""
        m = self.measured
        return not self.point.fused and m is not None and m.stock.n > 0 and m.winner is not None

    def chosen_speedup(self) -> float:
        """What the decision rule would gain here: the passing winner's ratio, else 1 (stock stays)."""
        m = self.measured
        if not self.covered or m is None or m.chosen is None:
            return 1.0
        rp = m.route(m.chosen)
        return rp.ev.ratio if rp is not None and rp.ev.ratio is not None else 1.0

    def table_speedup(self) -> float | None:
        """Stock/table-route ratio measured here; 1 where stock stays; None if the route is unmeasured."""
        if self.table_route is None or self.point.fused:
            return 1.0
        rp = self.measured.route(self.table_route) if self.measured is not None else None
        if rp is None or rp.ev.ratio is None:
            return None
        return rp.ev.ratio


def predictions(
    cpoints: Sequence[CensusPoint], points: Sequence[Point], table: TableView | None
) -> list[Prediction]:
    by_key = {(p.shape, p.M): p for p in points}
    out = []
    for cp in cpoints:
        route = table.route_at(cp.shape, cp.M) if table is not None and not cp.fused else None
        out.append(Prediction(cp, by_key.get((cp.shape, cp.M)), route))
    return out


def effective_M(test: str, ubatch: int) -> int | None:
    """M of the matmuls a llama-bench test runs: ppN -> min(N, ubatch), tgN -> 1; None if unknown."""
    m = re.fullmatch(r"pp(\d+)", test)
    if m:
        return min(int(m.group(1)), ubatch)
    if re.fullmatch(r"tg\d+", test):
        return 1
    return None


@dataclass(frozen=True)
class Predicted:
    """Census-weighted predicted speed-up of matmul time over a set of census points."""

    speedup: float
    covered_share: float  # share of the est_us considered that has tuning data
    unmeasured_share: float  # share where the table's route has no measurement (counted as 1)


def predicted_speedup(preds: Sequence[Prediction], which: str, M: int | None = None) -> Predicted | None:
    """``which``: "chosen" (the decision rule at each point) or "table". Points that are fused or lack
    tuning data count at 1.0 (stock stays); so does a table route never measured at a point."""
    sel = [p for p in preds if M is None or p.point.M == M]
    total = sum(p.point.est_us for p in sel)
    if not sel or total <= 0:
        return None
    speedups: list[float] = []
    unmeasured = 0.0
    for p in sel:
        s = p.chosen_speedup() if which == "chosen" else p.table_speedup()
        if s is None:
            unmeasured += p.point.est_us
        speedups.append(1.0 if s is None else s)
    covered = sum(p.point.est_us for p in sel if p.covered)
    return Predicted(
        weighted_speedup([p.point.est_us for p in sel], speedups), covered / total, unmeasured / total
    )


def ab_model_label(r: AbRecord) -> str:
    """The model as tables show it: with its run (A/B file) when several runs are reported."""
    return f"{r.model} [{r.run}]" if r.run else r.model


def ab_comparisons(records: Sequence[AbRecord], params: decide.Params) -> list[AbComparison]:
    """Per (model, test, ubatch): table/stock, crude/stock and table/crude, paired by ``pair``."""
    groups: dict[tuple[str, str, int], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        groups[(ab_model_label(r), r.test, r.ubatch)][r.arm][r.pair] = r.tps
    out: list[AbComparison] = []
    for (model, test, ubatch), arms in sorted(groups.items()):
        for arm, base in AB_COMPARISONS:
            if arm not in arms or base not in arms:
                continue
            common = sorted(set(arms[arm]) & set(arms[base]))
            ratio = paired_ratio([arms[arm][p] for p in common], [arms[base][p] for p in common], params)
            unpaired = len(set(arms[arm]) ^ set(arms[base]))
            pairs = tuple((p, arms[arm][p] / arms[base][p]) for p in common)
            out.append(AbComparison(model, test, ubatch, arm, base, ratio, unpaired, pairs))
    return out


def ab_arm_spreads(records: Sequence[AbRecord]) -> list[tuple[str, str, int, str, Spread]]:
    acc: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    for r in records:
        acc[(ab_model_label(r), r.test, r.ubatch, r.arm)].append(r.tps)
    keys = sorted(acc, key=lambda k: (k[0], k[1], k[2], AB_ARMS.index(k[3])))
    return [(*k, spread(acc[k])) for k in keys]


# ============================================================================================
# Formatting


def fmt_us(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.2f}"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.3f}"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"


def fmt_share(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def fmt_tps(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:,.1f}"


def fmt_iqr(s: Spread) -> str:
    return "–" if s.n == 0 else f"{s.q1:.2f}–{s.q3:.2f}"


def fmt_minmax(s: Spread) -> str:
    return "–" if s.n == 0 else f"{s.min:.2f}–{s.max:.2f}"


def ab_verdict(r: Ratio) -> str:
    if r.lo is None:
        return "n/a (<2 pairs)"
    return "LOSS" if r.below else "gain" if r.above else "within noise"


def md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# ============================================================================================
# Figures (matplotlib's Agg canvas; no pyplot state)


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _route_color(route: str, others: list[str]) -> str:
    if route in _ROUTE_COLORS:
        return _ROUTE_COLORS[route]
    if route not in others:
        others.append(route)
    return _OTHER_COLORS[others.index(route) % len(_OTHER_COLORS)]


def _log_m_axis(ax: Axes, Ms: Iterable[int]) -> None:
    """Log-2 M axis labelled with the measured M values (at most about 12 labels)."""
    ticks = sorted(set(Ms))
    ax.set_xscale("log", base=2)
    if ticks:
        step = max(1, math.ceil(len(ticks) / 12))
        ax.set_xticks(ticks[::step], [str(m) for m in ticks[::step]])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("M (tokens)")


def _tick_label(value: float, _pos: int) -> str:
    return f"{value:g}"


def _minor_tick_label(value: float, _pos: int) -> str:
    """Label the 2x and 5x minor ticks of a log axis, leave the others blank."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(mantissa, 6) in (2.0, 5.0) else ""


def _errorbar(ax: Axes, Ms: list[int], sp: list[Spread], color: str, label: str, style: str) -> None:
    med = [s.median for s in sp]
    ax.errorbar(
        Ms,
        med,
        yerr=[[s.median - s.q1 for s in sp], [s.q3 - s.median for s in sp]],
        fmt=style,
        color=color,
        label=label,
        capsize=3,
        ms=4,
        lw=1.2,
    )
    if len(Ms) > 1:
        ax.fill_between(Ms, [s.min for s in sp], [s.max for s in sp], color=color, alpha=0.12, lw=0)


def plot_shape(key: ShapeKey, points: Sequence[Point], rules: Sequence[Mapping[str, Any]], gpu: str) -> bytes:
    """Time vs M per route (median, IQR bars, min-max band), the stock anchor and the rules' M ranges."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    others: list[str] = []
    stock = [(p.M, p.stock) for p in points if p.stock.n > 0]
    if stock:
        _errorbar(ax, [m for m, _ in stock], [s for _, s in stock], _STOCK_COLOR, "stock (anchor)", "--o")
    for route in sorted({r.route for p in points for r in p.routes}, key=_route_key):
        series = [(p.M, rp.times) for p in points if (rp := p.route(route)) is not None and rp.times.n > 0]
        if series:
            color = _route_color(route, others)
            _errorbar(ax, [m for m, _ in series], [s for _, s in series], color, route, "-o")
    _log_m_axis(ax, [p.M for p in points])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_tick_label))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_tick_label))
    for rule in rules:
        color = _route_color(str(rule["route"]), others)
        lo, hi = int(rule["M_lo"]), int(rule["M_hi"])
        default = _is_default(rule)
        ax.axvspan(lo / 1.1, hi * 1.1, color=color, alpha=0.06 if default else 0.12, lw=0, hatch=None)
        ax.annotate(
            f"{'default' if default else 'rule'}: {rule['route']} M {lo}–{hi}",
            xy=((lo * hi) ** 0.5, 0.99 if not default else 0.94),
            xycoords=("data", "axes fraction"),
            ha="center",
            va="top",
            fontsize=7,
            color=color,
        )
    ax.set_ylabel("time per op (µs): median, IQR bars, min–max band")
    ax.set_title(f"{shape_label(key)}\n{gpu}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _png(fig)


def plot_type_speedups(tkey: tuple[str, str, str, str], points: Sequence[Point], gpu: str) -> bytes:
    """The fastest route's stock/route ratio (95% CI) vs M, one line per (N, K, B) of this type pair."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    by_shape: dict[ShapeKey, list[tuple[int, decide.RouteEval]]] = defaultdict(list)
    for p in points:
        rp = p.route(p.winner)
        if rp is not None and rp.ev.ratio is not None:
            by_shape[p.shape].append((p.M, rp.ev))
    for i, key in enumerate(sorted(by_shape, key=shape_sort_key)):
        series = by_shape[key]
        ratios = [ev.ratio or math.nan for _, ev in series]
        lo = [
            r - ev.ci_low if ev.ci_low is not None else 0.0 for r, (_, ev) in zip(ratios, series, strict=True)
        ]
        hi = [
            ev.ci_high - r if ev.ci_high is not None else 0.0
            for r, (_, ev) in zip(ratios, series, strict=True)
        ]
        ax.errorbar(
            [m for m, _ in series],
            ratios,
            yerr=[lo, hi],
            fmt="-o",
            ms=4,
            capsize=3,
            color=f"C{i % 10}",
            label=f"N={key.N} K={key.K} B={key.B}",
        )
    ax.axhline(1.0, color=_STOCK_COLOR, lw=1, ls="--")
    _log_m_axis(ax, [p.M for p in points])
    ax.set_ylabel("stock / fastest route (median of paired ratios, 95% CI)")
    ax.set_title(f"{' '.join(tkey[:2])} {tkey[2]} x {tkey[3]}: fastest route vs stock\n{gpu}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if by_shape:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _png(fig)


def plot_census(title: str, shares: Sequence[tuple[str, float]]) -> bytes:
    total = sum(v for _, v in shares) or 1.0
    top = list(shares[:_TOP_BARS])
    rest = shares[_TOP_BARS:]
    if rest:
        top.append((f"other ({len(rest)})", sum(v for _, v in rest)))
    fig = Figure(figsize=(8, 1.4 + 0.28 * len(top)))
    ax = fig.add_subplot()
    ax.barh(range(len(top)), [100.0 * v / total for _, v in reversed(top)], color="#4c72b0")
    ax.set_yticks(range(len(top)), [k for k, _ in reversed(top)], fontsize=7)
    ax.set_xlabel("share of census est_us (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def plot_gain(
    preds: Sequence[Prediction], comps: Sequence[AbComparison], ab_predicted: Mapping[int, float]
) -> bytes:
    """Left: predicted per-op speed-up per census point. Right (with A/B): measured ratios and CIs."""
    fig = Figure(figsize=(12 if comps else 8, 5))
    ax = fig.add_subplot(1, 2 if comps else 1, 1)
    covered = [p for p in preds if p.covered]
    total = sum(p.point.est_us for p in preds) or 1.0
    if covered:
        ax.scatter(
            [p.point.M for p in covered],
            [p.chosen_speedup() for p in covered],
            s=[max(12.0, 600.0 * p.point.est_us / total) for p in covered],
            alpha=0.5,
            color="#4c72b0",
            label="decision rule (passing winner, else stock)",
        )
        tab = [(p.point.M, s) for p in covered if p.table_route is not None and (s := p.table_speedup())]
        if tab:
            ax.scatter(
                [m for m, _ in tab], [s for _, s in tab], marker="x", color="#d62728", label="table route"
            )
        ax.legend(fontsize=8)
    ax.axhline(1.0, color=_STOCK_COLOR, lw=1, ls="--")
    _log_m_axis(ax, [p.point.M for p in covered])
    ax.set_ylabel("predicted per-op speed-up (stock / route)")
    ax.set_title("per census point (marker area ~ est_us share)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if comps:
        ax2 = fig.add_subplot(1, 2, 2)
        ys = list(range(len(comps)))
        pts = [c.ratio.point for c in comps]
        lo = [c.ratio.point - c.ratio.lo if c.ratio.lo is not None else 0.0 for c in comps]
        hi = [c.ratio.hi - c.ratio.point if c.ratio.hi is not None else 0.0 for c in comps]
        ax2.errorbar(pts, ys, xerr=[lo, hi], fmt="o", capsize=3, color="#4c72b0", label="measured (95% CI)")
        pred = sorted(ab_predicted.items())
        if pred:
            ax2.scatter(
                [v for _, v in pred],
                [i for i, _ in pred],
                marker="D",
                facecolors="none",
                edgecolors="#d62728",
                label="predicted, matmul time only",
            )
        ax2.axvline(1.0, color=_STOCK_COLOR, lw=1, ls="--")
        labels = [f"{c.model} {c.test} ub{c.ubatch}: {c.arm}/{c.baseline}" for c in comps]
        ax2.set_yticks(ys, labels, fontsize=7)
        ax2.invert_yaxis()
        ax2.set_xlabel("end-to-end t/s ratio (median of pairs)")
        ax2.set_title("measured A/B", fontsize=9)
        ax2.grid(True, axis="x", alpha=0.3)
        ax2.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


# ============================================================================================
# The report


class _Figures:
    """Collects rendered figures and reports progress."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self.files: dict[str, bytes] = {}
        self._progress = progress

    def add(self, name: str, png: bytes) -> str:
        self.files[name] = png
        if self._progress is not None:
            self._progress(1)
        return f"{PLOTS_DIR}/{name}"


def figure_count(inputs: Inputs) -> int:
    """How many figures :func:`build_report` renders (for a progress bar)."""
    shapes = {ShapeKey.of(r) for r in _records(inputs.tuning[list(schema.SHAPE_KEY)])}
    census = 4 if inputs.census is not None else 0
    profile = 1 if inputs.profile is not None else 0
    return len(shapes) + len({type_key(s) for s in shapes}) + census + profile


def _gpu_label(df: pd.DataFrame) -> str:
    r = df.iloc[0]
    return f"{r['gpu_name']} (cc {int(r['gpu_cc'])}, {int(r['gpu_sm_count'])} SMs)"


def build_report(inputs: Inputs, progress: Callable[[int], None] | None = None) -> Report:
    """The whole report. ``progress(1)`` is called after each figure."""
    params = inputs.params
    points = analyse_tuning(inputs.tuning, params)
    gpu = _gpu_label(inputs.tuning)
    figs = _Figures(progress)
    preds = (
        predictions(census_points(inputs.census), points, inputs.table) if inputs.census is not None else []
    )
    comps = ab_comparisons(inputs.ab, params) if inputs.ab else []
    ab_predicted = _ab_predicted(comps, preds, inputs.table)

    md: list[str] = ["# ggml-dispatch report", "", f"GPU: {md_escape(gpu)}.", ""]
    md += _section_provenance(inputs, gpu)
    md += _section_summary(inputs, points, preds, comps)
    md += _section_losing(inputs, points, comps)
    if inputs.ab is not None:
        md += _section_ab(inputs.ab, comps, preds, ab_predicted)
    if inputs.census is not None:
        md += _section_predictions(preds, comps, ab_predicted, inputs.table, figs)
    if inputs.profile is not None:
        md += _section_profile(inputs.profile, figs, preds, comps)
    if inputs.census is not None:
        md += _section_census(inputs.census, figs)
    md += _section_status(inputs.tuning, points)
    r0 = inputs.tuning.iloc[0]
    spec = analysis.gpu_spec(str(r0["gpu_name"]), int(r0["gpu_cc"]), int(r0["gpu_sm_count"]))
    md += _section_shapes(points, inputs.table, params, gpu, figs, spec)
    if inputs.notes and inputs.notes.strip():
        md += ["## Notes", "", inputs.notes.strip(), ""]
    return Report("\n".join(md).rstrip("\n") + "\n", figs.files)


def _section_provenance(inputs: Inputs, gpu: str) -> list[str]:
    md = ["## Data provenance", ""]
    for f in inputs.files:
        md.append(f"- **{f.role}** `{md_escape(f.name)}` (sha256 `{f.sha256}`)")
        md += [f"  - {label}: {md_escape(value)}" for label, value in f.details]
    md.append("")
    if inputs.table is not None:
        g = inputs.table.data["gpu"]
        table_gpu = f"{g['name']} (cc {g['cc']}, {g['sm_count']} SMs)"
        if inputs.table.rules and table_gpu != gpu:
            md += [
                f"**The table belongs to {md_escape(table_gpu)}, not to the tuning GPU {md_escape(gpu)}.**",
                "",
            ]
    p = inputs.params
    md += [
        f"Decision parameters used for the verdicts: theta {p.theta}, min trials {p.min_trials}, "
        f"{p.resamples} bootstrap resamples, {p.confidence:.0%} CI, seed {p.seed}"
        + (f", reference margin {p.reference_margin}" if p.reference_margin is not None else "")
        + ".",
        "",
    ]
    return md


_PROFILE_COLORS: Final = {
    **_ROUTE_COLORS,
    "conversion": "#f0a0c0",
    "attention": "#17becf",
    "other": "#bcbd22",
    "copy": "#8c564b",
    "idle": "#dddddd",
}


def plot_profile(profile: timeline.Profile) -> bytes:
    """Stacked bars: GPU ms per run by kernel category, then idle, for each (test, arm)."""
    rows = timeline.ordered(profile.rows)
    fig = Figure(figsize=(9, 2.0 + 0.32 * len(rows)))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    left = [0.0] * len(rows)
    for cat in (*timeline.CATEGORIES, "idle"):
        widths = [max(0.0, b.idle_ms) if cat == "idle" else b.ms[cat] for b in rows]
        if not any(widths):
            continue
        ax.barh(ys, widths, left=left, color=_PROFILE_COLORS[cat], label=cat, height=0.7)
        left = [lo + w for lo, w in zip(left, widths, strict=True)]
    ax.scatter([b.wall_ms for b in rows], ys, marker="|", s=200, color=_STOCK_COLOR, label="wall", zorder=3)
    ax.set_yticks(ys, [f"{timeline.test_label(b.test)} {b.arm}" for b in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "ms per run: kernel time by category, then idle (wall - busy)\n"
        "a bar passes its wall mark by the kernel time that overlapped other kernels"
    )
    ax.set_title("where a run's time goes (CUPTI kernel timelines)", fontsize=9)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _profile_prediction_rows(
    profile: timeline.Profile,
    deltas: Sequence[timeline.ArmDelta],
    preds: Sequence[Prediction],
    comps: Sequence[AbComparison],
) -> list[list[str]]:
    """Per profiled test: the census' predicted matmul speed-up for the table at that M, carried to the
    whole run through the stock run's measured matmul share, against what was measured."""
    stock = {b.test: b for b in profile.rows if b.arm == "stock"}
    model = timeline.profile_model(profile.note)
    rows: list[list[str]] = []
    for d in deltas:
        if d.arm != "table" or d.test not in stock:
            continue
        test, ubatch = timeline.test_case(d.test)
        pred = predicted_speedup(preds, "table", effective_M(test, ubatch or 1))
        if pred is None:
            continue
        base = stock[d.test]
        f = base.matmul_ms / base.wall_ms
        e2e = 1.0 / (1.0 - f + f / pred.speedup)
        ab = [
            f"{fmt_ratio(c.ratio.point)} {fmt_ci(c.ratio.lo, c.ratio.hi)}"
            for c in comps
            if (c.arm, c.baseline) == ("table", "stock")
            and c.test == test
            and (ubatch is None or c.ubatch == ubatch)
            and model is not None
            and (c.model == model or c.model.startswith(f"{model} ["))
        ]
        rows.append(
            [
                timeline.test_label(d.test),
                fmt_share(f),
                fmt_ratio(pred.speedup),
                fmt_ratio(e2e),
                fmt_ratio(d.measured),
                "; ".join(ab) or "–",
            ]
        )
    return rows


def _section_profile(
    profile: timeline.Profile,
    figs: _Figures,
    preds: Sequence[Prediction] = (),
    comps: Sequence[AbComparison] = (),
) -> list[str]:
    md = [
        "## Where a step's time goes (kernel timelines)",
        "",
        f"Profile `{md_escape(Path(profile.source).name)}`"
        + (f" ({md_escape(profile.note)})" if profile.note else "")
        + ": one llama-bench process per arm and test, every kernel's GPU time from CUPTI "
        "(`lab/kernel_timeline.cpp`). Milliseconds per run: pp2048 (one prompt) or tg128 (128 tokens). "
        "`matmul` is the route kernels (mmvq/mmq/mmvf/mmf/cuBLAS, activation quantization included); "
        "`conversion` is what the cuBLAS route adds around its GEMM (weight dequantization to f16, "
        "activation and result casts); `idle` is llama-bench's wall time minus the time any kernel or copy "
        "ran (launch and graph gaps, host work, synchronisation); `overlap` is kernel time that ran "
        "concurrently with other kernels. The profiler's own cost is in these runs: compare arms with each "
        "other, not with the A/B.",
        "",
    ]
    rows = timeline.ordered(profile.rows)
    routes = [c for c in timeline.MATMUL_CATEGORIES if c != "conversion"]
    md += md_table(
        [
            "test",
            "arm",
            "wall",
            "matmul",
            "conversion",
            "attention",
            "other",
            "copy",
            "idle",
            "overlap",
            "matmul+conv share",
            "routes",
        ],
        (
            [
                timeline.test_label(b.test),
                b.arm,
                f"{b.wall_ms:.2f}",
                f"{sum(b.ms[c] for c in routes):.2f}",
                f"{b.ms['conversion']:.2f}",
                f"{b.ms['attention']:.2f}",
                f"{b.ms['other']:.2f}",
                f"{b.ms['copy']:.2f}",
                f"{b.idle_ms:.2f}",
                f"{b.overlap_ms:.2f}",
                fmt_share(b.share(b.matmul_ms)),
                ", ".join(f"{c} {b.ms[c]:.2f}" for c in routes if b.ms[c] >= 0.005),
            ]
            for b in rows
        ),
    )
    md.append("")
    deltas = timeline.arm_deltas(profile.rows)
    if deltas:
        md += [
            "Against stock in the same profile: matmul time saved (conversions included), what that alone "
            "predicts for the run (stock wall / (stock wall - saved)), and the ratio these profiled runs "
            "measured. Where measured < predicted, the rest went into idle gaps or other kernels.",
            "",
        ]
        md += md_table(
            ["test", "arm", "matmul saved ms", "other kernels Δ ms", "idle Δ ms", "predicted", "measured"],
            (
                [
                    timeline.test_label(d.test),
                    d.arm,
                    f"{d.matmul_saved_ms:+.2f}",
                    f"{d.other_delta_ms:+.2f}",
                    f"{d.idle_delta_ms:+.2f}",
                    fmt_ratio(d.predicted),
                    fmt_ratio(d.measured),
                ]
                for d in deltas
            ),
        )
        md.append("")
    pred_rows = _profile_prediction_rows(profile, deltas, preds, comps) if preds else []
    if pred_rows:
        md += [
            "From per-op numbers to the run: the census' predicted matmul-time speed-up of the table at each "
            "test's M, carried through the matmul share f that the stock run measured "
            "(1 / (1 - f + f / s)), against the profiled runs and the A/B runs of the same model.",
            "",
        ]
        md += md_table(
            ["test", "stock matmul share f", "predicted matmul s", "predicted run", "profiled runs",
             "A/B table/stock"],
            pred_rows,
        )  # fmt: skip
        md.append("")
    dropped = sum(b.dropped for b in rows)
    if dropped:
        md += [f"CUPTI dropped {dropped} records: those runs' kernel times are incomplete.", ""]
    md += [f"![profile]({figs.add('profile.png', plot_profile(profile))})", ""]
    return md


def _status_total(df: pd.DataFrame) -> Counter[str]:
    return Counter(status_kind(str(s)) or "failed" for s in df["status"])


def _section_summary(
    inputs: Inputs, points: Sequence[Point], preds: Sequence[Prediction], comps: Sequence[AbComparison]
) -> list[str]:
    total = _status_total(inputs.tuning)
    md = ["## Summary", ""]
    md.append(
        f"- tuning: {len({p.shape for p in points})} shape keys, {len(points)} points (shape key, M), "
        f"{len(inputs.tuning)} trial rows: " + ", ".join(f"{k} {total.get(k, 0)}" for k in STATUS_KINDS) + "."
    )
    md.append(
        f"- the decision rule picks a route other than stock at {sum(p.chosen is not None for p in points)} "
        f"of {len(points)} points; a candidate is slower than stock beyond noise at "
        f"{sum(rp.slower for p in points for rp in p.routes)} (point, route) pairs."
    )
    if inputs.table is not None:
        md.append(f"- table: {len(inputs.table.rules)} rules.")
    chosen = predicted_speedup(preds, "chosen")
    if chosen is not None:
        md.append(
            f"- census: {fmt_share(chosen.covered_share)} of est_us has tuning data; predicted matmul-time "
            f"speed-up if every measured point took the decision rule's route: {fmt_ratio(chosen.speedup)}x."
        )
    tab = predicted_speedup(preds, "table") if inputs.table is not None else None
    if tab is not None:
        md.append(f"- predicted matmul-time speed-up with the table: {fmt_ratio(tab.speedup)}x.")
    for c in comps:
        md.append(
            f"- A/B {md_escape(c.model)} {md_escape(c.test)} ubatch {c.ubatch}: {c.arm}/{c.baseline} "
            f"{fmt_ratio(c.ratio.point)} {fmt_ci(c.ratio.lo, c.ratio.hi)} over {c.ratio.n} pairs "
            f"({ab_verdict(c.ratio)})."
        )
    return [*md, ""]


_LOSS_HEADER: Final = ("shape key", "M", "route", "stock µs", "route µs", "stock/route", "95% CI", "n")


def _loss_row(p: Point, rp: RouteAtPoint) -> list[str]:
    return [
        md_escape(shape_label(p.shape)),
        str(p.M),
        rp.route,
        fmt_us(p.stock.median),
        fmt_us(rp.times.median),
        fmt_ratio(rp.ev.ratio),
        fmt_ci(rp.ev.ci_low, rp.ev.ci_high),
        str(rp.ev.n_paired),
    ]


def _section_losing(inputs: Inputs, points: Sequence[Point], comps: Sequence[AbComparison]) -> list[str]:
    md = ["## Losing cases", ""]
    table = inputs.table
    if table is not None:
        md += ["### Table rules slower than stock beyond noise at a measured point", ""]
        losses: list[list[str]] = []
        unmeasured: list[str] = []
        for p in points:
            route = table.route_at(p.shape, p.M)
            if route is None:
                continue
            rp = p.route(route)
            if rp is None or rp.ev.n_ok == 0:
                unmeasured.append(f"{md_escape(shape_label(p.shape))} M={p.M} ({route})")
            elif rp.slower:
                losses.append(_loss_row(p, rp))
        md += md_table(_LOSS_HEADER, losses) if losses else ["None."]
        md.append("")
        if unmeasured:
            md += [
                "Measured points where the table's route has no ok trial: " + "; ".join(unmeasured) + ".",
                "",
            ]
    md += ["### Candidates slower than stock beyond noise", ""]
    losing = [_loss_row(p, rp) for p in points for rp in p.routes if rp.slower]
    md += md_table(_LOSS_HEADER, losing) if losing else ["None."]
    md.append("")
    if inputs.ab is not None:
        md += ["### A/B comparisons with the 95% CI below 1", ""]
        below = [c for c in comps if c.ratio.below]
        md += _ab_rows(below) if below else ["None."]
        md.append("")
        soft = [c for c in comps if not c.ratio.below and c.ratio.point < 1.0]
        if soft:
            md += ["A/B comparisons with a median below 1 but within noise (or fewer than 2 pairs):", ""]
            md += [*_ab_rows(soft), ""]
    return md


def _ab_rows(comps: Sequence[AbComparison]) -> list[str]:
    return md_table(
        [
            "model",
            "test",
            "ubatch",
            "comparison",
            "pairs",
            "median ratio",
            "95% CI",
            "unpaired runs",
            "verdict",
        ],
        (
            [
                md_escape(c.model),
                md_escape(c.test),
                str(c.ubatch),
                f"{c.arm}/{c.baseline}",
                str(c.ratio.n),
                fmt_ratio(c.ratio.point),
                fmt_ci(c.ratio.lo, c.ratio.hi),
                str(c.unpaired),
                ab_verdict(c.ratio),
            ]
            for c in comps
        ),
    )


def _ab_predicted(
    comps: Sequence[AbComparison], preds: Sequence[Prediction], table: TableView | None
) -> dict[int, float]:
    """For each table/stock comparison (by index): the table's predicted matmul speed-up at its M."""
    out: dict[int, float] = {}
    if table is None or not preds:
        return out
    for i, c in enumerate(comps):
        if (c.arm, c.baseline) == ("table", "stock"):
            pred = predicted_speedup(preds, "table", effective_M(c.test, c.ubatch))
            if pred is not None:
                out[i] = pred.speedup
    return out


def _section_ab(
    records: Sequence[AbRecord],
    comps: Sequence[AbComparison],
    preds: Sequence[Prediction],
    ab_predicted: Mapping[int, float],
) -> list[str]:
    md = ["## End-to-end A/B", ""]
    md += md_table(
        ["model", "test", "ubatch", "arm", "runs", "median t/s", "IQR t/s"],
        (
            [
                md_escape(m),
                md_escape(t),
                str(u),
                a,
                str(s.n),
                fmt_tps(s.median),
                f"{fmt_tps(s.q1)}–{fmt_tps(s.q3)}",
            ]
            for m, t, u, a, s in ab_arm_spreads(records)
        ),
    )
    md.append("")
    md += _ab_rows(comps) if comps else ["No arm has a partner (stock or crude) to compare with."]
    md.append("")
    if comps:
        md += ["Paired ratios, pair by pair:", ""]
        md += md_table(
            ["model", "test", "ubatch", "comparison", "pair: ratio"],
            (
                [
                    md_escape(c.model),
                    md_escape(c.test),
                    str(c.ubatch),
                    f"{c.arm}/{c.baseline}",
                    ", ".join(f"{p}: {r:.3f}" for p, r in c.pairs),
                ]
                for c in comps
            ),
        )
        md.append("")
    if not preds:
        return md
    md += [
        "Predicted matmul-time speed-up at each comparison's M (census points at that M weighted by est_us; "
        "points without tuning data count as stock). End-to-end time also holds non-matmul work, so a "
        "measured ratio r should fall between 1 and the predicted s. `implied matmul share` is the share f "
        "of end-to-end time in matmuls that would explain r (1/r = 1 - f + f/s); outside 0-100% the "
        "per-op numbers do not explain the end-to-end result.",
        "",
    ]
    rows: list[list[str]] = []
    for i, c in enumerate(comps):
        M = effective_M(c.test, c.ubatch)
        pred = ab_predicted.get(i)
        rule = predicted_speedup(preds, "chosen", M)
        implied = "–"
        if pred is not None and pred != 1.0:
            implied = fmt_share((1.0 - 1.0 / c.ratio.point) / (1.0 - 1.0 / pred))
        rows.append(
            [
                md_escape(c.model),
                md_escape(c.test),
                str(c.ubatch),
                f"{c.arm}/{c.baseline}",
                "all" if M is None else str(M),
                fmt_ratio(c.ratio.point),
                fmt_ratio(pred),
                "–" if rule is None else fmt_ratio(rule.speedup),
                "–" if rule is None else fmt_share(rule.covered_share),
                implied,
            ]
        )
    header = [
        "model",
        "test",
        "ubatch",
        "comparison",
        "M",
        "measured",
        "predicted (table)",
        "predicted (decision rule)",
        "est_us with tuning data",
        "implied matmul share",
    ]
    return [*md, *md_table(header, rows), ""]


def _section_predictions(
    preds: Sequence[Prediction],
    comps: Sequence[AbComparison],
    ab_predicted: Mapping[int, float],
    table: TableView | None,
    figs: _Figures,
) -> list[str]:
    md = ["## Predicted gain per census point", ""]
    link = figs.add("gain.png", plot_gain(preds, comps, ab_predicted))
    md += [
        f"![predicted vs measured gain]({link})",
        "",
        "Census rows summed per (shape key, M), heaviest first. `fastest` is the route with the lowest "
        "median; `stock/route` its median paired ratio; `decision` the route the decision rule would "
        "use there (stock unless the fastest passes). Fused groups are never overridden.",
        "",
    ]
    total = sum(p.point.est_us for p in preds) or 1.0
    header = [
        "shape key",
        "M",
        "est_us share",
        "calls",
        "stock µs (IQR)",
        "fastest",
        "route µs (IQR)",
        "stock/route",
        "95% CI",
        "n trials",
        "decision",
    ]
    if table is not None:
        header += ["table route", "table stock/route"]
    rows: list[list[str]] = []
    for pr in sorted(
        preds, key=lambda x: (-x.point.est_us, shape_sort_key(x.point.shape), x.point.M, x.point.fused)
    ):
        cp, m = pr.point, pr.measured
        row = [
            md_escape(shape_label(cp.shape)) + (" (fused)" if cp.fused else ""),
            str(cp.M),
            fmt_share(cp.est_us / total),
            str(cp.calls),
        ]
        rp = m.route(m.winner) if m is not None else None
        if cp.fused:
            row += ["–", "fused: not tunable", "–", "–", "n/a", "0", "stock"]
        elif m is None or rp is None or not pr.covered:
            row += ["–", "not measured", "–", "–", "n/a", "0", "stock"]
        else:
            row += [
                f"{fmt_us(m.stock.median)} ({fmt_iqr(m.stock)})",
                rp.route,
                f"{fmt_us(rp.times.median)} ({fmt_iqr(rp.times)})",
                fmt_ratio(rp.ev.ratio),
                fmt_ci(rp.ev.ci_low, rp.ev.ci_high),
                str(rp.ev.n_paired),
                m.chosen or "stock",
            ]
        if table is not None:
            ts = pr.table_speedup()
            row += [pr.table_route or "stock", "not measured" if ts is None else fmt_ratio(ts)]
        rows.append(row)
    return [*md, *md_table(header, rows), ""]


def _census_groups() -> list[tuple[str, str, Callable[[Mapping[str, Any]], str]]]:
    def by_shape(r: Mapping[str, Any]) -> str:
        return shape_label(ShapeKey.of(r)) + (f" fused:{r['fused']}" if r["fused"] else "")

    def by_role(r: Mapping[str, Any]) -> str:
        return str(r["role"]) if r["role"] else "(none)"

    def by_type(r: Mapping[str, Any]) -> str:
        return str(r["src0_type"])

    return [
        ("shape key", "census-shape", by_shape),
        ("tensor role", "census-role", by_role),
        ("quant type (src0)", "census-type", by_type),
    ]


def _section_census(rows: Sequence[Mapping[str, Any]], figs: _Figures) -> list[str]:
    md = [
        "## Census weights",
        "",
        "Shares of the census's estimated matmul time (est_us), not of call counts.",
        "",
    ]
    kinds = Counter(str(r["est_kind"]) for r in rows)
    md += ["Estimates: " + ", ".join(f"{k} {v} rows" for k, v in sorted(kinds.items())) + ".", ""]
    for title, stem, key in _census_groups():
        shares = census_shares(rows, key)
        total = sum(v for _, v in shares) or 1.0
        link = figs.add(f"{stem}.png", plot_census(f"census est_us by {title}", shares))
        md += [f"### By {title}", "", f"![census weights by {title}]({link})", ""]
        md += md_table(
            [title, "est_us", "share"], ([md_escape(k), f"{v:.1f}", fmt_share(v / total)] for k, v in shares)
        )
        md.append("")
    return md


def _status_cells(counts: Mapping[str, int]) -> list[str]:
    return [str(sum(counts.values())), *(str(counts.get(k, 0)) for k in STATUS_KINDS)]


def _section_status(df: pd.DataFrame, points: Sequence[Point]) -> list[str]:
    md = ["## Trial status", "", "Every trial row by status; nothing is left out of the counts.", ""]
    per: dict[tuple[ShapeKey, str], Counter[str]] = defaultdict(Counter)
    for p in points:
        for rp in p.routes:
            per[(p.shape, rp.route)].update(rp.counts)
    rows = [
        [md_escape(shape_label(key)), route, *_status_cells(per[(key, route)])]
        for key, route in sorted(per, key=lambda k: (shape_sort_key(k[0]), _route_key(k[1])))
    ]
    rows.append(["**all**", "", *_status_cells(_status_total(df))])
    md += [*md_table(["shape key", "route", "trials", *STATUS_KINDS], rows), ""]
    fails = failure_messages(df)
    if fails:
        md += ["Failure messages:", ""]
        md += md_table(
            ["message", "trials", "first seen"], ([md_escape(m), str(c), md_escape(w)] for m, c, w in fails)
        )
        md.append("")
    return md


def _section_shapes(
    points: Sequence[Point],
    table: TableView | None,
    params: decide.Params,
    gpu: str,
    figs: _Figures,
    spec: estimate.GpuSpec,
) -> list[str]:
    md = [
        "## Time vs M per shape key",
        "",
        "Median time per op over the ok trials (plots: IQR error bars, min–max band, log axes). "
        "`stock/route` is the median of the per-trial ratios anchor_us/us with a 95% paired bootstrap CI "
        f"({params.resamples} resamples); `faster`/`slower` only beyond noise (the CI excludes 1). "
        "`decision` marks the route the decision rule picks (the fastest, if it passes); otherwise the "
        "reason it does not pass is given. `× roofline` is the median time over the roofline limit "
        f"max(bytes / {spec.hbm_gbs / 1000:g} TB/s, FLOPs / {spec.tensor_tflops:g} TFLOP/s) of {spec.name} "
        f"({spec.source}): 1 is at the hardware limit; the per-M line `best` gives it for the fastest.",
        "",
    ]
    by_type: dict[tuple[str, str, str, str], list[Point]] = defaultdict(list)
    for p in points:
        by_type[type_key(p.shape)].append(p)
    for tkey in sorted(by_type, key=lambda t: shape_sort_key(ShapeKey(t[0], t[1], t[2], t[3], 0, 0, 0))):
        tpoints = by_type[tkey]
        name = "speedup-" + _safe_name("-".join(tkey).lower()) + ".png"
        link = figs.add(name, plot_type_speedups(tkey, tpoints, gpu))
        md += [f"### {tkey[0]} {tkey[1]} {tkey[2]} x {tkey[3]}", "", f"![fastest route vs stock]({link})", ""]
        for key in sorted({p.shape for p in tpoints}, key=shape_sort_key):
            spoints = [p for p in tpoints if p.shape == key]
            rules = table.rules_for(key) if table is not None else []
            link = figs.add(f"time-{shape_slug(key)}.png", plot_shape(key, spoints, rules, gpu))
            md += [f"#### {md_escape(shape_label(key))}", "", f"![time vs M]({link})", ""]
            if table is not None:
                described = "; ".join(
                    f"M {r['M_lo']}–{r['M_hi']} → {r['route']}"
                    + (" (type default)" if _is_default(r) else "")
                    for r in rules
                )
                md += [f"Table rules: {described}." if rules else "Table rules: none (stock everywhere).", ""]
            header = [
                "M",
                "route",
                "trials",
                "ok",
                "median µs",
                "IQR µs",
                "min–max µs",
                "stock/route",
                "95% CI",
            ]
            md += [
                *md_table([*header, "verdict", "decision", "× roofline"], _point_rows(spoints, table, spec)),
                "",
            ]
    return md


def fmt_roofline(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def best_time(p: Point) -> tuple[str, float | None]:
    """The fastest measured candidate of a point (stock included) and its median time."""
    best: tuple[str, float | None] = ("stock", p.stock.median if _finite(p.stock.median) else None)
    for rp in p.routes:
        m = rp.times.median
        if _finite(m) and (best[1] is None or m < best[1]):
            best = (rp.route, m)
    return best


def _point_rows(points: Sequence[Point], table: TableView | None, spec: estimate.GpuSpec) -> list[list[str]]:
    rows: list[list[str]] = []
    for p in points:
        roof = functools.partial(analysis.roofline_fraction, key=p.shape, M=p.M, spec=spec)
        st = p.stock
        table_route = table.route_at(p.shape, p.M) if table is not None else None
        stock_note = "stock stays" if p.chosen is None else ""
        if table is not None and table_route is None:
            stock_note = (stock_note + "; table: stock").lstrip("; ")
        rows.append(
            [
                str(p.M),
                "stock (anchor)",
                str(p.stock_trials),
                str(p.stock_trials),
                fmt_us(st.median),
                fmt_iqr(st),
                fmt_minmax(st),
                "1",
                "",
                "",
                stock_note,
                fmt_roofline(roof(st.median)),
            ]
        )
        for rp in p.routes:
            notes = []
            if rp.route == p.chosen:
                notes.append("chosen")
            elif rp.route == p.winner:
                notes.append(f"fastest, not chosen: {rp.check.reason}")
            if table_route == rp.route:
                notes.append("table rule")
            rows.append(
                [
                    str(p.M),
                    rp.route,
                    str(rp.trials),
                    str(rp.counts.get("ok", 0)),
                    fmt_us(rp.times.median),
                    fmt_iqr(rp.times),
                    fmt_minmax(rp.times),
                    fmt_ratio(rp.ev.ratio),
                    fmt_ci(rp.ev.ci_low, rp.ev.ci_high),
                    rp.verdict(),
                    md_escape("; ".join(notes)),
                    fmt_roofline(roof(rp.times.median)),
                ]
            )
        name, t = best_time(p)
        rows.append(
            [
                str(p.M),
                f"best: {md_escape(name)}",
                "",
                "",
                fmt_us(t),
                "",
                "",
                "",
                "",
                "",
                "",
                fmt_roofline(roof(t)),
            ]
        )
    return rows
