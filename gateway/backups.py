"""Backups of the home, online (inside the daemon) or offline (the CLI under the home lock): the
store stages its part at one consistent point through its ``Backup`` (``sessions.protocol``), the
gateway copies the rest around it, ``backups/`` checks and packs (blocking, off the loop).

In this order: channels.db and the Matrix crypto stores through SQLite's backup API; then the
store's point (the files backend: tasks.db, then in one pass of the event loop the sessions.json
entries as the store holds them and the active runs frozen on the append writer's thread behind
every append queued before, so every acknowledged message is in, each once, and nothing appended
later is, then the completed runs and archives; PostgreSQL: one REPEATABLE READ dump written as a
files home); then the workspaces, the config, and the memory tables copied on the index's write
thread. The doctor's safe fixes bring the stage in line (the folders are the truth, as at
start-up) and a check must find nothing before the archive is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backups import pack, retention, stage
from backups.errors import BackupRunning
from config.clock import Clock, iso
from config.loader import LoadedConfig
from gateway.places import memory_uri, version, workspaces
from home.copies import backup_sqlite, copy_tree
from home.layout import Home
from memory import MemoryService
from sessions.backends import offline_backup, staged_home
from sessions.backup import BackupPoint
from sessions.protocol import StoreProtocol

log = logging.getLogger(__name__)


def _inside(path: Path, root: Path) -> Path | None:
    with contextlib.suppress(ValueError):
        return path.expanduser().absolute().relative_to(root.absolute())
    return None


def stage_databases(home: Home, target: Home) -> list[str]:
    """channels.db and the Matrix accounts' crypto stores (``matrix/<account>/*.db``: the bot
    devices' keys, without which a restored bot cannot read its encrypted rooms); tasks.db is the
    store's (its ``Backup``)."""
    copied = []
    pairs = [(home.root / "channels.db", target.root / "channels.db")]
    pairs += [(db, target.root / db.relative_to(home.root)) for db in sorted(home.root.glob("matrix/*/*.db"))]
    for source, dest in pairs:
        if backup_sqlite(source, dest):
            copied.append(dest.relative_to(target.root).as_posix())
    return copied


def stage_files(config: LoadedConfig, home: Home, target: Home, point: BackupPoint) -> dict[str, Any]:
    """Workspaces inside the home and the config file; the notes of the manifest (with what the
    store's point copied)."""
    notes: dict[str, Any] = {"skipped": [], **point.notes}
    for agent_id, folder in sorted(workspaces(config).items()):
        rel = _inside(folder, home.root)
        if rel is None:
            notes["skipped"].append(f"workspace of {agent_id} ({folder}) is outside the home: back it up yourself")
        elif folder.is_dir():
            copy_tree(folder, target.root / rel)
    if config.config_path is not None and config.config_path.is_file():
        shutil.copyfile(config.config_path, target.root / "config.yaml")
        os.chmod(target.root / "config.yaml", 0o600)
    return notes


def stage_memory(config: LoadedConfig, home: Home, target: Home, notes: dict[str, Any]) -> None:
    uri = memory_uri(config)
    rel = _inside(uri, home.root)
    if rel is None:
        notes["skipped"].append(f"memory index {uri} is outside the home (rebuilt from the workspaces if missing)")
        return
    notes["memory_files"] = stage.copy_lance(uri, target.root / rel)


def _meta(config: LoadedConfig, mode: str, point: BackupPoint, notes: dict[str, Any]) -> dict[str, Any]:
    return {"neotask_version": version(), "mode": mode, "home": str(config.home), **point.meta, "notes": notes}


def _point(point: BackupPoint) -> dict[str, Any]:
    return {"at": point.at, "runs": {run_id: dict(run) for run_id, run in point.runs.items()}}


def _target(home: Home, output: Path | None, clock: Clock) -> Path:
    if output is not None:
        return output.expanduser().absolute()
    folder = retention.backup_dir(home.root)
    folder.mkdir(mode=0o700, exist_ok=True)
    return retention.default_path(home.root, clock())


def _summary(out: Path, manifest: Mapping[str, Any], pruned: list[str]) -> dict[str, Any]:
    point = manifest.get("point") or {}
    return {
        "path": str(out),
        "size": out.stat().st_size,
        "created_at": manifest["created_at"],
        "mode": manifest["mode"],
        "counts": manifest["counts"],
        "point": {"at": point.get("at"), "runs": point.get("runs", {})},
        "notes": manifest.get("notes", {}),
        "pruned": pruned,
    }


class Backups:
    """Backups inside the daemon: one at a time (a second call while one runs is a 409)."""

    def __init__(self, config: LoadedConfig, store: StoreProtocol, memory: MemoryService | None, clock: Clock) -> None:
        self.config = config
        self.store = store
        self.memory = memory
        self.clock = clock
        self._lock = asyncio.Lock()
        self.last: dict[str, Any] | None = None

    async def take(self, output: Path | None = None, *, prune: bool | None = None) -> dict[str, Any]:
        """Take a backup into ``output`` (default: ``<home>/backups/neotask-<time>.tar.gz``, and
        then the old ones beyond ``backup.keep`` pruned); a summary of the manifest."""
        if self._lock.locked():
            raise BackupRunning("a backup is being taken already: wait for it to finish")
        async with self._lock:
            home = Home(self.config.home)
            out = await asyncio.to_thread(_target, home, output, self.clock)
            await asyncio.to_thread(pack.check_target, out, home.root)
            started = self.clock()
            target = await asyncio.to_thread(stage.new_stage, home, f"{started:%Y%m%dT%H%M%S}-{os.getpid()}")
            try:
                manifest = await self._stage_and_pack(home, target, out)
            finally:
                await asyncio.to_thread(shutil.rmtree, target.root, True)
            keep = self.config.settings.backup.keep
            pruned = []
            if prune if prune is not None else output is None:
                pruned = await asyncio.to_thread(retention.prune, home.root, keep, spare=out.name)
            summary = await asyncio.to_thread(_summary, out, manifest, pruned)
            self.last = summary
            log.info("backup written: %s (%d runs, %d bytes)", out, manifest["counts"]["runs"], summary["size"])
            return summary

    async def scheduled(self) -> dict[str, Any] | None:
        """``backup.schedule``'s firing: a backup into the backup folder, old ones pruned; a
        failure is logged (the next firing tries again)."""
        try:
            return await self.take()
        except Exception:  # a scheduler job must not die of it: logged with its cause
            log.exception("scheduled backup failed")
            return None

    async def _stage_and_pack(self, home: Home, target: Home, out: Path) -> dict[str, Any]:
        await asyncio.to_thread(stage_databases, home, target)
        staged = staged_home(target.root)
        point = await self.store.backup.stage_backup(staged)
        notes = await asyncio.to_thread(stage_files, self.config, home, target, point)
        if self.memory is not None:
            await self.memory.exclusive(lambda: stage_memory(self.config, home, target, notes))
        else:
            await asyncio.to_thread(stage_memory, self.config, home, target, notes)
        meta = _meta(self.config, "online", point, notes)
        return await asyncio.to_thread(
            pack.finish, staged, out, meta=meta, point=_point(point), now=iso(self.clock()),
            settings=self.config.settings,
        )  # fmt: skip


def take_offline(
    config: LoadedConfig, output: Path | None, clock: Clock, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A backup without a daemon; the caller holds the home lock (nothing writes meanwhile; on
    PostgreSQL the dump's transaction is the point, whatever other machines write)."""
    home = Home(config.home)
    out = _target(home, output, clock)
    pack.check_target(out, home.root)
    started = clock()
    target = stage.new_stage(home, f"{started:%Y%m%dT%H%M%S}-{os.getpid()}")
    try:
        backup = offline_backup(config.home, config.settings, clock=clock, environ=os.environ if env is None else env)
        stage_databases(home, target)
        staged = staged_home(target.root)
        point = asyncio.run(backup.stage_backup(staged))
        notes = stage_files(config, home, target, point)
        stage_memory(config, home, target, notes)
        meta = _meta(config, "offline", point, notes)
        manifest = pack.finish(staged, out, meta=meta, point=_point(point), now=iso(clock()), settings=config.settings)
    finally:
        shutil.rmtree(target.root, ignore_errors=True)
    pruned = retention.prune(home.root, config.settings.backup.keep, spare=out.name) if output is None else []
    return _summary(out, manifest, pruned)
