"""Census rows: trace keys (or a declared workload) -> one row per distinct key, with role and est_us."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ggml_dispatch import options, schema
from ggml_dispatch.census import estimate, roles
from ggml_dispatch.census.gguf_meta import GgufModel, GgufTensor
from ggml_dispatch.census.trace import RouteKey, Tally
from ggml_dispatch.errors import InputError

Row = MutableMapping[str, Any]

EST_ROOFLINE = "roofline"
EST_MEASURED = "measured"

# Every census column a row holds: the required ones, then the optional MUL_MAT_ID statistics.
ROW_COLUMNS: Final[tuple[str, ...]] = (*schema.CENSUS_COLUMNS, *schema.CENSUS_OPTIONAL_COLUMNS)
# MUL_MAT_ID statistics that merged rows average (weighted by calls) instead of keying on
_MEANS: Final = ("experts_nonempty", "tokens_max", "tokens_cv")
# Census columns that identify a row; calls / est_us / est_kind are summed or derived.
KEY_COLUMNS: tuple[str, ...] = tuple(
    c for c in ROW_COLUMNS if c not in ("calls", "est_us", "est_kind", *_MEANS)
)
_COLUMN: Final[dict[str, int]] = {c: i for i, c in enumerate(ROW_COLUMNS)}
_KEY_INDEX: Final = tuple(_COLUMN[c] for c in KEY_COLUMNS)
_CALLS, _EST_US, _EST_KIND = (_COLUMN[c] for c in ("calls", "est_us", "est_kind"))
_MEAN_INDEX: Final = tuple(_COLUMN[c] for c in _MEANS)


class CensusRow(MutableMapping[str, Any]):
    """One census row read and written by column name like a dict, its values kept in one list in
    :data:`ROW_COLUMNS` order: about a quarter of a 25-key dict's memory (a trace can have
    millions of distinct keys). Columns cannot be added or removed."""

    __slots__ = ("cells",)

    def __init__(self, cells: list[Any]) -> None:
        assert len(cells) == len(_COLUMN)
        self.cells = cells

    def __getitem__(self, column: str) -> Any:
        return self.cells[_COLUMN[column]]

    def __setitem__(self, column: str, value: Any) -> None:
        self.cells[_COLUMN[column]] = value

    def __delitem__(self, column: str) -> None:
        raise TypeError("a census row has every census column")

    def __iter__(self) -> Iterator[str]:
        return iter(_COLUMN)

    def __len__(self) -> int:
        return len(_COLUMN)

    def key(self) -> tuple[Any, ...]:
        c = self.cells
        return tuple(c[i] for i in _KEY_INDEX)

    def __repr__(self) -> str:
        return f"CensusRow({dict(self)!r})"


class Aggregator:
    """Tallies per trace key, across files: identical keys add up, different GPUs stay apart.

    A key's strings and dimension tuples are shared with every other key that has the same value (one
    copy of "MUL_MAT", of a GPU identity, of src0_ne (4096, 14336, 1, 1), ...), so a key costs its
    own tensor name, its tally and two dict entries.
    """

    def __init__(self) -> None:
        self.tallies: dict[RouteKey, Tally] = {}
        self._pool: dict[Any, Any] = {}

    def shared(self, value: Any) -> Any:
        """The one stored copy of ``value`` (``value`` itself the first time)."""
        return self._pool.setdefault(value, value)

    def sink(self, key: RouteKey, path: str, line: int) -> Tally:
        t = self.tallies.get(key)
        if t is None:
            t = self.tallies[self._canonical(key)] = Tally(path, line)
        return t

    def _canonical(self, key: RouteKey) -> RouteKey:
        p = self.shared
        return RouteKey(
            gpu=p(key.gpu),
            op=p(key.op),
            tensor=key.tensor,  # mostly distinct: a pool entry would cost more than it saves
            src0_type=p(key.src0_type),
            src1_type=p(key.src1_type),
            src0_ne=p(key.src0_ne),
            src0_nb=p(key.src0_nb),
            src1_ne=p(key.src1_ne),
            layout=p(key.layout),
            fused=p(key.fused),
            route=p(key.route),
            stock_route=p(key.stock_route),
            reason=p(key.reason),
            config=p(key.config),
            attn=p(key.attn),
        )


@dataclass
class JoinReport:
    """What joining the trace with GGUF files found (for the ingest summary and the metadata)."""

    unseen: dict[str, list[str]] = field(default_factory=dict)  # gguf path -> weight tensors not traced
    not_in_gguf: list[str] = field(default_factory=list)  # traced weight tensors no GGUF has
    layout_disagrees: list[str] = field(default_factory=list)  # keys whose trace layout != shape's class
    specs: dict[schema.GpuId, estimate.GpuSpec] = field(default_factory=dict)
    attention_calls: int = 0  # FLASH_ATTN_EXT calls (not matmul rows: `census attention`)


def _aligned(nb: Sequence[int]) -> bool:
    return all(x % 16 == 0 for x in nb[1:4])


def _spec(gpu: schema.GpuId, specs: dict[schema.GpuId, estimate.GpuSpec]) -> estimate.GpuSpec:
    s = specs.get(gpu)
    if s is None:
        s = specs[gpu] = estimate.spec_for(gpu)
    return s


def _find_tensor(
    key: RouteKey, tally: Tally, models: Sequence[GgufModel]
) -> tuple[GgufModel | None, GgufTensor | None]:
    """The GGUF tensor a weight/expert key multiplies by; an error if the name exists but disagrees."""
    candidates = [(m, m.tensors[key.tensor]) for m in models if key.tensor in m.tensors]
    if not candidates:
        return None, None
    for m, t in candidates:
        if t.type_name == key.src0_type and t.ne == key.src0_ne:
            return m, t
    m, t = candidates[0]
    raise InputError(
        m.path,
        f"GGUF has {t.type_name} {list(t.ne)}, but {tally.path}:{tally.line} multiplies by it as "
        f"{key.src0_type} {list(key.src0_ne)}: this trace is not from this model",
        field=f"tensor {key.tensor!r}",
    )


def trace_rows(
    tallies: dict[RouteKey, Tally], models: Sequence[GgufModel] = (), *, consume: bool = False
) -> tuple[list[Row], JoinReport]:
    """One census row per distinct census key (keys that differ only in what the census does not keep
    add up). ``consume=True`` empties ``tallies`` on the way, so a key's tally is freed as soon as its
    row exists (the peak memory of a large trace)."""
    report = JoinReport()
    rows: list[Row] = []
    # merge by the hash of the key columns: a bucket is one row or a list of rows whose keys collide
    buckets: dict[int, CensusRow | list[CensusRow]] = {}
    seen_tensors: set[str] = set()
    not_in_gguf: set[str] = set()
    pool: dict[Any, Any] = {}
    shared = pool.setdefault
    source = schema.Source.TRACE.value
    keys: list[RouteKey | None] = list(tallies)
    for i, key in enumerate(keys):
        assert key is not None
        if consume:
            tally = tallies.pop(key)
            keys[i] = None
        else:
            tally = tallies[key]
        if key.op == schema.Op.FLASH_ATTN_EXT:
            report.attention_calls += tally.calls  # census.attention makes their rows
            continue
        gemm = schema.gemm_of(key.op, key.src0_ne, key.src1_ne)
        t0 = schema.ggml_type(key.src0_type)
        n_used = 0
        if key.layout != schema.Layout.ATTENTION:
            seen_tensors.add(key.tensor)
            if models:
                model, _ = _find_tensor(key, tally, models)
                if model is None:
                    not_in_gguf.add(key.tensor)
                else:
                    n_used = model.expert_used_count
        shape_layout = schema.layout_of(key.op, key.src0_ne, key.src0_nb, key.src0_type, gemm.B)
        if shape_layout != key.layout:
            report.layout_disagrees.append(
                f"{tally.path}:{tally.line}: tensor {key.tensor!r}: trace layout {key.layout!r}, "
                f"the shape's class is {shape_layout.value!r} (kept the trace's)"
            )
        spec = _spec(key.gpu, report.specs)
        ex = tally.experts if key.op == schema.Op.MUL_MAT_ID else None
        means = ex.means() if ex is not None else None
        if tally.timed_calls > 0 and key.route == key.stock_route:
            est = tally.calls * tally.time_us / tally.timed_calls
            kind = EST_MEASURED
        else:
            work = estimate.work_of(
                key.op,
                key.src0_type,
                key.src1_type,
                key.src0_ne,
                key.src1_ne,
                n_used,
                experts_touched=means["nonempty"] if means is not None else None,
            )
            est = tally.calls * estimate.per_call_us(spec, work)
            kind = EST_ROOFLINE
        row = CensusRow(
            [
                key.gpu.name,
                key.gpu.cc,
                key.gpu.sm_count,
                key.op,
                key.layout,
                key.fused,
                key.src0_type,
                key.src1_type,
                shared(gemm.M, gemm.M),
                shared(gemm.N, gemm.N),
                shared(gemm.K, gemm.K),
                shared(gemm.B, gemm.B),
                shared(gemm.E, gemm.E),
                shared(gemm.U, gemm.U),
                schema.is_contiguous(key.src0_ne, key.src0_nb, t0),
                _aligned(key.src0_nb),
                key.tensor,
                shared(r := roles.role_of(key.tensor, key.layout), r),
                key.route,
                key.stock_route,
                key.reason,
                tally.calls,
                est,
                kind,
                source,
                ex.bucket() if ex is not None else None,
                means["nonempty"] if means is not None else None,
                means["max"] if means is not None else None,
                means["cv"] if means is not None else None,
            ]
        )
        if _merge(buckets, row):
            rows.append(row)
    for m in models:
        unseen = [t.name for t in m.matmul_weights() if t.name not in seen_tensors]
        if unseen:
            report.unseen[m.path] = unseen
    report.not_in_gguf = sorted(not_in_gguf)
    return rows, report


def _merge(buckets: dict[int, CensusRow | list[CensusRow]], row: CensusRow) -> bool:
    """Keys that differ only in what the census does not keep (strides, KV size) become one row: add
    ``row`` into the row with its key and return False, or keep it (True) when it is the first."""
    k = row.key()
    h = hash(k)
    have = buckets.get(h)
    if have is None:
        buckets[h] = row
        return True
    for other in have if isinstance(have, list) else (have,):
        if other.key() == k:
            c = other.cells
            for i in _MEAN_INDEX:  # calls-weighted means (a side without statistics adds no weight)
                a, b = c[i], row.cells[i]
                if a is None or b is None:
                    c[i] = a if b is None else b
                elif c[_CALLS] + row.cells[_CALLS] > 0:
                    c[i] = (a * c[_CALLS] + b * row.cells[_CALLS]) / (c[_CALLS] + row.cells[_CALLS])
            c[_CALLS] += row.cells[_CALLS]
            c[_EST_US] += row.cells[_EST_US]
            if c[_EST_KIND] != row.cells[_EST_KIND]:
                c[_EST_KIND] = EST_ROOFLINE  # "measured" only when every part was measured
            return False
    buckets[h] = [*have, row] if isinstance(have, list) else [have, row]
    return True


def parse_m_list(text: str) -> list[int]:
    """``"1,2,4,512"`` -> [1, 2, 4, 512] (sorted, unique, positive, at most ``MAX_TOKENS``); ValueError
    otherwise."""
    out: set[int] = set()
    for part in options.list_items(text):
        try:
            v = int(part)
        except ValueError:
            raise ValueError(f"{part!r} is not an integer") from None
        if v <= 0:
            raise ValueError(f"{v} is not a positive token count")
        if v > options.MAX_TOKENS:
            raise ValueError(f"{v} tokens per pass is more than {options.MAX_TOKENS} (a 32-bit n_ubatch)")
        out.add(v)
    if not out:
        raise ValueError("no M values given")
    return sorted(out)


def _contiguous_nb(t: schema.GgmlType, ne: Sequence[int]) -> tuple[int, int, int, int]:
    nb0 = t.type_size
    nb1 = t.row_bytes(ne[0])
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def _declared_row(
    spec: estimate.GpuSpec,
    op: schema.Op,
    layout: schema.Layout,
    src0_type: str,
    gemm: schema.Gemm,
    *,
    contiguous: bool,
    nb: Sequence[int],
    tensor: str,
    role: str,
    calls: int,
    est_us: float,
) -> Row:
    """A census row of a declared workload (f32 activations, roofline estimate, no route recorded)."""
    return {
        "gpu_name": spec.name,
        "gpu_cc": spec.cc,
        "gpu_sm_count": spec.sm_count,
        "op": op.value,
        "layout": layout.value,
        "fused": None,
        "src0_type": src0_type,
        "src1_type": "f32",
        "M": gemm.M,
        "N": gemm.N,
        "K": gemm.K,
        "B": gemm.B,
        "E": gemm.E,
        "U": gemm.U,
        "src0_contiguous": contiguous,
        "src0_nb_aligned": _aligned(nb),
        "tensor": tensor,
        "role": role,
        "route": None,
        "stock_route": None,
        "reason": None,
        "calls": calls,
        "est_us": est_us,
        "est_kind": EST_ROOFLINE,
        "source": schema.Source.DECLARED.value,
    }


def declared_rows(model: GgufModel, ms: Iterable[int], output_rows: int, spec: estimate.GpuSpec) -> list[Row]:
    """A declared workload: every matmul weight once per forward pass of M tokens, for each M; the LM
    head (``token_embd.weight`` when tied) only at M = ``output_rows``, once per pass."""
    m_list = list(ms)
    head = model.lm_head
    rows: list[Row] = []
    for t in model.matmul_weights():
        role = roles.role_of(t.name, schema.Layout.WEIGHT.value)
        expert = role in roles.EXPERT_ROLES and t.n_dims == 3
        gt = schema.ggml_type(t.type_name)
        per_pass = (
            [(output_rows, len(m_list))]
            if head is not None and t.name == head.name
            else [(m, 1) for m in m_list]
        )
        for M, calls in per_pass:
            if expert:
                op, layout = schema.Op.MUL_MAT_ID, schema.Layout.EXPERT
                # llama.cpp: gate/up take src1 [K, 1, M]; down takes [K, n_used, M]
                u1 = max(model.expert_used_count, 1) if role == "ffn_down_exps" else 1
                src1_ne: tuple[int, int, int, int] = (t.ne[0], u1, M, 1)
            else:
                op, layout = schema.Op.MUL_MAT, schema.Layout.WEIGHT
                src1_ne = (t.ne[0], M, 1, 1)
            gemm = schema.gemm_of(op, t.ne, src1_ne)
            work = estimate.work_of(op, t.type_name, "f32", t.ne, src1_ne, model.expert_used_count)
            rows.append(
                _declared_row(
                    spec,
                    op,
                    layout,
                    t.type_name,
                    gemm,
                    contiguous=True,
                    nb=_contiguous_nb(gt, t.ne),
                    tensor=t.name,
                    role=roles.role_of(t.name, layout.value),
                    calls=calls,
                    est_us=calls * estimate.per_call_us(spec, work),
                )
            )
    return rows


def declared_attention_rows(
    model: GgufModel, ms: Iterable[int], n_kv: int, n_ctx: int, kv_type: str, spec: estimate.GpuSpec
) -> list[Row]:
    """KQ and KQV of every layer at each M over ``n_kv`` cached tokens of an ``n_ctx``-cell cache
    (FlashAttention off), with the views llama.cpp builds: K ``[head_dim, n_kv, n_head_kv]`` against
    Q ``[head_dim, M, n_head]``, transposed V ``[n_kv, head_dim, n_head_kv]`` against KQ
    ``[n_kv, M, n_head]``. The strides (so the contiguity flags) depend on the cache size."""
    if n_ctx < n_kv:
        raise InputError(None, f"the cache ({n_ctx} cells) is smaller than n_kv = {n_kv}", field="--n-ctx")
    heads, kv_heads, layers = model.head_count, model.head_count_kv or model.head_count, model.block_count
    if heads <= 0 or layers <= 0 or heads % kv_heads:
        raise InputError(
            model.path,
            "attention rows need scalar head_count, head_count_kv and block_count in the metadata",
            field=f"{model.architecture}.attention",
        )
    hk = model.key_length or (model.embedding_length // heads if model.embedding_length else 0)
    hv = model.value_length or hk
    if hk <= 0:
        raise InputError(
            model.path, "no head size (key_length or embedding_length)", field=model.architecture
        )
    t = schema.ggml_type(kv_type)
    ts = t.type_size
    rows: list[Row] = []
    for il in range(layers):
        for M in ms:
            views = (
                # name, role, src0_ne, src0_nb (views of a cache of n_ctx cells), src1_ne
                (
                    f"cache_k_l{il} (view) (permuted)",
                    roles.ATTN_KQ,
                    (hk, n_kv, kv_heads, 1),
                    (ts, ts * hk * kv_heads, ts * hk, ts * hk * kv_heads * n_ctx),
                    (hk, M, heads, 1),
                ),
                (
                    f"cache_v_l{il} (view) (permuted)",
                    roles.ATTN_KQV,
                    (n_kv, hv, kv_heads, 1),
                    (ts, ts * n_ctx, ts * n_ctx * hv, ts * n_ctx * hv * kv_heads),
                    (n_kv, M, heads, 1),
                ),
            )
            for name, role, ne, nb, src1_ne in views:
                gemm = schema.gemm_of(schema.Op.MUL_MAT, ne, src1_ne)
                work = estimate.work_of(schema.Op.MUL_MAT, kv_type, "f32", ne, src1_ne)
                rows.append(
                    _declared_row(
                        spec,
                        schema.Op.MUL_MAT,
                        schema.Layout.ATTENTION,
                        kv_type,
                        gemm,
                        contiguous=schema.is_contiguous(ne, nb, t),
                        nb=nb,
                        tensor=name,
                        role=role,
                        calls=1,
                        est_us=estimate.per_call_us(spec, work),
                    )
                )
    return rows


def weight_type_histogram(models: Sequence[GgufModel]) -> list[dict[str, Any]]:
    """Matmul weight tensors of the GGUF files by ggml type: count and bytes, largest first."""
    hist: dict[str, list[int]] = {}
    for m in models:
        for t in m.matmul_weights():
            h = hist.setdefault(t.type_name, [0, 0])
            h[0] += 1
            h[1] += t.n_bytes
    return [
        {"type": k, "tensors": v[0], "bytes": v[1]} for k, v in sorted(hist.items(), key=lambda kv: -kv[1][1])
    ]
