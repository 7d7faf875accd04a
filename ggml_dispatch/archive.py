"""The archive: raw device outputs and superseded tables, kept in git history instead of the checkout.

Everything a GPU session measured is committed once, with its provenance; what no longer serves a user (the
raw logs of each session under ``evidence/``, tables a later measurement replaced) leaves the checkout, so
the product tree stays small. It stays readable: :data:`COMMIT` is the last commit that holds it all, and
:func:`path` gives a file of it, from the checkout where it is still there, else from that commit
(``git archive``, extracted once into the cache). ``make archive`` restores the whole archive into
``.cache/archive/``; ``evidence/README.md`` indexes it.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Final

from ggml_dispatch import fetch

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
COMMIT: Final = "3cf04d44d5f5b2ccbe6a1f1c98097ccd9bbcdb5b"
# What left the checkout at COMMIT's successor (folders, relative to the repository root).
ARCHIVED: Final = (
    "evidence",
    "tables/cuda-sm90-nvidia-h200-attn",
    "tables/cuda-sm90-nvidia-h200-moe",
    "tables/cuda-sm90-nvidia-h200-moe-scaled",
    "tables/cuda-sm90-nvidia-h100-moe-scaled",
    "tables/cuda-sm90-nvidia-h100-moe-fused",
    "tables/cuda-sm90-nvidia-h100-moe-fit-s29",
    "tables/cuda-sm90-nvidia-h100-moe-fit-s30",
)


class ArchiveError(RuntimeError):
    """The archive cannot be read here (no git checkout of this repository with its history)."""


def root() -> Path:
    """The folder the archive is restored into (extracted once; later calls find it)."""
    return fetch.CACHE / "archive" / COMMIT[:12]


def _git(*args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        raise ArchiveError(
            f"the archive is git history of {REPO_ROOT} at {COMMIT[:12]}, which cannot be read here: "
            f"{err.decode(errors='replace').strip() or e}"
        ) from None


@functools.cache
def listing() -> frozenset[str]:
    """Every file and folder of the archive (paths relative to the repository root)."""
    out = _git("ls-tree", "-r", "-t", "--name-only", COMMIT, "--", *ARCHIVED).decode()
    return frozenset(line for line in out.splitlines() if line)


def exists(rel: str) -> bool:
    """Is ``rel`` (a file or folder path) in the checkout or in the archive?"""
    return (REPO_ROOT / rel).exists() or rel.rstrip("/") in listing()


def restore() -> Path:
    """The whole archive under :func:`root` (extracted from COMMIT on first use, atomically)."""
    dest = root()
    if (dest / ".complete").is_file():
        return dest
    with fetch._fetch_lock("archive"):
        if (dest / ".complete").is_file():
            return dest
        data = _git("archive", "--format=tar", COMMIT, "--", *ARCHIVED)
        with fetch._staged_dir(dest, f".{dest.name}.") as tmp:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter="data")
            (tmp / ".complete").write_text(COMMIT + "\n")
    return dest


def archived(rel: str | os.PathLike[str]) -> bool:
    """Is ``rel`` one of the archived folders or inside one?"""
    r = Path(rel).as_posix().rstrip("/")
    return any(r == a or r.startswith(a + "/") for a in ARCHIVED)


def path(rel: str | os.PathLike[str]) -> Path:
    """A file or folder of the repository: the checkout's where it is there, else the archive's (inside an
    archived folder: ``evidence/`` keeps its index and the sessions after the archive in the checkout)."""
    rel = Path(rel)
    here = REPO_ROOT / rel
    if here.exists() or not archived(rel):
        return here
    if rel.as_posix().rstrip("/") not in listing():
        raise ArchiveError(f"{rel}: in neither the checkout nor the archive ({COMMIT[:12]})")
    return restore() / rel


def main() -> int:
    print(restore())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
