"""Archived runs: ``archive/{uuid}.tar.gz`` holds a completed run's folder; its stores stay
readable (blocking helpers: callers run them off the event loop).

Archiving survives ``kill -9`` at any step: the archive is written under a temp
name and linked into place without ever replacing an existing one; the caller records it in
tasks.db; only then is the folder moved aside (one atomic rename, so ``completed/{uuid}`` is either
whole or gone) and removed. A folder whose archive already exists is never re-packed: a
half-removed folder would make a smaller archive."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

from home.atomic import fsync_dir, private
from sessions.protocol import ARCHIVE_STEPS as STEPS
from sessions.protocol import ArchiveStep as Step

__all__ = ["REMOVING_PREFIX", "STEPS", "Step", "archive_ok", "finish_removals", "read_member", "read_records",
           "remove_folder", "temp_of", "write_archive"]  # fmt: skip

REMOVING_PREFIX = ".removing-"  # archive/.removing-{uuid}: a folder moved aside, being removed


def _no_step(name: str) -> None:
    return None


class ArchiveDamaged(OSError):
    """An archive exists but cannot be read: it is kept, and its folder too."""


def archive_ok(archive: Path, run_id: str) -> bool:
    """The archive exists, decompresses to the end (gzip CRC checked) and holds the run's metadata;
    False when it is missing; ArchiveDamaged when it is there but unreadable."""
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            names = {member.name for member in tar}
    except FileNotFoundError:
        return False
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveDamaged(errno.EIO, f"archive {archive} is unreadable ({exc}); it is kept as it is") from exc
    if f"{run_id}/metadata.json" not in names and f"{run_id}/messages.jsonl" not in names:
        raise ArchiveDamaged(errno.EIO, f"archive {archive} does not hold run {run_id}; it is kept as it is")
    return True


def temp_of(archive: Path) -> Path:
    return archive.with_name(f".{archive.name}.tmp")


def write_archive(folder: Path, archive: Path, *, step: Step = _no_step) -> bool:
    """Pack ``folder`` into ``archive`` (temp name, fsync, link into place); an existing archive is
    never replaced. True when this call wrote it."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_of(archive)
    with open(tmp, "wb", opener=private) as raw:
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            tar.add(folder, arcname=folder.name)
        raw.flush()
        os.fsync(raw.fileno())
    step("packed")
    try:
        os.link(tmp, archive)  # fails if the archive exists: never overwritten
    except FileExistsError:
        os.unlink(tmp)
        return False
    except OSError as exc:  # a file system without hard links: check, then rename
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if archive.exists():
            os.unlink(tmp)
            return False
        os.replace(tmp, archive)
    else:
        os.unlink(tmp)
    fsync_dir(archive.parent)
    step("archived")
    return True


def remove_folder(folder: Path, archive_dir: Path, *, step: Step = _no_step) -> None:
    """Move the run folder aside in one rename, then remove it; ``completed/{uuid}`` is never left
    half removed."""
    if folder.is_dir():
        aside = archive_dir / f"{REMOVING_PREFIX}{folder.name}"
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(folder, aside)
        fsync_dir(folder.parent)
        fsync_dir(archive_dir)
        step("detached")
        _remove_tree(aside, step)
        fsync_dir(archive_dir)


def _remove_tree(path: Path, step: Step) -> None:
    first = True
    for root, dirs, files in os.walk(path, topdown=False):
        for name in sorted(files):
            os.unlink(os.path.join(root, name))
            if first:
                first = False
                step("removing")
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)


def finish_removals(archive_dir: Path) -> list[str]:
    """Remove folders a crash left moved aside (their archives are recorded); their run ids."""
    try:
        names = [n for n in os.listdir(archive_dir) if n.startswith(REMOVING_PREFIX)]
    except FileNotFoundError:
        return []
    for name in names:
        shutil.rmtree(archive_dir / name, ignore_errors=True)
    if names:
        fsync_dir(archive_dir)
    return [n.removeprefix(REMOVING_PREFIX) for n in names]


def read_member(archive: Path, run_id: str, name: str) -> str | None:
    """One file of an archived run as text; None when the archive or the file is missing."""
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            try:
                member = tar.getmember(f"{run_id}/{name}")
            except KeyError:
                return None
            handle = tar.extractfile(member)
            return None if handle is None else io.TextIOWrapper(handle, encoding="utf-8").read()
    except FileNotFoundError:
        return None


def read_records(archive: Path, run_id: str, name: str) -> list[dict[str, Any]]:
    text = read_member(archive, run_id, name) or ""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out
