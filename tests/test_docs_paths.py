"""The documents cite files that exist: every repository path in backticks in the README, the
architecture document and the folder READMEs names a file or folder of this checkout, nothing points
outside the repository (``../shared``) or at the folders that moved, and evidence/README.md indexes
every file kept under evidence/ (in the checkout or in the archive: ggml_dispatch/archive.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggml_dispatch import archive

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted(
    {
        REPO / "README.md",
        REPO / "ARCHITECTURE.md",
        REPO / "lab" / "README.md",
        REPO / "evidence" / "README.md",
        REPO / "samples" / "reference" / "README.md",
        *REPO.glob("evidence/*/README.md"),
        *REPO.glob("tables/*/README.md"),
        *REPO.glob("tables/*/NOTES.md"),
    }
)
TOP = (
    "ggml_dispatch",
    "hook",
    "census",
    "tuner",
    "codegen",
    "report",
    "lab",
    "evidence",
    "samples",
    "tables",
    "tests",
)
_CITED = re.compile(r"`((?:" + "|".join(TOP) + r")/[^`\s]*)`")


def cited_paths(text: str) -> list[str]:
    out = []
    for m in _CITED.finditer(text):
        p = m.group(1).rstrip(".,:;")
        if any(c in p for c in "<>*…$") or "/-" in p:
            continue  # a pattern or placeholder, not one path
        out.append(p.split(":")[0])
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = [p for p in cited_paths(text) if not archive.exists(p)]
    assert not missing, f"{doc.relative_to(REPO)} cites paths that do not exist: {missing}"
    assert "../shared" not in text and "device/results" not in text


def test_the_citations_are_found() -> None:
    """The check above reads real citations (it would pass vacuously on a pattern that finds none)."""
    readme = cited_paths((REPO / "README.md").read_text())
    assert "samples/trace-smollm2.jsonl" in readme and "ggml_dispatch/hook/native/ggml-cuda.hook" in readme
    assert "evidence/h200-2026-11-30-s2/qwen/" in cited_paths(
        (REPO / "tables/cuda-sm90-nvidia-h200/NOTES.md").read_text()
    )


def test_evidence_readme_indexes_every_kept_file() -> None:
    rows = [
        line for line in (REPO / "evidence" / "README.md").read_text().splitlines() if line.startswith("|")
    ]
    checkout = {str(p.relative_to(REPO)) for p in (REPO / "evidence").rglob("*") if p.is_file()}
    archived_files = {
        p for p in archive.listing() if p.startswith("evidence/") and "." in p.rsplit("/", 1)[-1]
    }
    kept = sorted(checkout | archived_files)
    assert len(kept) > 100  # the archive is read (it would pass vacuously on none)
    for rel in kept:
        f = Path(rel)
        if f.name == "README.md":
            continue
        folder = f.parent.name
        listed = any(f"`{folder}/" in r and f.name in r for r in rows)
        assert listed, f"evidence/README.md does not list {rel}"


def test_archived_files_left_the_checkout() -> None:
    """What the archive holds is read from git history, not kept twice (the checkout's evidence/ holds its
    index and what later sessions added)."""
    archived_files = {p for p in archive.listing() if "." in p.rsplit("/", 1)[-1]}
    for rel in archive.ARCHIVED:
        kept = [p for p in (REPO / rel).rglob("*") if p.is_file() and p.name != "README.md"]
        twice = [str(p.relative_to(REPO)) for p in kept if str(p.relative_to(REPO)) in archived_files]
        assert not twice, f"{rel}: kept in the checkout and the archive: {twice[:3]}"
        assert rel in archive.listing()
