"""The one H200 table (tables/cuda-sm90-nvidia-h200) against each sweep it was decided from, each decided
alone by today's codegen (real trials): where no other sweep measured a component's shapes the merged table
carries that component's rules unchanged (MoE and attention: every rule); the three dense sweeps (routes,
configurations, weight cache) measured many of the same shapes, and a shared decision pools their trials,
so the dense rules differ from each component's only at the shape keys listed here, each one measured by
another dense sweep too."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from ggml_dispatch.artifacts.table import LoadedTable
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import diff as dif

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "tables" / "cuda-sm90-nvidia-h200"
TUNING = H200 / "tuning"
BUDGET = "16384"  # the merged table's (its README says why)
DENSE = ("dense-routes", "configs", "cache")

# Per dense sweep: the shape keys ("type NxK", or "type default" for a type's size-class defaults, which
# pool every measured shape of the type) where the merged table's rules differ from the sweep's own table.
EXPECTED_DENSE_DIFFERENCES: dict[str, set[str]] = {
    "dense-routes": {
        "q4_K 1024x4096",
        "q4_K 14336x4096",
        "q4_K 4096x14336",
        "q4_K 4096x4096",
        "q4_K default",
        "q5_K 17408x5120",
        "q5_K default",
        "q6_K 4096x14336",
        "q6_K 5120x17408",
        "q6_K default",
        "q8_0 5120x6144",
        "q8_0 6144x5120",
        "q8_0 default",
    },
    "configs": {
        "q4_K 14336x4096",
        "q4_K 4096x14336",
        "q4_K 4096x4096",
        "q4_K default",
        "q5_K 17408x5120",
        "q5_K default",
        "q6_K 4096x14336",
        "q6_K 5120x17408",
        "q6_K default",
        "q8_0 6144x5120",
        "q8_0 default",
    },
    "cache": {
        "q4_K 14336x4096",
        "q4_K 4096x14336",
        "q4_K 4096x4096",
        "q4_K default",
        "q5_K 17408x5120",
        "q5_K default",
        "q6_K 1024x4096",
        "q6_K 4096x14336",
        "q6_K 5120x17408",
        "q6_K default",
        "q8_0 1024x5120",
        "q8_0 5120x6144",
        "q8_0 6144x5120",
        "q8_0 default",
    },
}


def _codegen(out: Path, tuning: str, *args: str) -> LoadedTable:
    res = CliRunner().invoke(main, ["codegen", str(TUNING / f"{tuning}.parquet"), *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return dif.load_file(out / "table.json")


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoadedTable]:
    """Each sweep's table decided alone, with the merged table's census and budget."""
    tmp = tmp_path_factory.mktemp("alone")
    census = ["--census", str(H200 / "census.parquet")]
    return {
        "moe-fit": _codegen(tmp / "moe", "moe-fit", "--census", str(H200 / "census-moe.parquet")),
        "attention": _codegen(tmp / "attn", "attention", "--vram-budget", BUDGET),
        "dense-routes": _codegen(tmp / "routes", "dense-routes", *census),
        "configs": _codegen(tmp / "configs", "configs", *census),
        "cache": _codegen(tmp / "cache", "cache", *census, "--vram-budget", BUDGET),
    }


@cache
def merged() -> LoadedTable:
    return dif.load_file(H200 / "table.json")


def _only(t: LoadedTable, keep: Any) -> LoadedTable:
    table = copy.deepcopy(t.table)
    table["rules"] = [r for r in table["rules"] if keep(r)]
    return LoadedTable(table, t.hash, t.origin, t.kind)


def _label(r: dict[str, Any]) -> str:
    return f"{r['src0_type']} default" if r["N"] == 0 else f"{r['src0_type']} {r['N']}x{r['K']}"


@cache
def _measured(sweep: str) -> frozenset[str]:
    """The shape keys (and per-type defaults) with ok trials in a dense sweep."""
    df = pd.read_parquet(TUNING / f"{sweep}.parquet", columns=["src0_type", "N", "K", "status"])
    ok = df[df["status"] == "ok"]
    return frozenset(f"{t} {n}x{k}" for t, n, k in zip(ok["src0_type"], ok["N"], ok["K"], strict=True)) | {
        f"{t} default" for t in ok["src0_type"]
    }


def test_the_merged_tables_inputs_are_the_five_sweeps() -> None:
    p = merged().table["provenance"]
    names = sorted(f["name"] for f in p["tuning_files"])
    assert names == sorted(f"{s}.parquet" for s in (*DENSE, "moe-fit", "attention"))
    assert merged().table["vram"]["budget_mib"] == int(BUDGET)


@pytest.mark.parametrize(("sweep", "op"), [("moe-fit", "MUL_MAT_ID"), ("attention", "FLASH_ATTN_EXT")])
def test_moe_and_attention_rules_are_the_components(
    alone: dict[str, LoadedTable], sweep: str, op: str
) -> None:
    a = _only(alone[sweep], lambda r: r["op"] == op)
    b = _only(merged(), lambda r: r["op"] == op)
    d = dif.diff_tables(a, b)
    assert not d.added and not d.removed and not d.changed, dif.format_diff(d)
    assert d.unchanged == len(a.table["rules"]) > 0


@pytest.mark.parametrize("sweep", DENSE)
def test_dense_rules_differ_from_each_components_only_where_the_dense_sweeps_overlap(
    alone: dict[str, LoadedTable], sweep: str
) -> None:
    mine = _measured(sweep)

    def keep(r: dict[str, Any]) -> bool:
        return bool(r["op"] == "MUL_MAT" and _label(r) in mine)

    d = dif.diff_tables(_only(alone[sweep], keep), _only(merged(), keep))
    differ = {_label(r) for r in d.added + d.removed} | {_label((c.before or c.after)[0]) for c in d.changed}
    assert differ == EXPECTED_DENSE_DIFFERENCES[sweep], dif.format_diff(d)
    others = frozenset().union(*(_measured(s) for s in DENSE if s != sweep))
    assert differ <= others  # each difference is a shape another dense sweep measured too
    assert mine - differ, "some of the sweep's keys are reproduced unchanged"
    assert d.unchanged > 0
