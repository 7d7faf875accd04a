"""Anchored edits of a source file: parse a hook spec, apply it, revert it. Pure (text in, text out).

A hook spec (``hook/native/ggml-cuda.hook``) is a list of hunks. Each hunk names the function it
touches and has an ``anchor`` (exact text that must occur exactly once in the original file) and, except
for ``require`` hunks, a ``text`` to insert before/after the anchor or to replace it with. A file that
does not match is refused with an error naming the hunk and the function, so a fork with the same
dispatch code takes the hook and one with different dispatch code is told where it differs.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Final

KINDS: Final = ("insert_after", "insert_before", "replace", "require")


class PatchError(ValueError):
    """The file does not take the hook (or a patched file cannot be reverted)."""

    def __init__(self, message: str, hunk: str | None = None, function: str | None = None) -> None:
        where = f"hunk '{hunk}' ({function}): " if hunk else ""
        super().__init__(where + message)
        self.hunk = hunk
        self.function = function


@dataclass(frozen=True)
class Hunk:
    name: str
    function: str
    kind: str
    anchor: str
    text: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Hunk:
        return Hunk(
            str(d["name"]), str(d["function"]), str(d["kind"]), str(d["anchor"]), str(d.get("text", ""))
        )


def parse_spec(text: str, source: str = "hook spec") -> list[Hunk]:
    """Parse the ``@@``-directive format; raises ValueError naming the line on malformed input."""
    hunks: list[Hunk] = []
    fields: dict[str, str] = {}
    block: str | None = None
    blocks: dict[str, list[str]] = {}
    start = 0
    for lineno, line in enumerate(text.splitlines(keepends=True), start=1):
        stripped = line.rstrip("\n")
        if stripped.startswith("@@ ") or stripped == "@@":
            words = stripped[3:].split(maxsplit=1)
            directive = words[0] if words else ""
            arg = words[1].strip() if len(words) > 1 else ""
            if directive == "hunk":
                if fields:
                    raise ValueError(
                        f"{source}:{lineno}: hunk '{arg}' starts before '@@ end' of the previous one"
                    )
                fields = {"name": arg}
                blocks = {}
                block = None
                start = lineno
            elif not fields:
                raise ValueError(f"{source}:{lineno}: '@@ {directive}' outside a hunk")
            elif directive in ("function", "kind"):
                fields[directive] = arg
                block = None
            elif directive in ("anchor", "text"):
                block = directive
                blocks[block] = []
            elif directive == "end":
                hunks.append(_make_hunk(fields, blocks, source, start))
                fields, blocks, block = {}, {}, None
            else:
                raise ValueError(f"{source}:{lineno}: unknown directive '@@ {directive}'")
            continue
        if block is not None:
            blocks[block].append(line if line.endswith("\n") else line + "\n")
        elif fields and stripped.strip():
            raise ValueError(
                f"{source}:{lineno}: text outside '@@ anchor' / '@@ text' in hunk '{fields['name']}'"
            )
    if fields:
        raise ValueError(f"{source}:{start}: hunk '{fields['name']}' has no '@@ end'")
    names = [h.name for h in hunks]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: hunk names are not unique")
    return hunks


def _make_hunk(fields: dict[str, str], blocks: dict[str, list[str]], source: str, line: int) -> Hunk:
    name = fields["name"]
    kind = fields.get("kind", "")
    if not name or kind not in KINDS or "function" not in fields:
        raise ValueError(f"{source}:{line}: hunk '{name}' needs a name, '@@ function' and a kind in {KINDS}")
    anchor = "".join(blocks.get("anchor", []))
    text = "".join(blocks.get("text", []))
    if not anchor:
        raise ValueError(f"{source}:{line}: hunk '{name}' has an empty anchor")
    if (kind == "require") != (not text):
        raise ValueError(f"{source}:{line}: hunk '{name}': a 'require' hunk has no text, the others need one")
    return Hunk(name, fields["function"], kind, anchor, text)


def _first_line(s: str) -> str:
    return s.splitlines()[0].strip() if s.strip() else s


def _locate(src: str, needle: str, hunk: Hunk, what: str) -> int:
    n = src.count(needle)
    if n == 1:
        return src.index(needle)
    if n == 0:
        hint = ""
        first = _first_line(needle)
        if first and src.count(first) >= 1:
            hint = f" (its first line `{first}` is there, the rest differs)"
        raise PatchError(f"{what} not found{hint}: `{first}`", hunk.name, hunk.function)
    raise PatchError(
        f"{what} occurs {n} times, expected once: `{_first_line(needle)}`", hunk.name, hunk.function
    )


def apply(src: str, hunks: list[Hunk]) -> str:
    """Apply every hunk to ``src``; each anchor must occur exactly once in the original text."""
    for h in hunks:
        _locate(src, h.anchor, h, "anchor")
    out = src
    for h in hunks:
        if h.kind == "require":
            continue
        i = _locate(out, h.anchor, h, "anchor")
        j = i + len(h.anchor)
        if h.kind == "insert_after":
            out = out[:j] + h.text + out[j:]
        elif h.kind == "insert_before":
            out = out[:i] + h.text + out[i:]
        else:
            out = out[:i] + h.text + out[j:]
    return out


def revert(src: str, hunks: list[Hunk]) -> str:
    """Undo :func:`apply` (hunks in reverse order). Raises PatchError naming the hunk that is not there."""
    out = src
    for h in reversed(hunks):
        if h.kind == "require":
            continue
        if h.kind == "insert_after":
            i = _locate(out, h.anchor + h.text, h, "patched text")
            out = out[: i + len(h.anchor)] + out[i + len(h.anchor) + len(h.text) :]
        elif h.kind == "insert_before":
            i = _locate(out, h.text + h.anchor, h, "patched text")
            out = out[:i] + out[i + len(h.text) :]
        else:
            i = _locate(out, h.text, h, "patched text")
            out = out[:i] + h.anchor + out[i + len(h.text) :]
    return out


def spec_digest(hunks: list[Hunk]) -> str:
    h = hashlib.sha256()
    for hunk in hunks:
        for part in (hunk.name, hunk.function, hunk.kind, hunk.anchor, hunk.text):
            h.update(part.encode("utf-8"))
            h.update(b"\0")
    return h.hexdigest()
