"""REPORT.md opens with a one-screen summary: the end-to-end gain per workload, where the table ties the
crude rule, and every loss beyond noise (CI upper end < 1). Real Parquet and JSON Lines files; the
tuning rows and t/s are synthetic (no GPU here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from test_report_build import GPU, Q4, Q6, arrow_table, tuning_rows

from ggml_dispatch import fileio, schema
from ggml_dispatch.cli import main
from ggml_dispatch.report import markdown

STOCK = (1000.0, 1010.0, 990.0, 1005.0, 995.0)
# pp512: table 1.2x stock; crude within 2% of the table either way (a tie)
TIE = (1.02, 0.98, 1.0, 1.01, 0.99)
# pp2048: table 1.3x stock, crude 1.1x (the table wins); tg128: the table loses 3% in every pair
MODEL = "llama-8b q4_K_M"


def ab_records(cached: float | None = None, hook: float | None = None) -> list[dict[str, Any]]:
    """``cached``, ``hook``: add that arm at this multiple of stock."""
    recs = []
    for p, s in enumerate(STOCK):
        for test, table, crude in (("pp512", 1.2, 1.2 / TIE[p]), ("pp2048", 1.3, 1.1), ("tg128", 0.97, 1.0)):
            base = {"model": MODEL, "test": test, "ubatch": 512, "pair": p}
            recs += [
                {**base, "arm": "stock", "tps": s},
                {**base, "arm": "table", "tps": s * table},
                {**base, "arm": "crude", "tps": s * crude},
            ]
            if cached is not None:
                recs.append({**base, "arm": "cached", "tps": s * cached})
            if hook is not None:
                recs.append({**base, "arm": "hook", "tps": s * hook})
    return recs


def _report(
    tmp_path: Path,
    table_rules: list[dict[str, Any]] | None = None,
    cached: float | None = None,
    hook: float | None = None,
) -> str:
    tuning = tmp_path / "tuning.parquet"
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, tuning_rows()), tuning, fileio.base_metadata(schema.TUNING_SCHEMA)
    )
    ab = tmp_path / "ab.jsonl"
    ab.write_text("\n".join(json.dumps(r) for r in ab_records(cached, hook)) + "\n")
    args = ["report", "--tuning", str(tuning), "--ab", str(ab), "-o", str(tmp_path / "out")]
    if table_rules is not None:
        table = {
            "schema": schema.TABLE_SCHEMA,
            "layout_version": schema.TABLE_LAYOUT_VERSION,
            "gpu": {"name": GPU["gpu_name"], "cc": 900, "sm_count": 132},
            "upstream_commit": schema.PINNED_UPSTREAM_COMMIT,
            "provenance": {"source": "measured"},
            "rules": table_rules,
            "refused": [],
        }
        (tmp_path / "table.json").write_text(json.dumps(table))
        args[-2:-2] = ["--table", str(tmp_path / "table.json")]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert md.index("## Summary") < md.index("## Data provenance") < md.index("## Losing cases")
    return md[md.index("## Summary") : md.index("## Data provenance")]


def _row(summary: str, workload: str) -> list[str]:
    line = next(x for x in summary.splitlines() if x.startswith(f"| {workload} |"))
    return [c.strip() for c in line.split("|")[2:-1]]


def test_summary_names_ties_with_the_crude_rule_and_every_loss(tmp_path: Path) -> None:
    summary = _report(tmp_path)
    pp512 = _row(summary, f"{MODEL} pp512 ub512")
    assert pp512[:2] == ["1.200 [1.200, 1.200]", "gain"]
    assert pp512[3] == "ties crude" and pp512[2].startswith("1.000 [")
    pp2048 = _row(summary, f"{MODEL} pp2048 ub512")
    assert pp2048[3] == "gain" and pp2048[2] == f"{1.3 / 1.1:.3f} [{1.3 / 1.1:.3f}, {1.3 / 1.1:.3f}]"
    tg = _row(summary, f"{MODEL} tg128 ub512")
    assert tg[:2] == ["0.970 [0.970, 0.970]", "LOSS"]
    assert tg[3] == "LOSS"  # 0.97 against the crude rule's 1.0 too
    assert "- Against the crude rule: ties at 1 of 3 workloads, faster beyond noise at 1, slower" in summary
    losses = next(x for x in summary.splitlines() if x.startswith("- Losses beyond noise"))
    assert f"{MODEL} tg128 ub512 table/stock 0.970 [0.970, 0.970]" in losses
    assert f"{MODEL} tg128 ub512 table/crude 0.970 [0.970, 0.970]" in losses
    assert "pp512" not in losses and "pp2048" not in losses
    assert "[Losing cases](#losing-cases)" in summary and "[End-to-end A/B](#end-to-end-ab)" in summary
    assert "(#predicted-gain-per-census-point)" not in summary  # no census: no such section below
    assert len(summary.splitlines()) < 40


def test_summary_lists_a_table_rule_slower_than_stock(tmp_path: Path) -> None:
    # q4_K M=1: mmq is 2x slower than stock beyond noise; a table that routes it there loses per op
    rules = [{**Q4, "M_lo": 1, "M_hi": 1, "route": "mmq"}, {**Q6, "M_lo": 8, "M_hi": 8, "route": "mmq"}]
    summary = _report(tmp_path, rules)
    assert (
        "- Per op: the table's route is slower than stock beyond noise at 1 measured point: "
        "MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1 M=1 mmq 0.500." in summary
    )
    no_loss = _report(tmp_path / "b", [{**Q6, "M_lo": 8, "M_hi": 8, "route": "mmq"}])
    assert "- Per op: no table rule is slower than stock beyond noise at a measured point." in no_loss


def test_summary_holds_a_cached_arm_against_stock_the_table_and_the_crude_rule(tmp_path: Path) -> None:
    summary = _report(tmp_path, cached=2.2)
    header = next(x for x in summary.splitlines() if x.startswith("| workload |"))
    assert [c.strip() for c in header.split("|")[2:-1] if c.strip()] == [
        "table/stock", "table/crude", "cached/stock", "cached/table", "cached/crude", "predicted matmul"
    ]  # fmt: skip
    pp2048 = _row(summary, f"{MODEL} pp2048 ub512")
    assert (
        pp2048[4] == "2.200 [2.200, 2.200]"
        and pp2048[6] == f"{2.2 / 1.3:.3f} [{2.2 / 1.3:.3f}, {2.2 / 1.3:.3f}]"
    )
    assert pp2048[8:10] == [f"{2.2 / 1.1:.3f} [{2.2 / 1.1:.3f}, {2.2 / 1.1:.3f}]", "gain"]
    assert "cached/crude" not in _report(tmp_path / "b")  # no cached arm: no such column


def test_summary_splits_table_over_stock_into_the_hook_and_the_rules(tmp_path: Path) -> None:
    # the hook alone costs 4%: tg128's 3% table loss is the hook's, the rules gain 1% against the hook
    summary = _report(tmp_path, hook=0.96)
    assert "The `hook` arm runs a hooked build with the dispatch on and no table compiled in" in summary
    header = next(x for x in summary.splitlines() if x.startswith("| workload |"))
    cols = [c.strip() for c in header.split("|")[2:-1] if c.strip()]
    assert cols == ["table/stock", "table/crude", "hook/stock", "table/hook", "predicted matmul"]
    tg = _row(summary, f"{MODEL} tg128 ub512")
    assert tg[4:8] == [
        "0.960 [0.960, 0.960]",
        "LOSS",
        f"{0.97 / 0.96:.3f} [{0.97 / 0.96:.3f}, {0.97 / 0.96:.3f}]",
        "gain",
    ]
    assert f"{MODEL} tg128 ub512 hook/stock 0.960" in summary  # among the losses beyond noise
    assert "hook/stock" not in _report(tmp_path / "b")  # no hook arm: no such column


def _many_workloads_report(tmp_path: Path) -> str:
    """An A/B of 30 depth tests (one loss, gains of different sizes, the rest within noise): more workloads
    than one screen holds."""
    recs = []
    ratios = {f"tg32 @ d{1024 * (i + 1)}": 1.0 + 0.01 * i for i in range(29)}
    ratios["pp2 @ d4096"] = 0.9  # the one loss beyond noise
    for p, s in enumerate(STOCK):
        for test, r in ratios.items():
            base = {"model": MODEL, "test": test, "ubatch": 512, "pair": p}
            noise = 1.0 if r != 1.0 else TIE[p]  # 1.0: a CI that straddles 1
            recs += [{**base, "arm": "stock", "tps": s}, {**base, "arm": "table", "tps": s * r * noise}]
    tuning = tmp_path / "tuning.parquet"
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, tuning_rows()), tuning, fileio.base_metadata(schema.TUNING_SCHEMA)
    )
    ab = tmp_path / "ab.jsonl"
    ab.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["report", "--tuning", str(tuning), "--ab", str(ab), "-o", str(out)], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    return (out / "REPORT.md").read_text()


def _summary_end(md: str) -> int:
    """The number of lines from the top of the report to the end of its summary section."""
    lines = md.splitlines()
    start = lines.index("## Summary")
    return next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))


def test_summary_fits_one_screen_and_keeps_the_key_numbers(tmp_path: Path) -> None:
    """Issue #49 item 5: every REPORT.md opens with a summary of at most 40 lines. With more workloads than
    fit, it shows every loss and the largest gains, and links the section that lists them all."""
    md = _many_workloads_report(tmp_path)
    assert _summary_end(md) <= 40
    summary = "\n".join(md.splitlines()[: _summary_end(md)])
    shown = [x for x in summary.splitlines() if x.startswith(f"| {MODEL} ")]
    assert 3 <= len(shown) < 30
    assert _row(summary, f"{MODEL} pp2 @ d4096 ub512")[:2] == ["0.900 [0.900, 0.900]", "LOSS"]
    assert _row(summary, f"{MODEL} tg32 @ d29696 ub512")[:2] == [
        "1.280 [1.280, 1.280]",
        "gain",
    ]  # the largest
    # the gains shown are the largest ones: every one left out is smaller than every one shown
    shown_gains = {float(_row(summary, r.split(" | ")[0][2:])[0].split()[0]) for r in shown} - {0.9}
    everything = md[md.index("## All workloads") : md.index("## Data provenance")]
    rows = [x for x in everything.splitlines() if x.startswith(f"| {MODEL} ")]
    assert len(rows) == 30
    left_out = {float(_row(everything, r.split(" | ")[0][2:])[0].split()[0]) for r in rows if r not in shown}
    assert max(left_out) < min(shown_gains)
    assert f"- Shown above: {len(shown)} of 30 workloads" in summary
    assert "[All workloads](#all-workloads)" in summary
    assert (
        "- Losses beyond noise (CI upper end < 1): " + f"{MODEL} pp2 @ d4096 ub512 table/stock 0.900"
        in summary
    )


def test_a_summary_that_fits_lists_every_workload_in_place(tmp_path: Path) -> None:
    summary = _report(tmp_path)
    assert "## All workloads" not in (tmp_path / "out" / "REPORT.md").read_text()
    assert "Shown above" not in summary and len(summary.splitlines()) < 40


REPO = Path(__file__).resolve().parent.parent


def test_every_committed_report_opens_with_a_one_screen_summary() -> None:
    reports = sorted(REPO.glob("tables/*/REPORT.md"))
    assert reports
    for rep in reports:
        md = rep.read_text()
        assert md.splitlines()[4] == "## Summary", rep
        assert _summary_end(md) <= 40, f"{rep.relative_to(REPO)}: the summary runs to line {_summary_end(md)}"


SERVER_PROFILE = (
    Path(__file__).resolve().parents[1] / "evidence" / "h200-2026-12-07-s33-qwen35" / "profile.tar.xz"
)


def test_a_server_profile_opens_the_report_with_where_the_gpu_time_goes(tmp_path: Path) -> None:
    # the committed H200 profile of the seed workload (qwen35 through llama-server, lab/serve_ab.py profile):
    # the Amdahl table comes first, the one-screen summary still fits below it
    tuning = tmp_path / "tuning.parquet"
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, tuning_rows()), tuning, fileio.base_metadata(schema.TUNING_SCHEMA)
    )
    out = tmp_path / "out"
    args = ["report", "--tuning", str(tuning), "--attribution", str(SERVER_PROFILE), "-o", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    lines = (out / "REPORT.md").read_text().splitlines()
    sections = [line for line in lines if line.startswith("## ")]
    assert sections[:2] == ["## Where the GPU time goes", "## Summary"]
    head = lines[: lines.index("## Summary")]
    rows = [line for line in head if line.startswith("| ") and "d48000" in line and line.count(" | ") > 4]
    assert [r.split(" | ")[0] for r in rows] == [
        "| prefill d48000 s1 (MTP server)", "| MTP decode d48000 s1 (acceptance 0.00)",
        "| prefill d48000 s1", "| plain decode d48000 s1",
    ]  # fmt: skip
    plain, mtp = rows[3].split(" | "), rows[1].split(" | ")
    # ms/token, coverage, tunable, Amdahl bound on GPU time and on wall time, speed-up of the tunable kernels
    # that 1.10x on wall time needs
    assert plain[3:9] == ["5.57", "98.3%", "83.8%", "6.17x", "2.64x", "1.17x"]
    assert plain[9].startswith("MUL_MAT mmvq 67.1%, FLASH_ATTN_EXT 16.7%")
    # MTP decode: the GPU idles for 46% of the wall time, so the kernels a table chooses must get 1.29x
    # faster for tokens/s to gain 1.10x
    assert mtp[6:9] == ["3.99x", "1.68x", "1.29x"]
    # where that idle time is: the MTP server evaluates four graphs per committed token (the verify and the
    # MTP head's), each followed by host work; plain decode one
    idle = {
        line.split(" | ")[0]: line.split(" | ")[1:]
        for line in lines
        if line.startswith("| ") and " decode d" in line
    }
    assert idle["| MTP decode d48000 s1"] == ["3.98", "7.53 |"]
    assert idle["| plain decode d48000 s1"] == ["1.02", "1.95 |"]
    details = lines.index("## Summary") + next(
        i for i, line in enumerate(lines[lines.index("## Summary") :]) if line.startswith("- Details below")
    )
    assert details < markdown.SUMMARY_MAX_LINES
    assert "server profile" in (out / "REPORT.md").read_text()  # provenance names the input


def test_a_folder_that_is_not_a_server_profile_is_one_error(tmp_path: Path) -> None:
    tuning = tmp_path / "tuning.parquet"
    fileio.write_parquet(
        arrow_table(schema.TUNING_COLUMNS, tuning_rows()), tuning, fileio.base_metadata(schema.TUNING_SCHEMA)
    )
    (tmp_path / "prof").mkdir()
    (tmp_path / "prof" / "phases-plain.jsonl").write_text('{"phase": "prefill"}\n')
    out = tmp_path / "out"
    for bad, says in ((tmp_path / "none", "no such profile"), (tmp_path / "prof", "plain.ktl: missing")):
        res = CliRunner().invoke(
            main, ["report", "--tuning", str(tuning), "--attribution", str(bad), "-o", str(out)]
        )
        assert res.exit_code != 0 and says in res.output, res.output
        assert "Traceback" not in res.output and not (out / "REPORT.md").exists()
