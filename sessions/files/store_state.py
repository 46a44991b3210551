"""What every part of the session store shares (``StoreState``): the home, tasks.db, the append
writer, sessions.json, the hooks given at open, the in-memory runs and their lookups, the
events. Each part (reads and records, appends, lifecycle, maintenance) holds this one object;
``sessions.files.store`` builds it and composes the parts over it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from config.clock import Clock, iso
from config.settings import Settings
from home.layout import Home
from sessions.bookkeeping import found_entry
from sessions.deliveries import RecordedId
from sessions.events import EventType, StoreEvent
from sessions.files.ledger import Ledger
from sessions.files.recovery import RecoveredRun
from sessions.files.registry import SessionEntry, SessionRegistry
from sessions.files.writer import AppendWriter
from sessions.records import RunState, copy_counters
from sessions.store_hooks import StoreHooks

log = logging.getLogger(__name__)

METADATA_FORMAT_VERSION = 1


@dataclass(eq=False)
class StoreState:
    """The store's resources and in-memory state, and the lookups every part makes."""

    home: Home
    settings: Settings
    clock: Clock
    ledger: Ledger
    writer: AppendWriter
    registry: SessionRegistry
    hooks: StoreHooks  # given at open, never changed
    runs: dict[str, RunState] = field(default_factory=dict)  # the active runs by id
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    files: dict[str, tuple[Path, Path, Path]] = field(default_factory=dict)  # run id -> (dir, messages, current)
    # per key, once read: the client_message_ids tasks.db records (created_at, run_id, seq); this
    # process is tasks.db's only writer, so it is kept up to date as it writes them
    recorded_ids: dict[str, dict[str, RecordedId]] = field(default_factory=dict)
    recovered: list[RecoveredRun] = field(default_factory=list)  # what recovery found at open

    # -- lookups (in memory) ----------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self.registry.entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        return found_entry(self.entry(key), key)

    def entries(self) -> Iterable[SessionEntry]:
        return self.registry.entries.values()

    def active_run(self, key: str) -> RunState | None:
        entry = self.entry(key)
        if entry is None or entry.run_id is None:
            return None
        return self.runs.get(entry.run_id)

    def run_state(self, run_id: str) -> RunState | None:
        return self.runs.get(run_id)

    def active_runs(self) -> Iterable[RunState]:
        return self.runs.values()

    def lock_for(self, key: str) -> asyncio.Lock:
        lock = self.locks.get(key)
        if lock is None:
            lock = self.locks[key] = asyncio.Lock()
        return lock

    # -- events -----------------------------------------------------------------------------------

    def emit_run(self, event_type: EventType, run: RunState, *, at: str | None = None, **fields: Any) -> None:
        """An event of the store's own about ``run`` to the listeners."""
        # One dict per event (this runs per message); the keys of its type, as StoreEvent lists them.
        at = at or iso(self.clock())
        event = cast(StoreEvent, {"type": event_type, "key": run.key, "run_id": run.run_id, "at": at, **fields})
        for listener in self.hooks.listeners:
            listener(event)

    def emit(self, event: StoreEvent) -> None:
        for listener in self.hooks.listeners:
            listener(event)

    # -- helpers of the parts ---------------------------------------------------------------------

    async def flush_registry(self) -> None:
        """Write sessions.json now; a failure is logged (it is rewritten on the next change and
        rebuilt at start from tasks.db and the run folders, which are the truth)."""
        try:
            await self.registry.flush()
        except OSError as exc:
            log.error("sessions.json could not be written (%s); it is written again on the next change", exc)

    def new_entry(self, key: str, agent_id: str | None, chat_type: str, channel: str | None) -> SessionEntry:
        now = iso(self.clock())
        return SessionEntry(
            key=key, agent_id=agent_id, chat_type=chat_type, channel=channel, created_at=now, updated_at=now
        )

    def checkpoint(self, run: RunState) -> None:
        """Checkpoint the run's counters in its key's entry (``Counters`` names them), to be written."""
        entry = self.entry(run.key)
        if entry is not None:
            copy_counters(run, entry)
            self.registry.touch(run.key)

    def forget_recorded(self, key: str | None = None) -> None:
        """Read tasks.db's records again on the next check (of ``key``, or of every key): after
        a purge, or a change of tasks.db made around this process."""
        if key is None:
            self.recorded_ids.clear()
        else:
            self.recorded_ids.pop(key, None)

    def expiry_cutoff(self, days: float) -> str:
        return iso(self.clock() - timedelta(days=days))

    def metadata(self, run: RunState) -> dict[str, Any]:
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

    def ledger_row(self, run: RunState) -> dict[str, Any]:
        entry = self.entry(run.key)
        labelled = {} if entry is None or (entry.label is None and not entry.settings) else {
            "label": entry.label, "settings": entry.settings,
        }  # fmt: skip
        return {
            "uuid": run.run_id,
            "status": run.status,
            **run.task_key.as_dict(),
            "created_at": run.started_at,
            "updated_at": run.started_at,
            "metadata": json.dumps({**self.metadata(run), **labelled}, ensure_ascii=False),
            "session_key": run.key,
            "agent_id": run.agent_id,
            "channel": run.channel,
            "chat_type": run.chat_type,
            "parent_uuid": run.parent_uuid,
            "pinned": int(entry is not None and entry.pinned),
        }
