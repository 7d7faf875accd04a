"""Census rows of MUL_MAT_ID from a trace with tokens-per-expert statistics: the routing bucket is part
of the row's key, the statistics are calls-weighted means, est_us reads only the experts that got
tokens, and a census without such rows keeps exactly the required columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import H200_DEVICE, TraceBuilder

from ggml_dispatch import registry, schema
from ggml_dispatch.census import build, estimate
from ggml_dispatch.cli import main

E, N, K = 128, 768, 2048
NB = [144, 1152, 1152 * N, 1152 * N * E]


def _record(tb: TraceBuilder, M: int, count: int, experts: dict[str, Any] | None) -> dict[str, Any]:
    over: dict[str, Any] = {
        "op": "MUL_MAT_ID",
        "tensor": "blk.0.ffn_up_exps.weight",
        "src0_type": "q4_K",
        "src0_ne": [K, N, E, 1],
        "src0_nb": NB,
        "src1_ne": [K, 1, M, 1],
        "layout": "expert",
        "route": "mmq",
        "stock_route": "mmq",
        "count": count,
    }
    if experts is not None:
        over["experts"] = experts
    return tb.route(**over)


def _experts(sampled: int, nonempty: float, mx: float, cv: float, routing: list[int]) -> dict[str, Any]:
    return {
        "sampled": sampled,
        "picks": 4096,
        "nonempty": nonempty,
        "max": mx,
        "max_max": mx + 3,
        "mean": 4096 / nonempty,
        "cv": cv,
        "routing": routing,
    }


def _ingest(tb: TraceBuilder, records: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    path = tb.write("t.jsonl", [tb.header(devices=[H200_DEVICE]), *records, tb.footer()])
    out = tmp_path / "census.parquet"
    res = CliRunner().invoke(main, ["census", "ingest", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    table = build.read(out)[0]
    return [r for r in table.to_pylist() if r["op"] == "MUL_MAT_ID"]


def test_rows_carry_the_bucket_and_weighted_statistics(make_trace: TraceBuilder, tmp_path: Path) -> None:
    recs = [
        # M = 512 spread, in two records (two flushes) whose means differ: weighted by sampled calls
        _record(make_trace, 512, 3, _experts(3, 128, 50, 0.2, [3, 0, 0])),
        _record(make_trace, 512, 1, _experts(1, 120, 70, 0.6, [1, 0, 0])),
        # the same M, but the key's calls concentrated: its own row (another tensor name keeps the
        # keys apart in the trace; the census key is the tensor and the bucket)
        {
            **_record(make_trace, 512, 2, _experts(2, 8, 512, 0.0, [0, 0, 2])),
            "tensor": "blk.1.ffn_up_exps.weight",
        },
    ]
    rows = _ingest(make_trace, recs, tmp_path)
    by = {(r["tensor"], r["routing"]): r for r in rows}
    spread = by[("blk.0.ffn_up_exps.weight", 1)]
    few = by[("blk.1.ffn_up_exps.weight", 3)]
    assert spread["calls"] == 4 and spread["E"] == E and spread["U"] == 1 and spread["M"] == 512
    assert spread["experts_nonempty"] == pytest.approx((3 * 128 + 120) / 4)
    assert spread["tokens_max"] == pytest.approx((3 * 50 + 70) / 4)
    assert spread["tokens_cv"] == pytest.approx((3 * 0.2 + 0.6) / 4)
    # est_us reads the weights of the experts that got tokens only: 8 experts cost less than 126
    spec = estimate.spec_for(schema.GpuId(H200_DEVICE["name"], H200_DEVICE["cc"], H200_DEVICE["sm_count"]))

    def per_call(touched: float | None) -> float:
        w = estimate.work_of("MUL_MAT_ID", "q4_K", "f32", (K, N, E, 1), (K, 1, 512, 1), 0, touched)
        return estimate.per_call_us(spec, w)

    assert few["est_us"] == pytest.approx(2 * per_call(8))
    assert spread["est_us"] == pytest.approx(4 * per_call((3 * 128 + 120) / 4))
    assert per_call(8) < per_call(None)
    assert registry.MulMatIdKey.of({**few, "routing": few["routing"]}).routing == 3


def test_a_trace_without_statistics_keeps_the_required_columns(
    make_trace: TraceBuilder, tmp_path: Path
) -> None:
    rows = _ingest(make_trace, [_record(make_trace, 512, 2, None)], tmp_path)
    assert [r["routing"] for r in rows] == [None]  # the reader fills the optional columns
    assert pq.ParquetFile(tmp_path / "census.parquet").schema_arrow.names == list(schema.CENSUS_COLUMNS)
    # the bound min(E, M * U) when nothing says which experts got tokens
    spec = estimate.spec_for(schema.GpuId(H200_DEVICE["name"], H200_DEVICE["cc"], H200_DEVICE["sm_count"]))
    w = estimate.work_of("MUL_MAT_ID", "q4_K", "f32", (K, N, E, 1), (K, 1, 512, 1))
    assert rows[0]["est_us"] == pytest.approx(2 * estimate.per_call_us(spec, w))
