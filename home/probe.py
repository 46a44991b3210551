"""The write probe: whether a small file can be written and synced in a folder of the home."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROBE_NAME = ".write-probe"
PROBE_BYTES = 4096


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
