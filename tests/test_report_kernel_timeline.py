"""The kernel-timeline format: the writer (ggml_dispatch/report/native/kernel_timeline.cpp, a CUPTI injection
library)
and the reader (report.timeline.parse_ktl) agree.

Without a GPU the library cannot run, so the records are produced from the writer's own ``fprintf``
formats, read out of its source, with values a real run would give; the specification in the source's
header comment must list the same records with the same fields. Where CUDA's CUPTI headers are present,
the library is also built with the make rule the GPU runs use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ggml_dispatch.errors import InputError
from ggml_dispatch.report import timeline

REPO = Path(__file__).resolve().parent.parent
WRITER = REPO / "ggml_dispatch" / "report" / "native" / "kernel_timeline.cpp"

_FPRINTF = re.compile(r'std::fprintf\(g_out,\s*((?:"(?:[^"\\]|\\.)*"\s*|PRIu64\s*)+)')


def writer_formats() -> dict[str, str]:
    """Record kind -> the printf format the writer emits it with (string pieces and PRIu64 joined)."""
    out: dict[str, str] = {}
    for m in _FPRINTF.finditer(WRITER.read_text()):
        pieces = re.findall(r'"((?:[^"\\]|\\.)*)"|(PRIu64)', m.group(1))
        fmt = "".join(lit if not macro else "llu" for lit, macro in pieces)
        fmt = fmt.encode().decode("unicode_escape")
        kind = fmt.split(" ", 1)[0] if not fmt.startswith("#") else "#"
        assert kind not in out, f"two formats for record {kind!r}"
        out[kind] = fmt
    return out


def emit(fmt: str, *values: object) -> str:
    """printf as C does it, for the conversions the writer uses."""
    return re.sub(r"%(?:llu|zu|u|d)", "%d", fmt) % values


def test_the_writer_emits_every_record_of_the_specification() -> None:
    fmts = writer_formats()
    assert fmts["#"] == timeline.FORMAT + "\n"
    spec = {}
    for line in WRITER.read_text().splitlines():
        m = re.match(r"//   ([NKCSD]) ((?:<[^>]+> ?)+)", line)
        if m:
            spec[m.group(1)] = m.group(2).split("> <")
    assert set(spec) == set(fmts) - {"#"} == {"N", "K", "C", "S", "D"}
    for kind, fields in spec.items():
        conversions = re.findall(r"%(?:llu|zu|u|d|s)", fmts[kind])
        assert len(conversions) == len(fields), (kind, fmts[kind], fields)
        assert fmts[kind].endswith("\n")


def test_a_file_in_the_writers_format_is_read_back(tmp_path: Path) -> None:
    f = writer_formats()
    mmq = "_Z9mul_mat_qIL9ggml_type12ELi128ELb0EEvPKcPKiS4_S4_PfS5_iiiiiiiiiiiiiiiii"
    norm = "_Z12rms_norm_f32ILi1024ELb1ELb0ELb0EEvPKfPfilllfS1_lll5uint3S3_S3_S3_S1_lllS3_S3_S3_S3_f"
    cublas = "sm90_xmma_gemm_f16f16_f16f16_f16_tn_n_tilesize128x128x64_warpgroupsize1x1x1_kernel__5x_cublas"
    t0 = 1_764_500_000_000_000_000  # CUPTI timestamps are ns since the epoch: beyond 32 bits
    text = "".join(
        [
            f["#"],
            emit(f["C"], t0, t0 + 400, 7, 98_000_000, 1),  # the model upload, before any kernel
            emit(f["N"], 0, mmq),
            emit(f["K"], t0 + 1_000, t0 + 3_000, 7, 0, 0),
            emit(f["N"], 1, norm),
            emit(f["K"], t0 + 2_000, t0 + 4_000, 13, 5, 1),  # a graph node on another stream, overlapping
            emit(f["S"], t0 + 4_500, t0 + 4_600, 7, 4096),
            emit(f["N"], 2, cublas),
            emit(f["K"], t0 + 5_000, t0 + 6_000, 7, 5, 2),
            emit(f["K"], t0 + 6_000, t0 + 6_500, 7, 5, 0),
            emit(f["D"], 0),
        ]
    )
    path = tmp_path / "stock.512.ktl"
    path.write_text(text)
    with path.open() as fh:
        tl = timeline.parse_ktl(fh, path)
    assert tl.dropped == 0
    assert sorted(tl.kernels) == [
        (t0 + 1_000, t0 + 3_000, "mmq"),
        (t0 + 2_000, t0 + 4_000, "other"),
        (t0 + 5_000, t0 + 6_000, "cublas"),
        (t0 + 6_000, t0 + 6_500, "mmq"),
    ]
    assert sorted(tl.copies) == [(t0, t0 + 400), (t0 + 4_500, t0 + 4_600)]
    assert sorted(zip(tl.copies, tl.copy_bytes, strict=True))[1] == ((t0 + 4_500, t0 + 4_600), 4096)
    # a run killed before exit has no D line: the reader refuses it, naming the file and last line
    cut = "".join(text.splitlines(keepends=True)[:-1])
    with pytest.raises(InputError, match=r"stock\.512\.ktl:10: truncated: no closing D line"):
        timeline.parse_ktl(cut.splitlines(), path)


def test_the_real_profile_was_written_in_this_format() -> None:
    """Every record kind of a real timeline (tables/, the H200 profile) has the writer's field count."""
    import tarfile

    counts = {k: len(re.findall(r"%(?:llu|zu|u|d|s)", v)) for k, v in writer_formats().items() if k != "#"}
    with tarfile.open(REPO / "tables" / "cuda-sm90-nvidia-h200" / "profile.tar.xz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("table.512.ktl"))
        fh = tar.extractfile(member)
        assert fh is not None
        lines = fh.read().decode().splitlines()
    assert lines[0] == timeline.FORMAT and lines[-1].startswith("D ")
    seen = set()
    for line in lines[1:]:
        kind, *fields = line.split(" ", counts["N"] if line.startswith("N ") else -1)
        seen.add(kind)
        assert len(fields) == counts[kind], line
    assert {"N", "K", "D"} <= seen


def _cuda_home() -> Path | None:
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda", nvcc and Path(nvcc).resolve().parent.parent]
    for c in candidates:
        if c and (Path(c) / "include" / "cupti.h").is_file():
            return Path(c)
    return None


@pytest.mark.slow
@pytest.mark.skipif(_cuda_home() is None, reason="no CUDA toolkit with CUPTI headers on this machine")
def test_the_library_builds_with_the_make_rule_and_exports_the_injection_entry(tmp_path: Path) -> None:
    """`make .carry/libkernel_timeline.so` as `make device-profile-carry` runs it (it runs only on a GPU)."""
    home = _cuda_home()
    assert home is not None
    lib = tmp_path / "libkernel_timeline.so"
    cmd = ["make", "-s", f"CARRY={tmp_path}", f"CUDA_HOME={home}", str(lib)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    assert " T InitializeInjection" in nm.stdout
    assert (tmp_path / "libcupti.so.13").is_file()
