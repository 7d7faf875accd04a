"""Imports point one way: the core (``ggml_dispatch/*.py``, ``ggml_dispatch/artifacts/``) imports no stage,
and every stage imports only the core and earlier stages, in the order of ARCHITECTURE.md's stage section.
Every ``import`` in every module is checked, function-local ones included, so a lazy import cannot hide a
backward edge; a later stage reaches an earlier one only through a file (census.parquet, tuning.parquet,
table.json) or through the root CLI, which names its commands as strings."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

PACKAGE: Final = Path(__file__).resolve().parent.parent / "ggml_dispatch"
# The data flow: the census feeds the tuner, whose trials feed codegen; install consumes codegen's tables
# (it renders their header); report and autotune read everything before them.
STAGES: Final = ("census", "tuner", "codegen", "hook", "report", "autotune")
RANK: Final = {"core": 0, **{s: i + 1 for i, s in enumerate(STAGES)}}


def stage_of(module: str) -> str | None:
    """``ggml_dispatch.<stage>...`` -> the stage; other ``ggml_dispatch`` modules -> "core"; outside: None."""
    parts = module.split(".")
    if parts[0] != "ggml_dispatch":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else "core"


def module_name(path: Path, package: Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool, package: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in ``tree``; ``from X import name`` names the submodule X.name
    where that is a module of the package, else X."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{target}.{a.name}"
                rel = Path(*sub.split("."))
                is_module = (package.parent / rel).with_suffix(".py").is_file() or (
                    package.parent / rel / "__init__.py"
                ).is_file()
                out.append((node.lineno, sub if is_module else target))
    return out


def backward_imports(package: Path) -> list[str]:
    """``file:line: stage -> later stage (module)`` for every import that points forward in the pipeline."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package)
        me = stage_of(module)
        assert me is not None
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, target in imported_modules(tree, module, path.name == "__init__.py", package):
            to = stage_of(target)
            if to is not None and RANK[to] > RANK[me]:
                found.append(f"{path.relative_to(package.parent)}:{line}: {me} -> {to} ({target})")
    return found


def test_no_import_points_to_a_later_stage() -> None:
    assert backward_imports(PACKAGE) == []


def test_every_stage_folder_is_ranked() -> None:
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders - set(STAGES) == {"artifacts"}  # the core's readers; everything else is a stage


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        (  # a function-local import from the core to a stage
            "artifacts/table.py",
            "def f():\n    from ggml_dispatch.codegen import render\n",
            "ggml_dispatch/artifacts/table.py:2: core -> codegen (ggml_dispatch.codegen.render)",
        ),
        (  # a relative import from the tuner to codegen
            "tuner/verify.py",
            "from ..codegen import decide\n",
            "ggml_dispatch/tuner/verify.py:1: tuner -> codegen (ggml_dispatch.codegen.decide)",
        ),
        (  # a plain import of a later stage's module
            "census/cli.py",
            "import ggml_dispatch.report.markdown\n",
            "ggml_dispatch/census/cli.py:1: census -> report (ggml_dispatch.report.markdown)",
        ),
    ],
)
def test_a_backward_import_is_named_by_file_and_line(
    tmp_path: Path, rel: str, text: str, expected: str
) -> None:
    pkg = tmp_path / "ggml_dispatch"
    for stage in (*STAGES, "artifacts"):
        _write(pkg, f"{stage}/__init__.py", "")
        _write(pkg, f"{stage}/decide.py", "")
        _write(pkg, f"{stage}/render.py", "")
        _write(pkg, f"{stage}/markdown.py", "")
    _write(pkg, "__init__.py", "")
    _write(pkg, rel, text)
    assert backward_imports(pkg) == [expected]


def test_earlier_and_core_imports_pass(tmp_path: Path) -> None:
    pkg = tmp_path / "ggml_dispatch"
    _write(pkg, "__init__.py", "")
    _write(pkg, "registry.py", "")
    _write(pkg, "census/__init__.py", "")
    _write(pkg, "report/__init__.py", "")
    _write(pkg, "report/cli.py", "from ggml_dispatch import registry\nfrom ggml_dispatch.census import x\n")
    assert backward_imports(pkg) == []
