"""The one place a session store is constructed: ``storage.backend`` chooses the backend.

| ``storage.backend`` | backend | capabilities (``sessions.protocol``) |
|---|---|---|
| ``files`` (default) | ``sessions.files.store.SessionStore``: run folders, tasks.db, sessions.json | all |

The in-memory backend (``sessions.inmemory``) has the base and record capabilities only (no
history index, no doctor or cleanup), so the daemon does not offer it; tests open it directly."""

from __future__ import annotations

from pathlib import Path

from config.clock import Clock
from config.settings import Settings
from sessions.files.store import SessionStore
from sessions.protocol import StoreProtocol
from sessions.store_hooks import StoreHooks


async def open_store(root: Path, settings: Settings, *, clock: Clock, hooks: StoreHooks | None = None) -> StoreProtocol:
    """Open the configured backend's storage under the home ``root`` (the caller holds its lock)."""
    backend = settings.storage.backend
    if backend == "files":
        return await SessionStore.open(root, settings, clock=clock, hooks=hooks or StoreHooks())
    raise AssertionError(f"unknown storage.backend {backend!r}")  # the settings allow no other value
