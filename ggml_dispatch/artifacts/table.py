"""table.json and the rendered C header: the one reader every command uses (codegen, diff, install,
report), so a bad file gets the same message everywhere.

The file checks (exists, not a folder, not empty, text) are here; the content checks are the table's
own (``codegen.table.validate``, and ``codegen.render.parse_header`` for a header's provenance block),
imported when a file is read so that this core module stays importable without the codegen stage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ggml_dispatch import fileio
from ggml_dispatch.artifacts import validators as v
from ggml_dispatch.errors import InputError

TABLE_WHAT: Final = "a table.json"
ANY_WHAT: Final = "a table.json or a ggml-dispatch-table.h header"
HEADER_MARK: Final = "GGML_DISPATCH_TABLE_"


decode_text = v.decode_text
read_text = v.read_text


@dataclass(frozen=True)
class LoadedTable:
    table: dict[str, Any]
    hash: str  # sha256 of the canonical table.json (the one a header embeds)
    origin: str
    kind: str  # "json", "header" or "empty"


def loads_any(text: str, origin: str) -> LoadedTable:
    """table.json text or a rendered header (the content decides which)."""
    from ggml_dispatch.codegen import render
    from ggml_dispatch.codegen import table as tbl

    body = text.lstrip()
    if body.startswith("{"):
        t = tbl.loads(text, origin)
        return LoadedTable(t, tbl.table_hash(t), origin, "json")
    if HEADER_MARK not in text:
        what = "JSON" if body[:1] in ("[", '"') or body[:1].isdigit() else "text"
        raise InputError(
            origin,
            f"{what}, but neither a table.json (a JSON object) "
            "nor a header rendered by ggml-dispatch codegen",
        )
    t, h = render.parse_header(text, origin)
    return LoadedTable(t, h, origin, "header")


def load_any(path: str | Path) -> LoadedTable:
    """A table.json or rendered header file."""
    return loads_any(read_text(path, ANY_WHAT), str(path))


def load(path: str | Path) -> dict[str, Any]:
    """A table.json file, validated."""
    from ggml_dispatch.codegen import table as tbl

    return tbl.loads(read_text(path, TABLE_WHAT), path)


@dataclass(frozen=True)
class Table:
    """A validated table.json file, with what a provenance section says about it."""

    path: Path
    data: dict[str, Any]
    sha256: str

    def details(self) -> list[tuple[str, str]]:
        from ggml_dispatch.codegen import table as tbl

        data: Mapping[str, Any] = self.data
        gpu = data["gpu"]
        prov = data.get("provenance", {})
        out = [
            ("GPU", f"{gpu['name']} (cc {gpu['cc']}, {gpu['sm_count']} SMs)"),
            ("upstream commit", str(data["upstream_commit"]) or "(none)"),
            ("rules", str(len(data["rules"]))),
            ("refused candidates", str(len(data.get("refused", [])))),
            ("table hash", tbl.table_hash(data)),
            ("source", str(prov.get("source", "(none)"))),
        ]
        if isinstance(prov.get("decision"), dict):
            out.append(("decision", json.dumps(prov["decision"], sort_keys=True)))
        return out


def read(path: str | Path) -> Table:
    p = Path(path)
    data = load(p)
    return Table(p, data, fileio.sha256_file(p))
