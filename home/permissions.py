"""Who can read the home: conversations are private to the owner. Files are created 0600 and
folders 0700 (the CLI sets the umask, and the store's own files carry explicit modes); a home made
by an older version, or copied, may be wider, which the doctor reports and fixes (blocking)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

OTHERS = 0o077  # group and other bits: none may be set


@dataclass(frozen=True)
class WideModes:
    paths: tuple[tuple[str, int], ...]  # (path relative to the root, mode), the first few
    count: int

    def describe(self) -> str:
        shown = ", ".join(f"{path or '.'} {mode:04o}" for path, mode in self.paths)
        more = f", and {self.count - len(self.paths)} more" if self.count > len(self.paths) else ""
        return f"{self.count} path(s) under the home can be read or written by other users: {shown}{more}"


def _walk(root: Path) -> list[tuple[str, int]]:
    """(relative path, permission bits) of the root and everything under it; symlinks are skipped
    (their own mode means nothing, and their target may lie outside the home)."""
    found: list[tuple[str, int]] = []
    try:
        found.append(("", stat.S_IMODE(os.lstat(root).st_mode)))
    except FileNotFoundError:
        return found
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(info.st_mode):
                continue
            found.append((os.path.relpath(path, root), stat.S_IMODE(info.st_mode)))
    return found


def wide_modes(root: Path, *, shown: int = 5) -> WideModes | None:
    wide = [(path, mode) for path, mode in _walk(root) if mode & OTHERS]
    return WideModes(tuple(wide[:shown]), len(wide)) if wide else None


def tighten(root: Path) -> int:
    """Clear the group and other bits everywhere under the root; how many paths changed."""
    changed = 0
    for path, mode in _walk(root):
        if mode & OTHERS:
            try:
                os.chmod(root / path if path else root, mode & ~OTHERS, follow_symlinks=False)
            except (FileNotFoundError, NotImplementedError):
                continue
            changed += 1
    return changed


def tighten_root(root: Path) -> int | None:
    """At start: a home the user made before the first start (``mkdir`` under a 022 umask gives
    0755) is made private to the owner. Its old mode when it was wider (the caller logs it), else
    None. Only the root: what the gateway creates under it carries its own modes, and anything
    else wider is the doctor's to report."""
    try:
        mode = stat.S_IMODE(os.stat(root).st_mode)
    except FileNotFoundError:
        return None
    if not mode & OTHERS:
        return None
    try:
        os.chmod(root, mode & ~OTHERS)
    except PermissionError:  # not the owner: the doctor reports it (wide_modes)
        return None
    return mode
