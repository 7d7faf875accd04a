"""``ggml-dispatch diff``: rule changes between table.json files, headers and git revisions, and the
predicted change in estimated matmul time over a census."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner
from test_codegen_support import H200, census_row, rule, trials, write_census, write_tuning

from ggml_dispatch import schema
from ggml_dispatch.cli import main
from ggml_dispatch.codegen import diff as dif
from ggml_dispatch.codegen import render
from ggml_dispatch.codegen import table as tbl


def _table(*rules: dict[str, Any], gpu: schema.GpuId = H200) -> dict[str, Any]:
    t = tbl.empty_table()
    t["gpu"] = {"name": gpu.name, "cc": gpu.cc, "sm_count": gpu.sm_count}
    t["upstream_commit"] = schema.PINNED_UPSTREAM_COMMIT
    t["provenance"] = {"source": "measured", "tool_version": schema.TOOL_VERSION}
    t["rules"] = list(rules)
    return tbl.validate(tbl.canonicalize(t))


A = _table(
    rule(4096, 4096, 8, 8, "mmq"),
    rule(4096, 4096, 256, 512, "cublas"),
    rule(1024, 4096, 256, 512, "cublas", "q6_K"),
)
B = _table(
    rule(4096, 4096, 8, 8, "mmq"),  # unchanged
    rule(4096, 4096, 256, 1024, "cublas"),  # interval changed
    rule(14336, 4096, 512, 512, "cublas"),  # added; the q6_K rule is removed
)


def _write(tmp_path: Path, name: str, t: dict[str, Any]) -> Path:
    p = tmp_path / name
    p.write_text(tbl.dumps(t))
    return p


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def test_added_removed_changed() -> None:
    d = dif.diff_tables(dif.LoadedTable(A, "a", "A", "json"), dif.LoadedTable(B, "b", "B", "json"))
    assert d.unchanged == 1
    assert d.added == [rule(14336, 4096, 512, 512, "cublas")]
    assert d.removed == [rule(1024, 4096, 256, 512, "cublas", "q6_K")]
    assert len(d.changed) == 1
    assert d.changed[0].before == [rule(4096, 4096, 256, 512, "cublas")]
    assert d.changed[0].after == [rule(4096, 4096, 256, 1024, "cublas")]
    assert d.differs and d.identity == {}


def test_route_change_and_split_are_one_change() -> None:
    a = _table(rule(4096, 4096, 256, 1024, "cublas"))
    b = _table(rule(4096, 4096, 256, 256, "mmq"), rule(4096, 4096, 512, 1024, "cublas"))
    d = dif.diff_tables(dif.LoadedTable(a, "", "a", "json"), dif.LoadedTable(b, "", "b", "json"))
    assert not d.added and not d.removed and len(d.changed) == 1
    assert [r["route"] for r in d.changed[0].after] == ["mmq", "cublas"]


def test_cli_text_json_and_exit_code(tmp_path: Path) -> None:
    pa, pb = _write(tmp_path, "a.json", A), _write(tmp_path, "b.json", B)
    code, out = _run("diff", str(pa), str(pb))
    assert code == 0
    assert "+ MUL_MAT weight q4_Kxf32 N=14336 K=4096 B=1 M=512 -> cublas" in out
    assert "- MUL_MAT weight q6_Kxf32 N=1024 K=4096 B=1 M=256..512 -> cublas" in out
    assert "~ MUL_MAT weight q4_Kxf32 N=4096 K=4096 B=1: M=256..512 cublas -> M=256..1024 cublas" in out
    assert "1 added, 1 removed, 1 changed, 1 unchanged; tables differ" in out
    code, _ = _run("diff", str(pa), str(pb), "--exit-code")
    assert code == 1
    code, out = _run("diff", str(pa), str(pb), "--json")
    j = json.loads(out)
    assert j["differs"] is True and len(j["added"]) == 1 and len(j["removed"]) == 1 and j["unchanged"] == 1
    assert j["changed"][0]["after"][0]["M_hi"] == 1024
    code, _ = _run("diff", str(pa), str(pa), "--exit-code")
    assert code == 0


def test_header_and_json_of_one_table_do_not_differ(tmp_path: Path) -> None:
    pj = _write(tmp_path, "t.json", A)
    ph = tmp_path / "t.h"
    ph.write_text(render.render_header(A))
    code, out = _run("diff", str(pj), str(ph), "--exit-code")
    assert code == 0, out
    assert "same decisions" in out and "3 unchanged" in out


def test_gpu_identity_change_alone_differs(tmp_path: Path) -> None:
    other = _table(*A["rules"], gpu=schema.GpuId("NVIDIA H100 80GB HBM3", 900, 132))
    code, out = _run(
        "diff", str(_write(tmp_path, "a.json", A)), str(_write(tmp_path, "b.json", other)), "--exit-code"
    )
    assert code == 1
    assert "identity gpu.name: 'NVIDIA H200' -> 'NVIDIA H100 80GB HBM3'" in out


def test_empty_and_git_revisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    _write(repo, "table.json", A)
    subprocess.run([*git, "add", "table.json"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    _write(repo, "table.json", B)
    monkeypatch.chdir(repo)
    code, out = _run("diff", "HEAD:table.json", "table.json")
    assert code == 0 and "1 added, 1 removed, 1 changed, 1 unchanged" in out
    code, out = _run("diff", "empty", "HEAD:table.json", "--exit-code")
    assert code == 1 and "3 added, 0 removed" in out
    code, out = _run("diff", "HEAD:nope.json", "table.json")
    assert code == 2 and "git show failed" in out
    code, out = _run("diff", "missing.json", "table.json")
    assert code == 2 and "no such file" in out


def test_bad_table_input_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{\n  "rules": [\n}\n')
    code, out = _run("diff", str(p), "empty")
    assert code == 2 and "bad.json:3: not JSON" in out
    newer = copy.deepcopy(A)
    newer["layout_version"] = 4
    code, out = _run("diff", str(_write(tmp_path, "n.json", newer)), "empty")
    assert code == 2 and "layout version 4 is not known" in out


def test_predicted_change_over_a_census(tmp_path: Path) -> None:
    rows = []
    for M in (256, 512, 1024):
        rows += trials(speed={"mmq": 1.0, "cublas": 2.0 if M < 1024 else 4.0}, M=M, noise=0.0)
        rows += trials(speed={"mmq": 1.0, "cublas": 1.5}, M=M, N=1024, K=4096, noise=0.0)
    tuning = write_tuning(rows, tmp_path / "tuning.parquet")
    a = _table(rule(4096, 4096, 256, 512, "cublas"))
    b = _table(rule(4096, 4096, 256, 1024, "cublas"), rule(0, 0, 256, 1024, "cublas"))
    census = write_census(
        [
            census_row(M=512, est_us=700.0),  # cublas in both: unaffected, measured stock 10 x 100 us
            census_row(M=1024, est_us=800.0),  # stock -> cublas, measured 4x: 10 x 100 us -> 250
            census_row(M=768, est_us=300.0),  # stock -> cublas, between 512 (2x) and 1024 (4x): min 2x
            census_row(M=600, N=5120, K=5120, est_us=600.0),  # unseen shape -> type default, worst shape 1.5x
            census_row(M=1024, est_us=800.0, fused="glu"),  # fused: unaffected
            census_row(M=1024, est_us=800.0, gpu=schema.GpuId("NVIDIA H100", 900, 132)),  # other GPU
        ],
        tmp_path / "census.parquet",
    )
    pa, pb = _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)
    code, out = _run("diff", str(pa), str(pb), "--census", str(census), "--tuning", str(tuning), "--json")
    assert code == 0, out
    p = json.loads(out)["prediction"]
    assert p["census_rows"] == 6 and p["fused_rows"] == 1 and p["unpredicted"] == 0
    got = {
        (r["M"], r["N"]): (r["route_a"], r["route_b"], round(r["us_a"], 3), round(r["us_b"], 3), r["basis"])
        for r in p["rows"]
    }
    assert got == {
        (1024, 4096): (None, "cublas", 1000.0, 250.0, "measured"),
        (768, 4096): (None, "cublas", 300.0, 150.0, "interpolated"),
        (600, 5120): (None, "cublas", 600.0, 400.0, "type default, worst measured shape"),
    }
    baselines = {(r["M"], r["N"]): r["baseline"] for r in p["rows"]}
    assert baselines == {(1024, 4096): "measured stock", (768, 4096): "est_us", (600, 5120): "est_us"}
    # measured stock where the point was tuned (M 512, 1024); est_us unmeasured, fused, other GPU
    assert p["total_a_us"] == pytest.approx(1000 + 1000 + 300 + 600 + 800 + 800)
    assert p["delta_us"] == pytest.approx(-750 - 150 - 200)
    code, out = _run("diff", str(pa), str(pb), "--census", str(census), "--tuning", str(tuning))
    assert "3 affected" in out and "(-1,100.0 us," in out
    code, out = _run("diff", str(pa), str(pb), "--census", str(census))
    assert code == 2 and "--census and --tuning go together" in out


def _id_rule(N: int, K: int, lo: int, hi: int, config: str, E: int = 32, **extra: Any) -> dict[str, Any]:
    """A MUL_MAT_ID rule: its key has E, U and routing where MUL_MAT's has B."""
    return {
        "op": "MUL_MAT_ID",
        "layout": "expert",
        "src0_type": "mxfp4",
        "src1_type": "f32",
        "N": N,
        "K": K,
        "E": E,
        "U": 4,
        "routing": 0,
        "M_lo": lo,
        "M_hi": hi,
        "config": config,
        "route": config.split("/")[0],
        **extra,
    }


def test_mul_mat_id_rules_are_compared_by_their_own_key(tmp_path: Path) -> None:
    cls = _id_rule(0, 0, 1, 8, "mmq", kind="default", NK_lo=1, NK_hi=10_000_000)
    a = _table(rule(4096, 4096, 8, 8, "mmq"), _id_rule(2880, 2880, 1, 8, "mmvq"), cls)
    b = _table(
        rule(4096, 4096, 8, 8, "mmq"),
        _id_rule(2880, 2880, 1, 8, "mmq/j=16"),  # a configuration with a parameter
        _id_rule(2880, 2880, 1, 8, "mmvq", E=64),  # another key: E differs
        cls,
    )
    d = dif.diff_tables(dif.LoadedTable(a, "a", "A", "json"), dif.LoadedTable(b, "b", "B", "json"))
    assert d.unchanged == 2 and not d.removed
    assert [r["E"] for r in d.added] == [64]
    assert len(d.changed) == 1 and d.changed[0].key["E"] == 32 and "B" not in d.changed[0].key
    out = "\n".join(dif.format_diff(d))
    assert (
        "~ MUL_MAT_ID expert mxfp4xf32 N=2880 K=2880 E=32 U=4 routing=0: M=1..8 mmvq -> M=1..8 mmq/j=16"
        in out
    )
    assert "+ MUL_MAT_ID expert mxfp4xf32 N=2880 K=2880 E=64 U=4 routing=0 M=1..8 -> mmvq" in out
    # the same through the rendered headers (the class rule's kind rides in its row comment)
    ha, hb = tmp_path / "a.h", tmp_path / "b.h"
    ha.write_text(render.render_header(a))
    hb.write_text(render.render_header(b))
    code, text = _run("diff", str(ha), str(hb))
    assert code == 0, text
    assert "1 added, 0 removed, 1 changed, 2 unchanged" in text
    code, text = _run("diff", str(_write(tmp_path, "a.json", a)), str(_write(tmp_path, "a2.json", a)))
    assert code == 0 and "0 added, 0 removed, 0 changed, 3 unchanged; same decisions" in text


def test_prediction_looks_mul_mat_id_rows_up_by_their_own_key() -> None:
    a = _table(rule(4096, 4096, 8, 8, "mmq"))
    b = _table(rule(4096, 4096, 8, 8, "mmq"), _id_rule(2880, 2880, 1, 8, "mmq"))
    census = [
        {
            **census_row(M=4, N=2880, K=2880, op="MUL_MAT_ID", layout="expert", src0_type="mxfp4"),
            "E": 32,
            "U": 4,
        },
        {
            **census_row(M=4, N=2880, K=2880, op="MUL_MAT_ID", layout="expert", src0_type="mxfp4"),
            "E": 8,
            "U": 4,
        },
    ]
    p = dif.predict(pd.DataFrame(census), a, b, {})
    assert [(r.route_a, r.route_b) for r in p.every_row] == [(None, "mmq"), (None, None)]
    assert p.unpredicted == 1  # no timing for the changed point: counted, not a crash
