"""Which upstream a tree is: its id (a commit, a build number or a registry version) and the fingerprint of
its hooked regions. Compatibility of a table with a tree is decided by the fingerprint, not by the id: a
registry sdist without git metadata, or a fork whose kernels are the pinned ones, gets the table.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from ggml_dispatch import schema
from ggml_dispatch.hook import patch

_HEX40: Final = re.compile(r"^[0-9a-f]{40}$")

# The fingerprint of each upstream a committed table was measured on (hooked regions as the hook specs name
# them; tests/test_install_hook.py recomputes the pinned one from the tree, so a spec change that moves it
# is caught there).
KNOWN_FINGERPRINTS: Final[dict[str, str]] = {
    schema.PINNED_UPSTREAM_COMMIT: "7f4408ace8f971a97f3136778f6962cd5070ab7b148e3d21ab9f0fd16e301d76",
}


class UpstreamError(ValueError):
    """An upstream id that is none of the accepted forms."""


def parse_id(text: str, what: str = "--upstream-commit") -> str:
    """A 40-hex commit (lower-cased), a build number (``b11549``) or a registry version
    (``llama-cpp-python==0.3.36``): the forms of schema.check_upstream_id, read from user input."""
    t = text.strip()
    try:
        return schema.check_upstream_id(t.lower() if _HEX40.match(t.lower()) else t)
    except ValueError as e:
        raise UpstreamError(f"{what}: {e}") from None


def resolve_id(tree: Path, given: str | None) -> tuple[str | None, str]:
    """(id, where it came from): ``given``, else the tree's UPSTREAM_COMMIT file, else ``git rev-parse HEAD``,
    else (None, "content only"): such a tree installs on its content alone."""
    if given:
        return parse_id(given), "--upstream-commit"
    stamp = tree / "UPSTREAM_COMMIT"
    if stamp.is_file():
        return parse_id(stamp.read_text(encoding="utf-8", errors="replace"), str(stamp)), str(stamp)
    if (tree / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            out = ""
        if _HEX40.match(out):
            return out, "git"
    return None, "content only"


def fingerprint(sources: Mapping[str, str], specs: Mapping[str, list[patch.Hunk]]) -> str:
    """sha256 over the hooked regions of a tree: each hunk's anchor as the tree has it, compared as the
    matching compares lines (whitespace, blank lines and line endings do not count); an anchor the tree
    lacks counts as absent."""
    h = hashlib.sha256()
    for target in sorted(specs):
        index = patch.index_lines(sources[target])
        for hunk in specs[target]:
            h.update(f"{target}\0{hunk.name}\0".encode())
            try:
                found = patch.locate(sources[target], hunk, index).anchor
            except patch.PatchError:
                h.update(b"absent\0")
                continue
            for line in found.splitlines():
                if line.strip():
                    h.update(" ".join(line.split()).encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()
