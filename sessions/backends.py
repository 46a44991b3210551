"""The one place a session store is constructed: ``storage.backend`` chooses the backend.

| ``storage.backend`` | backend | capabilities (``sessions.protocol``) |
|---|---|---|
| ``files`` (default) | ``sessions.files.store.SessionStore``: run folders, tasks.db, sessions.json | all |
| ``postgres`` | ``sessions.postgres.store.PgStore``: tables in PostgreSQL | all (archived runs stay as rows) |

Each backend opens its own history index (``sessions.history_index.HistoryIndexProtocol``).
The in-memory backend (``sessions.inmemory``) keeps nothing across a restart and takes no backup,
so the daemon does not offer it; tests open it directly.

This module and the storage copier (``sessions.copying``) are the only ones outside a backend's
package that import it (``tests/test_architecture.py``): everything else reaches a backend through
the capabilities of ``sessions.protocol``, and, with no daemon, through what this module opens:
``open_doctor`` (a ``Doctor``), ``offline_backup`` (a ``Backup``) and ``staged_home`` (the files
home a backup is staged in or restored into, ``sessions.backup.StagedHome``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from config.clock import Clock
from config.errors import ConfigError
from config.settings import Settings
from sessions.backup import StagedHome
from sessions.files.backup import HomeBackup
from sessions.files.offline import HomeDoctor, StagedFilesHome
from sessions.files.store import SessionStore
from sessions.leadership import Leadership, SoleLeader
from sessions.protocol import Backup, Doctor, StoreProtocol
from sessions.records import StoredRecord
from sessions.store_hooks import StoreHooks


async def open_store(
    root: Path,
    settings: Settings,
    *,
    clock: Clock,
    hooks: StoreHooks | None = None,
    environ: Mapping[str, str] | None = None,
) -> StoreProtocol:
    """Open the configured backend's storage under the home ``root`` (the caller holds its lock),
    or in the database ``storage.postgres`` names (its password from ``environ``)."""
    backend = settings.storage.backend
    if backend == "files":
        return await SessionStore.open(root, settings, clock=clock, hooks=hooks or StoreHooks())
    if backend == "postgres":
        from sessions.postgres.store import open_from_settings  # asyncpg only when configured

        return await open_from_settings(settings, os.environ if environ is None else environ, clock=clock, hooks=hooks)
    raise ConfigError(f"storage.backend {backend!r} is not served by this gateway yet; set storage.backend: files")


async def try_storage(settings: Settings, *, environ: Mapping[str, str] | None = None) -> str:
    """Whether the configured storage can be reached (``config check --connect``): one login to the
    database for postgres (``DatabaseRefused`` naming the setting to fix); what was tried."""
    if settings.storage.backend != "postgres":
        return f"storage.backend {settings.storage.backend}: no database to connect to"
    from sessions.postgres.store import try_login

    await try_login(settings, os.environ if environ is None else environ)
    return f"connected to {describe_backend(settings)}"


def open_leadership(settings: Settings, *, environ: Mapping[str, str] | None = None) -> Leadership:
    """Who leads (``sessions.leadership``): the files backend's one process always; with postgres,
    the process holding the leader lock, checked every ``storage.postgres.leader_interval_s``."""
    if settings.storage.backend != "postgres":
        return SoleLeader()
    from sessions.postgres.leader import Leadership as PgLeadership
    from sessions.postgres.store import connection_options

    pg = settings.storage.postgres
    dsn, password = connection_options(pg, os.environ if environ is None else environ)
    return PgLeadership(dsn, password=password, interval_s=pg.leader_interval_s)


def describe_backend(settings: Settings) -> str:
    """The backend as the start-up line names it (a DSN without its password)."""
    if settings.storage.backend == "postgres" and settings.storage.postgres.dsn:
        from sessions.postgres.store import redact

        return f"postgres {redact(settings.storage.postgres.dsn)}"
    return settings.storage.backend


# -- with no daemon (the CLI holds the home lock) ---------------------------------------------------


@contextlib.asynccontextmanager
async def open_doctor(
    root: Path, settings: Settings, *, clock: Clock, environ: Mapping[str, str] | None = None
) -> AsyncIterator[Doctor]:
    """The configured storage's doctor with no daemon: the files backend's over the home's files
    (no store opened: its recovery would change what the doctor reports); PostgreSQL's is the
    store (its start-up recovery runs first) with its history index's checks."""
    if settings.storage.backend != "postgres":
        yield HomeDoctor(root, settings, clock)
        return
    store = await open_store(root, settings, clock=clock, environ=environ)
    try:
        yield _StoreDoctor(store, history=settings.history.enabled)
    finally:
        await store.close()


class _StoreDoctor:
    """An open store's doctor, with its history index's checks when ``history``."""

    def __init__(self, store: StoreProtocol, *, history: bool) -> None:
        self._store = store
        self._history = history

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        findings = await self._store.check(fix=fix)
        if self._history:
            index = self._store.open_history()
            await index.open()
            try:
                findings += await self._store.check_history(index, fix=fix)
            finally:
                await index.close()
        return findings


def offline_backup(
    root: Path, settings: Settings, *, clock: Clock, environ: Mapping[str, str] | None = None
) -> Backup:
    """The configured storage's ``Backup`` with no daemon: the home's files (nothing writes them:
    the caller holds the lock), or the database on a connection of its own (its dump's
    transaction is the point, whatever other machines write)."""
    if settings.storage.backend != "postgres":
        return HomeBackup(root, clock)
    from sessions.copying import configured_end, dump
    from sessions.postgres.backup import PgBackup

    end = configured_end(settings, root, os.environ if environ is None else environ)
    return PgBackup(lambda: dump(end), clock)


def staged_home(root: Path) -> StagedHome:
    """The home under ``root`` as a backup's stage or a restore's target (a files home: the
    format of every backup)."""
    return StagedFilesHome(root)
