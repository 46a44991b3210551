"""Atomic writes under the home: a temporary file, fsync, rename, fsync of the folder, so readers
see the old file or the new one, never half (all blocking; callers run these off the event loop)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def private(path: str, flags: int) -> int:
    """An ``open`` opener creating files readable by the owner only (0600), whatever the umask."""
    return os.open(path, flags, 0o600)


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Temp file, fsync, rename, fsync the folder: readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb", opener=private) as handle:
        handle.write(data)
        handle.flush()
        if sync:
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def write_json_atomic(path: Path, value: Any, *, sync: bool = True) -> None:
    text = json.dumps(value, ensure_ascii=False, indent=2) + "\n"
    write_atomic(path, text.encode("utf-8"), sync=sync)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
