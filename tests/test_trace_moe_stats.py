"""MUL_MAT_ID tokens-per-expert statistics: the C rule (ggml_dispatch/hook/native/ggml-dispatch-moe-stats.h,
compiled
with g++ by tests/native/moe_driver.cpp) against the registry's Python rule, the trace member the
recorder writes through its extra-members hook, and the trace reader adding records up."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import H200_DEVICE, TraceBuilder

from ggml_dispatch import codes, registry
from ggml_dispatch.census import aggregate, trace
from ggml_dispatch.errors import InputError
from ggml_dispatch.hook.install import NATIVE_DIR

DRIVER = Path(__file__).parent / "native" / "moe_driver.cpp"
CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) on PATH")


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("moe") / "moe_driver"
    generated = codes.write_codes_header(exe.parent / "generated").parent
    cmd = [str(CXX), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{NATIVE_DIR}", f"-I{generated}"]
    subprocess.run([*cmd, str(DRIVER), "-o", str(exe)], check=True)
    return exe


def _calls() -> list[list[int]]:
    """Per-expert token counts of calls from uniform top-k, skewed and concentrated routing."""
    rng = random.Random(14)
    out: list[list[int]] = []
    for E, U, M in ((128, 8, 1), (128, 8, 16), (128, 8, 512), (64, 4, 3), (8, 2, 5)):
        for kind in ("uniform", "skewed", "few"):
            counts = [0] * E
            for _ in range(M):
                if kind == "uniform":
                    picks = rng.sample(range(E), U)
                elif kind == "skewed":
                    w = [1.0 / (e + 1) ** 1.5 for e in range(E)]
                    picks = list(dict.fromkeys(rng.choices(range(E), weights=w, k=4 * U)))[:U]
                else:
                    picks = list(range(min(U, E)))
                for e in picks:
                    counts[e] += 1
            out.append(counts)
    out.append([0] * 16)  # a call whose ids are all out of range
    return out


@needs_cxx
def test_c_and_python_agree_on_every_statistic(driver: Path, tmp_path: Path) -> None:
    calls = _calls()
    stdin = "".join(f"{len(c)} {' '.join(map(str, c))}\n" for c in calls)
    out = str(tmp_path / "t.jsonl")
    res = subprocess.run([str(driver), out], input=stdin, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(got) == len(calls)
    buckets = set()
    for c, g in zip(calls, got, strict=True):
        want = registry.moe_call_stats(c)
        assert (g["picks"], g["nonempty"], g["max"], g["routing"]) == (
            want.picks,
            want.nonempty,
            want.max,
            want.routing,
        )
        assert g["mean"] == pytest.approx(want.mean, rel=1e-12)
        assert g["cv"] == pytest.approx(want.cv, rel=1e-9, abs=1e-12)
        buckets.add(want.routing)
    assert buckets == {1, 2, 3}  # the cases reach every bucket


def test_bucket_rule() -> None:
    # uniform top-8 of 128 at 512 tokens: every expert busy, low spread
    assert registry.routing_bucket(4096, 128, 0.18, 128) == 1
    # decode: 8 picks on 8 experts
    assert registry.routing_bucket(8, 8, 0.0, 128) == 1
    # 512 tokens all on the same 8 experts
    assert registry.routing_bucket(4096, 8, 0.0, 128) == 3
    # half the experts, very uneven
    assert registry.routing_bucket(4096, 64, 2.0, 128) == 2
    assert registry.routing_bucket(0, 0, 0.0, 128) == 3


@needs_cxx
def test_trace_records_of_a_key_add_up_in_the_reader(driver: Path, tmp_path: Path) -> None:
    calls = [c for c in _calls() if len(c) == 8]
    assert len(calls) == 3
    path = tmp_path / "t.jsonl"
    stdin = "".join(f"8 {' '.join(map(str, c))}\n" for c in calls)
    subprocess.run([str(driver), str(path)], input=stdin, check=True, capture_output=True, text=True)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    routes = [r for r in records if r["kind"] == "route"]
    assert [r["experts"]["sampled"] for r in routes] == [2, 1]  # two flushes
    agg = aggregate.Aggregator()
    trace.read_trace(path, agg.sink)
    (tally,) = agg.tallies.values()
    assert tally.calls == 3 and tally.experts is not None
    stats = [registry.moe_call_stats(c) for c in calls]
    ex = tally.experts
    assert ex.sampled == 3
    assert ex.means()["nonempty"] == pytest.approx(sum(s.nonempty for s in stats) / 3, rel=1e-5)
    assert ex.means()["max"] == pytest.approx(sum(s.max for s in stats) / 3, rel=1e-5)
    assert ex.means()["cv"] == pytest.approx(sum(s.cv for s in stats) / 3, rel=1e-5)
    assert ex.max_max == max(s.max for s in stats)
    want = [sum(1 for s in stats if s.routing == b) for b in (1, 2, 3)]
    assert ex.routing == want
    assert ex.bucket() == max((1, 2, 3), key=lambda b: (want[b - 1], b))


def _write(tb: TraceBuilder, records: list[dict[str, object]]) -> Path:
    return tb.write("t.jsonl", [tb.header(devices=[H200_DEVICE]), *records, tb.footer()])


def _moe_record(experts: object, op: str = "MUL_MAT_ID") -> dict[str, object]:
    return {
        "kind": "route",
        "op": op,
        "device": 0,
        "tensor": "blk.0.ffn_gate_exps.weight",
        "src0_type": "q4_K",
        "src1_type": "f32",
        "src0_ne": [2048, 768, 128, 1],
        "src0_nb": [144, 1152, 884736, 113246208],
        "src1_ne": [2048, 1, 512, 1],
        "layout": "expert",
        "fused": None,
        "route": "mmq",
        "stock_route": "mmq",
        "reason": "stock",
        "experts": experts,
        "count": 4,
    }


GOOD = {
    "sampled": 4,
    "picks": 4096,
    "nonempty": 128,
    "max": 50,
    "max_max": 61,
    "mean": 32,
    "cv": 0.2,
    "routing": [4, 0, 0],
}


def test_identical_records_with_experts_all_count(make_trace: TraceBuilder) -> None:
    path = _write(make_trace, [_moe_record(GOOD)] * 3)
    agg = aggregate.Aggregator()
    trace.read_trace(path, agg.sink)
    (tally,) = agg.tallies.values()
    assert tally.calls == 12 and tally.experts is not None and tally.experts.sampled == 12
    assert tally.experts.routing == [12, 0, 0] and tally.experts.bucket() == 1


@pytest.mark.parametrize(
    ("experts", "needle"),
    [
        ({**GOOD, "routing": [1, 0, 0]}, "add up to sampled"),
        ({**GOOD, "sampled": 0, "routing": [0, 0, 0]}, "sampled must be a positive"),
        ({**GOOD, "cv": -1}, "cv must not be negative"),
        ({**GOOD, "nonempty": 129}, "more than the 128 experts"),
        ({k: v for k, v in GOOD.items() if k != "max"}, "missing field 'max'"),
        ("x", "'experts' must be an object"),
    ],
)
def test_bad_experts_members_name_the_line(make_trace: TraceBuilder, experts: object, needle: str) -> None:
    path = _write(make_trace, [_moe_record(experts)])
    with pytest.raises(InputError) as e:
        trace.read_trace(path, aggregate.Aggregator().sink)
    assert needle in str(e.value) and ":2:" in e.value.render()


def test_experts_on_a_mul_mat_record_is_refused(make_trace: TraceBuilder) -> None:
    rec = _moe_record(GOOD, op="MUL_MAT")
    rec["src1_ne"] = [2048, 512, 1, 1]
    path = _write(make_trace, [rec])
    with pytest.raises(InputError, match="only MUL_MAT_ID records carry 'experts'"):
        trace.read_trace(path, aggregate.Aggregator().sink)
