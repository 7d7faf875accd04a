"""Strings read from files (GPU names, commits, tensor names, paths), made safe to print on a terminal."""

from __future__ import annotations


def printable(s: object, width: int = 0) -> str:
    """``s`` with every non-printable character (newline, escape, ...) written as ``\\xNN``/``\\uNNNN``;
    cut to ``width`` characters with ``...`` when ``width`` is given."""
    text = "".join(
        c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}") for c in str(s)
    )
    if width and len(text) > width:
        text = text[: width - 3] + "..."
    return text
