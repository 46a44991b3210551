"""What every part of the session store shares: the in-memory runs and sessions.json entries,
their lookups, the events, and the intent methods that change an entry outside a run's lifecycle
(settings, the inheritance flag, the reset boundary). ``sessions.files.store`` assembles the parts."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from config.clock import Clock, iso
from config.errors import SessionNotFound
from config.settings import Settings
from home.layout import Home
from sessions.bookkeeping import relabel_entry
from sessions.deliveries import RecordedId
from sessions.events import EventType, StoreEvent
from sessions.files.ledger import Ledger
from sessions.files.recovery import RecoveredRun
from sessions.files.registry import SessionEntry, SessionRegistry
from sessions.files.writer import AppendWriter
from sessions.records import RunState, copy_counters
from sessions.store_hooks import DurableListener, Listener, RunHook

log = logging.getLogger(__name__)

METADATA_FORMAT_VERSION = 1


class StoreBase:
    """The attributes ``SessionStore.__init__`` sets, and the methods every part uses."""

    home: Home
    settings: Settings
    clock: Clock
    ledger: Ledger
    writer: AppendWriter
    registry: SessionRegistry
    completion_hooks: Mapping[str, RunHook]  # the hooks given at open (``StoreHooks``)
    stop_hooks: Mapping[str, RunHook]
    listeners: tuple[Listener, ...]
    durable_listeners: tuple[DurableListener, ...]  # (run, record) once the append is durable
    recovered: list[RecoveredRun]
    _runs: dict[str, RunState]
    _locks: dict[str, asyncio.Lock]
    _files: dict[str, tuple[Path, Path, Path]]  # run id -> (dir, messages, current)
    # per key, once read: the client_message_ids tasks.db records (created_at, run_id, seq); this
    # process is tasks.db's only writer, so it is kept up to date as it writes them
    _recorded_ids: dict[str, dict[str, RecordedId]]
    # the reply records asked for in this pass of the loop, and the future of their commit
    _reply_batch: tuple[list[tuple[Any, ...]], asyncio.Future[None]] | None
    _probed: tuple[float, str | None]  # (monotonic time, problem)

    # -- queries --------------------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self.registry.entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        entry = self.entry(key)
        if entry is None:
            raise SessionNotFound(f"no session with key {key!r}; post a message to create it")
        return entry

    def entries(self) -> Iterable[SessionEntry]:
        return self.registry.entries.values()

    def active_run(self, key: str) -> RunState | None:
        entry = self.entry(key)
        if entry is None or entry.run_id is None:
            return None
        return self._runs.get(entry.run_id)

    def run_state(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def active_runs(self) -> Iterable[RunState]:
        return self._runs.values()

    def lock_for(self, key: str) -> asyncio.Lock:
        """The per-key lock that serializes turns and lifecycle changes on one key."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # -- settings on the entry ------------------------------------------------------------------

    async def update_entry(
        self,
        key: str,
        *,
        pinned: bool | None = None,
        label: str | None = None,
        clear_label: bool = False,
        settings: Mapping[str, object] | None = None,
    ) -> SessionEntry:
        entry = self.require_entry(key)
        if pinned is not None and pinned != entry.pinned:
            entry.pinned = pinned
            await self.ledger.set_pinned(key, pinned)
        relabel_entry(entry, label=label, clear_label=clear_label, settings=settings)
        if label is not None or clear_label or settings is not None:  # durable beyond sessions.json
            await self.ledger.set_key_metadata(key, {"label": entry.label, "settings": entry.settings})
        entry.updated_at = iso(self.clock())
        self.registry.touch(key)
        await self.registry.flush()
        return entry

    async def set_inherit_next(self, key: str, inherit: bool) -> bool:
        """Whether the key's next run inherits from its last (``/new`` and a diverged OpenAI-compatible
        conversation say no, a reset and a run start say yes again); False when nothing changed
        (no entry, or the flag was already so)."""
        entry = self.entry(key)
        if entry is None or entry.inherit_next == inherit:
            return False
        entry.inherit_next = inherit
        self.registry.touch(key)
        return True

    async def set_reset_boundary(self, key: str, boundary: str) -> None:
        """The daily or idle reset boundary the key was last reset at (written at once: a restart
        must not reset the key again for the same boundary)."""
        entry = self.entry(key)
        if entry is None:
            return
        entry.last_reset_boundary = boundary
        self.registry.touch(key)
        await self.registry.flush()

    async def _flush_registry(self) -> None:
        """Write sessions.json now; a failure is logged (it is rewritten on the next change and
        rebuilt at start from tasks.db and the run folders, which are the truth)."""
        try:
            await self.registry.flush()
        except OSError as exc:
            log.error("sessions.json could not be written (%s); it is written again on the next change", exc)

    # -- helpers (shared by the parts of the store) ----------------------------------------------

    def _new_entry(self, key: str, agent_id: str | None, chat_type: str, channel: str | None) -> SessionEntry:
        now = iso(self.clock())
        return SessionEntry(
            key=key, agent_id=agent_id, chat_type=chat_type, channel=channel, created_at=now, updated_at=now
        )

    @staticmethod
    def sync_counters(entry: SessionEntry, run: RunState) -> None:
        """Checkpoint the run's counters in its key's entry (``Counters`` names them)."""
        copy_counters(run, entry)

    def _metadata(self, run: RunState) -> dict[str, Any]:
        return {
            "format_version": METADATA_FORMAT_VERSION,
            "uuid": run.run_id,
            "created_at": run.started_at,
            **run.task_key.as_dict(),
            "session_key": run.key,
            "agent_id": run.agent_id,
            "chat_type": run.chat_type,
            "channel": run.channel,
            "parent_uuid": run.parent_uuid,
        }

    def _entry_metadata(self, key: str) -> dict[str, Any]:
        entry = self.entry(key)
        if entry is None or (entry.label is None and not entry.settings):
            return {}
        return {"label": entry.label, "settings": entry.settings}

    def _ledger_row(self, run: RunState) -> dict[str, Any]:
        return {
            "uuid": run.run_id,
            "status": run.status,
            **run.task_key.as_dict(),
            "created_at": run.started_at,
            "updated_at": run.started_at,
            "metadata": json.dumps({**self._metadata(run), **self._entry_metadata(run.key)}, ensure_ascii=False),
            "session_key": run.key,
            "agent_id": run.agent_id,
            "channel": run.channel,
            "chat_type": run.chat_type,
            "parent_uuid": run.parent_uuid,
            "pinned": int(bool((self.entry(run.key) or _NO_ENTRY).pinned)),
        }

    def _emit(self, event_type: EventType, run: RunState, *, at: str | None = None, **fields: Any) -> None:
        # One dict per event (this runs per message); the keys of its type, as StoreEvent lists them.
        at = at or iso(self.clock())
        event = cast(StoreEvent, {"type": event_type, "key": run.key, "run_id": run.run_id, "at": at, **fields})
        for listener in self.listeners:
            listener(event)

    def emit(self, event: StoreEvent) -> None:
        """Publish a domain event (compaction, inheritance, reset, reply) to listeners."""
        for listener in self.listeners:
            listener(event)

    def expiry_cutoff(self, days: float) -> str:
        return iso(self.clock() - timedelta(days=days))


class _NoEntry:
    pinned = False


_NO_ENTRY = _NoEntry()
