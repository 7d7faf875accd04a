"""codegen.render: the generated header is strict, safe C/C++ and parses back to the same table."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_codegen_support import frame, trials

from ggml_dispatch import registry, schema
from ggml_dispatch.codegen import decide, render
from ggml_dispatch.codegen import table as tbl
from ggml_dispatch.errors import InputError

HOSTILE = 'NVIDIA "H200" \\ ??/ */ /* ??= %s %n \n\t\x01\x7f é 中 end'
GCC = ["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]
GXX = ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"]


def table_for(gpu: schema.GpuId) -> dict[str, Any]:
    rows = []
    for N, K in ((4096, 4096), (1024, 4096)):
        for M in (256, 512):
            rows += trials(speed={"mmq": 1.0, "cublas": 1.5}, M=M, N=N, K=K, gpu=gpu)
    rows += trials(speed={"mmvq": 1.0, "mmq": 1.5}, M=8, N=4096, K=4096, gpu=gpu)
    return tbl.build_table(decide.decide(frame(rows), decide.Params()), tuning_sha256="cd" * 32)


DRIVER = r"""
#include "ggml-dispatch-table.h"
#include <stdio.h>
int main(void) {
    printf("%d %d %d\n", GGML_DISPATCH_TABLE_RULE_COUNT, GGML_DISPATCH_TABLE_LAYOUT_VERSION,
           (int) sizeof(ggml_dispatch_table_hash));
    printf("%d\n", ggml_dispatch_table_gpu_matches(ggml_dispatch_table_gpu_name, GGML_DISPATCH_TABLE_GPU_CC,
                                                   GGML_DISPATCH_TABLE_GPU_SM_COUNT));
    const int64_t k[GGML_DISPATCH_TABLE_KEY_SLOTS] = {4096, 4096, 1, 0, 0};
    printf("%d\n", ggml_dispatch_table_lookup(0, 0, 12, 0, k, 8));
    fputs(ggml_dispatch_table_gpu_name, stdout);
    return 0;
}
"""


def compile_and_run(
    header: str, tmp_path: Path, compiler: list[str], suffix: str, driver: str = DRIVER
) -> bytes:
    """``header`` beside ``driver`` in ``tmp_path``, compiled with ``compiler`` and run: its stdout."""
    (tmp_path / tbl.HEADER_FILENAME).write_text(header)
    src = tmp_path / f"driver{suffix}"
    src.write_text(driver)
    exe = tmp_path / f"driver{suffix}.bin"
    res = subprocess.run(
        [*compiler, "-I", str(tmp_path), str(src), "-o", str(exe)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return subprocess.run([str(exe)], capture_output=True, check=True).stdout


@pytest.mark.parametrize(("compiler", "suffix"), [(GCC, ".c"), (GXX, ".cpp")])
def test_header_compiles_strict_and_hostile_names_survive(
    compiler: list[str], suffix: str, tmp_path: Path
) -> None:
    gpu = schema.GpuId(HOSTILE, 900, 132)
    t = table_for(gpu)
    out = compile_and_run(render.render_header(t), tmp_path, compiler, suffix)
    head, matches, route, name = out.split(b"\n", 3)
    count, layout, hash_size = (int(x) for x in head.split())
    assert count == len(t["rules"]) > 0 and layout == schema.TABLE_LAYOUT_VERSION and hash_size == 65
    assert matches == b"1" and int(route) == schema.ROUTE_CODES[schema.Route.MMQ]
    assert name == HOSTILE.encode("utf-8")


@pytest.mark.parametrize(("compiler", "suffix"), [(GCC, ".c"), (GXX, ".cpp")])
def test_empty_table_header_is_the_no_table_header(compiler: list[str], suffix: str, tmp_path: Path) -> None:
    out = compile_and_run(render.render_header(tbl.empty_table()), tmp_path, compiler, suffix)
    assert out.split(b"\n")[:3] == [f"0 {schema.TABLE_LAYOUT_VERSION} 65".encode(), b"0", b"0"]


def test_hostile_strings_never_appear_raw() -> None:
    header = render.render_header(table_for(schema.GpuId(HOSTILE, 900, 132)))
    assert "??" not in header and "\x01" not in header and "é" not in header
    assert header.isascii()
    comments = re.findall(r"/\*.*?\*/", header, re.S)
    assert all("H200" not in c for c in comments)  # data never lands in a comment
    (literal,) = re.findall(r"ggml_dispatch_table_gpu_name\[\] = (\".*\");", header)
    assert render.c_unescape(literal) == HOSTILE


def test_only_two_includes_and_an_include_guard() -> None:
    header = render.render_header(table_for(schema.GpuId("NVIDIA H200", 900, 132)))
    assert re.findall(r"#include\s*<([^>]+)>", header) == ["stdint.h", "string.h"]
    assert "#ifndef GGML_DISPATCH_TABLE_H" in header and header.rstrip().endswith(
        "#endif /* GGML_DISPATCH_TABLE_H */"
    )
    assert "malloc" not in header and "printf" not in header


def test_two_translation_units_link(tmp_path: Path) -> None:
    (tmp_path / tbl.HEADER_FILENAME).write_text(render.render_header(table_for(schema.GpuId("G", 900, 1))))
    (tmp_path / "a.c").write_text(
        '#include "ggml-dispatch-table.h"\n'
        "int a(void) { const int64_t k[5] = {4096, 4096, 1, 0, 0};\n"
        "  return ggml_dispatch_table_lookup(0, 0, 12, 0, k, 8); }\n"
    )
    (tmp_path / "b.c").write_text(
        '#include "ggml-dispatch-table.h"\n#include "ggml-dispatch-table.h"\n'
        "int a(void);\nint main(void) { return a() == 4 ? 0 : 1; }\n"
    )
    res = subprocess.run(
        [*GCC, "-I", str(tmp_path), str(tmp_path / "a.c"), str(tmp_path / "b.c"), "-o", str(tmp_path / "ab")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert subprocess.run([str(tmp_path / "ab")]).returncode == 0


def test_layout_version_is_checked_at_compile_time(tmp_path: Path) -> None:
    (tmp_path / tbl.HEADER_FILENAME).write_text(render.render_header(tbl.empty_table()))
    src = tmp_path / "x.c"
    src.write_text('#include "ggml-dispatch-table.h"\nint main(void) { return 0; }\n')

    def compile_expecting(version: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *GCC,
                f"-DGGML_DISPATCH_TABLE_EXPECTED_LAYOUT_VERSION={version}",
                "-I",
                str(tmp_path),
                str(src),
                "-o",
                str(tmp_path / "x"),
            ],
            capture_output=True,
            text=True,
        )

    bad = compile_expecting(schema.TABLE_LAYOUT_VERSION + 1)
    assert bad.returncode != 0 and "layout version" in bad.stderr
    good = compile_expecting(schema.TABLE_LAYOUT_VERSION)
    assert good.returncode == 0, good.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_header_compiles_as_cuda(tmp_path: Path) -> None:
    (tmp_path / tbl.HEADER_FILENAME).write_text(
        render.render_header(table_for(schema.GpuId(HOSTILE, 900, 132)))
    )
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "ggml-dispatch-table.h"\n'
        "__global__ void k(int * out) { *out = 1; }\n"
        "int host_pick(int64_t M) { const int64_t k[5] = {4096, 4096, 1, 0, 0};\n"
        "  return ggml_dispatch_table_lookup(0, 0, 12, 0, k, M); }\n"
    )
    res = subprocess.run(
        [
            "nvcc",
            "-std=c++17",
            "-arch=sm_90",
            "-Werror",
            "all-warnings",
            "-Xcompiler",
            "-Wall,-Wextra,-Werror",
            "-I",
            str(tmp_path),
            "-c",
            str(src),
            "-o",
            str(tmp_path / "k.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


def test_parse_header_round_trips() -> None:
    t = table_for(schema.GpuId(HOSTILE, 900, 132))
    parsed, h = render.parse_header(render.render_header(t))
    assert h == tbl.table_hash(t)
    assert parsed["gpu"] == t["gpu"] and parsed["upstream_commit"] == t["upstream_commit"]
    assert tbl.core_rules(parsed["rules"]) == tbl.core_rules(t["rules"])
    # each row's comment carries its rule kind back
    assert [r["kind"] for r in parsed["rules"]] == [tbl.rule_kind(r) for r in t["rules"]]
    assert {r["kind"] for r in parsed["rules"]} >= {"measured", "default"}
    assert parsed["provenance"]["tuning_sha256"] == "cd" * 32
    assert render.parse_header(render.render_header(tbl.empty_table()))[0]["rules"] == []


def test_parse_header_refuses_foreign_or_newer_headers() -> None:
    with pytest.raises(InputError, match="not a header rendered by ggml-dispatch"):
        render.parse_header("#define FOO 1\n", "x.h")
    h = render.render_header(tbl.empty_table()).replace(
        f"#define GGML_DISPATCH_TABLE_LAYOUT_VERSION {schema.TABLE_LAYOUT_VERSION}",
        "#define GGML_DISPATCH_TABLE_LAYOUT_VERSION 7",
    )
    with pytest.raises(InputError, match="layout version 7"):
        render.parse_header(h, "x.h")


def test_rules_carry_configuration_codes_that_parse_back() -> None:
    t = table_for(schema.GpuId("G", 900, 1))
    t["rules"][0] = {**t["rules"][0], "config": "mmq/j=64,stream_k=off", "route": "mmq"}
    t = tbl.validate(t)
    header = render.render_header(t)
    code = registry.Config.parse("mmq/j=64,stream_k=off").code
    assert f"}}, {t['rules'][0]['M_lo']}, {t['rules'][0]['M_hi']}, {code} }}," in header
    parsed, _ = render.parse_header(header)
    assert parsed["rules"][0]["config"] == "mmq/j=64,stream_k=off" and parsed["rules"][0]["route"] == "mmq"
    with pytest.raises(InputError, match="unknown code"):
        render.parse_header(header.replace(f", {code} }},", f", {code | 0x7F000} }},"), "x.h")


def test_filters_refuse_what_is_not_their_type() -> None:
    with pytest.raises(TypeError):
        render.c_int("1); evil(")
    with pytest.raises(TypeError):
        render.c_int(True)
    with pytest.raises(TypeError):
        render.c_string(5)
    assert render.c_string('a"b\\c?') == '"a\\042b\\134c\\077"'
    assert render.c_string("1\x002") == '"1\\0002"'  # octal escapes are 3 digits: never swallow a digit


def test_the_hook_reads_the_layout_version_codegen_writes() -> None:
    source = (
        Path(__file__).parent.parent / "ggml_dispatch" / "hook" / "native" / "ggml-dispatch.cu"
    ).read_text()
    v = schema.TABLE_LAYOUT_VERSION
    assert f"#define GGML_DISPATCH_TABLE_EXPECTED_LAYOUT_VERSION {v}\n" in source
    assert f"#if GGML_DISPATCH_TABLE_LAYOUT_VERSION != {v}\n" in source
    probe = (Path(__file__).parent / "native" / "cpu_probe" / "probe.c").read_text()
    assert f"GGML_DISPATCH_TABLE_LAYOUT_VERSION == {v} &&" in probe
