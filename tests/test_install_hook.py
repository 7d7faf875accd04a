"""``ggml-dispatch install`` on the real pinned tree: the hook applies, is idempotent, stamps provenance,
refuses a fork whose dispatch code differs (naming hunk and function), and uninstall restores the tree
byte for byte."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggml_dispatch import codes, fetch, registry, schema
from ggml_dispatch.cli import main
from ggml_dispatch.hook import fit, patch, upstream
from ggml_dispatch.hook import install as inst

CUDA = Path("ggml/src/ggml-cuda")


@pytest.fixture(scope="module")
def pinned() -> Path:
    return fetch.llama_cpp_dir()


@pytest.fixture
def tree(pinned: Path, tmp_path: Path) -> Path:
    """The files install touches, copied out of the pinned tree (which is never modified)."""
    t = tmp_path / "llama.cpp"
    (t / CUDA).mkdir(parents=True)
    shutil.copy2(pinned / CUDA / "ggml-cuda.cu", t / CUDA / "ggml-cuda.cu")
    shutil.copy2(pinned / CUDA / "mmq.cu", t / CUDA / "mmq.cu")
    shutil.copy2(pinned / CUDA / "mmq.cuh", t / CUDA / "mmq.cuh")
    shutil.copy2(pinned / CUDA / "fattn.cu", t / CUDA / "fattn.cu")
    shutil.copy2(pinned / CUDA / "fattn-common.cuh", t / CUDA / "fattn-common.cuh")
    shutil.copy2(pinned / CUDA / "mmvq.cu", t / CUDA / "mmvq.cu")
    shutil.copy2(pinned / CUDA / "mmvf.cu", t / CUDA / "mmvf.cu")
    (t / "UPSTREAM_COMMIT").write_text(schema.PINNED_UPSTREAM_COMMIT + "\n")
    return t


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def h200_table(commit: str = schema.PINNED_UPSTREAM_COMMIT) -> dict[str, Any]:
    from ggml_dispatch.codegen import table

    t = table.empty_table()
    t["gpu"] = {"name": "NVIDIA H200", "cc": 900, "sm_count": 132}
    t["upstream_commit"] = commit
    t["provenance"] = {"source": "measured"}
    t["rules"] = [
        {
            "op": "MUL_MAT",
            "layout": "weight",
            "src0_type": "q4_1",
            "src1_type": "f32",
            "N": 576,
            "K": 576,
            "B": 1,
            "M_lo": 2,
            "M_hi": 8,
            "route": "mmq",
        }
    ]
    return t


def write_table(path: Path, t: dict[str, Any]) -> Path:
    from ggml_dispatch.codegen import table

    path.write_text(table.dumps(t))
    return path


def test_spec_parses_and_names_every_hunk() -> None:
    hunks = inst.load_hunks()
    names = [h.name for h in hunks]
    assert len(names) == len(set(names)) >= 10
    assert {h.kind for h in hunks} <= set(patch.KINDS)
    assert {"mul_mat_cascade", "mul_mat_id_cascade"} <= {h.name for h in hunks if h.kind == "require"}
    assert all(h.function for h in hunks)


def test_hook_applies_to_pinned_tree_and_reverts_exactly(pinned: Path) -> None:
    src = (pinned / CUDA / "ggml-cuda.cu").read_text()
    hunks = inst.load_hunks()
    patched = patch.apply(src, hunks)
    assert patched != src
    assert inst.HOOK_MARKER in patched
    assert patched.count("ggml_cuda_mul_mat_dispatch(ctx, dst);") == 1
    assert "ggml_cuda_dispatch_note_fused" in patched and "GGML_DISPATCH_PROC_GET_COUNTS" in patched
    assert patch.revert(patched, hunks) == src


def test_install_is_idempotent_and_uninstall_restores_bytes(tree: Path) -> None:
    before = snapshot(tree)
    plan = inst.install(tree)
    assert plan.writes and not plan.unchanged
    cuda = tree / CUDA
    for name in (*inst.NATIVE_SOURCES, inst.TABLE_HEADER, inst.BUILD_HEADER, inst.MANIFEST):
        assert (cuda / name).is_file(), name
    mtimes = {p.name: p.stat().st_mtime_ns for p in cuda.iterdir()}
    installed = snapshot(tree)

    again = inst.install(tree)
    assert again.writes == {}
    assert snapshot(tree) == installed
    assert {p.name: p.stat().st_mtime_ns for p in cuda.iterdir()} == mtimes  # nothing rewritten

    inst.uninstall(tree)
    assert snapshot(tree) == before
    # uninstalling an unpatched tree is a no-op
    assert inst.uninstall(tree).writes == {}


def test_stamps_upstream_commit_and_patch_hash(tree: Path) -> None:
    inst.install(tree)
    build = (tree / CUDA / inst.BUILD_HEADER).read_text()
    phash = inst.patch_hash(inst.native_sources(), inst.load_specs())
    assert re.fullmatch(r"[0-9a-f]{64}", phash)
    assert f'GGML_DISPATCH_UPSTREAM_COMMIT "{schema.PINNED_UPSTREAM_COMMIT}"' in build
    assert f'GGML_DISPATCH_PATCH_HASH "{phash}"' in build
    record = json.loads((tree / CUDA / inst.MANIFEST).read_text())
    assert record["patch_hash"] == phash and record["upstream_commit"] == schema.PINNED_UPSTREAM_COMMIT
    # the native sources travel verbatim
    for name in inst.NATIVE_SOURCES:
        assert (tree / CUDA / name).read_bytes() == (inst.NATIVE_DIR / name).read_bytes()


def test_patch_hash_covers_sources_and_hunks() -> None:
    sources = inst.native_sources()
    specs = inst.load_specs()
    base = inst.patch_hash(sources, specs)
    changed = dict(sources)
    changed["ggml-dispatch.cu"] = sources["ggml-dispatch.cu"] + b"\n"
    assert inst.patch_hash(changed, specs) != base
    for target, hunks in specs.items():
        edited = [
            *hunks[:-1],
            patch.Hunk(hunks[-1].name, hunks[-1].function, hunks[-1].kind, hunks[-1].anchor, "x\n"),
        ]
        assert inst.patch_hash(sources, {**specs, target: edited}) != base, target


def test_upstream_commit_sources(tree: Path, tmp_path: Path) -> None:
    assert upstream.resolve_id(tree, None) == (schema.PINNED_UPSTREAM_COMMIT, str(tree / "UPSTREAM_COMMIT"))
    assert upstream.resolve_id(tree, "A" * 40)[0] == "a" * 40
    assert upstream.resolve_id(tree, "b11549")[0] == "b11549"
    assert upstream.resolve_id(tree, "llama-cpp-python==0.3.36")[0] == "llama-cpp-python==0.3.36"
    for bad in ("abc", "a" * 39, "b", "==0.3", "x==", "b11549 ; rm"):
        with pytest.raises(upstream.UpstreamError, match="40-hex commit, a build number"):
            upstream.resolve_id(tree, bad)
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--upstream-commit", "abc"])
    assert res.exit_code == 2 and "build number" in res.output
    assert not (tree / CUDA / inst.MANIFEST).exists()
    # a registry sdist has neither git metadata nor an UPSTREAM_COMMIT file: it installs on its content
    (tree / "UPSTREAM_COMMIT").unlink()
    plan = inst.install(tree)
    build = (tree / CUDA / inst.BUILD_HEADER).read_text()
    assert 'GGML_DISPATCH_UPSTREAM_COMMIT ""' in build
    fp = upstream.KNOWN_FINGERPRINTS[schema.PINNED_UPSTREAM_COMMIT]
    assert f'GGML_DISPATCH_UPSTREAM_FINGERPRINT "{fp}"' in build
    assert "by content" in plan.messages[-1]
    inst.uninstall(tree)
    if shutil.which("git") is None:
        return
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(tree), "commit", "-qm", "x"], check=True, env={**env, "PATH": "/usr/bin:/bin"}
    )
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    inst.install(tree)
    assert head.strip() in (tree / CUDA / inst.BUILD_HEADER).read_text()


def test_a_fork_with_other_dispatch_code_installs_without_the_stock_route_check(tree: Path) -> None:
    cu = tree / CUDA / "ggml-cuda.cu"
    src = cu.read_text()
    call = "ggml_cuda_should_use_mmvq(src0->type, cc, ne11)) {\n        ggml_cuda_mul_mat_vec_q"
    fork = src.replace(f"    if ({call}", f"    if (ne11 < 4 && {call}")
    assert fork != src
    cu.write_text(fork)
    report = inst.check(tree)
    skipped = report["features"]["stock_route"]
    assert skipped["status"] == "skipped"
    assert "mul_mat_cascade" in skipped["reason"] and "ggml_cuda_mul_mat" in skipped["reason"]
    assert "`if (ne11 < 4 && ggml_cuda_should_use_mmvq(src0->type, cc, ne11)) {`" in skipped["reason"]
    assert report["core"]["status"] == "applied"
    assert all(f["status"] == "applied" for n, f in report["features"].items() if n != "stock_route")
    plan = inst.install(tree)
    assert any(m.startswith("feature stock_route skipped: ") for m in plan.messages)
    mask = sum(1 << f.bit for n, f in registry.FEATURES.items() if n != "stock_route")
    assert f"#define GGML_DISPATCH_FEATURES {mask}u" in (tree / CUDA / inst.BUILD_HEADER).read_text()
    inst.uninstall(tree)
    assert cu.read_text() == fork


def test_refusal_names_function_of_a_missing_anchor(tree: Path) -> None:
    cu = tree / CUDA / "ggml-cuda.cu"
    cu.write_text(cu.read_text().replace('if (strcmp(name, "ggml_backend_get_features") == 0) {', "if (0) {"))
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree)])
    assert res.exit_code == 2
    assert "proc_address" in res.output and "ggml_backend_cuda_reg_get_proc_address" in res.output
    assert not (tree / CUDA / inst.MANIFEST).exists()


def test_refuses_a_duplicated_anchor(tree: Path) -> None:
    cu = tree / CUDA / "ggml-cuda.cu"
    cu.write_text(cu.read_text() + "\nggml_backend_t ggml_backend_cuda_init(int device) {\n")
    with pytest.raises(inst.InstallError, match=r"backend_init.*occurs 2 times"):
        inst.install(tree)


def test_refuses_a_hook_without_record(tree: Path) -> None:
    inst.install(tree)
    (tree / CUDA / inst.MANIFEST).unlink()
    with pytest.raises(inst.InstallError, match="missing"):
        inst.install(tree)


def test_uninstall_keeps_later_unrelated_edits(tree: Path) -> None:
    inst.install(tree)
    cu = tree / CUDA / "ggml-cuda.cu"
    cu.write_text(cu.read_text() + "// a later local edit\n")
    plan = inst.uninstall(tree)
    assert any("edited after install" in m for m in plan.messages)
    text = cu.read_text()
    assert inst.HOOK_MARKER not in text and text.endswith("// a later local edit\n")


def test_table_install_rewrites_only_the_table_header(tree: Path, tmp_path: Path) -> None:
    pytest.importorskip("ggml_dispatch.codegen.render")
    inst.install(tree)
    cuda = tree / CUDA
    no_table = (cuda / inst.TABLE_HEADER).read_text()
    assert "#define GGML_DISPATCH_TABLE_RULE_COUNT 0" in no_table
    plan = inst.install(tree, table_path=write_table(tmp_path / "table.json", h200_table()))
    assert set(plan.writes) == {str(CUDA / inst.TABLE_HEADER), str(CUDA / inst.MANIFEST)}
    header = (cuda / inst.TABLE_HEADER).read_text()
    assert "#define GGML_DISPATCH_TABLE_RULE_COUNT 1" in header
    record = json.loads((cuda / inst.MANIFEST).read_text())
    assert record["table_rules"] == 1 and re.fullmatch(r"[0-9a-f]{64}", record["table_hash"])
    # back to no table, then out: byte-exact
    inst.install(tree)
    assert (cuda / inst.TABLE_HEADER).read_text() == no_table


def test_table_from_another_upstream_is_refused_unless_allowed(tree: Path, tmp_path: Path) -> None:
    pytest.importorskip("ggml_dispatch.codegen.render")
    path = write_table(tmp_path / "table.json", h200_table(commit="1" * 40))
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--table", str(path)])
    assert res.exit_code == 2 and "--allow-upstream-mismatch" in res.output
    assert not (tree / CUDA / inst.MANIFEST).exists()
    res = CliRunner().invoke(
        main, ["install", "--llama-cpp", str(tree), "--table", str(path), "--allow-upstream-mismatch"]
    )
    assert res.exit_code == 0, res.output
    assert "warning" in res.output


def test_cli_dry_run_and_env_var(tree: Path) -> None:
    before = snapshot(tree)
    res = CliRunner().invoke(main, ["install", "--dry-run"], env={"LLAMA_CPP_DIR": str(tree)})
    assert res.exit_code == 0, res.output
    assert "write ggml/src/ggml-cuda/ggml-cuda.cu" in res.output
    assert snapshot(tree) == before
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree / "nope")])
    assert res.exit_code == 2 and "not a llama.cpp tree" in res.output
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--uninstall"])
    assert res.exit_code == 0, res.output
    assert snapshot(tree) == before


def test_install_writes_the_codes_header_rendered_from_the_registry(tree: Path) -> None:
    inst.install(tree)
    text = (tree / CUDA / codes.CODES_HEADER).read_text()
    assert text == codes.render_codes_header()
    assert f'"{codes.registry_sha256()}"' in text
    # the patch hash covers the generated header: another registry is another patch
    sources = inst.native_sources()
    assert sources[codes.CODES_HEADER] == text.encode()
    other = {**sources, codes.CODES_HEADER: text.replace("mmvq", "mmvx").encode()}
    assert inst.patch_hash(other, inst.load_specs()) != inst.patch_hash(sources, inst.load_specs())
    record = json.loads((tree / CUDA / inst.MANIFEST).read_text())
    assert str(CUDA / codes.CODES_HEADER) in record["files_added"]
    inst.uninstall(tree)
    assert not (tree / CUDA / codes.CODES_HEADER).exists()


def test_header_codes_match_schema() -> None:
    text = codes.render_codes_header()

    def define(name: str) -> int:
        m = re.search(rf"#define {name}\s+(\d+)", text)
        assert m, name
        return int(m.group(1))

    assert define("GGML_DISPATCH_ROUTE_STOCK") == schema.ROUTE_STOCK_CODE
    for route, code in schema.ROUTE_CODES.items():
        assert define(f"GGML_DISPATCH_ROUTE_{route.value.upper()}") == code
    assert define("GGML_DISPATCH_ROUTE_COUNT") == len(schema.ROUTE_CODES) + 1
    for op, code in schema.OP_CODES.items():
        assert define(f"GGML_DISPATCH_OP_{op.value}") == code
    for lay, code in schema.LAYOUT_CODES.items():
        assert define(f"GGML_DISPATCH_LAYOUT_{lay.value.upper()}") == code
    names = re.search(r"#define GGML_DISPATCH_ROUTE_NAMES \{([^}]*)\}", text)
    assert names
    listed = [s.strip().strip('"') for s in names.group(1).split(",")]
    assert listed == [
        "stock",
        *[r.value for r, _ in sorted(schema.ROUTE_CODES.items(), key=lambda kv: kv[1])],
    ]


def pinned_forms(target: str, src: str) -> list[patch.Hunk]:
    """The hunks of a target's spec that a pinned-like tree takes (located): every one but the other
    upstreams' forms of a grouped edit (the spec's `@@ group`s), which are all that is left out."""
    spec = inst.load_specs()[target]
    got = fit.fit({target: src}, {target: spec}).hunks[target]
    taken = {h.name for h in got}
    assert all(h.group for h in spec if h.name not in taken), [h.name for h in spec if h.name not in taken]
    return got


def test_mmq_spec_applies_to_pinned_tree_and_reverts_exactly(pinned: Path) -> None:
    src = (pinned / CUDA / "mmq.cuh").read_text()
    hunks = pinned_forms("mmq.cuh", src)
    # the tree picks J in mul_mat_q_switch_J: the J edit and the split's J there, not their mmq_args forms
    assert {h.name for h in hunks} >= {"mmq_J", "mmq_stream_k", "mmq_split", "mmq_split_J_in_switch"}
    assert "mmq_split_J_args" not in {h.name for h in hunks}
    patched = patch.apply(src, hunks)
    assert inst.HOOK_MARKERS["mmq.cuh"] in patched and inst.HOOK_MARKERS["mmq.cuh"] not in src
    assert "ggml_dispatch_params_current().mmq_J" in patched
    assert patch.revert(patched, hunks) == src


def test_fattn_spec_applies_to_pinned_tree_and_reverts_exactly(pinned: Path) -> None:
    src = (pinned / CUDA / "fattn.cu").read_text()
    hunks = inst.load_specs()["fattn.cu"]
    assert {h.name for h in hunks} == {
        "include",
        "stock_kernel",
        "dispatch_kernel",
        "alloc_size_all",
        "run_kernel",
        "sparse",
        "mma_ncols1",
        "mma_ncols2",
        "vec_kv_shadow",
    }
    patched = patch.apply(src, hunks)
    assert inst.HOOK_MARKERS["fattn.cu"] in patched and inst.HOOK_MARKERS["fattn.cu"] not in src
    # the MMA tile switches and the sparse gather read the configuration's parameters
    assert patched.count("ggml_dispatch_params_current().fa_ncols1") == 1
    assert patched.count("ggml_dispatch_params_current().fa_ncols2") == 2
    assert "return ggml_dispatch_fa_sparse(ggml_dispatch_sparse_hard," in patched
    # VEC under kv=shadow takes the f16 instance (which reads the shadow in launch_fattn)
    assert "fattn_vec_case_t vec_case = ggml_cuda_fattn_dispatch_vec_f16(dst) ?" in patched
    # the tree's choice is kept under another name; scratch sizing and the launch ask the hook's wrapper
    assert "ggml_cuda_get_best_fattn_kernel_stock(const int device, const ggml_tensor * dst) {" in patched
    assert "ggml_cuda_get_best_fattn_kernel(device, dst);" in patched  # get_alloc_size, unchanged
    assert (
        "ggml_cuda_get_best_fattn_kernel(ggml_cuda_get_device(), dst, /*run =*/ true, &ggml_dispatch_config)"
        in patched
    )
    assert patch.revert(patched, hunks) == src


def test_fattn_common_spec_applies_to_pinned_tree_and_reverts_exactly(pinned: Path) -> None:
    src = (pinned / CUDA / "fattn-common.cuh").read_text()
    hunks = inst.load_specs()["fattn-common.cuh"]
    assert [h.name for h in hunks] == [
        "params_include",
        "stream_k",
        "parallel_blocks",
        "kv_shadow_K",
        "kv_shadow_V",
    ]
    patched = patch.apply(src, hunks)
    assert (
        inst.HOOK_MARKERS["fattn-common.cuh"] in patched and inst.HOOK_MARKERS["fattn-common.cuh"] not in src
    )
    # launch_fattn's grid: stream-k (MMA_F16) and the parallel blocks (VEC, TILE) ask the parameters
    assert "ggml_dispatch_fa_stream_k(should_use_stream_k(cc, ntiles_dst, max_blocks, Q->ne[0]))" in patched
    assert "parallel_blocks = ggml_dispatch_fa_parallel_blocks(parallel_blocks, ntiles_KV);" in patched
    # kv=shadow: the per-call conversions of K and V are skipped where the shadow's view was had
    assert "if (need_f16_K && K->type != GGML_TYPE_F16 && !ggml_dispatch_shadow_K) {" in patched
    assert "if (need_f16_V && V->type != GGML_TYPE_F16 && !ggml_dispatch_shadow_V) {" in patched
    assert patch.revert(patched, hunks) == src


def test_install_records_every_target_and_restores_both(tree: Path) -> None:
    before = snapshot(tree)
    before_text = {rel: (tree / rel).read_text() for rel in before if rel.endswith((".cu", ".cuh"))}
    inst.install(tree)
    record = json.loads((tree / CUDA / inst.MANIFEST).read_text())
    assert set(record["targets"]) == {
        str(CUDA / "ggml-cuda.cu"),
        str(CUDA / "mmq.cuh"),
        str(CUDA / "fattn.cu"),
        str(CUDA / "fattn-common.cuh"),
        str(CUDA / "mmvq.cu"),
        str(CUDA / "mmvf.cu"),
    }
    for rel, t in record["targets"].items():
        assert t["original_sha256"] == before[rel]
        assert t["patched_sha256"] == hashlib.sha256((tree / rel).read_bytes()).hexdigest() != before[rel]
        assert t["spec"] == inst.HOOK_SPECS[Path(rel).name]
        name = Path(rel).name
        assert [h["name"] for h in t["hunks"]] == [h.name for h in pinned_forms(name, before_text[rel])]
    assert (tree / CUDA / "ggml-dispatch-params.h").read_bytes() == (
        inst.NATIVE_DIR / "ggml-dispatch-params.h"
    ).read_bytes()
    assert inst.install(tree).writes == {}
    inst.uninstall(tree)
    assert snapshot(tree) == before


def test_a_tree_whose_mmq_differs_skips_the_mmq_features_naming_the_hunk(tree: Path, tmp_path: Path) -> None:
    cuh = tree / CUDA / "mmq.cuh"
    src = cuh.read_text()
    anchor = "    if (!config.stream_k) {"
    assert src.count(anchor) == 1
    cuh.write_text(src.replace(anchor, "    if (!config.stream_k && true) {"))
    report = inst.check(tree)
    tiles, split = report["features"]["mmq_tiles"], report["features"]["moe_split"]
    assert tiles["status"] == split["status"] == "skipped"
    assert (
        "mmq.cuh" in tiles["reason"]
        and "mmq_tiling" in tiles["reason"]
        and "launch_mul_mat_q" in tiles["reason"]
    )
    assert "`if (!config.stream_k && true) {`" in tiles["reason"]
    assert split["reason"] == "needs feature 'mmq_tiles', which is skipped"
    # a table rule that needs a skipped feature is dropped at install, with one message; the others stay
    t = h200_table()
    t["rules"].append(
        {**t["rules"][0], "M_lo": 9, "M_hi": 16, "route": "mmq", "config": "mmq/j=16,stream_k=off"}
    )
    plan = inst.install(tree, table_path=write_table(tmp_path / "table.json", t))
    assert [m for m in plan.messages if "dropped" in m] == [
        f"warning: {tmp_path / 'table.json'}: 1 rule(s) dropped: they need feature mmq_tiles, skipped here"
    ]
    assert "#define GGML_DISPATCH_TABLE_RULE_COUNT 1" in (tree / CUDA / inst.TABLE_HEADER).read_text()
    assert "ggml-dispatch" not in cuh.read_text()  # neither mmq feature touched mmq.cuh
    inst.uninstall(tree)


def test_refuses_an_mmq_hook_without_record(tree: Path) -> None:
    cuh = tree / CUDA / "mmq.cuh"
    cuh.write_text(patch.apply(cuh.read_text(), pinned_forms("mmq.cuh", cuh.read_text())))
    with pytest.raises(inst.InstallError, match=r"mmq\.cuh"):
        inst.install(tree)
    with pytest.raises(inst.InstallError, match=r"mmq\.cuh"):
        inst.uninstall(tree)


def test_reads_a_single_target_record(tree: Path) -> None:
    """A record written before mmq.cuh was a target (``target`` + ``hunks``) still uninstalls."""
    before = snapshot(tree)
    cu = tree / CUDA / "ggml-cuda.cu"
    hunks = inst.load_specs()["ggml-cuda.cu"]
    cu.write_text(patch.apply(cu.read_text(), hunks))
    record = {
        "schema": inst.MANIFEST_SCHEMA,
        "target": str(CUDA / "ggml-cuda.cu"),
        "target_original_sha256": before[str(CUDA / "ggml-cuda.cu")],
        "files_added": [],
        "hunks": [h.to_json() for h in hunks],
    }
    (tree / CUDA / inst.MANIFEST).write_text(json.dumps(record))
    inst.uninstall(tree)
    assert snapshot(tree) == before


def test_a_crlf_reindented_tree_takes_the_hook_and_uninstall_restores_its_bytes(tree: Path) -> None:
    """Matching is by content: CRLF line endings, other indentation and extra blank lines do not matter; what
    install inserts takes the file's line endings, and uninstall gives the file back byte for byte."""
    for name in inst.HOOK_SPECS:
        p = tree / CUDA / name
        lines = p.read_bytes().decode().split("\n")
        p.write_bytes(
            "\r\n".join(
                ("  " + x if x.strip() else x) + ("\r\n" if i % 7 == 0 else "") for i, x in enumerate(lines)
            ).encode()
        )
    before = snapshot(tree)
    report = inst.check(tree)
    assert report["core"]["status"] == "applied"
    assert {n: f["status"] for n, f in report["features"].items()} == dict.fromkeys(
        report["features"], "applied"
    )
    inst.install(tree)
    cu = (tree / CUDA / "ggml-cuda.cu").read_bytes()
    assert b'#include "ggml-cuda/ggml-dispatch-hook.cuh"\r\n' in cu
    assert b"\n" not in cu.replace(b"\r\n", b"")  # no bare LF was put into a CRLF file
    inst.uninstall(tree)
    assert snapshot(tree) == before


def test_check_json_reports_core_features_unhooked_and_writes_nothing(tree: Path) -> None:
    before = snapshot(tree)
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--check", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert set(report) >= {"core", "features", "unhooked", "upstream"}
    assert report["core"]["status"] == "applied" and 0 < report["core"]["lines"] <= 150
    assert set(report["features"]) == set(registry.FEATURES) - {"core"}
    assert report["unhooked"] == []  # the copied files hold no launch the seam misses
    assert report["upstream"]["matches"] == [schema.PINNED_UPSTREAM_COMMIT]
    assert snapshot(tree) == before
    # a new launch of an mmvq kernel from a function the seam does not know is listed
    cu = tree / CUDA / "ggml-cuda.cu"
    cu.write_text(
        cu.read_text()
        + "\nstatic void my_fusion(ggml_backend_cuda_context & ctx, ggml_tensor * a, ggml_tensor * b,"
        + " ggml_tensor * d) {\n"
        + "    ggml_cuda_mul_mat_vec_q(ctx, a, b, nullptr, d);\n}\n"
    )
    listed = inst.check(tree)["unhooked"]
    assert [(u["function"], u["call"]) for u in listed] == [
        ("my_fusion", "ggml_cuda_mul_mat_vec_q(ctx, a, b, nullptr, d);")
    ]
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--json"])
    assert res.exit_code == 2 and "--json goes with --check" in res.output


def test_features_core_installs_the_seam_alone(tree: Path) -> None:
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--features", "core"])
    assert res.exit_code == 0, res.output
    assert "feature mmq_tiles skipped: not asked for (--features)" in res.output
    assert "ggml-dispatch" not in (tree / CUDA / "mmq.cuh").read_text()
    assert "#define GGML_DISPATCH_FEATURES 1u" in (tree / CUDA / inst.BUILD_HEADER).read_text()
    res = CliRunner().invoke(main, ["install", "--llama-cpp", str(tree), "--features", "core,nope"])
    assert res.exit_code == 2 and "unknown feature 'nope'" in res.output


def test_a_fork_with_the_pinned_kernels_gets_a_table_of_the_pinned_commit(tree: Path, tmp_path: Path) -> None:
    pytest.importorskip("ggml_dispatch.codegen.render")
    (tree / "UPSTREAM_COMMIT").write_text("b99999\n")  # a fork: another id, the same hooked regions
    plan = inst.install(tree, table_path=write_table(tmp_path / "table.json", h200_table()))
    assert any("hooked regions are the same" in m for m in plan.messages)
    assert "#define GGML_DISPATCH_TABLE_RULE_COUNT 1" in (tree / CUDA / inst.TABLE_HEADER).read_text()


def test_the_pinned_fingerprint_is_the_trees(pinned: Path) -> None:
    """upstream.KNOWN_FINGERPRINTS holds the pinned tree's: a spec change that moves it fails here."""
    assert (
        inst.check(pinned)["upstream"]["fingerprint"]
        == upstream.KNOWN_FINGERPRINTS[schema.PINNED_UPSTREAM_COMMIT]
    )


def test_the_core_seam_inserts_at_most_150_lines() -> None:
    specs = inst.load_specs()
    core = sum(h.inserted_lines for hunks in specs.values() for h in hunks if "core" in h.features)
    assert 0 < core <= 150
