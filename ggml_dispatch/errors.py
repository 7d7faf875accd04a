"""Bad input gets one clear message naming the file and the line (or field), and a non-zero exit."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad user input. Rendered as ``path:line: message`` (or ``path: field: message``)."""

    exit_code = 2

    def __init__(
        self,
        path: str | Path | None,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        self.message = message
        super().__init__(self.render())

    def render(self) -> str:
        where = self.path or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        if self.field is not None:
            where += f": {self.field}"
        return f"{where}: {self.message}"
