"""Anchored edits of a source file: parse a hook spec, locate its anchors, apply, revert. Pure (text in,
text out).

A hook spec (``ggml_dispatch/hook/native/*.hook``) is a list of hunks. Each hunk names the function it
touches, the hook
features it belongs to (``@@ feature core``; a hunk shared by several features lists them all and is applied
when any of them is), and has an ``anchor`` (whole lines that must occur exactly once in the original file)
and, except for ``require`` hunks, a ``text`` to insert before/after the anchor or to replace it with.

Anchors are located by content, not by bytes: lines are compared with their whitespace collapsed, blank
lines are skipped and line endings do not matter, so a re-indented, re-wrapped-by-blank-lines or CRLF file
takes the hook, and a hunk whose context moved elsewhere in the file still finds it. :func:`locate` turns a
spec hunk into the *effective* hunk for one file (its anchor as that file spells it, its text in that file's
line endings); :func:`apply` and :func:`revert` work on effective hunks byte for byte. A hunk that does not
fit is refused with the first anchor line that differs and the tree's line there.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
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
    features: tuple[str, ...] = ("core",)
    alternatives: tuple[str, ...] = ()  # other anchors that fit as well (upstream's forms of the same code)
    # hunks of one group are forms of one edit for different upstreams (in any target file): the first that
    # fits is applied, and the group fails only where none fits
    group: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["features"] = list(self.features)
        d["alternatives"] = list(self.alternatives)
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> Hunk:
        features = tuple(str(f) for f in d.get("features", ["core"]))
        alternatives = tuple(str(a) for a in d.get("alternatives", []))
        return Hunk(
            str(d["name"]),
            str(d["function"]),
            str(d["kind"]),
            str(d["anchor"]),
            str(d.get("text", "")),
            features,
            alternatives,
            str(d.get("group", "")),
        )

    @property
    def inserted_lines(self) -> int:
        """Lines this hunk puts into the upstream file (a replace counts its text)."""
        return 0 if self.kind == "require" else len(self.text.splitlines())


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
            elif directive in ("function", "kind", "feature", "group"):
                fields[directive] = arg
                block = None
            elif directive in ("anchor", "text", "or_anchor"):
                block = directive if directive != "or_anchor" else f"or_anchor{len(blocks)}"
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
    alternatives = tuple("".join(v) for k, v in blocks.items() if k.startswith("or_anchor"))
    if alternatives and kind == "replace":
        raise ValueError(f"{source}:{line}: hunk '{name}': a 'replace' hunk takes no '@@ or_anchor'")
    if any(not a.strip() for a in alternatives):
        raise ValueError(f"{source}:{line}: hunk '{name}' has an empty '@@ or_anchor'")
    features = tuple(fields.get("feature", "").split())
    if not features or any(not _FEATURE_NAME.match(f) for f in features):
        raise ValueError(f"{source}:{line}: hunk '{name}' needs '@@ feature NAME [NAME ...]'")
    if not any(_norm(x) for x in anchor.splitlines()):
        raise ValueError(f"{source}:{line}: hunk '{name}' has a blank anchor")
    group = fields.get("group", "")
    if group and not _FEATURE_NAME.match(group):
        raise ValueError(f"{source}:{line}: hunk '{name}': '@@ group' needs one lower-case name")
    return Hunk(name, fields["function"], kind, anchor, text, features, alternatives, group)


_FEATURE_NAME: Final = re.compile(r"^[a-z][a-z0-9_]*$")


def _norm(line: str) -> str:
    """A line as the matching compares it: whitespace runs collapsed, ends stripped (CR included)."""
    return " ".join(line.split())


@dataclass(frozen=True)
class _Lines:
    """A text's non-blank lines, normalized, with where each line starts and ends in the text."""

    norms: list[str]
    raws: list[str]  # the same lines with only their line ending and trailing blanks stripped
    starts: list[int]
    ends: list[int]  # past the line's newline
    numbers: list[int]  # 1-based line numbers
    where: dict[str, list[int]]  # normalized line -> indexes into norms

    @staticmethod
    def of(text: str) -> _Lines:
        norms: list[str] = []
        raws: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        numbers: list[int] = []
        where: dict[str, list[int]] = defaultdict(list)
        at = 0
        for number, line in enumerate(text.splitlines(keepends=True), start=1):
            n = _norm(line)
            if n:
                where[n].append(len(norms))
                norms.append(n)
                raws.append(line.rstrip())
                starts.append(at)
                ends.append(at + len(line))
                numbers.append(number)
            at += len(line)
        return _Lines(norms, raws, starts, ends, numbers, dict(where))


def _anchor_norms(anchor: str) -> list[str]:
    return [n for n in (_norm(x) for x in anchor.splitlines()) if n]


def _line_ending(text: str, at: int) -> str:
    end = text.find("\n", at)
    return "\r\n" if end > 0 and text[end - 1] == "\r" else "\n"


def index_lines(src: str) -> _Lines:
    """The index :func:`locate` searches (build it once per file for many hunks)."""
    return _Lines.of(src)


def locate(src: str, hunk: Hunk, lines: _Lines | None = None) -> Hunk:
    """The effective hunk for ``src`` (:func:`locate_one`); a hunk with alternative anchors takes the first
    of them that fits (its text goes to the same place), and names its first anchor's difference where none
    does."""
    lines = lines or _Lines.of(src)
    try:
        return locate_one(src, hunk, lines)
    except PatchError as first:
        for alt in hunk.alternatives:
            try:
                return locate_one(src, replace(hunk, anchor=alt, alternatives=()), lines)
            except PatchError:
                continue
        raise first


def locate_one(src: str, hunk: Hunk, lines: _Lines | None = None) -> Hunk:
    """The effective hunk for ``src``: its anchor as ``src`` spells it (whole lines, exactly once by content),
    its text in the line endings of the anchor's place. Raises PatchError naming the first anchor line that
    differs from the tree (with the tree's line there) or how often the anchor occurs."""
    lines = lines or _Lines.of(src)
    want = _anchor_norms(hunk.anchor)
    starts_at = [i for i in lines.where.get(want[0], []) if lines.norms[i : i + len(want)] == want]
    if len(starts_at) > 1:  # the same code at several places: the one indented as the anchor is, if one is
        raw = [x.rstrip() for x in hunk.anchor.splitlines() if x.strip()]
        exact = [i for i in starts_at if lines.raws[i : i + len(raw)] == raw]
        starts_at = exact if len(exact) == 1 else starts_at
    if len(starts_at) == 1:
        i = starts_at[0]
        start, end = lines.starts[i], lines.ends[i + len(want) - 1]
        anchor = src[start:end]
        if not anchor.endswith("\n"):  # the anchor closes the file without a newline: keep it whole
            anchor = src[start:]
        eol = _line_ending(src, start)
        text = hunk.text.replace("\r\n", "\n")
        if eol != "\n":
            text = text.replace("\n", eol)
        return replace(hunk, anchor=anchor, text=text)
    if len(starts_at) > 1:
        where = ", ".join(f"line {lines.numbers[i]}" for i in starts_at[:4])
        raise PatchError(
            f"anchor occurs {len(starts_at)} times, expected once ({where}): `{want[0]}`",
            hunk.name,
            hunk.function,
        )
    raise PatchError(_first_difference(lines, want), hunk.name, hunk.function)


def _first_difference(lines: _Lines, want: list[str]) -> str:
    """Where the anchor comes closest in the tree (most anchor lines in place): its first differing line."""
    votes: dict[int, int] = defaultdict(int)
    for k, n in enumerate(want):
        for i in lines.where.get(n, []):
            votes[i - k] += 1
    if not votes:
        close = difflib.get_close_matches(want[0], lines.norms, n=1, cutoff=0.75)
        if close:
            i = lines.norms.index(close[0])
            return f"anchor line 1 `{want[0]}` differs from the tree's line {lines.numbers[i]}: `{close[0]}`"
        return f"no line of the anchor is in the file; its first: `{want[0]}`"
    best = max(votes, key=lambda at: (votes[at], -at))
    for k, n in enumerate(want):
        i = best + k
        if not 0 <= i < len(lines.norms) or lines.norms[i] != n:
            found = (
                f"line {lines.numbers[i]}: `{lines.norms[i]}`" if 0 <= i < len(lines.norms) else "end of file"
            )
            return f"anchor line {k + 1} `{n}` differs from the tree's {found}"
    return f"anchor `{want[0]}` not found"  # unreachable: a full match is found by locate


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
        for part in (
            hunk.name,
            hunk.function,
            hunk.kind,
            hunk.anchor,
            hunk.text,
            hunk.group,
            *hunk.features,
            *hunk.alternatives,
        ):
            h.update(part.encode("utf-8"))
            h.update(b"\0")
    return h.hexdigest()
