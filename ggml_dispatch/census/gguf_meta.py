"""Tensor table of a GGUF model file, read with the ``gguf`` package.

Only metadata is used (names, ggml types, shapes, a few architecture keys); weights are never read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggml_dispatch import schema
from ggml_dispatch.census import roles
from ggml_dispatch.errors import InputError


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type_name: str  # ggml spelling, as in a trace: "q4_1", "q4_K", "f16"
    ne: tuple[int, int, int, int]  # ggml ne, padded with 1s
    n_dims: int
    n_bytes: int


@dataclass(frozen=True)
class GgufModel:
    path: str
    architecture: str
    tensors: dict[str, GgufTensor]
    expert_count: int = 0
    expert_used_count: int = 0
    block_count: int = 0
    head_count: int = 0
    head_count_kv: int = 0
    embedding_length: int = 0
    key_length: int = 0  # head size of K (0: embedding_length / head_count)
    value_length: int = 0
    nextn_layers: int = 0  # MTP (next-token prediction) blocks after the trunk's, <arch>.nextn_predict_layers

    def mtp_problem(self) -> str | None:
        """Why this model cannot draft with its own MTP head (llama-server --spec-type draft-mtp), or None."""
        if self.nextn_layers <= 0:
            return f"no MTP block ({self.architecture or 'the model'}.nextn_predict_layers is 0 or absent)"
        if not any(".nextn." in name for name in self.tensors):
            return f"declares {self.nextn_layers} MTP block(s) but has no blk.N.nextn.* tensor"
        return None

    @property
    def tied_embeddings(self) -> bool:
        """No ``output.weight``: the LM head multiplies by ``token_embd.weight``."""
        return roles.LM_HEAD_TENSOR not in self.tensors and roles.TOKEN_EMBD_TENSOR in self.tensors

    @property
    def lm_head(self) -> GgufTensor | None:
        name = roles.TOKEN_EMBD_TENSOR if self.tied_embeddings else roles.LM_HEAD_TENSOR
        return self.tensors.get(name)

    def matmul_weights(self) -> Iterator[GgufTensor]:
        """Tensors a forward pass multiplies by (block weights and the LM head), in file order."""
        tied = self.tied_embeddings
        for t in self.tensors.values():
            if roles.is_matmul_weight(t.name, t.n_dims, tied):
                yield t


def _scalar(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # a malformed value is treated as absent; shapes are what the census checks
        return None


def read_gguf(path: str | Path) -> GgufModel:
    """Read the tensor table; any unreadable, non-GGUF or truncated file is an :class:`InputError`."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise InputError(p, f"cannot read GGUF file: {e.strerror or e}") from None
    if size == 0:
        raise InputError(p, "empty file, not a GGUF model")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise InputError(p, f"cannot read GGUF file: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise InputError(p, f"not a GGUF file (magic {magic!r}, expected b'GGUF')")

    import gguf  # deferred: importing it costs time the trace-only paths do not need

    try:
        reader = gguf.GGUFReader(p)
    except Exception as e:
        # the gguf reader raises IndexError/ValueError/... on cut-off or corrupt files
        raise InputError(p, f"truncated or corrupt GGUF file ({type(e).__name__}: {e})") from None

    tensors: dict[str, GgufTensor] = {}
    data_end = 0
    for t in reader.tensors:
        name = str(t.name)
        type_id = int(t.tensor_type)
        gt = schema.GGML_TYPES_BY_ID.get(type_id)
        if gt is None:
            raise InputError(p, f"unknown ggml type id {type_id}", field=f"tensor {name!r}")
        dims = [int(x) for x in t.shape]
        if not 1 <= len(dims) <= 4 or any(d <= 0 for d in dims):
            raise InputError(p, f"bad shape {dims}", field=f"tensor {name!r}")
        if name in tensors:
            raise InputError(p, "tensor name appears twice", field=f"tensor {name!r}")
        ne = [*dims, 1, 1, 1][:4]
        tensors[name] = GgufTensor(name, gt.name, (ne[0], ne[1], ne[2], ne[3]), len(dims), int(t.n_bytes))
        data_end = max(data_end, int(t.data_offset) + int(t.n_bytes))
    if data_end > size:
        raise InputError(p, f"truncated GGUF file: tensor data ends at byte {data_end}, the file has {size}")

    arch_raw = _scalar(reader, "general.architecture")
    arch = arch_raw if isinstance(arch_raw, str) else ""

    def arch_int(suffix: str) -> int:
        v = _scalar(reader, f"{arch}.{suffix}")
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0

    return GgufModel(
        path=str(p),
        architecture=arch,
        tensors=tensors,
        expert_count=arch_int("expert_count"),
        expert_used_count=arch_int("expert_used_count"),
        block_count=arch_int("block_count"),
        head_count=arch_int("attention.head_count"),
        head_count_kv=arch_int("attention.head_count_kv"),
        embedding_length=arch_int("embedding_length"),
        key_length=arch_int("attention.key_length"),
        value_length=arch_int("attention.value_length"),
        nextn_layers=arch_int("nextn_predict_layers"),
    )
