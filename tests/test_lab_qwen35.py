"""lab.qwen35: a Qwen3.5-27B-shaped GGUF of architecture qwen35, checked against the pinned tree's loader
as parsed from its C++ source (no llama.cpp build here: CI has 2 cores)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from lab import qwen35

FULL = qwen35.Qwen35()
# a written file's size: 4 trunk layers (one group of the hybrid pattern) and the MTP block at real
# shapes, the vocabulary cut so that token_embd / output stay small (about 1.5 GB in all)
REDUCED = dataclasses.replace(FULL, layers=4, vocab=4096)


def _loader(tree: Path) -> tuple[list[qwen35.LoaderTensor], dict[str, bool]]:
    return qwen35.loader_tensors(tree), qwen35.loader_keys(tree)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("qwen35") / "reduced.gguf"
    qwen35.write(path, REDUCED, seed=3)
    yield path
    path.unlink()  # pytest keeps the last sessions' temporary folders; this file is large


def test_the_configuration_is_qwen3_5_27b() -> None:
    d = FULL
    assert (d.hidden, d.ffn, d.layers, d.vocab, d.mtp_layers) == (5120, 17408, 64, 248320, 1)
    assert (d.heads, d.kv_heads, d.head_dim, d.heads // d.kv_heads) == (24, 4, 256, 6)
    assert (d.linear_key_heads, d.linear_value_heads) == (16, 48)
    assert (d.linear_key_head_dim, d.linear_value_head_dim) == (128, 128)
    assert (d.key_dim, d.value_dim, d.conv_dim, d.conv_kernel) == (2048, 6144, 10240, 4)
    assert (d.full_attention_interval, d.rope_dim, d.rope_theta) == (4, 64, 1e7)
    assert d.mrope_section == (11, 11, 10)
    assert (d.rms_eps, d.context, d.block_count) == (1e-6, 262144, 65)
    d.validate()


def test_the_hybrid_pattern_has_16_full_attention_layers_and_the_mtp_block_after_them() -> None:
    full_attention = [il for il in range(FULL.block_count) if not FULL.is_recurrent(il)]
    assert full_attention == [*range(3, 64, 4), 64]  # blk.64 is the MTP block
    specs = {s.name: s for s in qwen35.tensor_specs(FULL)}
    assert sum(n.endswith("ssm_out.weight") for n in specs) == 48
    assert sum(n.endswith("attn_q.weight") for n in specs) == 16 + 1
    assert "blk.64.nextn.eh_proj.weight" in specs and "blk.65.attn_norm.weight" not in specs


def test_the_trunk_projections_total_24_35_g() -> None:
    counts = qwen35.trunk_projections(FULL)
    total = sum(counts.values())
    assert total == 24_350_556_160
    assert abs(total / 24.35e9 - 1) < 0.005
    assert counts["ffn_down.weight"] == 64 * 17408 * 5120
    assert counts["attn_q.weight"] == 16 * 5120 * 2 * 24 * 256
    assert counts["attn_qkv.weight"] == 48 * 5120 * 10240
    assert counts["ssm_alpha.weight"] == counts["ssm_beta.weight"] == 48 * 5120 * 48
    # no embeddings, head, MTP block or conv kernels
    left_out = {"token_embd.weight", "output.weight", "nextn.eh_proj.weight", "ssm_conv1d.weight"}
    assert not left_out & set(counts)


def test_the_count_command_prints_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert qwen35.main(["count"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "24,350,556,160" in last and "24.35 G" in last


def test_the_full_depth_configuration_matches_the_loader_without_writing_weights(tree: Path) -> None:
    kv, shapes = qwen35.specs_as_file(FULL)
    assert qwen35.check(kv, shapes, *_loader(tree)) == []
    for layers in (4, 8, 60):
        kv, shapes = qwen35.specs_as_file(dataclasses.replace(FULL, layers=layers))
        assert qwen35.check(kv, shapes, *_loader(tree)) == [], layers


def test_the_loader_parse_finds_each_scope(tree: Path) -> None:
    by_scope: dict[str, set[str]] = {}
    for t in qwen35.loader_tensors(tree):
        if t.required:
            by_scope.setdefault(t.scope, set()).add(t.name.replace("blk.%d.", ""))
    assert by_scope["global"] == {"token_embd.weight", "output_norm.weight"}
    assert {"ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_out.weight"} <= by_scope["recr"]
    assert {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q_norm.weight"} <= by_scope["attn"]
    assert {"ffn_gate.weight", "post_attention_norm.weight"} <= by_scope["trunk"]
    assert {"nextn.eh_proj.weight", "nextn.enorm.weight", "attn_output.weight"} <= by_scope["mtp"]
    keys = qwen35.loader_keys(tree)
    assert keys["qwen35.ssm.time_step_rank"] and keys["qwen35.rope.dimension_sections"]
    assert keys["qwen35.full_attention_interval"] is False


def test_check_reports_what_the_loader_would_refuse(tree: Path) -> None:
    kv, shapes = qwen35.specs_as_file(REDUCED)
    shapes.pop("blk.1.ssm_a")
    shapes["blk.3.attn_k.weight"] = (5120, 2048)
    shapes["blk.2.attn_q.weight"] = (5120, 12288)  # a DeltaNet layer has no attn_q
    problems = qwen35.check(kv, shapes, *_loader(tree))
    assert problems == [
        "blk.1.ssm_a: required, missing",
        "blk.3.attn_k.weight: ne [5120, 2048], the loader wants [5120, 1024]",
        "blk.2.attn_q.weight: the loader does not create it",
    ]
    del kv["qwen35.ssm.group_count"]
    assert qwen35.check(kv, shapes, *_loader(tree)) == ["key qwen35.ssm.group_count is missing"]


def test_the_k_quant_encoders_write_blocks_gguf_reads_back() -> None:
    x = (np.random.default_rng(0).standard_normal((64, 256)) * 0.02).astype(np.float32)
    x[0] = 0.0  # a zero block: scales 0, no division by zero
    for name, encode in (("Q5_K", qwen35.encode_q5_k), ("Q6_K", qwen35.encode_q6_k)):
        qtype = gguf.GGMLQuantizationType[name]
        blocks = encode(x)
        assert blocks.dtype == np.uint8 and blocks.shape == (64, gguf.GGML_QUANT_SIZES[qtype][1])
        back = gguf.quants.dequantize(blocks.reshape(-1), qtype).reshape(x.shape)
        assert np.all(back[0] == 0)
        # within half a quantization step of each sub-block (5 / 6 bits of its range)
        bound = 0.5 * (np.abs(x).max() * 2 / 31 if name == "Q5_K" else np.abs(x).max() / 31) * 1.1
        assert np.abs(back - x).max() < bound, name
        assert np.corrcoef(back[1:].ravel(), x[1:].ravel())[0, 1] > 0.99


def test_the_written_model_reads_back_with_the_loaders_tensors(reduced: Path, tree: Path) -> None:
    kv, shapes, types = qwen35.read(reduced)
    assert kv["general.architecture"] == "qwen35"
    assert qwen35.check_file(reduced, tree) == []
    assert kv["qwen35.block_count"] == 5 and kv["qwen35.nextn_predict_layers"] == 1
    assert kv["qwen35.attention.recurrent_layers"] == [True, True, True, False, False]
    assert kv["qwen35.rope.dimension_sections"] == [11, 11, 10, 0]
    assert kv["qwen35.vocab_size"] == 4096 and kv["tokenizer.ggml.model"] == "none"
    # every per-layer tensor has the full-depth configuration's shape
    full = {s.name: s.ne for s in qwen35.tensor_specs(FULL)}
    for name, ne in shapes.items():
        if name.startswith("blk.4."):  # the MTP block is blk.64 at full depth
            assert full[name.replace("blk.4.", "blk.64.", 1)] == ne, name
        elif name.startswith("blk."):
            assert full[name] == ne, name
    assert shapes["blk.0.attn_qkv.weight"] == (5120, 10240)
    assert shapes["blk.0.ssm_conv1d.weight"] == (4, 10240)
    assert shapes["blk.3.attn_q.weight"] == (5120, 12288)
    assert shapes["blk.3.attn_output.weight"] == (6144, 5120)
    assert shapes["blk.4.nextn.eh_proj.weight"] == (10240, 5120)
    mtp = {"nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight", "attn_output.weight"}
    assert {f"blk.4.{r}" for r in mtp} <= set(shapes)
    assert not any(n.startswith(("blk.3.ssm_", "blk.0.attn_q.")) for n in shapes)
    assert types == {name: qwen35.tensor_type(name) for name in shapes}
    assert types["blk.0.ffn_up.weight"] == "Q5_K" and types["blk.0.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.ssm_out.weight"] == "Q8_0" and types["blk.3.attn_v.weight"] == "Q8_0"
    for name in ("blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.4.nextn.enorm.weight"):
        assert types[name] == "F32", name


def test_the_written_weights_are_real_blocks(reduced: Path) -> None:
    r = gguf.GGUFReader(reduced)
    tensors = {t.name: t for t in r.tensors}
    for name in (
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_down.weight",
        "blk.0.ssm_out.weight",
        "blk.4.attn_v.weight",
    ):
        t = tensors[name]
        values = gguf.quants.dequantize(np.asarray(t.data[:4]), t.tensor_type)
        assert np.all(np.isfinite(values)) and 0.01 < float(values.std()) < 0.03, name
    assert np.all(np.asarray(tensors["blk.0.attn_norm.weight"].data) == 1.0)
    ssm_a = np.asarray(tensors["blk.1.ssm_a"].data)
    assert np.all((ssm_a <= -1.0) & (ssm_a >= -16.0))
    assert np.all(np.asarray(tensors["blk.2.ssm_dt.bias"].data) < 0)  # softplus(bias) = dt <= 0.1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["write", "--layers", "0"], "--layers must be a multiple of 4"),
        (["write", "--layers", "6"], "not 6"),
        (["write", "--layers", "68"], "from 4 to 64"),
        (["write", "--vocab", "0"], "--vocab must be from 1 to 248320"),
        (["count", "--layers", "-4"], "--layers must be a multiple of 4"),
    ],
)
def test_a_bad_request_fails_with_one_message(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.gguf"
    args = [*argv, "-o", str(out)] if argv[0] == "write" else argv
    with pytest.raises(SystemExit) as e:
        qwen35.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("python -m lab.qwen35: error:")
    assert not out.exists()


def test_a_missing_folder_fails_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        qwen35.main(["write", "--layers", "4", "-o", str(tmp_path / "no" / "m.gguf")])
    assert "does not exist" in capsys.readouterr().err


def test_the_check_command(reduced: Path, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert qwen35.main(["check", str(reduced), "--tree", str(tree)]) == 0
    assert capsys.readouterr().out.strip().endswith(": ok")


def test_a_declared_census_of_the_model_lists_every_projection_of_the_delta_net_and_mtp_blocks(
    reduced: Path,
) -> None:
    # `census from-gguf` (autotune's census without a trace) must see the gated-delta-net layers'
    # projections (attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out) and the MTP block's eh_proj: in
    # the traced seed workload they are an eighth of the matmul time
    from ggml_dispatch.census import aggregate, estimate, gguf_meta

    spec = estimate.lookup_name("h200")
    assert spec is not None
    rows = aggregate.declared_rows(gguf_meta.read_gguf(reduced), [1, 3], 1, spec)
    listed = {r["tensor"]: r["role"] for r in rows}
    quantized_2d = {s.name for s in qwen35.tensor_specs(REDUCED) if s.type != "F32" and len(s.ne) == 2}
    assert set(listed) == quantized_2d - {"token_embd.weight"}  # token_embd is read by GET_ROWS only
    assert {listed[f"blk.0.{r}.weight"] for r in ("attn_gate", "ssm_alpha", "ssm_beta", "ssm_out")} == {
        "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out"
    }  # fmt: skip
    mtp = REDUCED.layers  # the MTP block follows the trunk
    assert listed[f"blk.{mtp}.nextn.eh_proj.weight"] == "nextn.eh_proj"
    assert "other" not in listed.values()
