"""Packing a staged home into one archive, and a restore out of one (blocking).

``finish``: the doctor's safe fixes over the stage (the folders are the truth: a run that started
or ended between the ledger's copy and the point is brought in line, as start-up recovery does),
then a check that finds nothing, then ``manifest.json`` and every file into ``<out>.tmp``, fsync,
rename. ``restore``: verify the whole archive, refuse a home that is not empty, create the folders
above it, extract into a sibling temp folder, check it with the doctor, rename it into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backups.errors import BackupInvalid, BackupTargetError, HomeNotEmpty
from backups.manifest import (
    DAMAGED,
    FORMAT,
    FORMAT_VERSION,
    HOME_PREFIX,
    MANIFEST,
    counts,
    file_table,
    verify,
)
from config.settings import Settings
from home.atomic import fsync_dir
from home.copies import walk_files
from home.layout import PRIVATE_DIR, Home
from home.targets import replace_problem
from sessions.backends import staged_home
from sessions.backup import StagedHome
from sessions.records import StoredRecord

COMPRESS_LEVEL = 3  # a backup of a busy home is CPU-bound at 6 for little gain


def check_target(out: Path, home: Path | None = None) -> None:
    """Fail before any work when ``out`` cannot be written (nothing is left behind), or must not
    be: a device, FIFO or socket (the archive would replace it: ``/dev/null`` became a file), a
    file that is not a neotask backup (a backup replaces only an older one), or a path inside the
    gateway's ``home`` other than its backups folder (``sessions.json`` became a tarball)."""
    parent = out.parent
    try:
        if problem := replace_problem(out):
            raise BackupTargetError(f"{out}: {problem}; give the path of a file to write")
        if not parent.is_dir():
            raise BackupTargetError(f"{parent} does not exist: create it or choose another -o")
        if home is not None:
            _outside_home(out, home)
        if os.path.lexists(out):
            _is_backup(out)
    except OSError as exc:  # a name too long, a loop of links: not a path this host can write
        raise BackupTargetError(f"cannot use {str(out)[:200]!r}: {exc.strerror or exc}; choose another -o") from exc
    probe = parent / f".{out.name}.probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BackupTargetError(f"cannot write to {parent}: {exc.strerror or exc}; choose another -o") from exc


def _outside_home(out: Path, home: Path) -> None:
    real = Path(os.path.realpath(out.parent)) / out.name
    root, backups = Path(os.path.realpath(home)), Path(os.path.realpath(home / "backups"))
    if real.is_relative_to(root) and not real.parent.is_relative_to(backups):
        raise BackupTargetError(
            f"{out} is inside the gateway's home ({home}): a backup there would replace its files;"
            f" choose a path outside it, or {backups}"
        )


def _is_backup(out: Path) -> None:
    """An existing regular file the archive may replace: a neotask backup (its first member is the
    manifest)."""
    try:
        with tarfile.open(out, mode="r:gz") as tar:
            first = tar.next()
    except (OSError, tarfile.TarError, EOFError):
        first = None
    if first is None or first.name != MANIFEST:
        raise BackupTargetError(
            f"{out} exists and is not a neotask backup: a backup replaces only an older backup;"
            " remove it or choose another -o"
        )


def problems(findings: list[StoredRecord]) -> list[str]:
    return [str(f["detail"]) for f in findings if f["severity"] in ("error", "warning") and not f["fixed"]]


def finish(
    stage: StagedHome, out: Path, *, meta: Mapping[str, Any], point: Mapping[str, Any], now: str, settings: Settings
) -> dict[str, Any]:
    """Bring the stage in line, check it, pack it into ``out``; the manifest."""
    stage.check(fix=True, now=now, settings=settings)
    left = problems(stage.check(fix=False, now=now, settings=settings))
    if left:  # never expected: a backup that would not restore clean is not written
        raise BackupInvalid(f"the staged copy is not consistent ({left[0]}); nothing was written")
    files = file_table(stage.root)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **meta,
        "created_at": now,
        "point": dict(point),
        "counts": counts(files, point),
        "history_index": "not included: rebuilt from the run folders and archives at the first start",
        "files": files,
    }
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a crashed backup's, or a link planted there: created anew, never followed
        exclusive = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with open(tmp, "wb", opener=lambda p, _: os.open(p, exclusive, 0o600)) as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=COMPRESS_LEVEL, format=tarfile.PAX_FORMAT) as tar:
                data = json.dumps(manifest, ensure_ascii=False, indent=1).encode("utf-8")
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode, info.mtime = len(data), 0o600, int(os.path.getmtime(stage.root))
                tar.addfile(info, io.BytesIO(data))
                for path in walk_files(stage.root):
                    tar.add(path, arcname=HOME_PREFIX + path.relative_to(stage.root).as_posix(), recursive=False)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise BackupTargetError(f"cannot write {out}: {exc.strerror or exc}; choose another -o") from exc
    return manifest


def is_empty(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def restore(archive: Path, target: Path, *, now: str, settings: Settings) -> dict[str, Any]:
    """Restore ``archive`` into ``target`` (new or empty); the manifest. Nothing is written
    when the archive is bad or the target is not empty."""
    target = target.expanduser().absolute()
    if not is_empty(target):
        raise HomeNotEmpty(f"{target} is not empty: restore into a new or empty folder (--home)")
    manifest = verify(archive)
    created = _make_parents(target)
    work = target.parent / f".{target.name}.restoring-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        work.mkdir(mode=PRIVATE_DIR)
        _extract(archive, work)
        for path in [work, *work.rglob("*")]:
            os.chmod(path, PRIVATE_DIR if path.is_dir() else 0o600)
        Home(work).ensure()
        restored = staged_home(work)
        if settings.history.enabled:
            asyncio.run(build_history(restored))
        left = problems(restored.check(fix=False, now=now, settings=settings))
        if left:
            raise BackupInvalid(f"the restored home does not check clean ({left[0]}); nothing was restored")
        if target.exists():
            target.rmdir()
        os.rename(work, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return manifest


def _make_parents(target: Path) -> list[Path]:
    """Create the missing folders above ``target`` (private, as the home is); the ones created,
    outermost first, for a failed restore to remove."""
    missing = [folder for folder in reversed(target.parents) if not folder.is_dir()]
    created = []
    try:
        for folder in missing:
            folder.mkdir(mode=PRIVATE_DIR)
            created.append(folder)
    except OSError as exc:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise BackupTargetError(
            f"cannot create {exc.filename or target.parent}: {exc.strerror or exc}; choose another --home"
        ) from exc
    return created


def _extract(archive: Path, work: Path) -> None:
    """The home's files of the (verified) archive into ``work``; ``BackupInvalid`` if it no longer
    reads (changed on disk since the verify)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(HOME_PREFIX) and m.isfile()]
            for member in members:
                member.name = member.name.removeprefix(HOME_PREFIX)
            tar.extractall(work, members=members, filter="data")
    except DAMAGED as exc:
        raise BackupInvalid(f"{archive} is truncated or damaged ({str(exc) or type(exc).__name__})") from exc


async def build_history(home: StagedHome) -> None:
    """The history index the backup left out, built from the restored runs and archives (so the
    doctor finds it, and the first start need not)."""
    left = problems(await home.build_history())
    if left:
        raise BackupInvalid(f"the history index of the restored home could not be built ({left[0]})")


def restored_files(manifest: Mapping[str, Any]) -> int:
    return len(manifest.get("files") or {})
