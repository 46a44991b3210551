"""JSON Lines files: encoding, reading, torn-tail repair, atomic rewrites (all blocking; callers
run these on the writer or ledger thread, never on the event loop)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from home.atomic import private, write_atomic
from sessions.codec import decode, encode

log = logging.getLogger(__name__)

_TAIL_CHUNK = 65536


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete, parseable line; a missing file yields nothing."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                break
            try:
                record = decode(raw)
            except ValueError:
                record = None
            if isinstance(record, dict):
                yield record
            elif raw.strip():  # corruption, not silence: `neotask doctor` reports and cuts it
                log.warning("%s line %d is not a JSON object: skipped", path, number)


def read_records(path: Path) -> list[dict[str, Any]]:
    return list(iter_records(path))


def last_record(path: Path) -> dict[str, Any] | None:
    """The last complete line, read from the end (O(line length), not O(file))."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size == 0:
                return None
            buffer = b""
            position = size
            while position > 0:
                step = min(_TAIL_CHUNK, position)
                position -= step
                handle.seek(position)
                buffer = handle.read(step) + buffer
                lines = buffer.rstrip(b"\n").split(b"\n")
                if len(lines) > 1 or position == 0:
                    for raw in reversed(lines):
                        try:
                            record = decode(raw)
                        except ValueError:
                            continue
                        if isinstance(record, dict):
                            return record
                    if position == 0:
                        return None
    except FileNotFoundError:
        return None
    return None


def repair_tail(path: Path | str) -> tuple[int, dict[str, Any] | None]:
    """Cut a torn tail (a last line with no newline, or one that is not JSON) into
    ``<file>.torn`` and log it; return the bytes cut and the last good record."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0, None
    last: dict[str, Any] | None = None
    try:
        size = os.fstat(fd).st_size
        good = size
        while good > 0:
            start = max(0, good - _TAIL_CHUNK)
            data = os.pread(fd, good - start, start)
            complete = data.endswith(b"\n")
            previous = data.rfind(b"\n", 0, len(data) - 1 if complete else len(data))
            if previous < 0 and start > 0:  # a line longer than the chunk: read it whole
                start, data = 0, os.pread(fd, good, 0)
                previous = data.rfind(b"\n", 0, len(data) - 1 if complete else len(data))
            if complete:
                parsed = _parse(data[previous + 1 : -1])
                if parsed is not None:
                    last = parsed if isinstance(parsed, dict) else None
                    break
            good = start + previous + 1
        if good == size:
            return 0, last
        torn = os.pread(fd, size - good, good)
        with open(f"{path}.torn", "ab", opener=private) as out:
            out.write(torn if torn.endswith(b"\n") else torn + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.ftruncate(fd, good)
        os.fsync(fd)
        log.warning("cut a torn tail of %d bytes from %s into %s.torn", size - good, path, os.path.basename(path))
        return size - good, last
    finally:
        os.close(fd)


def _parse(line: bytes) -> Any:
    """The parsed line, ``{}`` for a blank one, None when it is not JSON."""
    if not line.strip():
        return {}
    try:
        return decode(line)
    except ValueError:
        return None


def write_records_atomic(path: Path, records: Iterable[dict[str, Any]], *, sync: bool = True) -> None:
    write_atomic(path, b"".join(encode(r) for r in records), sync=sync)
