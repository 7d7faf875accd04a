"""The one schema module every stage imports.

Names follow DESIGN.md: the GEMM is ``Y[M x N] = X[M x K] * W[K x N]``.

=====  ==========================  ==================
name   MUL_MAT                     MUL_MAT_ID
=====  ==========================  ==================
M      src1.ne[1] (tokens)         src1.ne[2]
N      src0.ne[1] (out features)   src0.ne[1]
K      src0.ne[0] (reduction)      src0.ne[0]
B      src1.ne[2] * src1.ne[3]     1
E      1                           src0.ne[2]
U      1                           src1.ne[1]
=====  ==========================  ==================

test-backend-ops prints ``m,n,k`` with m = N and n = M; convert with :func:`from_test_backend_ops`
at the border and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

TOOL_NAME: Final = "ggml-dispatch"
TOOL_VERSION: Final = "0.1.0"

TRACE_SCHEMA: Final = "ggml-route-trace/1"
TRACE_STDERR_PREFIX: Final = "ggml-route-trace: "
CENSUS_SCHEMA: Final = "ggml-dispatch-census/1"
TUNING_SCHEMA: Final = "ggml-dispatch-tuning/1"
TABLE_SCHEMA: Final = "ggml-dispatch-table/1"
# Bumped whenever the C layout of the generated header changes; the runtime lookup checks it.
TABLE_LAYOUT_VERSION: Final = 1

# The pinned upstream tree (DESIGN.md "Where things run").
PINNED_LLAMA_CPP_PYTHON: Final = "0.3.36"
PINNED_SDIST_SHA256: Final = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PINNED_UPSTREAM_COMMIT: Final = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


class Op(StrEnum):
    MUL_MAT = "MUL_MAT"
    MUL_MAT_ID = "MUL_MAT_ID"


class Layout(StrEnum):
    """Rules never cross layout classes."""

    WEIGHT = "weight"  # contiguous src0, B = 1
    ATTENTION = "attention"  # src0 is a KV-cache view (non-contiguous) or B > 1
    EXPERT = "expert"  # MUL_MAT_ID


class Fused(StrEnum):
    GLU = "glu"
    BIAS = "bias"
    SCALE = "scale"


class Route(StrEnum):
    """Kernel families a table may choose. The integer codes are shared with the native side."""

    MMVF = "mmvf"
    MMF = "mmf"
    MMVQ = "mmvq"
    MMQ = "mmq"
    CUBLAS = "cublas"


# Stable integer codes used by the generated header and the native hook (0 = stock / no rule).
ROUTE_STOCK_CODE: Final = 0
ROUTE_CODES: Final[dict[Route, int]] = {
    Route.MMVF: 1,
    Route.MMF: 2,
    Route.MMVQ: 3,
    Route.MMQ: 4,
    Route.CUBLAS: 5,
}

# Integer codes shared with the generated header and the native hook.
OP_CODES: Final[dict[Op, int]] = {Op.MUL_MAT: 0, Op.MUL_MAT_ID: 1}
LAYOUT_CODES: Final[dict[Layout, int]] = {Layout.WEIGHT: 0, Layout.ATTENTION: 1, Layout.EXPERT: 2}

# What a trace may report as having run: the table routes plus paths the table never chooses.
TRACE_ONLY_ROUTES: Final = frozenset(
    {
        "mmvf_t",  # the transposed-vector mmvf path (ne01 == 1)
        "fwht",  # the FWHT hint path
        "id_sorted",  # MUL_MAT_ID fallback: per-expert MUL_MATs after sorting rows
    }
)
TRACE_ROUTES: Final = frozenset({r.value for r in Route}) | TRACE_ONLY_ROUTES

REASON_STOCK: Final = "stock"
REASON_TABLE: Final = "table"
REASON_FORCED: Final = "forced"
REASON_FUSED: Final = "fused"
REASON_INELIGIBLE_PREFIX: Final = "ineligible:"
REASONS: Final = frozenset({REASON_STOCK, REASON_TABLE, REASON_FORCED, REASON_FUSED})


def is_valid_reason(reason: str) -> bool:
    if reason in REASONS:
        return True
    return reason.startswith(REASON_INELIGIBLE_PREFIX) and len(reason) > len(REASON_INELIGIBLE_PREFIX)


class Source(StrEnum):
    TRACE = "trace"  # census rows from a route trace
    DECLARED = "declared"  # census rows from a GGUF plus declared M values
    MEASURED = "measured"  # tuning rows from the harness
    REFERENCE = "reference"  # tuning rows converted from shared/reference (one sample, no CI)


class TrialStatus(StrEnum):
    OK = "ok"
    INELIGIBLE = "ineligible"
    WRONG = "wrong"
    DRIFTED = "drifted"
    PRUNED = "pruned"  # a racing tuner stopped timing the route; decisions skip it like drifted
    # failures are written as "failed:<msg>"


FAILED_PREFIX: Final = "failed:"
TRIAL_STATUSES: Final = frozenset(s.value for s in TrialStatus)


# --------------------------------------------------------------------------------------------
# ggml types of the pinned tree: id -> (name as ggml_type_name spells it, block size, bytes/block)


@dataclass(frozen=True)
class GgmlType:
    id: int
    name: str
    block_size: int
    type_size: int

    @property
    def quantized(self) -> bool:
        return self.name not in _UNQUANTIZED

    def row_bytes(self, ne0: int) -> int:
        return (ne0 // self.block_size) * self.type_size

    def bytes_per_element(self) -> float:
        return self.type_size / self.block_size


_QK_K = 256
_TYPE_ROWS: tuple[tuple[int, str, int, int], ...] = (
    (0, "f32", 1, 4),
    (1, "f16", 1, 2),
    (2, "q4_0", 32, 2 + 16),
    (3, "q4_1", 32, 2 + 2 + 16),
    (6, "q5_0", 32, 2 + 4 + 16),
    (7, "q5_1", 32, 2 + 2 + 4 + 16),
    (8, "q8_0", 32, 2 + 32),
    (9, "q8_1", 32, 2 + 2 + 32),
    (10, "q2_K", 256, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    (11, "q3_K", 256, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    (12, "q4_K", 256, 2 + 2 + _QK_K // 2 + 12),
    (13, "q5_K", 256, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    (14, "q6_K", 256, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    (15, "q8_K", 256, 4 + _QK_K + _QK_K // 8),
    (16, "iq2_xxs", 256, 2 + _QK_K // 4),
    (17, "iq2_xs", 256, 2 + _QK_K // 4 + _QK_K // 32),
    (18, "iq3_xxs", 256, 2 + _QK_K // 4 + _QK_K // 8),
    (19, "iq1_s", 256, 2 + _QK_K // 8 + _QK_K // 16),
    (20, "iq4_nl", 32, 2 + 16),
    (21, "iq3_s", 256, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    (22, "iq2_s", 256, 2 + _QK_K // 4 + _QK_K // 16),
    (23, "iq4_xs", 256, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    (24, "i8", 1, 1),
    (25, "i16", 1, 2),
    (26, "i32", 1, 4),
    (27, "i64", 1, 8),
    (28, "f64", 1, 8),
    (29, "iq1_m", 256, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    (30, "bf16", 1, 2),
    (34, "tq1_0", 256, 2 + 4 * 13),
    (35, "tq2_0", 256, 2 + 64),
    (39, "mxfp4", 32, 1 + 16),
    (40, "nvfp4", 64, 4 + 32),
    (41, "q1_0", 128, 2 + 16),
    (42, "q2_0", 64, 2 + 16),
)
_UNQUANTIZED = frozenset({"f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64"})

GGML_TYPES: Final[dict[str, GgmlType]] = {name: GgmlType(i, name, b, s) for i, name, b, s in _TYPE_ROWS}
GGML_TYPES_BY_ID: Final[dict[int, GgmlType]] = {t.id: t for t in GGML_TYPES.values()}


def ggml_type(name: str) -> GgmlType:
    """Look a type up by its ggml name (``q4_K``, ``f16``); KeyError if unknown."""
    return GGML_TYPES[name]


# --------------------------------------------------------------------------------------------
# Shapes


@dataclass(frozen=True, order=True)
class Gemm:
    """The GEMM a MUL_MAT / MUL_MAT_ID node performs, in the project's names."""

    M: int
    N: int
    K: int
    B: int = 1
    E: int = 1
    U: int = 1


def gemm_of(op: Op | str, src0_ne: tuple[int, ...], src1_ne: tuple[int, ...]) -> Gemm:
    if Op(op) is Op.MUL_MAT:
        return Gemm(M=src1_ne[1], N=src0_ne[1], K=src0_ne[0], B=src1_ne[2] * src1_ne[3])
    return Gemm(M=src1_ne[2], N=src0_ne[1], K=src0_ne[0], B=1, E=src0_ne[2], U=src1_ne[1])


def is_contiguous(ne: tuple[int, ...], nb: tuple[int, ...], t: GgmlType) -> bool:
    """ggml_is_contiguous for a tensor of type t."""
    expect = t.type_size
    if nb[0] != expect:
        return False
    expect = t.row_bytes(ne[0])
    for i in (1, 2, 3):
        if ne[i] != 1 and nb[i] != expect:
            return False
        expect *= ne[i]
    return True


def layout_of(
    op: Op | str, src0_ne: tuple[int, ...], src0_nb: tuple[int, ...], src0_type: str, B: int
) -> Layout:
    if Op(op) is Op.MUL_MAT_ID:
        return Layout.EXPERT
    if B == 1 and is_contiguous(src0_ne, src0_nb, ggml_type(src0_type)):
        return Layout.WEIGHT
    return Layout.ATTENTION


def from_test_backend_ops(m: int, n: int, k: int) -> tuple[int, int, int]:
    """test-backend-ops ``m,n,k`` (m = src0 rows, n = src1 columns) -> project (M, N, K)."""
    return n, m, k


def to_test_backend_ops(M: int, N: int, K: int) -> tuple[int, int, int]:
    """Project (M, N, K) -> test-backend-ops ``m,n,k``."""
    return N, M, K


# --------------------------------------------------------------------------------------------
# GPU identity: a table applies only when all three match.


@dataclass(frozen=True, order=True)
class GpuId:
    name: str
    cc: int  # as ggml encodes it: 700, 900, ...
    sm_count: int

    def slug(self) -> str:
        """Folder name under tables/, e.g. ``cuda-sm90-nvidia-h200``."""
        safe = "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-")
        while "--" in safe:
            safe = safe.replace("--", "-")
        return f"cuda-sm{self.cc // 10}-{safe}"


# --------------------------------------------------------------------------------------------
# Trace records (ggml-route-trace/1)

TRACE_KINDS: Final = frozenset({"header", "route", "footer"})

# route record: field -> expected JSON type(s); "ne"/"nb" are lists of 4 ints
TRACE_ROUTE_FIELDS: Final[dict[str, str]] = {
    "op": "str",
    "device": "int",
    "tensor": "str",
    "src0_type": "str",
    "src1_type": "str",
    "src0_ne": "ne",
    "src0_nb": "nb",
    "src1_ne": "ne",
    "layout": "str",
    "fused": "str|null",
    "route": "str",
    "stock_route": "str",
    "reason": "str",
    "count": "int",
}
TRACE_ROUTE_OPTIONAL: Final[dict[str, str]] = {"t_us": "num"}
TRACE_HEADER_FIELDS: Final[dict[str, str]] = {
    "schema": "str",
    "upstream_commit": "str|null",
    "patch_hash": "str|null",
    "table_hash": "str|null",
    "build": "obj",
    "env": "obj",
    "devices": "list",
    "pid": "int",
    "started": "str",
}
TRACE_DEVICE_FIELDS: Final[dict[str, str]] = {
    "id": "int",
    "name": "str",
    "uuid": "str",
    "cc": "int",
    "sm_count": "int",
    "smpbo": "int",
    "vram_mib": "int",
}
TRACE_FOOTER_FIELDS: Final[dict[str, str]] = {"records": "int", "dropped": "int", "ended": "str"}


# --------------------------------------------------------------------------------------------
# Parquet files: columns and key-value metadata keys

META_PREFIX: Final = "ggml_dispatch."
META_SCHEMA: Final = META_PREFIX + "schema"
META_TOOL_VERSION: Final = META_PREFIX + "tool_version"
META_INPUT_HASHES: Final = META_PREFIX + "input_hashes"  # JSON {path: sha256}
META_UPSTREAM_COMMIT: Final = META_PREFIX + "upstream_commit"
META_GGUF_HASHES: Final = META_PREFIX + "gguf_hashes"  # JSON {path: sha256}
META_PATCH_HASH: Final = META_PREFIX + "patch_hash"
META_TRACE_HEADERS: Final = META_PREFIX + "trace_headers"  # JSON list of header records
META_CREATED: Final = META_PREFIX + "created"
# census files (written by census ingest / from-gguf)
META_GPU_SPECS: Final = META_PREFIX + "gpu_specs"  # JSON list: the specs each GPU's roofline est_us used
META_WARNINGS: Final = META_PREFIX + "warnings"  # JSON list of warnings given while ingesting
META_GGUF_UNSEEN: Final = META_PREFIX + "gguf_unseen"  # JSON {gguf path: [weight tensors not in the trace]}
META_DECLARED: Final = META_PREFIX + "declared"  # JSON {"M": [...], "output_rows": n} (from-gguf only)

# Census: one row per distinct key.
CENSUS_COLUMNS: Final[dict[str, str]] = {
    "gpu_name": "string",
    "gpu_cc": "int64",
    "gpu_sm_count": "int64",
    "op": "string",
    "layout": "string",
    "fused": "string",  # null when not fused
    "src0_type": "string",
    "src1_type": "string",
    "M": "int64",
    "N": "int64",
    "K": "int64",
    "B": "int64",
    "E": "int64",
    "U": "int64",
    "src0_contiguous": "bool",
    "src0_nb_aligned": "bool",  # every src0 nb[1..3] is a multiple of 16 bytes (vector loads)
    "tensor": "string",
    "role": "string",
    "route": "string",
    "stock_route": "string",
    "reason": "string",
    "calls": "int64",
    "est_us": "float64",
    "est_kind": "string",  # "roofline" or "measured"
    "source": "string",  # Source.TRACE or Source.DECLARED
}

# Tuning results: one row per (shape, route, trial).
TUNING_COLUMNS: Final[dict[str, str]] = {
    "gpu_name": "string",
    "gpu_uuid": "string",
    "gpu_cc": "int64",
    "gpu_sm_count": "int64",
    "driver": "string",
    "cuda_version": "string",
    "cublas_version": "string",
    "upstream_commit": "string",
    "patch_hash": "string",
    "harness_version": "string",
    "op": "string",
    "layout": "string",
    "src0_type": "string",
    "src1_type": "string",
    "M": "int64",
    "N": "int64",
    "K": "int64",
    "B": "int64",
    "route": "string",
    "trial": "int64",
    "us": "float64",
    "replays": "int64",
    "weight_copies": "int64",
    "anchor_us": "float64",
    "nmse": "float64",
    "route_ran": "string",
    "status": "string",
    "source": "string",
}

# The key that identifies a tunable shape class (a rule is an M interval per such key).
SHAPE_KEY: Final = ("op", "layout", "src0_type", "src1_type", "N", "K", "B")


@dataclass(frozen=True, order=True)
class ShapeKey:
    """A SHAPE_KEY value; in a table, N = K = 0 marks a per-type default."""

    op: str
    layout: str
    src0_type: str
    src1_type: str
    N: int
    K: int
    B: int

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> ShapeKey:
        """The key of a tuning or census row (any mapping with the SHAPE_KEY columns)."""
        return cls(
            str(row["op"]),
            str(row["layout"]),
            str(row["src0_type"]),
            str(row["src1_type"]),
            int(row["N"]),
            int(row["K"]),
            int(row["B"]),
        )

    def group(self) -> ShapeKey:
        """The per-type default key this shape falls under."""
        return ShapeKey(self.op, self.layout, self.src0_type, self.src1_type, 0, 0, self.B)

    @property
    def is_default(self) -> bool:
        return self.N == 0 and self.K == 0

    def codes(self) -> tuple[int, int, int, int, int, int, int]:
        """Sort order shared with the C rules array."""
        return (
            OP_CODES[Op(self.op)],
            LAYOUT_CODES[Layout(self.layout)],
            GGML_TYPES[self.src0_type].id,
            GGML_TYPES[self.src1_type].id,
            self.N,
            self.K,
            self.B,
        )

    def label(self) -> str:
        """For people: ``MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1``."""
        nk = "N=* K=*" if self.is_default else f"N={self.N} K={self.K}"
        return f"{self.op} {self.layout} {self.src0_type}x{self.src1_type} {nk} B={self.B}"

    def id(self) -> str:
        """For case ids and journals: ``MUL_MAT:weight:q4_K:f32:N4096:K4096:B1``."""
        return f"{self.op}:{self.layout}:{self.src0_type}:{self.src1_type}:N{self.N}:K{self.K}:B{self.B}"

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in SHAPE_KEY}
