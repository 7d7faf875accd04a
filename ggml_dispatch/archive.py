"""The archive: raw device outputs and superseded tables, kept in git history instead of the checkout.

Everything a GPU session measured is committed once, with its provenance; what no longer serves a user (the
raw logs of each session under ``evidence/``, tables a later measurement replaced) leaves the checkout, so
the product tree stays small. It stays readable: each :class:`Batch` names the last commit that holds
its folders under their archive names (a folder may be archived under a name other than its path at
that commit, e.g. a table folder whose path a newer table took), and :func:`path` gives a file of it,
from the checkout where it is still there, else from that commit (``git archive``, extracted once into
the cache). ``make archive`` restores the whole archive into ``.cache/archive/``; ``evidence/README.md``
indexes it.
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ggml_dispatch import fetch

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
COMMIT: Final = "3cf04d44d5f5b2ccbe6a1f1c98097ccd9bbcdb5b"
# What left the checkout at COMMIT's successor (folders, relative to the repository root).
ARCHIVED_AT_COMMIT: Final = (
    "evidence",
    "tables/cuda-sm90-nvidia-h200-attn",
    "tables/cuda-sm90-nvidia-h200-moe",
    "tables/cuda-sm90-nvidia-h200-moe-scaled",
    "tables/cuda-sm90-nvidia-h100-moe-scaled",
    "tables/cuda-sm90-nvidia-h100-moe-fused",
    "tables/cuda-sm90-nvidia-h100-moe-fit-s29",
    "tables/cuda-sm90-nvidia-h100-moe-fit-s30",
)


@dataclass(frozen=True)
class Batch:
    """Folders that left the checkout together: each archive name and its path at ``commit`` (the last
    commit that holds them)."""

    commit: str
    pairs: tuple[tuple[str, str], ...]  # (archive name, path at commit)

    @property
    def folders(self) -> dict[str, str]:
        return dict(self.pairs)


# The component tables of each GPU (one sweep each: dense routes, configurations, weight cache, MoE,
# attention) left the checkout when one table per GPU model, decided over all their tuning files, took
# their place; the dense routes' folder is archived as -routes because the product table took its path.
COMPONENTS_COMMIT: Final = "0d289075a1fa5e447f1d328641561d3ebca1c9cf"
COMPONENTS: Final = (
    ("tables/cuda-sm90-nvidia-h200-routes", "tables/cuda-sm90-nvidia-h200"),
    ("tables/cuda-sm90-nvidia-h200-configs", "tables/cuda-sm90-nvidia-h200-configs"),
    ("tables/cuda-sm90-nvidia-h200-cache", "tables/cuda-sm90-nvidia-h200-cache"),
    ("tables/cuda-sm90-nvidia-h200-moe-fit", "tables/cuda-sm90-nvidia-h200-moe-fit"),
    ("tables/cuda-sm90-nvidia-h200-attn-shadow", "tables/cuda-sm90-nvidia-h200-attn-shadow"),
    ("tables/cuda-sm90-nvidia-h100-moe-fit", "tables/cuda-sm90-nvidia-h100-moe-fit"),
)

BATCHES: Final = (
    Batch(COMMIT, tuple((f, f) for f in ARCHIVED_AT_COMMIT)),
    Batch(COMPONENTS_COMMIT, COMPONENTS),
)
# every archived folder (its archive name), over all batches
ARCHIVED: Final = tuple(name for b in BATCHES for name in b.folders)


class ArchiveError(RuntimeError):
    """The archive cannot be read here (no git checkout of this repository with its history)."""


def root(batch: Batch = BATCHES[0]) -> Path:
    """The folder a batch is restored into (extracted once; later calls find it)."""
    return fetch.CACHE / "archive" / batch.commit[:12]


def _git(*args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        raise ArchiveError(
            f"the archive is git history of {REPO_ROOT} at {', '.join(b.commit[:12] for b in BATCHES)}, "
            f"which cannot be read here: {err.decode(errors='replace').strip() or e}"
        ) from None


def _rename(batch: Batch, at_commit: str) -> str:
    """A path at the batch's commit -> its archive name."""
    for name, src in batch.folders.items():
        if at_commit == src or at_commit.startswith(src + "/"):
            return name + at_commit[len(src) :]
    return at_commit


@functools.cache
def _batch_listing(batch: Batch) -> frozenset[str]:
    out = _git("ls-tree", "-r", "-t", "--name-only", batch.commit, "--", *batch.folders.values()).decode()
    return frozenset(_rename(batch, line) for line in out.splitlines() if line)


def listing() -> frozenset[str]:
    """Every file and folder of the archive (archive names, relative to the repository root)."""
    return frozenset().union(*(_batch_listing(b) for b in BATCHES))


def exists(rel: str) -> bool:
    """Is ``rel`` (a file or folder path) in the checkout or in the archive?"""
    return (REPO_ROOT / rel).exists() or rel.rstrip("/") in listing()


def _restore(batch: Batch) -> Path:
    dest = root(batch)
    if (dest / ".complete").is_file():
        return dest
    with fetch._fetch_lock("archive"):
        if (dest / ".complete").is_file():
            return dest
        data = _git("archive", "--format=tar", batch.commit, "--", *batch.folders.values())
        with fetch._staged_dir(dest, f".{dest.name}.") as tmp:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp / ".tree", filter="data")
            for name, src in batch.folders.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / ".tree" / src).rename(tmp / name)
            shutil.rmtree(tmp / ".tree")
            (tmp / ".complete").write_text(batch.commit + "\n")
    return dest


def restore() -> list[Path]:
    """The whole archive, each batch under its :func:`root` (extracted from its commit on first use,
    atomically)."""
    return [_restore(b) for b in BATCHES]


def _batch_of(rel: str) -> Batch | None:
    for b in BATCHES:
        if any(rel == a or rel.startswith(a + "/") for a in b.folders):
            return b
    return None


def archived(rel: str | os.PathLike[str]) -> bool:
    """Is ``rel`` one of the archived folders or inside one?"""
    return _batch_of(Path(rel).as_posix().rstrip("/")) is not None


def path(rel: str | os.PathLike[str]) -> Path:
    """A file or folder of the repository: the checkout's where it is there, else the archive's (inside an
    archived folder: ``evidence/`` keeps its index and the sessions after the archive in the checkout)."""
    rel = Path(rel)
    here = REPO_ROOT / rel
    name = rel.as_posix().rstrip("/")
    batch = _batch_of(name)
    if here.exists() or batch is None:
        return here
    if name not in _batch_listing(batch):
        raise ArchiveError(f"{rel}: in neither the checkout nor the archive ({batch.commit[:12]})")
    return _restore(batch) / rel


def main() -> int:
    for p in restore():
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
