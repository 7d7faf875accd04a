"""The one registry of ops, layouts, routes, route parameters, configurations and shape keys.

Everything the Python stages and the native code call by name or by integer code is spelled here
once; ``ggml_dispatch/codes.py`` renders it into the C header ``ggml-dispatch-codes.h`` (install writes
it
into the tree beside the other native files, the harness build gets the same file), and a test holds
the op and type tables against the pinned tree's ``ggml/include/ggml.h``.

* **ops** (:class:`Op`): the ggml ops the project measures, with their ggml enum name, the layout
  classes they come in, the shape-key class that identifies a tunable shape of the op, the census file
  its rows are in and the tuner module that makes its cases (named, resolved by the tuner).
* **layouts** (:class:`Layout`): rules never cross layout classes.
* **routes** (:class:`Route`): the kernel families a table or a forced run may choose, per op, each
  with its named **parameters** and their legal values. Trace-only routes (paths stock takes that a
  table never chooses) get codes after the table routes; they are never persisted as codes.
* **configurations** (:class:`Config`): the decision unit, a route plus values for some of its
  parameters. A parameter left out means "what stock does inside that route", so every route is a
  configuration without parameters (``cublas``). Canonical text form: ``route`` or
  ``route/name=value,name=value`` with the parameters in the route's declared order (the parser
  takes any order). Integer form (C tables, the override API): bits 0-7 the route code, then each
  parameter of the route in declared order in a field of :attr:`Param.bits` bits holding 0 (not set)
  or 1 + the index of its value in :attr:`Param.values`. Code 0 is stock.
* **shape keys**: one frozen dataclass per op (:class:`ShapeKey` for MUL_MAT, :class:`MulMatIdKey`,
  :class:`FlashAttnKey`). A rule is an interval of ``M`` (tokens; Q columns for attention) per key.
  In the C table a key is (op, layout, type0, type1, k[KEY_SLOTS]); a key's ``DEFAULT_FIELDS`` set to
  0 make the per-type default the lookup falls back to. A key's fields, and the other per-row columns
  its class declares, are the op's columns in the census and tuning files (:func:`op_columns`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Final, Self

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

    @property
    def family(self) -> str:
        """How the type dequantizes: "k" (256-element super-blocks, q2_K..q6_K), "iq" (the i-quants),
        "legacy" (32-element blocks, q4_0..q8_1), "float" (f32, f16, bf16). Size-class defaults of a type
        measured at too few shapes are fitted on its family's shapes (codegen.classes.family_rules)."""
        if not self.quantized:
            return "float"
        if self.name.startswith("iq"):
            return "iq"
        return "k" if self.name.endswith("_K") else "legacy"


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


# --------------------------------------------------------------------------------------------
# Ops, layouts, fused groups, reasons


class Op(StrEnum):
    MUL_MAT = "MUL_MAT"
    MUL_MAT_ID = "MUL_MAT_ID"
    FLASH_ATTN_EXT = "FLASH_ATTN_EXT"


class Layout(StrEnum):
    """Rules never cross layout classes."""

    WEIGHT = "weight"  # contiguous src0, B = 1
    ATTENTION = "attention"  # src0 is a KV-cache view (non-contiguous) or B > 1; FLASH_ATTN_EXT's K/V
    EXPERT = "expert"  # MUL_MAT_ID


LAYOUT_CODES: Final[dict[Layout, int]] = {Layout.WEIGHT: 0, Layout.ATTENTION: 1, Layout.EXPERT: 2}


class Fused(StrEnum):
    """Node groups ggml_cuda_try_fuse runs as one kernel (the table never overrides them)."""

    GLU = "glu"
    BIAS = "bias"
    SCALE = "scale"


# code 0 = not fused
FUSED_CODES: Final[dict[Fused, int]] = {Fused.GLU: 1, Fused.BIAS: 2, Fused.SCALE: 3}

# Why a node ran what it ran (trace `reason`); "ineligible:<why>" carries the eligibility answer.
REASONS: Final[tuple[str, ...]] = ("stock", "table", "forced", "fused", "ineligible")

# The eligibility check's answers (ggml_dispatch/hook/native/ggml-dispatch-eligibility.cuh), in code order;
# "ok" = 0.
INELIGIBLE: Final[dict[str, str]] = {
    "ok": "eligible",
    "route": "not a valid configuration of a table route",
    "vendor": "not an NVIDIA device",
    "no_device_code": "no compiled arch <= cc, or the kernel needs a newer one",
    "fwht": "the FWHT hint path owns this node",
    "src1_type": "kernel wrappers assert src1 F32",
    "dst_type": "kernel wrappers assert dst F32",
    "src0_type": "no kernel for this weight type",
    "element_stride": "nb[0] != type size (asserted by every wrapper)",
    "batch": "M outside the compiled template range",
    "align": "strides not aligned for the kernel's vector loads",
    "rows": "N not a multiple of the kernel's rows per block",
    "cols": "K not a multiple of the kernel's reduction step",
    "padding": "padded compute-buffer view (mmvq/mmq assert)",
    "smem": "MMQ tiles need >= 48 KiB shared memory per block",
    "dst_layout": "cuBLAS asserts a contiguous dst",
    "convert": "cuBLAS has no strided conversion for this weight type",
    "op": "the configuration's route does not serve this op",
    "params": "a parameter value this node cannot take (no converter, no compiled J, no stream-k)",
    "attn": "FlashAttention kernel not legal here (head dims, KV length, Q columns, GQA, cc; fattn.cu)",
    "no_shadow": "kv=reuse where no shadow of the KV cache has been made: stock's kernel",
    "feature": "the configuration needs a hook feature the tree did not take (ggml-dispatch install --check)",
}


# --------------------------------------------------------------------------------------------
# Routes and their parameters


@dataclass(frozen=True)
class Param:
    """A route parameter: its name in config strings and its legal values (left out = stock's choice)."""

    name: str
    values: tuple[str, ...]
    doc: str
    ops: tuple[Op, ...] = ()  # the ops whose nodes may set it; () = every op of the route
    untimed: tuple[str, ...] = ()  # values a sweep never times (codegen writes them into rules)
    feature: str = "core"  # the hook feature whose edits read it (FEATURES)

    @property
    def timed(self) -> tuple[str, ...]:
        """The values a sweep times."""
        return tuple(v for v in self.values if v not in self.untimed)

    @property
    def bits(self) -> int:
        """Width of its field in a config code (holds 0 = not set, or 1 + value index)."""
        return max(1, len(self.values).bit_length())


class Route(StrEnum):
    """Kernel families a table or a forced run may choose."""

    MMVF = "mmvf"
    MMF = "mmf"
    MMVQ = "mmvq"
    MMQ = "mmq"
    CUBLAS = "cublas"
    FA_VEC = "fa_vec"
    FA_TILE = "fa_tile"
    FA_MMA = "fa_mma"
    ID_SORTED = "id_sorted"


@dataclass(frozen=True)
class RouteSpec:
    route: Route
    code: int  # 1..ROUTE_CODE_MASK; 0 is stock
    ops: tuple[Op, ...]  # the ops whose nodes may run it
    params: tuple[Param, ...]
    doc: str
    feature: str = "core"  # the hook feature that can run the route (FEATURES)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


ROUTE_CODE_BITS: Final = 8
ROUTE_CODE_MASK: Final = (1 << ROUTE_CODE_BITS) - 1
STOCK_CODE: Final = 0

_MMQ_J: Final = tuple(str(j) for j in range(8, 129, 8))  # mul_mat_q_switch_J's compiled widths (mmq.cuh)
# split=2j_fused: the narrow widths compiled beside J = 128 (emitted as GGML_DISPATCH_MMQ_FUSED_J_LIST)
MMQ_FUSED_J: Final = (16, 24, 32, 48, 64)
MMQ_FIT_SPLITS: Final = ("fit", "fit64")  # the splits that fit the width per expert (no J of their own)
# FLASH_ATTN_EXT MMA_F16 tiles (fattn.cu's switch_ncols1/switch_ncols2 over the compiled instances
# template-instances/fattn-mma-f16-instance-ncols1_<n1>-ncols2_<n2>.cu): ncols1 x ncols2 Q columns x heads per
# tile, ncols1 x ncols2 in FA_MMA_NCOLS; head dims 64..256 have every such pair with ncols2 <= 8.
_FA_MMA_NCOLS1: Final = ("1", "2", "4", "8", "16", "32", "64")
_FA_MMA_NCOLS2: Final = ("1", "2", "4", "8")
FA_MMA_NCOLS: Final = (8, 16, 32, 64)
# FLASH_ATTN_EXT VEC: parallel blocks per output tile (launch_fattn's parallel_blocks)
_FA_VEC_BLOCKS: Final = tuple(str(1 << i) for i in range(9))  # 1 .. 256
# VEC, TILE and MMA_F16 on a quantized (q8_0) KV cache: read its f16 shadow instead of converting K and V per
# call (VEC: instead of its quantized instance; it then runs the f16 one)
_FA_KV_SHADOW: Final = Param(
    "kv",
    ("shadow", "reuse"),
    "shadow: read a persistent f16 shadow of the q8_0 KV cache (made once within the shadow budget, kept in"
    " step with every write to the cache) instead of converting the K/V view to f16 on every call; reuse"
    " (codegen's choice below the deepest run of KV buckets with shadow rules): the same where a shadow of"
    " the cache exists or the cache is long enough for a shadow-making rule of the node's kind to apply in"
    " it, else stock's kernel, so a short context never pays the shadow's upkeep",
    untimed=("reuse",),  # where a shadow exists it runs exactly what `shadow` measured
    feature="kv_shadow",
)

# Decode and speculative verify (M <= 8): the launch shapes of the vector kernels. mmvq's warps per
# block x rows per block replace calc_nwarps / calc_rows_per_block (mmvq.cu) through compiled instances,
# one per candidate pair below (index 1 + its position; 0 = the tree's constexpr table), for ncols_dst
# 1..MMVQ_MAX_COLS; mmvf's block size is one of the widths launch_mul_mat_vec_f_cuda already compiles.
MMVQ_MAX_COLS: Final = 8  # mmvq.cu's MMVQ_MAX_BATCH_SIZE, the ncols_dst switch 1..8
MMVQ_WARP_SIZE: Final = 32  # NVIDIA's; the hook refuses other vendors
_MMVQ_NWARPS: Final = (1, 2, 4, 8)
_MMVQ_ROWS: Final = (1, 2, 4)
_MMVQ_SMEM_LIMIT: Final = 48 * 1024  # static shared memory per block


def mmvq_pair_valid(nwarps: int, rows: int, warp_size: int = MMVQ_WARP_SIZE) -> bool:
    """Can mul_mat_vec_q run with ``nwarps`` warps and ``rows`` rows per block at every ncols_dst <= 8?
    A block holds at most 1024 threads; lane i writes row i (rows <= warp size); the cross-warp
    reduction's static shared memory, (nwarps - 1) x ncols x rows x warp size floats, fits 48 KiB (the
    candidate instances are never launched with a fused gate, which would double it)."""
    smem = max(nwarps - 1, 1) * MMVQ_MAX_COLS * rows * warp_size * 4
    return nwarps * warp_size <= 1024 and 1 <= rows <= warp_size and smem <= _MMVQ_SMEM_LIMIT


# The candidate pairs, generated: their order is the compiled instances' index (1-based) in the codes header.
MMVQ_CONFIGS: Final[tuple[tuple[int, int], ...]] = tuple(
    (w, r) for w in _MMVQ_NWARPS for r in _MMVQ_ROWS if mmvq_pair_valid(w, r)
)
# What install compiles unless told otherwise (--mmvq-configs): each instance costs build time and binary size
# (docs/mmvq-configs.md has the measurement); "all" = MMVQ_CONFIGS.
MMVQ_DEFAULT_CONFIGS: Final[tuple[tuple[int, int], ...]] = ((1, 1), (2, 1), (4, 1), (4, 2), (8, 1), (8, 2))
# The weight types mul_mat_vec_q_switch_type launches (mmvq.cu); the candidate instances are compiled for
# MMVQ_DEFAULT_TYPES unless install is told otherwise (--mmvq-types).
MMVQ_TYPES: Final[tuple[str, ...]] = (
    "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4",
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
    "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "iq3_s",
)  # fmt: skip
MMVQ_DEFAULT_TYPES: Final[tuple[str, ...]] = ("q4_0", "q8_0", "q4_K", "q5_K", "q6_K")
# Register caps per thread a candidate pair can be compiled with besides the compiler's own choice (the
# kernel's __launch_bounds__ minimum blocks per SM, 65536 / (regs x threads per block); upstream asks for 1
# block, which lets the K-quant kernels at ncols_dst 2-4 take 72-95 registers and so 5-7 blocks of 128
# threads per SM). 64 registers is 1024 resident threads at any block size; docs/mmvq-configs.md has the
# registers and spills each cap gives. Each cap compiled doubles the candidates' kernels (--mmvq-regs).
MMVQ_REGS: Final[tuple[int, ...]] = (64,)
MMVQ_DEFAULT_REGS: Final[tuple[int, ...]] = (64,)
_MMVQ_REGS_PER_SM: Final = 65536  # 32-bit registers per SM, sm_70 to sm_90
# Every compiled candidate (nwarps, rows, regs; 0 regs: no cap): each pair uncapped, then each pair under each
# cap. The position is the instance's index (1-based) in the codes header; the pairs keep theirs.
MMVQ_CANDIDATES: Final[tuple[tuple[int, int, int], ...]] = tuple(
    (w, r, g) for g in (0, *MMVQ_REGS) for w, r in MMVQ_CONFIGS
)
MMVF_BLOCKS: Final[tuple[int, ...]] = tuple(range(32, 257, 32))  # launch_mul_mat_vec_f_cuda's block sizes


def mmvq_pair_text(pair: tuple[int, int]) -> str:
    """``4x2`` for 4 warps x 2 rows per block (the --mmvq-configs spelling)."""
    return f"{pair[0]}x{pair[1]}"


def parse_mmvq_configs(text: str) -> tuple[tuple[int, int], ...]:
    """``--mmvq-configs``: "all", "none", or NxR items separated by commas, each a candidate pair
    (ValueError names the first item that is not); in MMVQ_CONFIGS order."""
    if text.strip() == "all":
        return MMVQ_CONFIGS
    if text.strip() == "none":
        return ()
    out: list[tuple[int, int]] = []
    for item in text.split(","):
        w, x, r = item.strip().partition("x")
        pair = (int(w), int(r)) if x and w.isdigit() and r.isdigit() else None
        if pair is None or pair not in MMVQ_CONFIGS:
            choices = ",".join(mmvq_pair_text(p) for p in MMVQ_CONFIGS)
            raise ValueError(f"--mmvq-configs: {item.strip()!r} is not one of {choices} (or all, none)")
        if pair not in out:
            out.append(pair)
    return tuple(sorted(out, key=MMVQ_CONFIGS.index))


def parse_mmvq_regs(text: str) -> tuple[int, ...]:
    """``--mmvq-regs``: "all", "none", or register caps separated by commas, each one of MMVQ_REGS."""
    if text.strip() == "all":
        return MMVQ_REGS
    if text.strip() == "none":
        return ()
    out: list[int] = []
    for item in text.split(","):
        cap = int(item.strip()) if item.strip().isdigit() else None
        if cap is None or cap not in MMVQ_REGS:
            choices = ",".join(map(str, MMVQ_REGS))
            raise ValueError(f"--mmvq-regs: {item.strip()!r} is not one of {choices} (or all, none)")
        if cap not in out:
            out.append(cap)
    return tuple(sorted(out, key=MMVQ_REGS.index))


def mmvq_min_blocks(nwarps: int, regs: int, warp_size: int = MMVQ_WARP_SIZE) -> int:
    """The launch bounds' minimum blocks per SM a register cap asks for (1: no cap, as upstream)."""
    return max(1, _MMVQ_REGS_PER_SM // (regs * nwarps * warp_size)) if regs else 1


def parse_mmvq_types(text: str) -> tuple[str, ...]:
    """``--mmvq-types``: "all" or ggml type names separated by commas, each one mmvq launches."""
    if text.strip() == "all":
        return MMVQ_TYPES
    out: list[str] = []
    for item in text.split(","):
        name = item.strip()
        if name not in MMVQ_TYPES:
            choices = ", ".join(MMVQ_TYPES)
            raise ValueError(f"--mmvq-types: {name!r} is not a type mmvq runs ({choices}, or all)")
        if name not in out:
            out.append(name)
    return tuple(sorted(out, key=MMVQ_TYPES.index))


@dataclass(frozen=True)
class MmvqBuild:
    """Which mmvq candidate instances a build compiles (feature mmvq_params): pairs and weight types. Install
    stamps it into the tree; the tuner reads it back to know which candidates a harness can time."""

    configs: tuple[tuple[int, int], ...] = MMVQ_DEFAULT_CONFIGS
    types: tuple[str, ...] = MMVQ_DEFAULT_TYPES
    regs: tuple[int, ...] = MMVQ_DEFAULT_REGS  # each pair is compiled uncapped and under each of these caps

    @classmethod
    def parse(
        cls,
        configs: str | None,
        types: str | None,
        previous: MmvqBuild | None = None,
        regs: str | None = None,
    ) -> MmvqBuild:
        """From ``--mmvq-configs`` / ``--mmvq-types`` / ``--mmvq-regs`` (None: the previous install's, else
        the defaults); ValueError names the option and item that are not understood."""
        base = previous or cls()
        return cls(
            base.configs if configs is None else parse_mmvq_configs(configs),
            base.types if types is None else parse_mmvq_types(types),
            base.regs if regs is None else parse_mmvq_regs(regs),
        )

    @classmethod
    def from_json(cls, d: Any) -> MmvqBuild | None:
        """An install record's ``mmvq`` entry, the choice a later install keeps (None where it has none or one
        that does not parse). A record without ``regs`` predates the caps, so nobody chose against them: the
        default caps."""
        if not isinstance(d, dict):
            return None
        try:
            regs = str(d["regs"]) if "regs" in d else None
            return cls.parse(str(d["configs"]) or "none", str(d["types"]), regs=regs)
        except (KeyError, ValueError):
            return None

    def to_json(self) -> dict[str, str]:
        return {"configs": self.configs_text(), "types": ",".join(self.types), "regs": self.regs_text()}

    def configs_text(self) -> str:
        return ",".join(mmvq_pair_text(p) for p in self.configs) or "none"

    def regs_text(self) -> str:
        return ",".join(map(str, self.regs)) or "none"

    def compiled(self, src0_type: str, pair: tuple[int, int], regs: int = 0) -> bool:
        return src0_type in self.types and pair in self.configs and (regs == 0 or regs in self.regs)

    def kernels(self) -> int:
        """Kernel instances the candidates add (ncols_dst 1..MMVQ_MAX_COLS each)."""
        return len(self.configs) * len(self.types) * MMVQ_MAX_COLS * (1 + len(self.regs))


ROUTES: Final[dict[Route, RouteSpec]] = {
    Route.MMVF: RouteSpec(
        Route.MMVF,
        1,
        (Op.MUL_MAT, Op.MUL_MAT_ID),
        (
            Param(
                "block",
                tuple(str(b) for b in MMVF_BLOCKS),
                "threads per block (stock: the fewest K iterations, then the smallest block)",
                ops=(Op.MUL_MAT,),
                feature="mmvf_params",
            ),
        ),
        "mul_mat_vec_f (f32/f16/bf16 vector)",
    ),
    Route.MMF: RouteSpec(Route.MMF, 2, (Op.MUL_MAT, Op.MUL_MAT_ID), (), "mul_mat_f (f16/bf16 tensor cores)"),
    Route.MMVQ: RouteSpec(
        Route.MMVQ,
        3,
        (Op.MUL_MAT, Op.MUL_MAT_ID),
        (
            Param(
                "nwarps",
                tuple(str(w) for w in _MMVQ_NWARPS),
                "warps per block (stock: calc_nwarps by GPU family and ncols_dst); needs rows, and the pair"
                " compiled in (install --mmvq-configs, --mmvq-types)",
                ops=(Op.MUL_MAT,),
                feature="mmvq_params",
            ),
            Param(
                "rows",
                tuple(str(r) for r in _MMVQ_ROWS),
                "output rows per block (stock: calc_rows_per_block); needs nwarps",
                ops=(Op.MUL_MAT,),
                feature="mmvq_params",
            ),
            Param(
                "regs",
                tuple(str(g) for g in MMVQ_REGS),
                "registers per thread at most (stock: the compiler's choice under one block per SM): more"
                " resident warps to keep weight loads in flight; needs nwarps and rows, compiled in (install"
                " --mmvq-regs)",
                ops=(Op.MUL_MAT,),
                feature="mmvq_params",
            ),
        ),
        "mul_mat_vec_q (quantized vector)",
    ),
    Route.MMQ: RouteSpec(
        Route.MMQ,
        4,
        (Op.MUL_MAT, Op.MUL_MAT_ID),
        (
            Param(
                "j",
                _MMQ_J,
                "column tile width J (stock: fewest column tiles, then the smallest J)",
                feature="mmq_tiles",
            ),
            Param(
                "stream_k", ("on", "off"), "stream-k decomposition or one block per tile", feature="mmq_tiles"
            ),
            Param(
                "split",
                ("2j", "2j_wave", "2j_fused", "fit", "fit64"),
                "MUL_MAT_ID: only experts with at most 2 x J tokens run this J and stream-k (a grid"
                " of 2 column tiles per expert); a second launch runs the others as the tree would."
                " Each block reads its expert's token count on the device, so the choice follows the"
                " routing without a host sync. Needs j. 2j_wave (needs stream_k=off): that first launch"
                " is one wave of blocks, each running a run of whole tiles in turn, so where every"
                " expert went to the second launch it costs one wave of block starts, not one per tile."
                " 2j_fused (needs stream_k=off, j in MMQ_FUSED_J, rows a multiple of 128): one launch"
                " over the tree's grid at J = 128, each block running its expert's tiles at j or at 128"
                " by the expert's token count, so no second launch and no block beyond the tree's."
                " fit (needs stream_k=off, no j): that launch with the width fitted to each expert, one"
                " tile of the narrowest MMQ_FUSED_J that holds its tokens, 128 beyond the widest."
                " fit64 (needs stream_k=off, no j): fit over a grid of 64-column slots, so an expert with"
                " 65-128 tokens runs two J = 64 tiles instead of one J = 128 tile (twice the blocks where"
                " few experts hold all tokens); beyond 128 tokens J = 128 tiles",
                ops=(Op.MUL_MAT_ID,),
                feature="moe_split",
            ),
        ),
        "mul_mat_q (quantized tiles, Q8_1 activations)",
    ),
    Route.CUBLAS: RouteSpec(
        Route.CUBLAS,
        5,
        (Op.MUL_MAT,),
        (
            Param(
                "out",
                ("f16", "f32"),
                "GEMM output type: f16 then a convert to f32, or f32 directly",
                feature="cublas_params",
            ),
            Param("compute", ("f16", "f32", "bf16"), "cuBLAS compute type", feature="cublas_params"),
            Param(
                "weight",
                ("cached",),
                "read a persistent f16 copy of the weight (made once, within the cache budget) instead of"
                " dequantizing it on every call",
                feature="weight_cache",
            ),
        ),
        "cuBLAS GEMM after dequantization",
    ),
    # FLASH_ATTN_EXT kernels (fattn.cu's best_fattn_kernel). VEC reads a quantized K/V cache directly where
    # its K/V type pair is compiled; TILE and MMA_F16 convert K and V to f16 on every call (the f16 copies
    # live in the node's scratch, sized by ggml_cuda_flash_attn_ext_get_alloc_size for the kernel chosen).
    Route.FA_VEC: RouteSpec(
        Route.FA_VEC,
        6,
        (Op.FLASH_ATTN_EXT,),
        (
            Param(
                "blocks",
                _FA_VEC_BLOCKS,
                "parallel blocks over the KV length (stock: from occupancy, the best tail efficiency; at most"
                " one per KV tile of head-dim columns)",
                feature="fa_params",
            ),
            _FA_KV_SHADOW,
        ),
        "flash_attn_ext_vec (1-2 Q columns per block)",
    ),
    Route.FA_TILE: RouteSpec(
        Route.FA_TILE,
        7,
        (Op.FLASH_ATTN_EXT,),
        (_FA_KV_SHADOW,),
        "flash_attn_ext_tile (no tensor cores, f16 K/V)",
    ),
    Route.FA_MMA: RouteSpec(
        Route.FA_MMA,
        8,
        (Op.FLASH_ATTN_EXT,),
        (
            Param(
                "ncols1",
                _FA_MMA_NCOLS1,
                "Q columns per tile (switch_ncols1; ncols1 x ncols2 must be a compiled instance pair)",
                feature="fa_params",
            ),
            Param(
                "ncols2",
                _FA_MMA_NCOLS2,
                "Q heads of one KV head packed per tile (switch_ncols2, the GQA packing; above 1 only where"
                " the tree's GQA optimization applies: a mask, no ALiBi, KV length a multiple of 256)",
                feature="fa_params",
            ),
            Param(
                "sparse",
                ("on", "off"),
                "the sparse-gather variant (instances compiled with it, graphs with n_kv_max): on where its"
                " hard limits hold, off never (stock: also its 4096 / 2 x gathered-columns threshold)",
                feature="fa_params",
            ),
            Param(
                "stream_k",
                ("on", "off"),
                "stream-k (one wave of blocks, tiles split along the KV length) or one block per tile",
                feature="fa_params",
            ),
            _FA_KV_SHADOW,
        ),
        "flash_attn_ext_mma_f16 (tensor cores, f16 K/V)",
    ),
    # ggml_cuda_mul_mat_id's own fallback: a host sync reads ids, then one MUL_MAT per expert with tokens
    # (stock's cascade per slice). It synchronizes the stream, so a graph with such a node is never captured
    # (the hook tells ggml_cuda_mul_mat_id_needs_sync): the harness times it eagerly and reports it as
    # breaking graphs, and codegen never makes it a rule (ARCHITECTURE.md, "Decision rule").
    Route.ID_SORTED: RouteSpec(
        Route.ID_SORTED,
        9,
        (Op.MUL_MAT_ID,),
        (),
        "MUL_MAT_ID fallback: a host sync, then one MUL_MAT per expert with tokens (breaks CUDA graphs)",
        feature="id_sorted",
    ),
}
# Routes whose nodes synchronize the stream: a graph holding one runs without CUDA graphs
GRAPH_BREAKING_ROUTES: Final = frozenset({Route.ID_SORTED})


# --------------------------------------------------------------------------------------------
# Hook features: the optional edits of upstream files that a configuration's route or parameters need.
# `install` applies each feature whose edits fit the tree and skips the others with the reason; a rule or a
# forced configuration that needs a skipped feature runs stock (the native side reads the installed mask).


@dataclass(frozen=True)
class Feature:
    name: str
    bit: int  # its bit in GGML_DISPATCH_FEATURES (ggml-dispatch-build.h)
    doc: str
    requires: tuple[str, ...] = ()  # features whose edits this one's edits call


FEATURES: Final[dict[str, Feature]] = {
    f.name: f
    for f in (
        Feature(
            "core",
            0,
            "the seam: MUL_MAT, MUL_MAT_ID and FLASH_ATTN_EXT ask the dispatch for a route and call the"
            " tree's own kernel entry points; route trace, override API, CUDA-graph bookkeeping",
        ),
        Feature(
            "stock_route",
            1,
            "the tree's MUL_MAT / MUL_MAT_ID cascades are the ones the trace's stock_route prediction mirrors"
            " (checks only; where skipped, the stock_route the trace records is a prediction)",
        ),
        Feature("mmq_tiles", 2, "mmq column tile width J and stream-k per configuration (mmq.cuh)"),
        Feature(
            "moe_split",
            3,
            "MUL_MAT_ID mmq splits by tokens per expert: 2j, 2j_wave, 2j_fused, fit, fit64 (mmq.cuh)",
            requires=("mmq_tiles",),
        ),
        Feature("id_sorted", 4, "MUL_MAT_ID's per-expert fallback as a chosen route (ggml-cuda.cu)"),
        Feature("cublas_params", 5, "cuBLAS compute and output type per configuration (ggml-cuda.cu)"),
        Feature("weight_cache", 6, "cuBLAS reads a persistent f16 copy of a quantized weight (ggml-cuda.cu)"),
        Feature("kv_shadow", 7, "FlashAttention reads an f16 shadow of a quantized KV cache (fattn*.cu*)"),
        Feature(
            "fa_params",
            8,
            "FlashAttention parameters: VEC parallel blocks, MMA tile ncols1 x ncols2, sparse gather,"
            " stream-k",
        ),
        Feature(
            "mmvq_params",
            9,
            "mmvq warps and rows per block per configuration, from compiled candidate instances (mmvq.cu)",
        ),
        Feature("mmvf_params", 10, "mmvf threads per block per configuration (mmvf.cu)"),
    )
}
CORE_FEATURE: Final = "core"


def config_features(config: Config) -> frozenset[str]:
    """The hook features a configuration needs beyond the core seam (its route's and its set parameters')."""
    spec = ROUTES[config.route]
    need = {spec.feature}
    for name, _ in config.params:
        p = spec.param(name)
        if p is not None:
            need.add(p.feature)
    return frozenset(need - {CORE_FEATURE})


# FLASH_ATTN_EXT: fattn.cu's best_fattn_kernel values -> route
FATTN_KERNEL_ROUTES: Final[dict[str, Route]] = {
    "VEC": Route.FA_VEC,
    "TILE": Route.FA_TILE,
    "MMA_F16": Route.FA_MMA,
}

# Paths stock takes that a table never chooses: reported by the trace, counted as "other" by the
# override API's counts. Their codes follow the table routes' (native side only, never persisted).
TRACE_ONLY_ROUTES: Final[dict[str, str]] = {
    "mmvf_t": "the transposed-vector mmvf path (ne01 == 1)",
    "fwht": "the FWHT hint path",
}

ROUTE_CODES: Final[dict[Route, int]] = {r: s.code for r, s in ROUTES.items()}
ROUTE_COUNT: Final = max(ROUTE_CODES.values()) + 1  # table route codes 0..ROUTE_COUNT-1, 0 = stock
TRACE_ROUTE_CODES: Final[dict[str, int]] = {
    **{r.value: c for r, c in ROUTE_CODES.items()},
    **{name: ROUTE_COUNT + i for i, name in enumerate(TRACE_ONLY_ROUTES)},
}


def route_names_by_code() -> list[str]:
    """Every route name indexed by its code (table routes, then trace-only); [0] = "stock"."""
    names = ["stock"] + [""] * (len(TRACE_ROUTE_CODES))
    for name, code in TRACE_ROUTE_CODES.items():
        names[code] = name
    if "" in names:
        raise AssertionError("route codes are not contiguous")
    return names


def param_shifts(spec: RouteSpec) -> list[int]:
    """Bit offset of each parameter's field in a config code of this route."""
    shifts, at = [], ROUTE_CODE_BITS
    for p in spec.params:
        shifts.append(at)
        at += p.bits
    if at > 31:
        raise AssertionError(f"config codes of {spec.route} need {at} bits")
    return shifts


# --------------------------------------------------------------------------------------------
# Configurations: route + parameter values

_NAME: Final = re.compile(r"^[a-z][a-z0-9_]*$")


class ConfigError(ValueError):
    """A config string or code that names no legal configuration."""


@dataclass(frozen=True, order=True)
class Config:
    """A route plus the values of some of its parameters (in the route's declared order)."""

    route: Route
    params: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        spec = ROUTES[self.route]
        order = [p.name for p in spec.params]
        seen: list[str] = []
        for name, value in self.params:
            p = spec.param(name)
            if p is None:
                raise ConfigError(f"route {self.route} has no parameter {name!r} (it has: {_names(order)})")
            if value not in p.values:
                raise ConfigError(f"{self.route}/{name}={value!r} is not one of {', '.join(p.values)}")
            if name in seen:
                raise ConfigError(f"parameter {name!r} given twice")
            seen.append(name)
        if seen != [n for n in order if n in seen]:
            raise ConfigError(f"parameters out of the declared order ({', '.join(order)}); use Config.of")

    @classmethod
    def of(cls, route: Route | str, params: Mapping[str, str] | None = None) -> Config:
        """A config from a route and a mapping of parameter values (any order)."""
        try:
            r = Route(route)
        except ValueError:
            raise ConfigError(f"unknown route {route!r} (routes: {_names(r.value for r in Route)})") from None
        given = dict(params or {})
        spec = ROUTES[r]
        unknown = [n for n in given if spec.param(n) is None]
        if unknown:
            names = _names(p.name for p in spec.params)
            raise ConfigError(f"route {r} has no parameter {unknown[0]!r} (it has: {names})")
        return cls(r, tuple((p.name, given[p.name]) for p in spec.params if p.name in given))

    @classmethod
    def parse(cls, text: str) -> Config:
        """``route`` or ``route/name=value,...`` (parameters in any order, each at most once)."""
        if not isinstance(text, str) or not text:
            raise ConfigError("empty configuration")
        route, sep, rest = text.partition("/")
        params: dict[str, str] = {}
        if sep:
            if not rest:
                raise ConfigError(f"{text!r}: no parameters after '/'")
            for part in rest.split(","):
                name, eq, value = part.partition("=")
                if not eq or not _NAME.match(name) or not value:
                    raise ConfigError(f"{text!r}: {part!r} is not name=value")
                if name in params:
                    raise ConfigError(f"{text!r}: parameter {name!r} given twice")
                params[name] = value
        return cls.of(route, params)

    @classmethod
    def from_code(cls, code: int) -> Config:
        route_code = code & ROUTE_CODE_MASK
        spec = next((s for s in ROUTES.values() if s.code == route_code), None)
        if spec is None or code < 0:
            raise ConfigError(f"config code {code}: no route with code {route_code}")
        params = []
        rest = code
        for p, shift in zip(spec.params, param_shifts(spec), strict=True):
            v = (code >> shift) & ((1 << p.bits) - 1)
            rest &= ~(((1 << p.bits) - 1) << shift)
            if v > len(p.values):
                raise ConfigError(f"config code {code}: {spec.route}/{p.name} value {v} out of range")
            if v:
                params.append((p.name, p.values[v - 1]))
        if rest != route_code:
            raise ConfigError(f"config code {code}: bits beyond the parameters of {spec.route}")
        return cls(spec.route, tuple(params))

    @property
    def code(self) -> int:
        spec = ROUTES[self.route]
        code = spec.code
        values = dict(self.params)
        for p, shift in zip(spec.params, param_shifts(spec), strict=True):
            if p.name in values:
                code |= (1 + p.values.index(values[p.name])) << shift
        return code

    def with_param(self, name: str, value: str) -> Config:
        """The same configuration with one parameter set to `value`."""
        return Config.of(self.route, {**dict(self.params), name: value})

    @property
    def is_plain(self) -> bool:
        """No parameter set: the route as stock runs it."""
        return not self.params

    def has(self, name: str, value: str) -> bool:
        """Does the configuration set parameter ``name`` to ``value``?"""
        return (name, value) in self.params

    @property
    def measured(self) -> Config:
        """The configuration its evidence was timed as: ``kv=reuse`` runs exactly ``kv=shadow`` where a
        shadow exists, and a sweep times only the latter."""
        return self.with_param("kv", "shadow") if self.has("kv", "reuse") else self

    @property
    def order(self) -> tuple[int, int]:
        """Sort key of configs: route code, then config code (a plain route sorts first)."""
        return (ROUTES[self.route].code, self.code)

    def fields(self) -> dict[str, str]:
        """A rule's or refusal's ``config`` (canonical text) and ``route`` fields."""
        return {"config": str(self), "route": self.route.value}

    def __str__(self) -> str:
        if not self.params:
            return self.route.value
        return self.route.value + "/" + ",".join(f"{n}={v}" for n, v in self.params)


def route_configs(route: Route | str) -> list[Config]:
    """Every configuration of a route a sweep times: the plain route, each switch (a one-valued parameter)
    alone on the route's own choice of the rest, then every combination of all its parameters' values, a
    switch both left out and set (declared order; eligibility per shape is the hook's check)."""
    spec = ROUTES[Route(route)]
    out = [Config(spec.route)]
    combos: list[tuple[tuple[str, str], ...]] = [()]
    for p in spec.params:
        if len(p.timed) == 1 or p.ops:  # a switch, or a parameter of some ops only: left out, and each value
            combos = [c2 for c in combos for c2 in (c, *((*c, (p.name, v)) for v in p.timed))]
            continue
        combos = [(*c, (p.name, v)) for c in combos for v in p.timed]
    alone = [((p.name, p.timed[0]),) for p in spec.params if len(p.timed) == 1]
    out += [Config(spec.route, c) for c in alone if config_pairs_compiled(spec.route, c)]
    out += [
        Config(spec.route, c) for c in combos if c and c not in alone and config_pairs_compiled(spec.route, c)
    ]
    if spec.route is Route.MMQ:  # split=fit/fit64 fit J per expert: the mmq configurations without a J
        out += [Config(spec.route, (("stream_k", "off"), ("split", s))) for s in MMQ_FIT_SPLITS]
    return out


def mmvq_params_pair(values: Mapping[str, str]) -> tuple[int, int] | None:
    """The candidate pair an mmvq configuration's parameters name (None: not both set, or not a candidate)."""
    if "nwarps" not in values or "rows" not in values:
        return None
    pair = (int(values["nwarps"]), int(values["rows"]))
    return pair if pair in MMVQ_CONFIGS else None


def mmvq_params_regs(values: Mapping[str, str]) -> int:
    """The register cap an mmvq configuration's parameters name (0: none)."""
    return int(values.get("regs", 0))


def mmvq_config_problem(config: Config) -> str | None:
    """Why an mmvq configuration cannot run anywhere (one parameter without the other, a register cap without
    both, a pair that is not a candidate), else None: the message a forced or table configuration is refused
    with."""
    if config.route is not Route.MMVQ or config.is_plain:
        return None
    values = dict(config.params)
    if "nwarps" not in values or "rows" not in values:
        return f"{config}: mmvq's nwarps and rows are set together (e.g. mmvq/nwarps=4,rows=2)"
    if mmvq_params_pair(values) is None:
        choices = ", ".join(mmvq_pair_text(p) for p in MMVQ_CONFIGS)
        return f"{config}: {values['nwarps']}x{values['rows']} is not a candidate pair ({choices})"
    return None


def fa_mma_pair_compiled(ncols1: int, ncols2: int) -> bool:
    """Is ncols1 x ncols2 an MMA_F16 tile the switch functions launch (head dims 64..256)?"""
    return ncols1 * ncols2 in FA_MMA_NCOLS and ncols2 <= 8


def config_pairs_compiled(route: Route, params: tuple[tuple[str, str], ...]) -> bool:
    """False for an fa_mma configuration naming both ncols1 and ncols2 of a tile with no compiled instance,
    for an mmq split without its J (but split=fit and fit64, which have none: they need stream_k=off and no
    J), for a 2j_wave or 2j_fused split without stream_k=off, for a 2j_fused split at a J without fused
    code, and for an mmvq configuration that does not name a candidate pair of nwarps and rows (a sweep leaves
    them out; the runtime refuses them as ineligible:params)."""
    values = dict(params)
    if route is Route.MMVQ and ("nwarps" in values or "rows" in values or "regs" in values):
        return mmvq_params_pair(values) is not None
    if route is Route.MMQ and values.get("split") in MMQ_FIT_SPLITS:
        return "j" not in values and values.get("stream_k") == "off"
    if route is Route.MMQ and "split" in values and "j" not in values:
        return False
    if (
        route is Route.MMQ
        and values.get("split") in ("2j_wave", "2j_fused")
        and values.get("stream_k") != "off"
    ):
        return False
    if (
        route is Route.MMQ
        and values.get("split") == "2j_fused"
        and int(values.get("j", "0")) not in MMQ_FUSED_J
    ):
        return False
    if route is not Route.FA_MMA or "ncols1" not in values or "ncols2" not in values:
        return True
    return fa_mma_pair_compiled(int(values["ncols1"]), int(values["ncols2"]))


def _names(names: Any) -> str:
    return ", ".join(names) or "none"


def canonical_config(text: str) -> str:
    """The canonical spelling of a config string (ConfigError if it names none)."""
    return str(Config.parse(text))


def measured_config(text: str) -> str:
    """``Config.measured`` of a config string, as text."""
    return str(Config.parse(text).measured)


def config_route(text: str) -> str:
    """The route name of a config string."""
    return Config.parse(text).route.value


def config_order(text: str) -> tuple[int, int]:
    """``Config.order`` of a config string."""
    return Config.parse(text).order


# --------------------------------------------------------------------------------------------
# Shape keys, one class per op

KEY_SLOTS: Final = 5


def kv_bucket(n_kv: int) -> int:
    """FLASH_ATTN_EXT KV-length bucket: the smallest power of two >= n_kv (1 for n_kv <= 1)."""
    return 1 if n_kv <= 1 else 1 << (int(n_kv) - 1).bit_length()


class _Key:
    """Shared behaviour of the per-op shape keys (frozen dataclasses whose first fields are op, layout).

    A subclass declares ``TYPE_FIELDS`` (two ggml type names, C slots type0/type1), ``INT_FIELDS``
    (up to KEY_SLOTS integers, C slots k[0..]) and ``DEFAULT_FIELDS`` (integer fields a per-type
    default sets to 0)."""

    OP: ClassVar[Op]
    TYPE_FIELDS: ClassVar[tuple[str, str]]
    INT_FIELDS: ClassVar[tuple[str, ...]]
    DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = ()
    # integer fields a row may lack (or hold null in): their value then
    OPTIONAL_FIELDS: ClassVar[Mapping[str, int]] = {}
    # The op's own columns in the census and tuning files (:func:`op_columns`): beyond the columns every
    # row of the file has, in file order. None: the key fields the file's shared columns lack. A key
    # field takes the key's type (:meth:`column_types`); any other column is typed in EXTRA_COLUMNS.
    CENSUS_COLUMNS: ClassVar[tuple[str, ...] | None] = None
    TUNING_COLUMNS: ClassVar[tuple[str, ...] | None] = None
    EXTRA_COLUMNS: ClassVar[Mapping[str, str]] = {}

    op: str
    layout: str

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return ("op", "layout", *cls.TYPE_FIELDS, *cls.INT_FIELDS)

    @classmethod
    def column_types(cls) -> dict[str, str]:
        """The key's fields as file columns with their types (``schema``'s type names): op, layout and
        the ggml type names are strings, the integer fields int64."""
        return {f: "int64" if f in cls.INT_FIELDS else "string" for f in cls.fields()}

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Self:
        """The key of a tuning or census row (any mapping with the key's columns)."""
        vals: list[Any] = [str(row["op"]), str(row["layout"])]
        vals += [str(row[f]) for f in cls.TYPE_FIELDS]
        for f in cls.INT_FIELDS:
            v = row.get(f) if f in cls.OPTIONAL_FIELDS else row[f]
            missing = v is None or (isinstance(v, float) and v != v)
            vals.append(cls.OPTIONAL_FIELDS[f] if missing and f in cls.OPTIONAL_FIELDS else int(v))  # type: ignore[arg-type]
        return cls(*vals)

    def _replace_ints(self, values: Mapping[str, int]) -> Self:
        return type(self)(*(values.get(f, getattr(self, f)) for f in self.fields()))

    @property
    def types(self) -> tuple[str, str]:
        """The key's two ggml type names, whatever the op calls them (src0/src1, k/v)."""
        return (getattr(self, self.TYPE_FIELDS[0]), getattr(self, self.TYPE_FIELDS[1]))

    def with_type0(self, name: str) -> Self:
        """The same key with another first type (a weight's type for MUL_MAT)."""
        return type(self)(*(name if f == self.TYPE_FIELDS[0] else getattr(self, f) for f in self.fields()))

    def group(self) -> Self:
        """The per-type default key this shape falls under (itself when the op has no defaults)."""
        return self._replace_ints({f: 0 for f in self.DEFAULT_FIELDS})

    @property
    def is_default(self) -> bool:
        return bool(self.DEFAULT_FIELDS) and all(getattr(self, f) == 0 for f in self.DEFAULT_FIELDS)

    def slots(self) -> tuple[int, ...]:
        """(type0 id, type1 id, k[0..KEY_SLOTS-1]) as the C table holds them."""
        ks = [int(getattr(self, f)) for f in self.INT_FIELDS]
        return (
            GGML_TYPES[self.types[0]].id,
            GGML_TYPES[self.types[1]].id,
            *ks,
            *([0] * (KEY_SLOTS - len(ks))),
        )

    def codes(self) -> tuple[int, ...]:
        """Sort order shared with the C rules array: (op, layout, type0, type1, k...)."""
        return (OP_CODES[Op(self.op)], LAYOUT_CODES[Layout(self.layout)], *self.slots())

    def label(self) -> str:
        """For people: ``MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1`` (``N=* K=*`` for a default)."""
        t0, t1 = self.types
        parts = [
            f"{f}=*" if self.is_default and f in self.DEFAULT_FIELDS else f"{f}={getattr(self, f)}"
            for f in self.INT_FIELDS
        ]
        return f"{self.op} {self.layout} {t0}x{t1} " + " ".join(parts)

    def id(self) -> str:
        """For case ids and journals: ``MUL_MAT:weight:q4_K:f32:N4096:K4096:B1``."""
        t0, t1 = self.types
        return ":".join([self.op, self.layout, t0, t1, *(f"{f}{getattr(self, f)}" for f in self.INT_FIELDS)])

    def seed_text(self) -> str:
        """The key's part of a deterministic per-point seed: its fields joined by '|'."""
        return "|".join(str(getattr(self, f)) for f in self.fields())

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.fields()}


@dataclass(frozen=True, order=True)
class ShapeKey(_Key):
    """MUL_MAT: (op, layout, src0_type, src1_type, N, K, B); in a table N = K = 0 is a per-type default."""

    OP: ClassVar[Op] = Op.MUL_MAT
    TYPE_FIELDS: ClassVar[tuple[str, str]] = ("src0_type", "src1_type")
    INT_FIELDS: ClassVar[tuple[str, ...]] = ("N", "K", "B")
    DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = ("N", "K")

    op: str
    layout: str
    src0_type: str
    src1_type: str
    N: int
    K: int
    B: int


@dataclass(frozen=True, order=True)
class MulMatIdKey(_Key):
    """MUL_MAT_ID: types, N, K, E experts, U used per token and a routing bucket (0 = any routing)."""

    OP: ClassVar[Op] = Op.MUL_MAT_ID
    TYPE_FIELDS: ClassVar[tuple[str, str]] = ("src0_type", "src1_type")
    INT_FIELDS: ClassVar[tuple[str, ...]] = ("N", "K", "E", "U", "routing")
    DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = ("N", "K")
    OPTIONAL_FIELDS: ClassVar[Mapping[str, int]] = {"routing": 0}
    # census rows ingested from a trace with tokens-per-expert statistics (E and U are matmul census
    # columns: 1 on MUL_MAT rows): the bucket most of the key's calls fell in, and means per sampled call
    CENSUS_COLUMNS: ClassVar[tuple[str, ...] | None] = (
        "routing",
        "experts_nonempty",
        "tokens_max",
        "tokens_cv",
    )
    # tuning rows: the harness' routing kind (uniform, skewed, few, trace), the bucket its case measured
    # (null: not measured) and the experts used per token (a gate/up node's n_expert_used, U = 1)
    TUNING_COLUMNS: ClassVar[tuple[str, ...] | None] = ("E", "U", "routing_kind", "routing", "used")
    EXTRA_COLUMNS: ClassVar[Mapping[str, str]] = {
        "experts_nonempty": "float64",
        "tokens_max": "float64",
        "tokens_cv": "float64",
        "routing_kind": "string",
        "used": "int64",
    }

    op: str
    layout: str
    src0_type: str
    src1_type: str
    N: int
    K: int
    E: int
    U: int
    routing: int


@dataclass(frozen=True, order=True)
class FlashAttnKey(_Key):
    """FLASH_ATTN_EXT: K/V types, head dims D_K/D_V, GQA ratio (Q heads / KV heads), KV-length bucket
    (:func:`kv_bucket`). M of its rules is the number of Q columns."""

    OP: ClassVar[Op] = Op.FLASH_ATTN_EXT
    TYPE_FIELDS: ClassVar[tuple[str, str]] = ("k_type", "v_type")
    INT_FIELDS: ClassVar[tuple[str, ...]] = ("D_K", "D_V", "gqa", "kv")

    op: str
    layout: str
    k_type: str
    v_type: str
    D_K: int
    D_V: int
    gqa: int
    kv: int


# The census files an op's rows can be in: the matmul census (``census ingest``, ``census from-gguf``) and
# the attention census (``census attention``).
CENSUS_MATMUL: Final = "matmul"
CENSUS_ATTENTION: Final = "attention"
CENSUS_KINDS: Final = (CENSUS_MATMUL, CENSUS_ATTENTION)


@dataclass(frozen=True)
class OpSpec:
    op: Op
    code: int
    ggml_op: str  # the enum name in ggml.h
    layouts: tuple[Layout, ...]
    key: type[_Key]
    doc: str
    census: str  # the census file its rows are in (CENSUS_KINDS)
    # The tuner module whose ``candidates`` function makes the op's cases from a census; named, not
    # imported (the core imports no stage): ggml_dispatch.tuner.candidates resolves it.
    candidates: str

    @property
    def routes(self) -> tuple[Route, ...]:
        """The table routes its nodes may run, by code."""
        return tuple(r for r, s in sorted(ROUTES.items(), key=lambda kv: kv[1].code) if self.op in s.ops)

    @property
    def default_mask(self) -> int:
        """Bit i set: key slot k[i] is 0 in this op's per-type defaults."""
        return sum(1 << self.key.INT_FIELDS.index(f) for f in self.key.DEFAULT_FIELDS)


OPS: Final[dict[Op, OpSpec]] = {
    Op.MUL_MAT: OpSpec(
        Op.MUL_MAT,
        0,
        "GGML_OP_MUL_MAT",
        (Layout.WEIGHT, Layout.ATTENTION),
        ShapeKey,
        "Y = X W (dense matmul)",
        census=CENSUS_MATMUL,
        candidates="ggml_dispatch.tuner.select",
    ),
    Op.MUL_MAT_ID: OpSpec(
        Op.MUL_MAT_ID,
        1,
        "GGML_OP_MUL_MAT_ID",
        (Layout.EXPERT,),
        MulMatIdKey,
        "expert matmul (MoE)",
        census=CENSUS_MATMUL,
        candidates="ggml_dispatch.tuner.mul_mat_id",
    ),
    Op.FLASH_ATTN_EXT: OpSpec(
        Op.FLASH_ATTN_EXT,
        2,
        "GGML_OP_FLASH_ATTN_EXT",
        (Layout.ATTENTION,),
        FlashAttnKey,
        "FlashAttention",
        census=CENSUS_ATTENTION,
        candidates="ggml_dispatch.tuner.attention",
    ),
}
OP_CODES: Final[dict[Op, int]] = {o: s.code for o, s in OPS.items()}

# The order the ops' own columns follow one another in a file that holds rows of several ops
# (:func:`op_columns`): the order they joined its format (FLASH_ATTN_EXT's tuning columns came before
# MUL_MAT_ID's); a new op's go last.
COLUMN_ORDER: Final[tuple[Op, ...]] = (Op.MUL_MAT, Op.FLASH_ATTN_EXT, Op.MUL_MAT_ID)

for _spec in OPS.values():
    assert _spec.key.OP is _spec.op and len(_spec.key.INT_FIELDS) <= KEY_SLOTS
    assert [f.name for f in dataclasses.fields(_spec.key)] == list(_spec.key.fields())  # type: ignore[arg-type]
    assert _spec.census in CENSUS_KINDS, _spec
assert sorted(COLUMN_ORDER) == sorted(OPS)


def op_spec(op: Op | str) -> OpSpec:
    return OPS[Op(op)]


def key_class(op: Op | str) -> type[_Key]:
    return OPS[Op(op)].key


def census_ops(census: str) -> tuple[Op, ...]:
    """The ops whose rows a census file of kind ``census`` (CENSUS_KINDS) holds, by code."""
    return tuple(o for o, s in sorted(OPS.items(), key=lambda kv: kv[1].code) if s.census == census)


def op_columns(file: str, shared: Mapping[str, str], ops: Iterable[Op] | None = None) -> dict[str, str]:
    """The columns the ``ops`` (every op: None) add to a ``file`` ("census" or "tuning") whose every row
    has the ``shared`` columns: each op's own columns (its key class' ``CENSUS_COLUMNS`` or
    ``TUNING_COLUMNS``; by default the key fields ``shared`` lacks) in COLUMN_ORDER, a column two ops
    share once, with their types (name -> ``schema`` type name). ValueError where an op's rows would lack
    a key field, or two ops type one column differently."""
    if file not in ("census", "tuning"):
        raise ValueError(f"file must be census or tuning, got {file!r}")
    wanted = set(OPS if ops is None else ops)
    out: dict[str, str] = {}
    for op in (o for o in COLUMN_ORDER if o in wanted):
        key = OPS[op].key
        types = {**key.column_types(), **key.EXTRA_COLUMNS}
        declared = key.CENSUS_COLUMNS if file == "census" else key.TUNING_COLUMNS
        names = declared if declared is not None else tuple(f for f in key.fields() if f not in shared)
        lacking = [f for f in key.fields() if f not in shared and f not in names]
        if lacking:
            raise ValueError(f"{op} {file} rows lack its key field(s) {', '.join(lacking)}")
        for name in (*(f for f in key.fields() if f in shared), *names):
            kind = types.get(name, shared.get(name))
            if kind is None:
                raise ValueError(f"{op} {file} column {name!r} has no type ({key.__name__}.EXTRA_COLUMNS)")
            other = shared.get(name, out.get(name, kind))
            if other != kind:
                raise ValueError(f"{op} {file} column {name!r} is {kind} here, {other} elsewhere")
            if name not in shared:
                out[name] = kind
    return out


def shape_key(row: Mapping[str, Any]) -> Any:
    """The shape key of a row (or rule) of any op, by its ``op`` field."""
    return key_class(str(row["op"])).of(row)


def route_allowed(op: Op | str, config: Config | str) -> bool:
    """May nodes of ``op`` run this configuration: its route, and each parameter it sets?"""
    c = config if isinstance(config, Config) else Config.parse(config)
    spec = ROUTES[c.route]
    if Op(op) not in spec.ops:
        return False
    params = (spec.param(name) for name, _ in c.params)
    return all(p is None or not p.ops or Op(op) in p.ops for p in params)


# --------------------------------------------------------------------------------------------
# MUL_MAT_ID routing buckets (a MulMatIdKey's ``routing``), as
# ggml_dispatch/hook/native/ggml-dispatch-moe-stats.h
# computes them per call from the tokens each expert got. Coverage = non-empty experts / min(E, picks),
# picks = (token, slot) pairs.

ROUTING_ANY: Final = 0
ROUTING_BUCKETS: Final[dict[int, str]] = {
    1: "spread",  # coverage >= 1/2 and CV <= 1
    2: "skewed",  # neither
    3: "concentrated",  # coverage < 1/8
}


def routing_bucket(picks: int, nonempty: int, cv: float, n_experts: int) -> int:
    """The routing bucket of one MUL_MAT_ID call (the C rule, ggml_dispatch_routing_bucket)."""
    if picks <= 0 or nonempty <= 0:
        return 3
    reach = min(picks, n_experts)
    if 2 * nonempty >= reach and cv <= 1.0:
        return 1
    if 8 * nonempty < reach:
        return 3
    return 2


def attainable_buckets(M: int, used: int, n_experts: int) -> frozenset[int]:
    """The routing buckets a call of M tokens, each routed to ``used`` distinct experts of E, can fall in
    (a superset: a bucket left out cannot occur).

    Non-empty experts n range from ``used`` (every token on the same experts) to reach = min(M * used, E);
    an expert gets at most M tokens, so the CV over the non-empty experts (counts in [1, M]) is at most
    (M - 1) / (2 sqrt M) (Bhatia-Davis), above 1 only from M = 6. Hence concentrated (8 n < reach) needs
    8 * used < reach, skewed needs 2 * used < reach or M >= 6, and spread is always attainable.
    """
    if M <= 0 or used <= 0 or n_experts <= 0:
        return frozenset(ROUTING_BUCKETS)
    reach = min(M * used, n_experts)
    out = {1}
    if 2 * used < reach or M >= 6:
        out.add(2)
    if 8 * used < reach:
        out.add(3)
    return frozenset(out)


def runtime_key(key: Any) -> Any:
    """The key the runtime looks a shape up with: a MUL_MAT_ID key at routing 0 (a call's bucket is not
    known without a host sync), any other key as it is."""
    if isinstance(key, MulMatIdKey) and key.routing != ROUTING_ANY:
        return key._replace_ints({"routing": ROUTING_ANY})
    return key


@dataclass(frozen=True)
class MoeCall:
    """Tokens-per-expert statistics of one MUL_MAT_ID call (ggml_dispatch_moe_stats)."""

    picks: int
    nonempty: int
    max: int
    mean: float  # tokens per non-empty expert
    cv: float  # population coefficient of variation over the non-empty experts
    routing: int


def moe_call_stats(counts: Any) -> MoeCall:
    """The statistics of a call from its per-expert token counts (any sequence of E integers)."""
    nz = [int(n) for n in counts if int(n) > 0]
    picks = sum(nz)
    mean = picks / len(nz) if nz else 0.0
    var = sum(n * n for n in nz) / len(nz) - mean * mean if nz else 0.0
    cv = var**0.5 / mean if nz and var > 0 else 0.0
    bucket = routing_bucket(picks, len(nz), cv, len(counts))
    return MoeCall(picks, len(nz), max(nz, default=0), mean, cv, bucket)
