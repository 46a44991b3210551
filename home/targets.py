"""What a file written under a temporary name and renamed over ``path`` (an export, a backup) may
replace: nothing, or a regular file. The rename replaces the directory entry itself, so a symbolic
link would become a file (``/dev/stdout`` under a root daemon) and a device, FIFO or socket would
be lost; a folder cannot be replaced at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def replace_problem(path: Path) -> str | None:
    """Why a rename must not replace what is at ``path`` (one ``lstat``, no link followed), or None
    when nothing is there or a regular file is. The reason only: the caller says what to do instead.
    ``OSError`` other than a missing path is raised."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "it is a symbolic link (the file written would replace the link, not what it points to)"
    if stat.S_ISDIR(mode):
        return "it is a folder"
    if not stat.S_ISREG(mode):
        return "it is not a regular file (a device, FIFO or socket)"
    return None
