"""lab/ab_first_rep.py, lab/first_use_gaps.py and lab/eval_gaps.py: one-off costs in the first repetition of
an A/B, the GPU idle before kernels' first launches, and each timed evaluation's host and GPU time. The A/B is
a real one of the committed attention table (on the build with the first warm-up); the
timelines are written here in the kernel-timeline format (real ones need a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ggml_dispatch import archive
from ggml_dispatch.artifacts.timeline import parse_ktl
from lab import ab_first_rep, eval_gaps, first_use_gaps

REPO = Path(__file__).resolve().parent.parent
AB = archive.path("evidence/h200-2026-12-01-s8/attn/ab-warmup-v1/ab-llama8b-q8_0-f16.jsonl")


def test_first_repetition_carries_the_committed_ab_losses() -> None:
    pairs = ab_first_rep.pairs([AB])
    assert len(pairs[("llama8b", "pp3 @ d4096")]) == 8
    rows = {
        ln.split(" | ")[1]: ln for ln in ab_first_rep.render(pairs).splitlines() if ln.startswith("| llama8b")
    }
    cells = rows["pp3 @ d4096"].split(" | ")
    mean, first, later = cells[3], cells[4], cells[5]
    assert "**loss**" in mean and "**loss**" in first and "loss" not in later
    assert float(first.split()[0]) < 0.3 < 0.95 < float(later.split()[0])
    assert "gain" in rows["tg32 @ d49152 kv q8_0"].split(" | ")[5]


def test_pairs_need_both_arms_and_two_repetitions(tmp_path: Path) -> None:
    records = [json.loads(ln) for ln in AB.read_text().splitlines()]
    first_pair = [r for r in records if r["pair"] == 1 and r["test"] == "pp3 @ d4096"]
    lines = first_pair[:1] + [r for r in first_pair if r["arm"] != first_pair[0]["arm"]][:1]
    assert {r["arm"] for r in lines} == {"stock", "table"}
    p0 = tmp_path / "pair.jsonl"
    p0.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert len(ab_first_rep.pairs([p0])[("llama8b", "pp3 @ d4096")]) == 1
    one_rep = [dict(r, samples_tps=r["samples_tps"][:1]) for r in lines]
    p = tmp_path / "ab.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in one_rep))
    assert ab_first_rep.pairs([p]) == {}
    res = subprocess.run(
        [sys.executable, str(REPO / "lab" / "ab_first_rep.py"), str(p)], capture_output=True, text=True
    )
    assert res.returncode == 1 and "no stock/table pairs" in res.stderr and "Traceback" not in res.stderr
    p.write_text('{"arm": "table"}\n')
    res = subprocess.run(
        [sys.executable, str(REPO / "lab" / "ab_first_rep.py"), str(p)], capture_output=True, text=True
    )
    assert res.returncode == 1 and "ab.jsonl" in res.stderr and "Traceback" not in res.stderr


def _ktl(records: list[str], closed: bool = True) -> str:
    return (
        "\n".join(
            ["# kernel-timeline/1", "N 0 kernel_a", "N 1 kernel_b", *records, *(["D 0"] if closed else [])]
        )
        + "\n"
    )


def test_gaps_before_first_launches_only(tmp_path: Path) -> None:
    ms = 1_000_000
    text = _ktl(
        [
            f"K {1 * ms} {2 * ms} 7 0 0",  # a, first launch (nothing before it)
            f"K {5 * ms} {6 * ms} 7 0 1",  # b, first launch after 3 ms idle: listed
            f"C {6 * ms} {7 * ms} 13 4096 1",  # a copy keeps the GPU busy
            f"K {7 * ms + ms // 2} {8 * ms} 7 0 1",  # b again after 0.5 ms
            f"K {20 * ms} {21 * ms} 7 0 0",  # a again after 12 ms: not a first launch
        ]
    )
    assert first_use_gaps.first_use_gaps(text, tmp_path / "x.ktl", 1.0) == [(3.0, "kernel_b")]
    assert first_use_gaps.first_use_gaps(text, tmp_path / "x.ktl", 5.0) == []
    f = tmp_path / "stock.tg32.ktl"
    f.write_text(text)
    res = subprocess.run(
        [sys.executable, str(REPO / "lab" / "first_use_gaps.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and "| stock.tg32.ktl | 1 | 3.0 | kernel_b (3.00) |" in res.stdout
    f.write_text(_ktl([f"K {ms} {2 * ms} 7 0 0"], closed=False))
    res = subprocess.run(
        [sys.executable, str(REPO / "lab" / "first_use_gaps.py"), str(f)], capture_output=True, text=True
    )
    assert res.returncode == 1 and "truncated" in res.stderr and "Traceback" not in res.stderr


def test_evaluations_split_at_idle_and_keep_the_test_graph(tmp_path: Path) -> None:
    us = 1_000
    text = _ktl(
        [
            # a depth-fill burst of one kernel: not the test's graph
            f"K {0} {50 * us} 7 0 0",
            # evaluation 1, direct: input copy, 20 us of host, three kernels with 10 us idle between
            f"C {1000 * us} {1002 * us} 13 8 1",
            f"K {1022 * us} {1032 * us} 7 0 0",
            f"K {1042 * us} {1052 * us} 7 0 1",
            f"K {1062 * us} {1072 * us} 7 0 0",
            # evaluation 2, a graph replay: copy, 100 us of host, three back-to-back kernels
            f"C {2000 * us} {2002 * us} 13 8 1",
            f"K {2102 * us} {2112 * us} 7 5 0",
            f"K {2112 * us} {2122 * us} 7 5 1",
            f"K {2122 * us} {2132 * us} 7 5 0",
        ]
    )
    t = parse_ktl(text.splitlines(), tmp_path / "x.ktl")
    assert t.kernel_graphs == (0, 0, 0, 0, 5, 5, 5)
    evs = eval_gaps.evaluations(t, split_us=300, min_kernels=2)
    assert [(e.graph, e.kernels) for e in evs] == [(0, 3), (5, 3)]
    assert (evs[0].span_us, evs[0].busy_us, evs[0].lead_us) == (72.0, 32.0, 20.0)
    assert (evs[1].span_us, evs[1].busy_us, evs[1].lead_us) == (132.0, 32.0, 100.0)
    # a smaller split joins nothing new but cuts evaluation 2 from its copy: no lead then
    assert eval_gaps.evaluations(t, split_us=50, min_kernels=2)[1].lead_us is None
    f = tmp_path / "table.pp2@d16384.ktl"
    f.write_text(text)
    res = subprocess.run(
        [sys.executable, str(REPO / "lab" / "eval_gaps.py"), "--min-kernels", "2", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "| table.pp2@d16384.ktl | 1 | direct | 3 | 72.0 | 32.0 | 40.0 | 20.0 |" in res.stdout
    assert "| table.pp2@d16384.ktl | 2 | graph 5 | 3 | 132.0 | 32.0 | 100.0 | 100.0 |" in res.stdout


def test_chain_bounds_packs_and_stops_at_a_failed_step(tmp_path: Path) -> None:
    step = tmp_path / "step.sh"
    step.write_text(
        'echo "deadline $DEADLINE part $PART"; echo "# $PART" > "$OUT/r.md"; [ "$PART" != bad ]\n'
    )
    out = tmp_path / "out"
    res = subprocess.run(
        ["bash", str(REPO / "lab" / "chain.sh"), f"PART=a {step}", f"PART=bad {step}", f"PART=c {step}"],
        capture_output=True,
        text=True,
        env={"OUT": str(out), "CALL_S": "100", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 1
    assert sorted(p.name for p in out.iterdir()) == ["1-step-a.tar.gz", "2-step-bad.tar.gz", "steps.txt"]
    assert "# a" in res.stdout and "# bad" in res.stdout and "# c" not in res.stdout
    assert "step 2 rc=1" in (out / "steps.txt").read_text()


HOOK_AB = sorted((archive.path("evidence/h200-2026-12-03-s14")).glob("ab-qwen3-seed-f16-hook-call*.jsonl"))


def test_each_repetition_apart_on_the_real_three_arm_ab() -> None:
    # an A/B (stock, the no-table hook, the shadow table; qwen3 f16): every test ran
    # 3 repetitions in 8 pairs (7 in the first call, cut short by its deadline)
    assert len(HOOK_AB) == 2
    reps = ab_first_rep.each_rep(HOOK_AB, "table", "hook")
    assert len(reps[("qwen3-seed", "pp2 @ d49152")]) == 15
    md = ab_first_rep.render_each_rep(reps, "table/hook")
    pooled = {ln.split(" | ")[0]: ln for ln in md.split("Pooled", 1)[1].splitlines() if ln.startswith("| ")}
    pp = [float(c) for c in pooled["| pp"].strip(" |").split(" | ")[1:]]
    # the table's pp loss is in the direct (1) and captured (2) evaluations, not in the replayed one (3)
    assert pp[0] < 0.98 and pp[1] < 0.98 and pp[2] > max(pp[0], pp[1])
    hook = ab_first_rep.render_each_rep(ab_first_rep.each_rep(HOOK_AB, "hook", "stock"), "hook/stock")
    hook_pp = [float(c) for c in hook.split("| pp |", 1)[1].splitlines()[0].strip(" |").split(" | ")]
    assert all(0.97 < r < 1.01 for r in hook_pp)


def test_each_rep_refuses_unknown_arms_and_empty_pairs(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "lab" / "ab_first_rep.py"), "--each-rep"]
    res = subprocess.run([*cmd, "table/nothing", str(HOOK_AB[0])], capture_output=True, text=True)
    assert res.returncode == 2 and "ARM/BASE" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*cmd, "crude/stock", str(HOOK_AB[0])], capture_output=True, text=True)
    assert res.returncode == 1 and "no crude/stock pairs" in res.stderr
