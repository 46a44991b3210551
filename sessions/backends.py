"""The one place a session store is constructed: ``storage.backend`` chooses the backend.

| ``storage.backend`` | backend | capabilities (``sessions.protocol``) |
|---|---|---|
| ``files`` (default) | ``sessions.files.store.SessionStore``: run folders, tasks.db, sessions.json | all |
| ``postgres`` | ``sessions.postgres.store.PgStore``: tables in PostgreSQL | base and records (refused here) |

``postgres`` is refused here (a ``ConfigError``) until it has the history and maintenance capabilities.
The in-memory backend (``sessions.inmemory``) has the base and record capabilities only (no
history index, no doctor or cleanup), so the daemon does not offer it; tests open it directly."""

from __future__ import annotations

from pathlib import Path

from config.clock import Clock
from config.errors import ConfigError
from config.settings import Settings
from sessions.files.store import SessionStore
from sessions.protocol import StoreProtocol
from sessions.store_hooks import StoreHooks


async def open_store(root: Path, settings: Settings, *, clock: Clock, hooks: StoreHooks | None = None) -> StoreProtocol:
    """Open the configured backend's storage under the home ``root`` (the caller holds its lock)."""
    backend = settings.storage.backend
    if backend == "files":
        return await SessionStore.open(root, settings, clock=clock, hooks=hooks or StoreHooks())
    # postgres: sessions.postgres has the base and record capabilities, not yet history and maintenance;
    # gateway.validation.check_config refuses it before the daemon gets here
    raise ConfigError(f"storage.backend {backend!r} is not served by this gateway yet; set storage.backend: files")
