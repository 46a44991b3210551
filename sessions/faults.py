"""Storage faults: what a failed write means for the client, and whether the store can write.

A full disk is 507 ``insufficient_storage``; any other refused write (a read-only file system,
permissions, an I/O error) is 503 ``storage_unavailable``. Either way nothing was stored, so the
client may send again once the operator has fixed the disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from config.errors import InsufficientStorage, NeotaskError, StorageUnavailable

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
PROBE_NAME = ".write-probe"
PROBE_BYTES = 4096


def storage_error(exc: OSError, what: str = "the message") -> NeotaskError:
    """The typed error a failed write answers; the message says nothing was stored."""
    reason = exc.strerror or str(exc)
    if exc.errno in FULL:
        return InsufficientStorage(
            f"the disk holding the Neotask home is full ({reason}): {what} was not stored;"
            " free some space and send it again"
        )
    return StorageUnavailable(f"the store cannot write ({reason}): {what} was not stored; send it again later")


def probe_writable(folder: Path) -> str | None:
    """Write, sync and remove a small file in ``folder`` (blocking); None when that worked, else
    why not. A disk with less room than a short message is not writable."""
    path = folder / PROBE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(b"\n" * PROBE_BYTES)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return None
