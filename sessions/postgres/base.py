"""What every part of the PostgreSQL store shares: the pool, the in-memory view (the keys' entries
and the active runs, as the protocol's synchronous lookups need them), the entries' persistence
(written at once on lifecycle changes, coalesced otherwise, as sessions.json is) and the events."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import asyncpg

from config.clock import Clock, iso
from config.errors import SessionNotFound
from config.settings import Settings
from sessions.entries import SessionEntry
from sessions.events import EventType, StoreEvent
from sessions.postgres.faults import unavailable
from sessions.records import USAGE_KEYS, RunState, TaskKey, copy_counters
from sessions.store_hooks import StoreHooks

log = logging.getLogger(__name__)

NOWHERE = Path("/nonexistent/neotask-postgres")  # a run's ``dir``: its stores are tables, not a folder


class PgBase:
    """The attributes ``PgStore.__init__`` sets, and the methods every part uses."""

    settings: Settings
    clock: Clock
    pool: asyncpg.Pool
    where: str  # the database, for messages (no password)
    hooks: StoreHooks
    _entries: dict[str, SessionEntry]
    _dirty: set[str]
    _flush_task: asyncio.Task[None] | None
    _runs: dict[str, RunState]
    _locks: dict[str, asyncio.Lock]
    _probed: tuple[float, str | None]

    # -- lookups (in memory) --------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self._entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        entry = self.entry(key)
        if entry is None:
            raise SessionNotFound(f"no session with key {key!r}; post a message to create it")
        return entry

    def entries(self) -> Iterable[SessionEntry]:
        return self._entries.values()

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
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # -- the entries' persistence ---------------------------------------------------------------

    def touch(self, key: str) -> None:
        """An entry changed; its row follows within ``sessions_flush_ms``."""
        self._dirty.add(key)
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.settings.storage.sessions_flush_ms / 1000)
        try:
            await self.flush_entries()
        except Exception as exc:  # written again on the next change; the runs table is the truth
            log.warning("session entries not written to the database (%s); retried on the next change", exc)

    async def flush_entries(self, *keys: str) -> None:
        """Write the changed entries (and ``keys``) now: one statement, removed entries deleted."""
        wanted, self._dirty = self._dirty | set(keys), set()
        if not wanted:
            return
        bodies = {k: _encode_entry(e) for k in wanted if (e := self._entries.get(k)) is not None}
        gone = [k for k in wanted if k not in bodies]
        try:
            with unavailable("the session's state was not stored"):
                async with self.pool.acquire() as conn, conn.transaction():
                    if bodies:
                        await conn.execute(
                            "INSERT INTO entries (key, body) SELECT * FROM unnest($1::text[], $2::json[])"
                            " ON CONFLICT (key) DO UPDATE SET body = excluded.body",
                            list(bodies),
                            list(bodies.values()),
                        )
                    if gone:
                        await conn.execute("DELETE FROM entries WHERE key = ANY($1::text[])", gone)
        except BaseException:
            self._dirty |= wanted  # not lost: written on the next flush
            raise

    # -- helpers --------------------------------------------------------------------------------

    def _new_entry(self, key: str, agent_id: str | None, chat_type: str, channel: str | None) -> SessionEntry:
        now = iso(self.clock())
        return SessionEntry(
            key=key, agent_id=agent_id, chat_type=chat_type, channel=channel, created_at=now, updated_at=now
        )

    @staticmethod
    def sync_counters(entry: SessionEntry, run: RunState) -> None:
        copy_counters(run, entry)

    def _emit(self, event_type: EventType, run: RunState, *, at: str | None = None, **fields: object) -> None:
        at = at or iso(self.clock())
        self.emit(cast(StoreEvent, {"type": event_type, "key": run.key, "run_id": run.run_id, "at": at, **fields}))

    def emit(self, event: StoreEvent) -> None:
        for listener in self.hooks.listeners:
            listener(event)

    def expiry_cutoff(self, days: float) -> str:
        return iso(self.clock() - timedelta(days=days))


def _encode_entry(entry: SessionEntry) -> str:
    return json.dumps(entry.to_dict(), ensure_ascii=False, separators=(",", ":"))


def decode_entry(text: str) -> SessionEntry:
    data = json.loads(text)
    key = data.pop("key")
    return SessionEntry.from_dict(data, key=key)


def state_from_row(row: Mapping[str, Any], folder: Path) -> RunState:
    """A run's state from its ``runs`` row."""
    run = RunState(
        run_id=row["run_id"], key=row["session_key"] or "", agent_id=row["agent_id"],
        chat_type=row["chat_type"] or "direct", channel=row["channel"], status=row["status"], dir=folder,
        started_at=row["created_at"],
        task_key=TaskKey(row["task_type"], row["task_identifier"], row["repository"], row["user"]),
        parent_uuid=row["parent_uuid"], next_tool_seq=int(row["next_tool_seq"]), next_plan_id=int(row["next_plan_id"]),
    )  # fmt: skip
    run.next_seq, run.next_summary_id = int(row["next_seq"]), int(row["last_summary_id"]) + 1
    run.context_tokens, run.compaction_count = int(row["context_tokens"]), int(row["compaction_count"])
    run.context_bytes, run.context_lines = int(row["context_bytes"]), int(row["context_lines"])
    run.last_context_seq, run.messages_bytes = int(row["last_context_seq"]), int(row["messages_bytes"])
    run.usage = {k: int(row[k] or 0) for k in USAGE_KEYS}
    return run
