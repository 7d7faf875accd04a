"""The one schema module every stage imports.

Names follow ARCHITECTURE.md ("Shape convention"): the GEMM is ``Y[M x N] = X[M x K] * W[K x N]``.

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

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ggml_dispatch import registry

TOOL_NAME: Final = "ggml-dispatch"
TOOL_VERSION: Final = "0.1.0"

TRACE_SCHEMA: Final = "ggml-route-trace/1"
TRACE_STDERR_PREFIX: Final = "ggml-route-trace: "
CENSUS_SCHEMA: Final = "ggml-dispatch-census/1"
TUNING_SCHEMA: Final = "ggml-dispatch-tuning/1"
TABLE_SCHEMA: Final = "ggml-dispatch-table/1"
# Bumped whenever the C layout of the generated header changes; the runtime lookup checks it.
TABLE_LAYOUT_VERSION: Final = 3

# The pinned upstream tree (ARCHITECTURE.md "Where things run").
PINNED_LLAMA_CPP_PYTHON: Final = "0.3.36"
PINNED_SDIST_SHA256: Final = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PINNED_UPSTREAM_COMMIT: Final = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

# What names the llama.cpp a measurement or a table belongs to: a git commit (40 lower-case hex
# digits), a release build number (b11549, the tag llama.cpp publishes per build), or a registry
# release pinned by version (llama-cpp-python==0.3.36: a PEP 508 name, then a PEP 440 version). Each
# names one tree exactly; anything else (a short hash, a branch, free text) does not.
_UPSTREAM_COMMIT: Final = re.compile(r"[0-9a-f]{40}")
_UPSTREAM_BUILD: Final = re.compile(r"b[1-9][0-9]{0,8}")
_UPSTREAM_RELEASE: Final = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
    r"==(?:[0-9]+!)?[0-9]+(?:\.[0-9]+){0,9}(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+){0,9})?"
)
UPSTREAM_ID_HELP: Final = (
    "a 40-hex commit, a build number like b11549 or a registry version like "
    f"llama-cpp-python=={PINNED_LLAMA_CPP_PYTHON}"
)


def check_upstream_id(text: object) -> str:
    """``text`` when it names an upstream tree as :data:`UPSTREAM_ID_HELP` says, spelled canonically
    (lower-case hex, no surrounding space: a caller reading user input normalizes it first); else a
    ValueError whose message says what was expected."""
    if not isinstance(text, str):
        raise ValueError(f"{type(text).__name__} is not an upstream id ({UPSTREAM_ID_HELP})")
    for form in (_UPSTREAM_COMMIT, _UPSTREAM_BUILD, _UPSTREAM_RELEASE):
        if form.fullmatch(text):
            return text
    shown = repr(text if len(text) <= 60 else text[:57] + "...")
    raise ValueError(f"{shown} is not an upstream id ({UPSTREAM_ID_HELP})")


# Ops, layouts, fused groups and routes, with their integer codes, are spelled once in the registry.
Op = registry.Op
Layout = registry.Layout
Fused = registry.Fused
Route = registry.Route  # the kernel families a table may choose

# The ops whose route-trace records (ggml-route-trace/1) the matmul census reads (the registry says which
# census file each op's rows are in): the matrix multiplications.
TRACE_OPS: Final = frozenset(registry.census_ops(registry.CENSUS_MATMUL))

# Stable integer codes used by the generated header and the native hook (0 = stock / no rule).
ROUTE_STOCK_CODE: Final = registry.STOCK_CODE
ROUTE_CODES: Final[dict[Route, int]] = registry.ROUTE_CODES
OP_CODES: Final[dict[Op, int]] = registry.OP_CODES
LAYOUT_CODES: Final[dict[Layout, int]] = registry.LAYOUT_CODES

# What a trace may report as having run: the table routes plus paths the table never chooses.
TRACE_ONLY_ROUTES: Final = frozenset(registry.TRACE_ONLY_ROUTES)
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
    REFERENCE = "reference"  # tuning rows converted from samples/reference (one sample, no CI)


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
# ggml types of the pinned tree (the registry holds the table)

GgmlType = registry.GgmlType
GGML_TYPES: Final = registry.GGML_TYPES
GGML_TYPES_BY_ID: Final = registry.GGML_TYPES_BY_ID


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
    if Op(op) is Op.MUL_MAT_ID:
        return Gemm(M=src1_ne[2], N=src0_ne[1], K=src0_ne[0], B=1, E=src0_ne[2], U=src1_ne[1])
    raise ValueError(f"{op} is not a matrix multiplication")


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
    layouts = registry.OPS[Op(op)].layouts
    if len(layouts) == 1:  # MUL_MAT_ID: expert, FLASH_ATTN_EXT: attention
        return layouts[0]
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
# config: the configuration that ran, canonical text (null for a trace-only path)
TRACE_ROUTE_OPTIONAL: Final[dict[str, str]] = {"t_us": "num", "config": "str|null", "experts": "obj"}
# MUL_MAT_ID records of a traced run: tokens-per-expert statistics of the sampled calls since the last
# flush (ggml_dispatch/hook/native/ggml-dispatch-moe-stats.h): means per call, the largest max, calls per
# routing bucket.
TRACE_EXPERTS_FIELDS: Final[dict[str, str]] = {
    "sampled": "int",
    "picks": "num",
    "nonempty": "num",
    "max": "num",
    "max_max": "num",
    "mean": "num",
    "cv": "num",
    "routing": "list",
}
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

# The census columns of one op's rows, from its key class (registry.op_columns): MUL_MAT_ID rows
# ingested from a trace with tokens-per-expert statistics carry routing (the registry's routing bucket
# most of the key's calls fell in, part of the key) and means per sampled call (merged rows: weighted by
# calls). A file without them reads as all null, and a census writes them only when a row has them.
CENSUS_OPTIONAL_COLUMNS: Final[dict[str, str]] = registry.op_columns("census", CENSUS_COLUMNS, TRACE_OPS)

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

# The tuning columns of one op's rows (null on the others), from its key class (registry.op_columns):
# FLASH_ATTN_EXT rows carry their attention key (registry.FlashAttnKey); MUL_MAT_ID rows the expert count
# E, src1 rows per token U, the harness' routing kind (uniform, skewed, few, trace), the routing bucket its
# case measured (registry.routing_bucket of the case's tokens-per-expert statistics; null: not measured)
# and the experts per token of the case (U for a down node; the model's n_expert_used for a gate/up
# node, U = 1): which routing buckets the point can meet (registry.attainable_buckets).
TUNING_OP_COLUMNS: Final[dict[str, str]] = registry.op_columns("tuning", TUNING_COLUMNS)

# Tuning columns a reader fills with nulls where an older file lacks them. config: the configuration
# timed, canonical text (registry.Config); its route is the row's route. Then the ops' own columns.
TUNING_OPTIONAL_COLUMNS: Final[dict[str, str]] = {"config": "string", **TUNING_OP_COLUMNS}

# The key that identifies a tunable MUL_MAT shape class (a rule is an M interval per such key); the
# other ops' keys are registry.MulMatIdKey and registry.FlashAttnKey (registry.key_class(op)).
ShapeKey = registry.ShapeKey
SHAPE_KEY: Final = ShapeKey.fields()
