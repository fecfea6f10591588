"""Atomic writes: a reader (or a resumed run) sees the old file or folder, or the whole new one, never half.

Everything is written beside its destination (same filesystem), flushed, fsynced and renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flashdraft.errors import UserError


MARKER = ".flashdraft-output.json"


def check_output_dir(
    path: str | Path,
    command: str,
    *,
    flag: str = "--output",
    overwrite: bool | None = False,
    produced: Callable[[Path], bool] | None = None,
) -> Path:
    """Refuse an output folder that holds something this command did not write; returns it resolved.

    Allowed: a new or empty folder, or an earlier output of the same command, which it replaces or
    continues: `produced(folder)` says so, or else the marker file `mark_output` leaves. Refused always:
    a file, the working folder, the home folder and the filesystem root. Any other non-empty folder is
    refused unless `overwrite` (None: the command has no --overwrite to offer).
    """
    path = Path(path).expanduser()
    resolved = path.resolve()
    if resolved in (Path.cwd().resolve(), Path.home().resolve(), Path(resolved.anchor)):
        raise UserError(f"{flag} {path} is the working, home or root folder; give a folder of its own")
    if resolved.exists() and not resolved.is_dir():
        raise UserError(f"{flag} {path} is a file; give a folder")
    if resolved.is_dir() and any(resolved.iterdir()) and not overwrite:
        ours = produced(resolved) if produced is not None else _marked_by(resolved, command)
        if not ours:
            offer = "" if overwrite is None else ", or pass --overwrite to replace what is there"
            raise UserError(
                f"{flag} {path} is not empty and is not an earlier output of `flashdraft {command}`; give a new or "
                f"empty folder{offer}"
            )
    return resolved


def check_output_file(path: str | Path | None, what: str) -> Path:
    """An output file path that can be written: not a folder, its folder a folder (created if missing)."""
    if not path:
        raise UserError(f"{what} is not set; give the file to write")
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder; give a file path, e.g. {path / 'report.json'}")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(f"{what} {path}: {parent} is a file, not a folder")
    return path


@contextlib.contextmanager
def undone_on_bad_input(folder: Path) -> Iterator[None]:
    """A new (missing or empty) output folder is left as it was when the block fails on bad input, so a
    fixed rerun starts clean; an earlier output, or a run interrupted any other way, is kept for resume."""
    existed = folder.exists()
    fresh = not existed or (folder.is_dir() and not any(folder.iterdir()))
    try:
        yield
    except UserError:
        if fresh and folder.is_dir():
            for child in list(folder.iterdir()) if existed else [folder]:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def holds_only(*names: str) -> Callable[[Path], bool]:
    """A `produced` test: the folder holds nothing but these names (and hidden temp files of ours)."""
    allowed = set(names)
    return lambda folder: all(p.name in allowed or p.name.startswith(".") for p in folder.iterdir())


def _marked_by(folder: Path, command: str) -> bool:
    marker = folder / MARKER
    try:
        return marker.is_file() and json.loads(marker.read_text()).get("command") == command
    except (OSError, ValueError, AttributeError):
        return False


def mark_output(folder: str | Path, command: str) -> None:
    """Record in `folder` that `command` wrote it (check_output_dir then lets the command replace it)."""
    write_json(Path(folder) / MARKER, {"command": command})


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, data: Any, indent: int = 2) -> Path:
    """`data` as JSON (non-JSON values as their str()), atomically."""
    return write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp file path beside `path` for a writer that streams (parquet, jsonl); when the block
    succeeds the file is fsynced and renamed to `path`; when it raises, the temp file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp folder beside `path`; when the block succeeds it becomes `path`.

    `path` must not exist yet, or hold only an earlier result of the same writer (the caller decides
    which): it is replaced in one rename after the new one is complete. When the block raises, the temp
    folder is removed and `path` is left as it was.
    """
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            # A rename cannot replace a non-empty folder: move the old one aside first, then drop it.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "previous")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
