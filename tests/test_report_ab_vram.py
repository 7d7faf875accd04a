"""Peak GPU memory of each A/B run (ggml-dispatch ab --vram), the per-arm environment (--arm-env), the
cached arm, and the report's column. nvidia-smi and llama-bench are stand-ins (no GPU here): shell
scripts that answer as the real ones do."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_report_ab_records import TABLE_HASH, fake_llama_bench

from ggml_dispatch.artifacts import ab
from ggml_dispatch.cli import main
from ggml_dispatch.errors import InputError
from ggml_dispatch.report import abrun
from ggml_dispatch.report.ab import load_ab
from ggml_dispatch.report.analysis import ab_arm_vram


def test_nvidia_smi_parsing() -> None:
    text = "4242, 2048\n17, 99\n4242, 1024\n"
    assert abrun.parse_compute_apps(text, 4242) == 3072.0
    assert abrun.parse_compute_apps(text, 5) is None
    assert abrun.parse_compute_apps("No running processes found\n", 1) is None
    assert abrun.parse_memory_used("81234\n") == 81234.0
    assert abrun.parse_memory_used("[N/A]\n") is None


def _smi(tmp_path: Path, per_process: bool) -> Path:
    """A stand-in nvidia-smi: memory.used rises from 1000 MiB while a run is alive; with per_process it
    lists the run's pid (which the fake llama-bench writes) at 3000 MiB."""
    d = tmp_path / "smi"
    d.mkdir()
    smi = d / "nvidia-smi"
    pidfile = tmp_path / "bench.pid"
    apps = f'[ -f "{pidfile}" ] && echo "$(cat "{pidfile}"), 3000"' if per_process else "true"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-compute-apps=*) {apps} ;;\n"
        f'  --query-gpu=memory.used) if [ -f "{pidfile}" ]; then echo 1700; else echo 1000; fi ;;\n'
        '  *) echo "NVIDIA H200, GPU-1, 580" ;;\n'
        "esac\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return d


def _slow_bench(tmp_path: Path) -> Path:
    fake = fake_llama_bench(tmp_path)
    pidfile = tmp_path / "bench.pid"
    text = (
        fake.read_text().replace("#!/bin/sh\n", f'#!/bin/sh\necho $$ > "{pidfile}"\nsleep 1\n', 1)
        + f'rm -f "{pidfile}"\n'
    )
    fake.write_text(text)
    return fake


@pytest.mark.parametrize(
    ("per_process", "peak", "source"), [(True, 3000.0, "process"), (False, 700.0, "device")]
)
def test_each_record_carries_its_runs_peak_vram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_process: bool, peak: float, source: str
) -> None:
    smi = _smi(tmp_path, per_process)
    monkeypatch.setenv("PATH", f"{smi}{os.pathsep}{os.environ['PATH']}")
    fake = _slow_bench(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runner = abrun.Runner(abrun.Gpu("NVIDIA H200", "GPU-1", "580"), reps=1, vram=True)
    arms = [
        abrun.Arm("stock", fake, "off"),
        abrun.Arm("cached", fake, "table", (("GGML_CUDA_DISPATCH_CACHE", "0"),)),
    ]
    out = tmp_path / "ab.jsonl"
    monkeypatch.delenv("GGML_CUDA_ROUTE_TRACE", raising=False)
    assert abrun.run_ab(runner, arms, [("m", model)], ["-p 512 -n 0"], 1, out) == 4
    recs = [r for _, r in ab.read_file(out)]
    for r in recs:
        assert r.provenance is not None
        assert r.provenance.peak_vram_mib == peak and r.provenance.vram_source == source
        assert dict(r.provenance.env).get("GGML_CUDA_DISPATCH_CACHE") == ("0" if r.arm == "cached" else None)
    ab.check_records(ab.read_file(out), out, TABLE_HASH)  # the cached arm applied a table
    records, _ = load_ab([out])
    vram = ab_arm_vram(records)
    assert set(vram.values()) == {peak} and {k[3] for k in vram} == {"stock", "cached"}


def test_reader_refuses_a_bad_peak(tmp_path: Path) -> None:
    fake = fake_llama_bench(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    out = tmp_path / "ab.jsonl"
    abrun.run_ab(
        abrun.Runner(abrun.Gpu("G", "U", "D"), reps=1),
        [abrun.Arm("stock", fake, "off")],
        [("m", model)],
        ["-p 512 -n 0"],
        1,
        out,
    )
    rec = json.loads(out.read_text().splitlines()[0])
    assert "peak_vram_mib" not in rec  # not measured: no field, not a guess
    for bad, field in ((-1, "peak_vram_mib"), ("lots", "peak_vram_mib"), (5.0, "vram_source")):
        p = tmp_path / f"bad-{field}-{bad}.jsonl"
        p.write_text(json.dumps({**rec, "peak_vram_mib": bad}) + "\n")
        with pytest.raises(InputError, match=field):
            ab.read_file(p)


def test_arm_env_is_checked() -> None:
    assert abrun.parse_arm_env("cached=GGML_CUDA_DISPATCH_CACHE=0") == (
        "cached",
        "GGML_CUDA_DISPATCH_CACHE",
        "0",
    )
    res = CliRunner().invoke(
        main, ["ab", "--arm", "stock=x", "--arm-env", "stock=PATH=/x", "--model", "m", "-o", "o.jsonl"]
    )
    assert res.exit_code == 2 and "ARM=GGML_VAR=VALUE" in res.output
