"""The documents cite files that exist: every repository path in backticks, every relative Markdown link
(and the heading it points at) and every document named by file name (``ARCHITECTURE.md``) in any Markdown
file of the repository, and every document a source comment or docstring names, is a file or folder of this
checkout or of the archive (ggml_dispatch/archive.py); nothing points outside the repository
(``../shared``) or at the folders that moved, and evidence/README.md indexes every file kept under
evidence/."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

from ggml_dispatch import archive

REPO = Path(__file__).resolve().parent.parent


def _tracked(*patterns: str) -> list[Path]:
    """The repository's files matching the patterns: tracked, or new and not ignored (a document being
    written is checked before its first commit)."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "--", *patterns],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({REPO / line for line in out.splitlines() if line and (REPO / line).is_file()})


DOCS = _tracked("*.md")
SOURCES = _tracked("ggml_dispatch/**", "lab/**", "tests/**")
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
    "docs",
)
_CITED = re.compile(r"`((?:" + "|".join(TOP) + r")/[^`\s]*)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A document named by its file name: upper-case names (README.md, ARCHITECTURE.md, NOTES.md, ...) and
# any docs/ page.
_DOC_NAME = re.compile(r"(?<![\w/.$-])((?:docs/)?[A-Z][A-Z0-9_-]*\.md)\b")


def cited_paths(text: str) -> list[str]:
    out = []
    for m in _CITED.finditer(text):
        p = m.group(1).rstrip(".,:;")
        if any(c in p for c in "<>*…$") or "/-" in p:
            continue  # a pattern or placeholder, not one path
        if p.endswith("/") and p.count("/") == 1:
            continue  # one folder's name (`report/` in an index of a session's folders), not a path
        out.append(p.split(":")[0])
    return out


def _anchors(doc: Path) -> set[str]:
    """The link targets GitHub gives the headings of a Markdown file."""
    out = set()
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = "".join(ch for ch in title if ch.isalnum() or ch in " -_")
            out.add(slug.replace(" ", "-"))
    return out


def linked_paths(doc: Path, text: str) -> list[str]:
    """Where the relative Markdown links of ``doc`` point: '<path relative to the repository>#<anchor>'."""
    out = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        rel = (doc.parent / path).resolve() if path else doc.resolve()
        try:
            out.append(str(rel.relative_to(REPO)) + (f"#{anchor}" if anchor else ""))
        except ValueError:
            out.append(target)  # outside the repository: reported as it is written
    return out


@functools.cache
def _doc_names() -> frozenset[str]:
    """The file names of every Markdown file of the checkout and the archive."""
    return frozenset(p.name for p in DOCS) | frozenset(
        p.rsplit("/", 1)[-1] for p in archive.listing() if p.endswith(".md")
    )


def named_docs(text: str) -> list[str]:
    """The documents ``text`` names by file name that no file of the repository or the archive is called
    (a per-folder name such as REPORT.md or NOTES.md is read as the one of the folder being discussed)."""
    return [m.group(1) for m in _DOC_NAME.finditer(text) if m.group(1).rsplit("/", 1)[-1] not in _doc_names()]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = [p for p in cited_paths(text) if not archive.exists(p)]
    assert not missing, f"{doc.relative_to(REPO)} cites paths that do not exist: {missing}"
    assert "../shared" not in text and "device/results" not in text


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_document_name_resolves(doc: Path) -> None:
    text = doc.read_text()
    broken = []
    for target in linked_paths(doc, text):
        path, _, anchor = target.partition("#")
        if not archive.exists(path) or (
            anchor
            and path.endswith(".md")
            and (REPO / path).is_file()
            and anchor not in _anchors(REPO / path)
        ):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)} links to what does not exist: {broken}"
    missing = named_docs(text)
    assert not missing, f"{doc.relative_to(REPO)} names documents that do not exist: {missing}"


def test_sources_name_only_documents_that_exist() -> None:
    """A comment or docstring that cites a document (``DESIGN.md "Decision rule"``) cites one the reader
    can open."""
    bad = {}
    for src in SOURCES:
        if src == Path(__file__).resolve():
            continue  # names a missing document on purpose, to show the check finds one
        if src.suffix in {".parquet", ".gz", ".png", ".so", ".tsv", ".json", ".jsonl"}:
            continue
        try:
            text = src.read_text()
        except UnicodeDecodeError:
            continue
        missing = named_docs(text)
        if missing:
            bad[str(src.relative_to(REPO))] = missing
    assert not bad, f"sources name documents that do not exist: {bad}"


def test_the_checks_read_real_citations() -> None:
    """The checks above read real citations (they would pass vacuously on patterns that find none), and
    they find a missing one."""
    readme = (REPO / "README.md").read_text()
    assert "docs/USAGE.md" in linked_paths(REPO / "README.md", readme)
    assert "ARCHITECTURE.md" in linked_paths(REPO / "README.md", readme)
    assert named_docs("the rule of DESIGN.md and of ARCHITECTURE.md") == ["DESIGN.md"]
    assert len(DOCS) >= 15 and REPO / "evidence" / "README.md" in DOCS
    assert any(p.name == "REPORT.md" for p in DOCS) and any(p.suffix == ".py" for p in SOURCES)


def test_the_citations_are_found() -> None:
    """The check above reads real citations (it would pass vacuously on a pattern that finds none)."""
    usage = cited_paths((REPO / "docs" / "USAGE.md").read_text())
    assert "samples/trace-smollm2.jsonl" in usage and "ggml_dispatch/hook/native/ggml-cuda.hook" in usage
    assert "evidence/h200-2026-11-30-s2/qwen/" in cited_paths(
        archive.path("tables/cuda-sm90-nvidia-h200-routes/NOTES.md").read_text()
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
