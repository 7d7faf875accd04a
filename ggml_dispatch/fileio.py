"""Atomic outputs (temporary name, then rename), hashing, and Parquet with key-value metadata."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ggml_dispatch import schema
from ggml_dispatch.errors import InputError


def _same_file(a: Path, b: Path) -> bool:
    """The same file: equal resolved paths (symlinks followed) or the same inode (hard links)."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _nearest_existing(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not os.path.lexists(p):
        p = p.parent
    return p


def check_output(path: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Refuse an output file that cannot be written or that names an input, before any work is done.

    Raises :class:`InputError` naming ``path`` when it is a folder, when it is (through a symlink or a
    hard link) one of ``inputs``, when a parent is not a folder, or when the nearest existing folder
    does not accept a new file (read-only mount, /proc, no permission: probed with a temporary file
    that is removed at once). Creates nothing that stays.
    """
    target = Path(path)
    for given in inputs:
        if _same_file(target, Path(given)):
            raise InputError(target, f"is also an input ({given}): an output never replaces an input")
    if target.is_dir():
        raise InputError(target, "is a folder, expected a file to write")
    if os.path.lexists(target) and not target.is_file():
        raise InputError(target, "exists and is not a regular file")
    _check_folder(target.parent, target)


def check_output_folder(path: str | Path) -> None:
    """Refuse an output folder that is a file, or that cannot be created or written (as
    :func:`check_output` does for a file)."""
    folder = Path(path)
    if os.path.lexists(folder) and not folder.is_dir():
        raise InputError(folder, "is not a folder")
    _check_folder(folder, folder)


def _check_folder(folder: Path, target: Path) -> None:
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise InputError(target, f"cannot create the folder: {base} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ggml-dispatch-probe.", dir=base)
    except OSError as e:
        raise InputError(target, f"cannot write in {base}: {e.strerror or e}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _mkdirs(folder: Path, target: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the folders created (outermost first)."""
    created: list[Path] = []
    missing: list[Path] = []
    p = folder
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise InputError(target, f"cannot create the folder {d}: {e.strerror or e}") from None
        created.append(d)
    if not folder.is_dir():
        raise InputError(target, f"cannot create the folder: {p} is not a folder")
    return created


def _mkstemp_beside(target: Path) -> Path:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise InputError(target, f"cannot write in {target.parent}: {e.strerror or e}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600; outputs get the permissions an ordinary open() would give them
    umask = os.umask(0)
    os.umask(umask)
    tmp_path.chmod(0o666 & ~umask)
    return tmp_path


def _write_error(target: Path, tmp: Path, e: OSError) -> InputError | None:
    """An OSError of writing ``tmp`` (no filename, or the temporary's) as an error naming ``target``."""
    if e.filename is None or str(e.filename) == str(tmp):
        return InputError(target, f"cannot write: {e.strerror or e}")
    return None


def _rmdirs(created: Sequence[Path]) -> None:
    for d in reversed(created):
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    A folder that cannot be created or written, or a folder where the file should be, raises
    :class:`InputError` naming ``path``; nothing is left behind.
    """
    target = Path(path)
    if target.is_dir():
        raise InputError(target, "is a folder, expected a file to write")
    created = _mkdirs(target.parent, target)
    try:
        tmp_path = _mkstemp_beside(target)
    except InputError:
        _rmdirs(created)
        raise
    done = False
    try:
        try:
            yield tmp_path
        except OSError as e:
            err = _write_error(target, tmp_path, e)
            if err is None:
                raise
            raise err from None
        try:
            os.replace(tmp_path, target)
        except OSError as e:
            raise InputError(target, f"cannot write: {e.strerror or e}") from None
        done = True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if not done:
            _rmdirs(created)


class OutputSet:
    """Temporaries of several output files that are renamed into place together (see :func:`output_set`)."""

    def __init__(self) -> None:
        self.staged: dict[Path, Path] = {}  # target -> temporary

    def path(self, target: str | Path) -> Path:
        """The temporary to write ``target``'s content into."""
        return self.staged[Path(target)]


def _set_write_error(outputs: OutputSet, e: OSError) -> OSError | InputError:
    for t, tmp in outputs.staged.items():
        if e.filename is not None and str(e.filename) == str(tmp):
            return InputError(t, f"cannot write: {e.strerror or e}")
    if e.filename is None and outputs.staged:
        first = next(iter(outputs.staged))
        return InputError(first.parent, f"cannot write: {e.strerror or e}")
    return e


def _backup(target: Path) -> Path:
    """A hard link (else a copy) of ``target``'s current content beside it, to restore on failure."""
    backup = _mkstemp_beside(target)
    backup.unlink()
    try:
        os.link(target, backup)
    except OSError:
        try:
            shutil.copy2(target, backup)
        except OSError as e:
            raise InputError(target, f"cannot keep its previous content: {e.strerror or e}") from None
    return backup


@contextlib.contextmanager
def output_set(targets: Iterable[str | Path], inputs: Iterable[str | Path] = ()) -> Iterator[OutputSet]:
    """Write several files as one output: all of them, or (on any error) none of them.

    Every target is checked (:func:`check_output`) before the first temporary is made; the block writes
    each target's content to ``outputs.path(target)``; only when the block succeeds are they renamed
    into place. Should a rename fail, the files already renamed get their previous content back (or
    are removed when there was none) and folders this call created are removed.
    """
    wanted = [Path(t) for t in targets]
    given = list(inputs)
    for t in wanted:
        check_output(t, given)
    created: list[Path] = []
    outputs = OutputSet()
    backups: list[tuple[Path, Path | None]] = []  # renamed target, its previous content
    committed = False
    try:
        for t in wanted:
            created += _mkdirs(t.parent, t)
            outputs.staged[t] = _mkstemp_beside(t)
        try:
            yield outputs
        except OSError as e:
            raise _set_write_error(outputs, e) from None
        for t, tmp in outputs.staged.items():
            backup = None
            if os.path.lexists(t):
                backup = _backup(t)
            backups.append((t, backup))
            try:
                os.replace(tmp, t)
            except OSError as e:
                raise InputError(t, f"cannot write: {e.strerror or e}") from None
        committed = True
    finally:
        if not committed:
            for t, backup in reversed(backups):
                with contextlib.suppress(OSError):
                    if backup is None:
                        t.unlink()
                    else:
                        os.replace(backup, t)
        for _, backup in backups:
            if backup is not None:
                with contextlib.suppress(FileNotFoundError):
                    backup.unlink()
        for tmp in outputs.staged.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if not committed:
            _rmdirs(created)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def base_metadata(schema_name: str, **extra: Any) -> dict[str, str]:
    """Provenance common to every Parquet file: schema, tool version, creation time, plus extras.

    Values that are not strings are stored as canonical JSON.
    """
    meta: dict[str, str] = {
        schema.META_SCHEMA: schema_name,
        schema.META_TOOL_VERSION: schema.TOOL_VERSION,
        schema.META_CREATED: now_iso(),
    }
    for key, value in extra.items():
        full = key if key.startswith(schema.META_PREFIX) else schema.META_PREFIX + key
        meta[full] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return meta


def write_parquet(table: pa.Table, path: str | Path, metadata: Mapping[str, str]) -> None:
    """Write ``table`` with ``metadata`` merged into the schema's key-value metadata, atomically."""
    existing = dict(table.schema.metadata or {})
    existing.update({k.encode(): v.encode() for k, v in metadata.items()})
    table = table.replace_schema_metadata(existing)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_metadata(path: str | Path) -> dict[str, str]:
    md = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in md.items() if k.decode().startswith(schema.META_PREFIX)}
