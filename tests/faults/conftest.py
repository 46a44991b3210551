"""Real faults for the ``tests/faults`` suite: a small tmpfs as the home (filled to make the disk
full), and helpers to fill and free it. Mounting needs root; without it the tests skip."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

TMPFS_SIZE = "5m"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 5 MiB tmpfs mounted under ``tmp_path``, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(folder: Path, name: str = "filler.bin") -> Path:
    """Write zeros into ``folder/name`` until the file system refuses (ENOSPC); blocking."""
    path = folder / name
    block = b"\0" * 65536
    try:
        with path.open("ab") as handle:
            while True:
                handle.write(block)
                handle.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    # the buffered tail may not have been written: top up with small writes until refused
    with contextlib.suppress(OSError), path.open("ab", buffering=0) as handle:
        while handle.write(b"\0" * 512):
            pass
    return path
