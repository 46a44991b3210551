"""The end of ``logs/gateway.log`` for the console's live log page (``GET /v1/admin/logs``).

Read on a worker thread. A first call takes the last ``lines`` lines; the next ones pass the
``offset`` they were given and get what was written since (at most ``MAX_BYTES``; the rest with
the call after). When the file is shorter than the offset, or another file now has its name, it
was rotated: the reading starts again at its beginning and ``rotated`` says so."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BYTES = 256 * 1024
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Tail:
    lines: list[str]
    offset: int  # where the next call starts
    inode: int | None
    rotated: bool = False

    def as_json(self, file: str) -> dict[str, Any]:
        return {"file": file, "lines": self.lines, "offset": self.offset, "inode": self.inode, "rotated": self.rotated}


def read_tail(path: Path, *, lines: int, after: int | None = None, inode: int | None = None) -> Tail:
    """The last ``lines`` lines (``after`` None), or the whole lines written after ``after``."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return Tail([], 0, None, rotated=after is not None)
    try:
        stat = os.fstat(fd)
        rotated = after is not None and (after > stat.st_size or (inode is not None and inode != stat.st_ino))
        if after is not None and not rotated:
            return _since(fd, after, stat.st_size, stat.st_ino)
        if rotated:
            return _since(fd, 0, stat.st_size, stat.st_ino, rotated=True)
        return _last(fd, lines, stat.st_size, stat.st_ino)
    finally:
        os.close(fd)


def _since(fd: int, start: int, size: int, inode: int, *, rotated: bool = False) -> Tail:
    data = os.pread(fd, min(MAX_BYTES, size - start), start)
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
    return Tail(_decode(data[:end]), start + end, inode, rotated)


def _last(fd: int, count: int, size: int, inode: int) -> Tail:
    data, position = b"", size
    while position > 0 and data.count(b"\n") <= count and size - position < MAX_BYTES:
        step = min(_CHUNK, position)
        position -= step
        data = os.pread(fd, step, position) + data
    end = data.rfind(b"\n") + 1
    whole = _decode(data[:end])
    if position > 0 and whole:
        whole = whole[1:]  # the first line read may be cut
    return Tail(whole[-count:] if count else [], position + end, inode)


def _decode(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()
