"""tuner.reference + ``tune import-reference``: the real reference TSV (samples/reference) -> tuning rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from test_codegen_support import reference_tsv

from ggml_dispatch import fileio, schema
from ggml_dispatch.cli import main
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import reference


def _data_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")][1:]


def test_real_tsv_converts_every_row(tmp_path: Path) -> None:
    tsv = reference_tsv()
    out = tmp_path / "ref.parquet"
    r = CliRunner().invoke(main, ["tune", "import-reference", str(tsv), "--sm-count", "132", "-o", str(out)])
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(out)
    assert list(df.columns) == list(schema.TUNING_COLUMNS)
    assert len(df) == len(_data_lines(tsv.read_text()))
    meta = fileio.read_parquet_metadata(out)
    assert meta[schema.META_SCHEMA] == schema.TUNING_SCHEMA
    assert meta[schema.META_UPSTREAM_COMMIT] == schema.PINNED_UPSTREAM_COMMIT
    assert "mmvq for M <= 8" in meta[schema.META_PREFIX + "reference_assumptions"]
    assert set(df["source"]) == {"reference"} and set(df["status"]) == {"ok"}
    assert (
        set(df["gpu_name"]) == {"NVIDIA H200"}
        and set(df["gpu_cc"]) == {900}
        and set(df["gpu_sm_count"]) == {132}
    )
    assert set(df["upstream_commit"]) == {schema.PINNED_UPSTREAM_COMMIT}
    assert set(df["driver"]) == {"580.159.04"} and set(df["cuda_version"]) == {"13.0"}
    assert (df["route_ran"] == df["route"]).all() and df["nmse"].isna().all()


def test_test_backend_ops_names_are_converted_at_the_border() -> None:
    text = reference_tsv().read_text()
    ident = reference.parse_identity(text.splitlines())
    assert ident == reference.ReferenceIdentity(
        "NVIDIA H200", 900, "580.159.04", "13.0", schema.PINNED_UPSTREAM_COMMIT
    )
    rows = reference.to_tuning_rows(reference.parse_samples(text, "t.tsv"), ident, 132)
    by = {(r["src0_type"], r["M"], r["N"], r["K"], r["route"]): r for r in rows}
    # TSV "q4_K 1024 256 4096 cublas 42535 23.53": m = N = 1024, n = M = 256, k = K = 4096
    r = by[("q4_K", 256, 1024, 4096, "cublas")]
    assert (r["us"], r["replays"]) == (23.53, 42535)
    assert r["anchor_us"] == 33.27  # stock at M = 256 on cc 900 is mmq
    # at M <= 8 stock is mmvq: "q4_K 17408 8 5120 mmvq 14271 70.39"
    assert by[("q4_K", 8, 17408, 5120, "mmq")]["anchor_us"] == 70.39
    assert by[("q4_K", 8, 17408, 5120, "mmvq")]["anchor_us"] == 70.39
    assert by[("q8_0", 1, 5120, 17408, "mmvq")]["anchor_us"] == 31.4


def test_stock_assumption() -> None:
    assert reference.stock_route_assumed(900, "q4_K", 8) == "mmvq"
    assert reference.stock_route_assumed(900, "q4_K", 9) == "mmq"
    assert reference.stock_route_assumed(900, "f16", 512) is None  # not quantized: not covered
    assert reference.stock_route_assumed(700, "q4_K", 512) is None  # other architectures: not declared
    assert reference.expand_commit("0c1e57098bba") == schema.PINNED_UPSTREAM_COMMIT
    assert reference.expand_commit("deadbeef") == "deadbeef"


HEAD = "# NVIDIA H200 (cc 9.0, driver 580.159.04, CUDA 13.0), llama.cpp 0c1e57098bba (x).\n"
COLS = "type\tm\tn\tk\troute\truns\tus_per_run\n"


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("q9_K\t1\t1\t256\tmmq\t1\t1.0\n", 3, "unknown ggml type 'q9_K'"),
        ("q4_K\t1\t1\t256\tfast\t1\t1.0\n", 3, "unknown route 'fast'"),
        ("q4_K\tx\t1\t256\tmmq\t1\t1.0\n", 3, "is not an integer"),
        ("q4_K\t1\t1\t256\tmmq\t1\t-2\n", 3, "positive time"),
        ("q4_K\t1\t1\t256\tmmq\t1\n", 3, "expected 7 tab-separated cells"),
        (
            "q4_K\t1\t1\t256\tmmq\t1\t1.0\nq4_K\t1\t1\t256\tmmq\t1\t2.0\n",
            4,
            "duplicate sample (first on line 3)",
        ),
    ],
)
def test_bad_rows_name_their_line(body: str, line: int, message: str, tmp_path: Path) -> None:
    tsv = tmp_path / "bad.tsv"
    tsv.write_text(HEAD + COLS + body)
    out = tmp_path / "out.parquet"
    r = CliRunner().invoke(main, ["tune", "import-reference", str(tsv), "--sm-count", "132", "-o", str(out)])
    assert r.exit_code == 2
    assert f"bad.tsv:{line}:" in r.output and message in r.output
    assert not out.exists() and list(tmp_path.iterdir()) == [tsv]


def test_missing_columns_and_identity(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="column header lacks us_per_run"):
        reference.parse_samples("type\tm\tn\tk\troute\truns\nq4_K\t1\t1\t1\tmmq\t1\n", "x.tsv")
    tsv = tmp_path / "noid.tsv"
    tsv.write_text("# no identity here\n" + COLS + "q4_K\t1\t1\t256\tmmq\t1\t1.0\n")
    r = CliRunner().invoke(
        main, ["tune", "import-reference", str(tsv), "--sm-count", "132", "-o", str(tmp_path / "o")]
    )
    assert r.exit_code == 2 and "noid.tsv:1:" in r.output


def test_sm_count_must_be_declared(tmp_path: Path) -> None:
    tsv = tmp_path / "ok.tsv"
    tsv.write_text(HEAD + COLS + "q4_K\t1\t1\t256\tmmq\t1\t1.0\n")
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["tune", "import-reference", str(tsv), "-o", str(out)])
    assert r.exit_code == 2 and "--sm-count" in r.output and not out.exists()
