"""Convert ``samples/reference/h200-mul-mat-routes.tsv`` into tuning rows (``source = reference``).

The reference file holds one sample per (shape, route) from test-backend-ops ``perf`` with the route
forced at the top of ``ggml_cuda_mul_mat``. It has no trials, no stock anchor and no numerical check, so
the converter declares what it assumes and writes those assumptions into the rows and the metadata:

* test-backend-ops ``m, n, k`` is converted at this border: N = m, M = n, K = k
  (:func:`ggml_dispatch.schema.from_test_backend_ops`).
* MUL_MAT, weight layout (contiguous src0, B = 1), src1 = f32: the test-backend-ops perf cases.
* Stock's route at a point (written into ``anchor_us`` as that route's sample at the same point):
  on cc 900 stock sends quantized weights with mmq support to mmvq for M <= 8 (``MMVQ_MAX_BATCH_SIZE``)
  and to mmq above (``turing_mma_available``). Where that route was not sampled at a point,
  ``anchor_us`` is null and codegen cannot compare candidates there.
* ``route_ran`` is the forced route (the reference build did not verify it), ``nmse`` is null.
* The SM count is not in the file; it is declared by the caller (H200: 132).

Everything here is pure; :mod:`tuner.reference_cli` does the IO.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from ggml_dispatch import schema
from ggml_dispatch.errors import InputError

REFERENCE_HARNESS: Final = "test-backend-ops perf (reference, route forced, one sample)"
MMVQ_MAX_BATCH_SIZE: Final = 8  # ggml-cuda/mmvq.cuh at the pinned tree
MAX_INT: Final = 1 << 62  # dimensions and run counts (as traces bound them); tuning columns are int64

STOCK_ASSUMPTION: Final = (
    "cc 900 stock: quantized src0 with mmq support -> mmvq for M <= 8 (MMVQ_MAX_BATCH_SIZE), mmq above; "
    "anchor_us = the stock route's own sample at the same (shape, M); null where it was not sampled"
)

# Types ggml_cuda_should_use_mmq accepts at the pinned tree (mmq.cu).
_MMQ_TYPES: Final = frozenset(
    {
        "q1_0",
        "q2_0",
        "q4_0",
        "q4_1",
        "q5_0",
        "q5_1",
        "q8_0",
        "q2_K",
        "q3_K",
        "q4_K",
        "q5_K",
        "q6_K",
        "iq1_s",
        "iq2_xxs",
        "iq2_xs",
        "iq2_s",
        "iq3_xxs",
        "iq3_s",
        "iq4_xs",
        "iq4_nl",
        "mxfp4",
        "nvfp4",
    }
)

_COLUMNS: Final = ("type", "m", "n", "k", "route", "runs", "us_per_run")
_HEADER_RE: Final = re.compile(
    r"^#\s*(?P<name>[^(]+?)\s*\(cc (?P<major>\d+)\.(?P<minor>\d+), driver (?P<driver>[^,]+), "
    r"CUDA (?P<cuda>[^)]+)\),\s*llama\.cpp (?P<commit>[0-9a-fA-F]{7,40})\b"
)


@dataclass(frozen=True)
class ReferenceIdentity:
    """What the reference file's first comment says about where it was measured."""

    gpu_name: str
    cc: int
    driver: str
    cuda_version: str
    upstream_commit: str


@dataclass(frozen=True)
class ReferenceSample:
    line: int
    src0_type: str
    M: int
    N: int
    K: int
    route: str
    runs: int
    us: float


def stock_route_assumed(cc: int, src0_type: str, M: int) -> str | None:
    """Stock's route under the converter's declared assumption; None where it does not say."""
    if cc != 900 or src0_type not in _MMQ_TYPES:
        return None
    return schema.Route.MMVQ.value if M <= MMVQ_MAX_BATCH_SIZE else schema.Route.MMQ.value


def expand_commit(commit: str) -> str:
    """Abbreviated commit -> the pinned 40-hex commit when it is a prefix of it, else unchanged."""
    c = commit.lower()
    if schema.PINNED_UPSTREAM_COMMIT.startswith(c):
        return schema.PINNED_UPSTREAM_COMMIT
    return c


def parse_identity(lines: Sequence[str]) -> ReferenceIdentity | None:
    for line in lines:
        if not line.startswith("#"):
            break
        m = _HEADER_RE.match(line)
        if m:
            return ReferenceIdentity(
                gpu_name=m["name"].strip(),
                cc=int(m["major"]) * 100 + int(m["minor"]) * 10,
                driver=m["driver"].strip(),
                cuda_version=m["cuda"].strip(),
                upstream_commit=expand_commit(m["commit"]),
            )
    return None


def parse_samples(text: str, path: str | Path) -> list[ReferenceSample]:
    """Parse the TSV body. Comment lines start with ``#``; the first other line is the column header."""
    samples: list[ReferenceSample] = []
    header: list[str] | None = None
    seen: dict[tuple[str, int, int, int, str], int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = [c.strip() for c in cells]
            missing = [c for c in _COLUMNS if c not in header]
            if missing:
                raise InputError(path, f"column header lacks {', '.join(missing)}", line=lineno)
            continue
        if len(cells) != len(header):
            raise InputError(
                path, f"expected {len(header)} tab-separated cells, got {len(cells)}", line=lineno
            )
        row = dict(zip(header, (c.strip() for c in cells), strict=True))
        src0_type = row["type"]
        if src0_type not in schema.GGML_TYPES:
            raise InputError(path, f"unknown ggml type {src0_type!r}", line=lineno, field="type")
        route = row["route"]
        if route not in {r.value for r in schema.Route}:
            raise InputError(path, f"unknown route {route!r}", line=lineno, field="route")
        ints: dict[str, int] = {}
        for col in ("m", "n", "k", "runs"):
            try:
                ints[col] = int(row[col])
            except ValueError:
                raise InputError(path, f"{row[col]!r} is not an integer", line=lineno, field=col) from None
            if not 0 < ints[col] <= MAX_INT:
                raise InputError(
                    path, f"must be an integer in [1, 2^62], got {row[col]}", line=lineno, field=col
                )
        try:
            us = float(row["us_per_run"])
        except ValueError:
            raise InputError(
                path, f"{row['us_per_run']!r} is not a number", line=lineno, field="us_per_run"
            ) from None
        if not math.isfinite(us) or us <= 0:
            raise InputError(path, f"must be a positive time, got {us}", line=lineno, field="us_per_run")
        M, N, K = schema.from_test_backend_ops(ints["m"], ints["n"], ints["k"])
        key = (src0_type, M, N, K, route)
        if key in seen:
            raise InputError(path, f"duplicate sample (first on line {seen[key]})", line=lineno)
        seen[key] = lineno
        samples.append(ReferenceSample(lineno, src0_type, M, N, K, route, ints["runs"], us))
    if header is None:
        raise InputError(path, "no column header and no rows")
    if not samples:
        raise InputError(path, "no rows")
    return samples


def to_tuning_rows(
    samples: Iterable[ReferenceSample], identity: ReferenceIdentity, sm_count: int
) -> list[dict[str, Any]]:
    """One tuning row per sample: trial 0, ``status = ok``, ``source = reference``."""
    samples = list(samples)
    by_point: dict[tuple[str, int, int, int], dict[str, float]] = {}
    for s in samples:
        by_point.setdefault((s.src0_type, s.M, s.N, s.K), {})[s.route] = s.us
    rows: list[dict[str, Any]] = []
    for s in sorted(samples, key=lambda s: (s.src0_type, s.N, s.K, s.M, s.route)):
        stock = stock_route_assumed(identity.cc, s.src0_type, s.M)
        anchor = by_point[(s.src0_type, s.M, s.N, s.K)].get(stock) if stock else None
        rows.append(
            {
                "gpu_name": identity.gpu_name,
                "gpu_uuid": None,
                "gpu_cc": identity.cc,
                "gpu_sm_count": sm_count,
                "driver": identity.driver,
                "cuda_version": identity.cuda_version,
                "cublas_version": None,
                "upstream_commit": identity.upstream_commit,
                "patch_hash": None,
                "harness_version": REFERENCE_HARNESS,
                "op": schema.Op.MUL_MAT.value,
                "layout": schema.Layout.WEIGHT.value,
                "src0_type": s.src0_type,
                "src1_type": "f32",
                "M": s.M,
                "N": s.N,
                "K": s.K,
                "B": 1,
                "route": s.route,
                "trial": 0,
                "us": s.us,
                "replays": s.runs,
                "weight_copies": 1,
                "anchor_us": anchor,
                "nmse": None,
                "route_ran": s.route,
                "status": schema.TrialStatus.OK.value,
                "source": schema.Source.REFERENCE.value,
            }
        )
    return rows


_ARROW_TYPES: Final = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}


def tuning_arrow_schema() -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in schema.TUNING_COLUMNS.items()])


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=tuning_arrow_schema())
