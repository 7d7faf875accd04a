"""The executor seam of ``tune run`` without a harness build: the Ray task resources, the mixed-GPU
refusal, the options that need ``--executor ray``, a missing Ray, and the multi-GPU spread summary
on synthetic rows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggml_dispatch import schema
from ggml_dispatch.cli import main as cli_main
from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner import executor_spread
from ggml_dispatch.tuner.executor import check_sweep_gpus, gpu_id
from ggml_dispatch.tuner.executor_ray import node_slots, parse_resources, task_options
from tests.test_tuner_native import census_row, write_census


def test_task_resources() -> None:
    assert parse_resources("GPU=1") == {"GPU": 1.0, "CPU": 1.0}
    assert parse_resources(" CPU=1 ") == {"CPU": 1.0}
    assert parse_resources("GPU=1,CPU=2,nvlink=0.5") == {"GPU": 1.0, "CPU": 2.0, "nvlink": 0.5}
    assert task_options(parse_resources("GPU=1")) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert task_options(parse_resources("CPU=1,x=2")) == {
        "num_cpus": 1.0,
        "num_gpus": 0.0,
        "resources": {"x": 2.0},
    }
    for bad in ("GPU", "GPU=one", "=1", "GPU=-1", "GPU=0", "", "GPU=nan"):
        with pytest.raises(InputError, match="ray-resources"):
            parse_resources(bad)
    # a node with 4 GPUs and 16 CPUs runs 4 one-GPU cases at once; a CPU-only node none
    assert node_slots({"GPU": 4.0, "CPU": 16.0}, parse_resources("GPU=1")) == 4
    assert node_slots({"GPU": 8.0, "CPU": 3.0}, parse_resources("GPU=1")) == 3
    assert node_slots({"CPU": 16.0}, parse_resources("GPU=1")) == 0
    assert node_slots({"CPU": 2.0}, parse_resources("CPU=1")) == 2
    assert node_slots({"GPU": 1.0, "CPU": 4.0}, parse_resources("GPU=0.5")) == 2


def header(name: str, cc: int = 900, sm: int = 132, uuid: str = "") -> dict[str, Any]:
    return {"gpu_name": name, "gpu_cc": cc, "gpu_sm_count": sm, "gpu_uuid": uuid}


def test_mixed_gpu_models(tmp_path: Path) -> None:
    journal = tmp_path / "t.parquet.journal.jsonl"
    h200 = {gpu_id(header("NVIDIA H200", uuid=f"GPU-{i}")): f"case {i}" for i in range(4)}
    assert list(h200) == [schema.GpuId("NVIDIA H200", 900, 132)]  # four GPUs of one model
    check_sweep_gpus(h200, journal, allow_mixed=False)
    cut = {**h200, gpu_id(header("NVIDIA H200", sm=114)): "case q4_0:N64:K256:M8"}  # another SM count
    with pytest.raises(InputError) as e:
        check_sweep_gpus(cut, journal, allow_mixed=False)
    assert e.value.render() == (
        f"{journal}: gpu_name: cases come from 2 GPUs (NVIDIA H200 cc 900 114 SMs (case q4_0:N64:K256:M8); "
        "NVIDIA H200 cc 900 132 SMs (case 3)); a table belongs to one GPU (name, cc and SM count): "
        "split the inputs, or pass --allow-mixed"
    )
    check_sweep_gpus(cut, journal, allow_mixed=True)
    assert gpu_id({}) == schema.GpuId("", 0, 0)


@pytest.fixture()
def census(tmp_path: Path) -> Path:
    return write_census(tmp_path / "census.parquet", [census_row("q4_0", 1, 64, 256, 50.0)])


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli_main, list(args), catch_exceptions=False)


def test_options_that_need_the_ray_executor(census: Path, tmp_path: Path) -> None:
    base = ["tune", "run", str(census), "--llama-cpp", str(tmp_path), "-o", str(tmp_path / "t.parquet")]
    r = invoke(*base, "--address", "10.0.0.1:6379")
    assert r.exit_code == 2 and "Error: --address needs --executor ray" in r.output
    r = invoke(*base, "--executor", "ray", "--device", "CUDA1")
    assert (
        r.exit_code == 2 and "Error: --device with --executor ray: Ray assigns each case its GPU" in r.output
    )
    r = invoke(*base, "--executor", "ray", "--ray-resources", "GPU=x")
    assert r.exit_code == 2 and "Invalid value for --ray-resources: 'GPU=x' is not NAME=AMOUNT" in r.output
    assert not list(tmp_path.glob("t.parquet*"))


def test_without_ray_installed_the_message_says_how(
    census: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    base = ["tune", "run", str(census), "--llama-cpp", str(tmp_path), "-o", str(tmp_path / "t.parquet")]
    r = invoke(*base, "--executor", "ray")
    assert r.exit_code == 1 and "pip install 'ggml-dispatch[ray]'" in r.output
    assert not list(tmp_path.glob("t.parquet*"))


def row(
    M: int, route: str, trial: int, us: float | None, anchor: float, gpu: str, status: str = "ok"
) -> dict[str, Any]:
    return {
        "op": "MUL_MAT",
        "layout": "weight",
        "src0_type": "q4_0",
        "src1_type": "f32",
        "M": M,
        "N": 4096,
        "K": 4096,
        "B": 1,
        "route": route,
        "trial": trial,
        "us": us,
        "anchor_us": anchor,
        "status": status,
        "gpu_uuid": gpu,
    }


def test_spread_of_a_multi_gpu_sweep_against_one_gpu() -> None:
    # M=1 on GPU-a: 10.0/10.2/9.8 against 10.0/10.1/9.9 (agrees); M=8 on GPU-b: 13 against 10 (does not)
    multi = [
        *(row(1, "mmvq", t, us, 20.0, "GPU-a") for t, us in enumerate((10.0, 10.2, 9.8))),
        *(row(1, "mmq", t, None, 20.0, "GPU-a", "ineligible") for t in range(3)),
        *(row(8, "mmq", t, 13.0, 30.0, "GPU-b") for t in range(3)),
        row(64, "mmq", 0, 5.0, 6.0, "GPU-b"),  # not in the one-GPU sweep
    ]
    single = [
        *(row(1, "mmvq", t, us, 20.0 + t, "GPU-0") for t, us in enumerate((10.0, 10.1, 9.9))),
        *(row(8, "mmq", t, 10.0, 30.0, "GPU-0") for t in range(3)),
    ]
    s = executor_spread.spread(multi, single)
    by = {(c["M"], c["route"]): c for c in s["cases"]}
    assert set(by) == {(1, "mmvq"), (1, "stock"), (8, "mmq"), (8, "stock")}
    m1 = by[(1, "mmvq")]
    assert m1["gpu"] == "GPU-a" and m1["ratio"] == pytest.approx(1.0) and m1["noise"] == pytest.approx(0.04)
    assert m1["agrees"]
    stock = by[(1, "stock")]  # stock once per trial from anchor_us, not once per row
    assert (
        stock["multi_us"] == 20.0 and stock["single_us"] == 21.0 and stock["noise"] == pytest.approx(2 / 21)
    )
    assert stock["agrees"]
    m8 = by[(8, "mmq")]
    assert m8["ratio"] == pytest.approx(1.3) and m8["noise"] == 0.0 and not m8["agrees"]
    assert s["per_gpu"]["GPU-b"] == {
        "cases": 2,
        "median_ratio": pytest.approx(1.15),
        "min_ratio": 1.0,
        "max_ratio": pytest.approx(1.3),
        "agree_within_noise": 1,
    }
    assert s["per_gpu"]["GPU-a"]["agree_within_noise"] == 2
    assert s["only_multi"] == 2 and s["only_single"] == 0  # M=64 mmq and its stock


def test_cost_of_a_multi_gpu_sweep() -> None:
    def rec(case: str, wall: float, gpu: str | None) -> dict[str, Any]:
        r: dict[str, Any] = {"case": case, "wall_s": wall}
        if gpu is not None:
            r["placement"] = {"node_id": "n1", "node_ip": "10.0.0.1", "gpu_ids": [gpu]}
        return r

    multi = [rec("a", 2.0, "0"), rec("b", 3.0, "1"), rec("c", 1.0, "0"), rec("d", 4.0, "1")]
    single = [rec(c, w, None) for c, w in (("a", 2.0), ("b", 3.0), ("c", 1.0), ("d", 4.0))]
    walls = executor_spread.phase_walls(
        [
            '{"phase": "multi", "wall_s": 4.0}',
            "",
            '{"phase": "multi", "wall_s": 2.5}',
            '{"phase": "single", "wall_s": 11}',
        ]
    )
    assert walls == {"multi": 6.5, "single": 11.0}
    c = executor_spread.cost(
        multi, single, multi_wall_s=walls["multi"], single_wall_s=walls["single"], gpus=2
    )
    assert c["busy_s"] == {"10.0.0.1/0": 3.0, "10.0.0.1/1": 7.0} and c["multi_case_s"] == 10.0
    assert c["multi_device_s"] == 13.0 and c["single_case_s"] == 10.0
    assert c["speedup"] == pytest.approx(11 / 6.5)
    assert c["wall_over_ideal"] == pytest.approx(6.5 / 5.5) and c["target_met"]  # 6.5 <= 1.2 x 5.5
    slow = executor_spread.cost(multi, single, multi_wall_s=7.0, single_wall_s=11.0, gpus=2)
    assert not slow["target_met"]
