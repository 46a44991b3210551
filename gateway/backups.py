"""Backups of the home, online (inside the daemon) or offline (the CLI under the home lock): the
gateway picks the consistent point, ``backups/`` stages, checks and packs (blocking, off the loop).

Online, in this order: the SQLite databases through the backup API (tasks.db, channels.db); then
the point, in one pass of the event loop: the sessions.json entries as the store holds them, and
the active runs, frozen on the append writer's thread (``backups.stage.freeze_runs``) behind every
append queued before (so every acknowledged message is in, each once, and nothing appended later
is); then the completed runs, archives, workspaces, the config, and the memory tables copied on the
index's write thread. The doctor's safe fixes bring the stage in line (the folders are the truth,
as at start-up) and a check must find nothing before the archive is written.
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
from config.errors import Unavailable
from config.loader import LoadedConfig
from gateway import backup_postgres
from gateway.places import memory_uri, version, workspaces
from home.layout import Home
from memory import MemoryService
from sessions.files.store import SessionStore
from sessions.protocol import StoreProtocol

log = logging.getLogger(__name__)


def _inside(path: Path, root: Path) -> Path | None:
    with contextlib.suppress(ValueError):
        return path.expanduser().absolute().relative_to(root.absolute())
    return None


def stage_databases(home: Home, target: Home) -> list[str]:
    """tasks.db, channels.db and the Matrix accounts' crypto stores (``matrix/<account>/*.db``: the
    bot devices' keys, without which a restored bot cannot read its encrypted rooms)."""
    copied = []
    pairs = [(home.tasks_db, target.tasks_db), (home.root / "channels.db", target.root / "channels.db")]
    pairs += [(db, target.root / db.relative_to(home.root)) for db in sorted(home.root.glob("matrix/*/*.db"))]
    for source, dest in pairs:
        if stage.backup_sqlite(source, dest):
            copied.append(dest.relative_to(target.root).as_posix())
    return copied


def stage_files(config: LoadedConfig, home: Home, target: Home, skip: set[str], *, runs: bool = True) -> dict[str, Any]:
    """Completed runs (but ``skip``), archives, workspaces inside the home, the config file
    (``runs=False``: no run folder nor archive of the home, which the database holds)."""
    notes: dict[str, Any] = {"skipped": []}
    if runs:
        notes["completed_runs"] = stage.copy_completed(home, target, skip)
        notes["archives"] = stage.copy_archives(home, target)
    for agent_id, folder in sorted(workspaces(config).items()):
        rel = _inside(folder, home.root)
        if rel is None:
            notes["skipped"].append(f"workspace of {agent_id} ({folder}) is outside the home: back it up yourself")
        elif folder.is_dir():
            stage.copy_tree(folder, target.root / rel)
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


def _meta(config: LoadedConfig, mode: str) -> dict[str, Any]:
    return {"neotask_version": version(), "mode": mode, "home": str(config.home)}


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
            store = self.store
            postgres = self.config.settings.storage.backend == "postgres"
            if not postgres and not isinstance(store, SessionStore):
                raise Unavailable(
                    f"backups need storage.backend files or postgres, not {self.config.settings.storage.backend}"
                )
            home = store.home if isinstance(store, SessionStore) else Home(self.config.home)
            out = await asyncio.to_thread(_target, home, output, self.clock)
            await asyncio.to_thread(pack.check_target, out, home.root)
            started = self.clock()
            target = await asyncio.to_thread(stage.new_stage, home, f"{started:%Y%m%dT%H%M%S}-{os.getpid()}")
            try:
                if isinstance(store, SessionStore):
                    manifest = await self._stage_and_pack(store, home, target, out)
                else:
                    manifest = await self._stage_database(home, target, out)
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

    async def _stage_database(self, home: Home, target: Home, out: Path) -> dict[str, Any]:
        """A PostgreSQL deployment (``gateway.backup_postgres``): the point is the dump's transaction."""
        at = iso(self.clock())
        snapshot = await backup_postgres.online_snapshot(self.store)
        runs = await asyncio.to_thread(backup_postgres.stage_snapshot, self.config, home, target, snapshot)
        notes = await asyncio.to_thread(stage_files, self.config, home, target, set(), runs=False)
        if self.memory is not None:
            await self.memory.exclusive(lambda: stage_memory(self.config, home, target, notes))
        else:
            await asyncio.to_thread(stage_memory, self.config, home, target, notes)
        meta = {**_meta(self.config, "online"), **backup_postgres.meta(), "notes": notes}
        return await asyncio.to_thread(
            pack.finish, target, out, meta=meta, point={"at": at, "runs": runs}, now=iso(self.clock()),
            settings=self.config.settings,
        )  # fmt: skip

    async def _stage_and_pack(self, store: SessionStore, home: Home, target: Home, out: Path) -> dict[str, Any]:
        await asyncio.to_thread(stage_databases, home, target)
        # The point: one pass of the loop takes the entries and queues the freeze behind every append.
        at = iso(self.clock())
        encoded = {key: entry.encode() for key, entry in store.registry.entries.items()}
        active = [run.run_id for run in store.active_runs()]

        def freeze() -> list[stage.FrozenRun]:
            folders = [
                home.contexts / state / run_id for run_id in active for state in ("running", "paused", "completed")
            ]
            return stage.freeze_runs(target, [f for f in folders if f.is_dir()])

        frozen = await store.writer.call(freeze)
        await asyncio.to_thread(stage.write_sessions, target, encoded)
        await asyncio.to_thread(stage.settle_runs, frozen)
        notes = await asyncio.to_thread(stage_files, self.config, home, target, {run.run_id for run in frozen})
        if self.memory is not None:
            await self.memory.exclusive(lambda: stage_memory(self.config, home, target, notes))
        else:
            await asyncio.to_thread(stage_memory, self.config, home, target, notes)
        point = {"at": at, "runs": {run.run_id: {"state": run.state, "seq": run.seq} for run in frozen}}
        meta = {**_meta(self.config, "online"), "notes": notes}
        return await asyncio.to_thread(
            pack.finish, target, out, meta=meta, point=point, now=iso(self.clock()), settings=self.config.settings
        )


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
        if config.settings.storage.backend == "postgres":
            manifest = _offline_database(config, home, target, out, clock, os.environ if env is None else env)
        else:
            manifest = _offline_files(config, home, target, out, clock)
    finally:
        shutil.rmtree(target.root, ignore_errors=True)
    pruned = retention.prune(home.root, config.settings.backup.keep, spare=out.name) if output is None else []
    return _summary(out, manifest, pruned)


def _offline_database(
    config: LoadedConfig, home: Home, target: Home, out: Path, clock: Clock, env: Mapping[str, str]
) -> dict[str, Any]:
    at = iso(clock())
    snapshot = backup_postgres.offline_snapshot(config, env)
    runs = backup_postgres.stage_snapshot(config, home, target, snapshot)
    notes = stage_files(config, home, target, set(), runs=False)
    stage_memory(config, home, target, notes)
    meta = {**_meta(config, "offline"), **backup_postgres.meta(), "notes": notes}
    return pack.finish(
        target, out, meta=meta, point={"at": at, "runs": runs}, now=iso(clock()), settings=config.settings
    )


def _offline_files(config: LoadedConfig, home: Home, target: Home, out: Path, clock: Clock) -> dict[str, Any]:
    started = clock()
    stage_databases(home, target)
    if home.sessions_json.is_file():
        shutil.copyfile(home.sessions_json, target.sessions_json)
    frozen = stage.freeze_runs(target, stage.run_folders(home, ("running", "paused")))
    stage.settle_runs(frozen)
    notes = stage_files(config, home, target, {run.run_id for run in frozen})
    stage_memory(config, home, target, notes)
    point = {"at": iso(started), "runs": {run.run_id: {"state": run.state, "seq": run.seq} for run in frozen}}
    return pack.finish(
        target, out, meta={**_meta(config, "offline"), "notes": notes}, point=point, now=iso(clock()),
        settings=config.settings,
    )  # fmt: skip
