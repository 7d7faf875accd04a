"""Every numeric option of every command is finite and in range: ``nan``, ``inf``, a 23-digit integer or
a value out of range is refused while parsing (exit 2, the option named, no traceback, nothing written).
``codegen --theta nan`` used to give 28 rules instead of 20 and record theta null."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import REPO, make_inputs, run, snapshot
from conftest import MakeGguf

from ggml_dispatch.options import FiniteFloat

BIG = "99999999999999999999999"
H200_TABLE = REPO / "tables" / "cuda-sm90-nvidia-h200" / "table.json"


@pytest.fixture
def inputs(tmp_path: Path, make_gguf: MakeGguf) -> dict[str, Path]:
    (tmp_path / "in").mkdir()
    return make_inputs(tmp_path / "in", make_gguf("in/m.gguf", [("blk.0.attn_q.weight", "q8_0", [64, 64])]))


def _argv(cmd: str, i: dict[str, Path], out: Path) -> list[str | Path]:
    return {
        "from-gguf": ["census", "from-gguf", i["gguf"], "--m", "1", "-o", out / "c.parquet"],
        "show": ["census", "show", i["census"]],
        "tune run": ["tune", "run", i["census"], "--llama-cpp", i["trace"].parent, "-o", out / "t.parquet"],
        "tune build": ["tune", "build", "--llama-cpp", i["trace"].parent],
        "import-reference": ["tune", "import-reference", i["tsv"], "--sm-count", "132", "-o", out / "r.pq"],
        "codegen": ["codegen", i["tuning"], "-o", out / "table"],
        "report": ["report", "--tuning", i["tuning"], "-o", out / "report"],
        "attention": ["census", "attention", i["trace"], "-o", out / "a.parquet"],
        "tune verify": ["tune", "verify", H200_TABLE, "--shape", "q4_K:8x8", "--m", "8", "--dry-run"],
        "autotune": [
            "autotune",
            "--llama-cpp",
            i["trace"].parent,
            "--model",
            i["gguf"],
            "-o",
            out / "t",
            "--dry-run",
        ],
    }[cmd]


CASES: list[tuple[str, str, str]] = [
    ("from-gguf", "--m", BIG),
    ("from-gguf", "--m", "1,4294967296"),
    ("from-gguf", "--output-rows", BIG),
    ("from-gguf", "--n-kv", BIG),
    ("from-gguf", "--n-ctx", "4294967296"),
    ("from-gguf", "--cc", BIG),
    ("from-gguf", "--sm-count", "0"),
    ("show", "--top", BIG),
    ("show", "--top", "0"),
    ("tune run", "--coverage", "nan"),
    ("tune run", "--coverage", "inf"),
    ("tune run", "--coverage", "1.5"),
    ("tune run", "--trials", BIG),
    ("tune run", "--nmse-max", "nan"),
    ("tune run", "--nmse-max", "-inf"),
    ("tune run", "--max-seconds", "inf"),
    ("tune run", "--max-seconds", "nan"),
    ("tune run", "--l2-bytes", BIG),
    ("tune run", "--l2-bytes", "-1"),
    ("tune run", "--case-timeout", "inf"),
    ("tune run", "--jobs", BIG),
    ("tune build", "--jobs", "0"),
    ("import-reference", "--sm-count", BIG),
    ("import-reference", "--cc", BIG),
    ("codegen", "--theta", "nan"),
    ("codegen", "--theta", "inf"),
    ("codegen", "--theta", "-0.1"),
    ("codegen", "--theta", "2"),
    ("codegen", "--reference-margin", "nan"),
    ("codegen", "--reference-margin", "1"),
    ("codegen", "--min-trials", BIG),
    ("codegen", "--resamples", BIG),
    ("codegen", "--seed", BIG),
    ("codegen", "--min-default-shapes", BIG),
    ("report", "--reference-margin", "inf"),
    ("report", "--reference-margin", "0"),
    ("attention", "--max-m", BIG),
    ("tune verify", "--case-timeout", "nan"),
    ("tune verify", "--trials", BIG),
    ("tune verify", "--l2-bytes", BIG),
    ("autotune", "--tune-seconds", "nan"),
    ("autotune", "--tune-seconds", "inf"),
    ("autotune", "--case-timeout", "nan"),
    ("autotune", "--coverage", "nan"),
    ("autotune", "--vram-budget", "nan"),
    ("autotune", "--vram-budget", BIG),
    ("autotune", "--vram-budget", "-1"),
    ("autotune", "--vram-budget", "lots"),
    ("codegen", "--vram-budget", "nan"),
    ("codegen", "--vram-budget", "-1"),
    ("codegen", "--vram-budget", "lots"),
    ("codegen", "--vram-budget", BIG),
    ("autotune", "--trials", "nan"),
    ("autotune", "--pairs", "nan"),
    ("autotune", "--reps", "nan"),
    ("autotune", "--reps", BIG),
    ("autotune", "--jobs", "0"),
]


@pytest.mark.parametrize(("cmd", "option", "value"), CASES)
def test_a_bad_number_is_refused_while_parsing(
    cmd: str, option: str, value: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    res = run(*_argv(cmd, inputs, out), option, value)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
    err = res.stderr.strip().splitlines()[-1]
    assert err.startswith("Error: Invalid value for") and option in err, res.stderr
    assert snapshot(tmp_path) == before


# (command, option, value, the empty item's number and the item count)
EMPTY_ITEMS: list[tuple[str, str, str, int, int]] = [
    ("from-gguf", "--m", "1,,512", 2, 3),
    ("from-gguf", "--m", ",1", 1, 2),
    ("from-gguf", "--m", "1,512,", 3, 3),
    ("from-gguf", "--m", "1, ,512", 2, 3),
    ("tune verify", "--m", "5-7,,384", 2, 3),
    ("autotune", "--ubatch", "512,,2048", 2, 3),
    ("autotune", "--depth", "4096,", 2, 2),
    ("autotune", "--workload", "decode,,prefill", 2, 3),
    ("tune run", "--routes", "mmq,,cublas", 2, 3),
    ("tune run", "--layouts", "weight,", 2, 2),
    ("tune run", "--routing-kinds", "few,,uniform", 2, 3),
]


@pytest.mark.parametrize(("cmd", "option", "value", "item", "items"), EMPTY_ITEMS)
def test_an_empty_item_in_a_list_is_refused(
    cmd: str, option: str, value: str, item: int, items: int, inputs: dict[str, Path], tmp_path: Path
) -> None:
    """``--m 1,,512`` used to mean ``--m 1,512``: a list's typo is refused, not dropped."""
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    res = run(*_argv(cmd, inputs, out), option, value)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
    assert res.stderr.strip().splitlines()[-1] == (
        f"Error: Invalid value for {option}: {value!r}: item {item} of {items} is empty "
        "(a doubled, leading or trailing comma)"
    ), res.stderr
    assert snapshot(tmp_path) == before


def test_codegen_theta_nan_writes_no_table(inputs: dict[str, Path], tmp_path: Path) -> None:
    res = run("codegen", inputs["tuning"], "--theta", "nan", "-o", tmp_path / "t")
    assert res.exit_code == 2 and "'nan' is not a finite number" in res.stderr
    assert not (tmp_path / "t").exists()
    ok = run("codegen", inputs["tuning"], "--theta", "0.05", "-o", tmp_path / "t")
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize(
    ("kind", "value", "ok"),
    [
        (FiniteFloat(0, 1, min_open=True), "1", True),
        (FiniteFloat(0, 1, min_open=True), "0", False),
        (FiniteFloat(0, 1, max_open=True), "1", False),
        (FiniteFloat(0), "1e308", True),
        (FiniteFloat(0), "1e309", False),  # float() gives inf
        (FiniteFloat(), "-nan", False),
        (FiniteFloat(), "x", False),
    ],
)
def test_finite_float_bounds(kind: FiniteFloat, value: str, ok: bool) -> None:
    import click

    if ok:
        assert kind.convert(value, None, None) == float(value)
    else:
        with pytest.raises(click.BadParameter):
            kind.convert(value, None, None)
