"""The one place a session store is constructed: ``storage.backend`` chooses the backend.

| ``storage.backend`` | backend | capabilities (``sessions.protocol``) |
|---|---|---|
| ``files`` (default) | ``sessions.files.store.SessionStore``: run folders, tasks.db, sessions.json | all |
| ``postgres`` | ``sessions.postgres.store.PgStore``: tables in PostgreSQL | all (archived runs stay as rows) |

Each backend opens its own history index (``sessions.history_index.HistoryIndexProtocol``).
The in-memory backend (``sessions.inmemory``) has the base and record capabilities only (no
history index, no doctor or cleanup), so the daemon does not offer it; tests open it directly."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from config.clock import Clock
from config.errors import ConfigError
from config.settings import Settings
from sessions.files.store import SessionStore
from sessions.leadership import Leadership, SoleLeader
from sessions.protocol import StoreProtocol
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
