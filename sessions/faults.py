"""Storage faults: what a failed write means for the client (whether the store can write is
``home.probe``).

A full disk is 507 ``insufficient_storage``; any other refused write (a read-only file system,
permissions, an I/O error) is 503 ``storage_unavailable``. Either way nothing was stored, so the
client may send again once the operator has fixed the disk.
"""

from __future__ import annotations

import errno

from config.errors import InsufficientStorage, NeotaskError, StorageUnavailable

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_error(exc: OSError, what: str = "the message") -> NeotaskError:
    """The typed error a failed write answers; the message says nothing was stored."""
    reason = exc.strerror or str(exc)
    if exc.errno in FULL:
        return InsufficientStorage(
            f"the disk holding the Neotask home is full ({reason}): {what} was not stored;"
            " free some space and send it again"
        )
    return StorageUnavailable(f"the store cannot write ({reason}): {what} was not stored; send it again later")
