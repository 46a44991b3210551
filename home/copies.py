"""Copies of files under a home, for backups (blocking): every regular file under a folder in
order, a tree copied without its temporary files (a file that vanishes meanwhile is skipped), and
one consistent copy of a SQLite database through its backup API."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path

from home.layout import PRIVATE_DIR


def walk_files(root: Path) -> Iterator[Path]:
    """Every regular file under ``root``, sorted (a backup archive's order)."""
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            yield path


def is_temp(name: str) -> bool:
    return name.endswith(".tmp")


def private_dir(path: Path) -> None:
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)


def copy_tree(source: Path, target: Path) -> int:
    """Copy the files under ``source`` (temp files left out); a file that vanishes meanwhile is
    skipped. The number of files copied."""
    return copy_files((p for p in walk_files(source) if not is_temp(p.name)), source, target)


def copy_files(files: Iterable[Path], source: Path, target: Path) -> int:
    """Copy each file (under ``source``) to its place under ``target``, in order, owner-only; one
    that vanished meanwhile is skipped. The number of files copied."""
    copied = 0
    for path in files:
        dest = target / path.relative_to(source)
        private_dir(dest.parent)
        try:
            shutil.copyfile(path, dest)
        except FileNotFoundError:
            continue
        os.chmod(dest, 0o600)
        copied += 1
    return copied


def backup_sqlite(source: Path, target: Path) -> bool:
    """One consistent copy of a SQLite database through its backup API (a read transaction:
    writers may go on); False when there is no such database."""
    if not source.exists():
        return False
    private_dir(target.parent)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            dst.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            dst.close()
    finally:
        src.close()
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{target}{suffix}")
    return True
