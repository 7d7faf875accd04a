"""codegen.table: canonical table.json, validation with clear messages, and the Python lookup."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_codegen_support import H200, frame, trials

from ggml_dispatch import schema
from ggml_dispatch.codegen import decide
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError


def _table() -> dict[str, Any]:
    rows = []
    for N, K in ((4096, 4096), (1024, 4096)):
        for M in (256, 512):
            rows += trials(speed={"mmq": 1.0, "cublas": 1.5}, M=M, N=N, K=K)
    rows += trials(speed={"mmvq": 1.0, "mmq": 1.5}, M=8, N=4096, K=4096)
    rows += trials(speed={"mmq": 1.0, "cublas": 0.5}, M=64, N=4096, K=4096)
    return tbl.build_table(decide.decide(frame(rows), decide.Params()), tuning_sha256="ab" * 32)


def _rule(**kw: Any) -> dict[str, Any]:
    r = {"op": "MUL_MAT", "layout": "weight", "src0_type": "q4_K", "src1_type": "f32", "N": 4096, "K": 4096}
    r.update({"B": 1, "M_lo": 8, "M_hi": 16, "route": "mmq"})
    r.update(kw)
    r.setdefault("config", r["route"])
    return r


def test_canonical_text_is_stable_sorted_and_ends_with_newline() -> None:
    t = _table()
    text = tbl.dumps(t)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert tbl.dumps(tbl.loads(text)) == text
    shuffled = copy.deepcopy(t)
    shuffled["rules"].reverse()
    shuffled["refused"].reverse()
    assert tbl.dumps(shuffled) == text
    assert tbl.table_hash(shuffled) == tbl.table_hash(t)
    lines = text.splitlines()
    rule_lines = [ln for ln in lines if ln.startswith('    {"B"') and '"M_hi"' in ln]
    assert len(rule_lines) == len(t["rules"])  # one rule per line: git diff shows rule changes
    keys = [k for k in json.loads(text)]
    assert keys == sorted(keys)
    codes = [tbl.rule_sort_key(r) for r in json.loads(text)["rules"]]
    assert codes == sorted(codes)


def test_table_carries_identity_and_provenance() -> None:
    t = _table()
    assert t["gpu"] == {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    assert t["upstream_commit"] == schema.PINNED_UPSTREAM_COMMIT
    assert t["layout_version"] == schema.TABLE_LAYOUT_VERSION and t["schema"] == schema.TABLE_SCHEMA
    p = t["provenance"]
    assert p["tuning_sha256"] == "ab" * 32 and p["tool_version"] == schema.TOOL_VERSION
    assert p["patch_hashes"] == ["p" * 64] and p["harness_versions"] == ["test"] and p["source"] == "measured"
    assert p["decision"]["theta"] == 0.03 and p["decision"]["bootstrap_resamples"] == 2000
    assert "created" not in json.dumps(t)  # no time stamps: same input, same bytes


def test_lookup_prefers_exact_rules_and_checks_the_gpu() -> None:
    t = _table()
    q = ("MUL_MAT", "weight", "q4_K", "f32")
    assert tbl.lookup(t, H200, *q, 8, 4096, 4096, 1) == "mmq"
    assert tbl.lookup(t, H200, *q, 300, 4096, 4096, 1) == "cublas"
    assert tbl.lookup(t, H200, *q, 300, 5120, 5120, 1) == "cublas"  # type default
    assert tbl.lookup(t, H200, *q, 64, 4096, 4096, 1) is None
    assert tbl.lookup(t, H200, *q, 9, 4096, 4096, 1) is None  # beyond the measured neighbours
    for other in (
        schema.GpuId("NVIDIA H100 80GB HBM3", 900, 132),
        schema.GpuId("NVIDIA H200", 890, 132),
        schema.GpuId("NVIDIA H200", 900, 114),
    ):
        assert tbl.lookup(t, other, *q, 8, 4096, 4096, 1) is None
    # an exact rule beats a default that also covers the point
    t2 = copy.deepcopy(t)
    t2["rules"] = [_rule(N=0, K=0, M_lo=1, M_hi=100, route="cublas"), _rule(M_lo=8, M_hi=8, route="mmvq")]
    assert tbl.lookup(t2, H200, *q, 8, 4096, 4096, 1) == "mmvq"
    assert tbl.lookup(t2, H200, *q, 9, 4096, 4096, 1) == "cublas"


def test_empty_table() -> None:
    e = tbl.empty_table()
    assert tbl.validate(e) is e and e["rules"] == []
    assert not tbl.gpu_matches(e, schema.GpuId("", 0, 0))
    assert tbl.lookup(e, H200, "MUL_MAT", "weight", "q4_K", "f32", 1, 1, 1, 1) is None
    assert tbl.dumps(tbl.empty_table()) == tbl.dumps(e)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.update(layout_version=4), "layout version 4 is not known to this tool"),
        (lambda t: t.update(schema="ggml-dispatch-table/9"), "unknown table schema"),
        (lambda t: t["rules"].append(_rule(route="stock")), "unknown route 'stock'"),
        (lambda t: t["rules"].append(_rule(N=0)), "both 0"),
        (lambda t: t["rules"].append(_rule(M_lo=20, M_hi=10)), "M_lo <= M_hi"),
        (lambda t: t["rules"].append(_rule(N=True)), "non-negative integer"),
        (lambda t: t["rules"].extend([_rule(), _rule(M_lo=16, M_hi=20, route="cublas")]), "overlaps"),
        (lambda t: t["gpu"].update(name="a\0b"), "without NUL"),
        (lambda t: t["rules"].append({"op": "MUL_MAT"}), "missing layout"),
        (lambda t: t["rules"].append({"op": "SOFT_MAX"}), "unknown op 'SOFT_MAX'"),
        (lambda t: t["rules"].append(_rule(layout="expert")), "'expert' is not a layout of MUL_MAT"),
        (lambda t: t["rules"].append(_rule(config="mmq/j=12")), "is not one of 8, 16"),
        (lambda t: t["rules"].append(_rule(config="cublas/compute=f16,out=f32")), "not a canonical"),
        (lambda t: t["rules"].append(_rule(config="cublas/out=f32")), "is not the route of config"),
    ],
)
def test_validation_names_the_problem(mutate: Any, message: str, tmp_path: Path) -> None:
    t = copy.deepcopy(_table())
    t["rules"] = []
    mutate(t)
    p = tmp_path / "table.json"
    p.write_text(json.dumps(t))
    with pytest.raises(InputError, match=message) as e:
        tbl.load(p)
    assert str(e.value).startswith(str(p))


def test_a_rule_carries_its_configuration_and_a_layout_1_table_is_upgraded(tmp_path: Path) -> None:
    t = copy.deepcopy(_table())
    t["rules"] = [_rule(config="cublas/out=f32,compute=f16", route="cublas")]
    tbl.validate(t)
    assert (
        tbl.lookup(t, H200, "MUL_MAT", "weight", "q4_K", "f32", 8, 4096, 4096, 1)
        == "cublas/out=f32,compute=f16"
    )
    assert tbl.core_rules(t["rules"])[0]["config"] == "cublas/out=f32,compute=f16"
    old = copy.deepcopy(_table())
    old["layout_version"] = 1
    for r in old["rules"] + old["refused"]:
        del r["config"]
    p = tmp_path / "table.json"
    p.write_text(json.dumps(old))
    assert tbl.load(p) == _table()
    # layout 2 (configurations, no size classes) reads as it is, in the current layout
    p.write_text(json.dumps({**_table(), "layout_version": 2}))
    assert tbl.load(p) == _table() and _table()["layout_version"] == schema.TABLE_LAYOUT_VERSION == 3


def test_load_rejects_non_json_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "table.json"
    p.write_text('{\n  "schema": \n}\n')
    with pytest.raises(InputError, match=r"table.json:3: not JSON"):
        tbl.load(p)
