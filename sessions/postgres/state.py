"""What every part of the PostgreSQL store shares (``PgState``): the pool, the in-memory view (the
keys' entries and the active runs, as the protocol's synchronous lookups need them), the entries'
persistence (written at once on lifecycle changes, coalesced otherwise, as sessions.json is) and
the events. The parts (``appends``, ``reads``, ``records``, ``usage``, ``lifecycle``,
``maintenance``, ``export``, ``shared``, the queue of ``batching``) each hold this one object;
``store.py`` composes them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import asyncpg

from config.clock import Clock, iso
from config.settings import Settings
from sessions.bookkeeping import found_entry
from sessions.entries import SessionEntry
from sessions.events import EventType, StoreEvent
from sessions.postgres.faults import unavailable
from sessions.postgres.notify import EventRelay
from sessions.records import USAGE_KEYS, Counters, RunState, TaskKey, copy_counters, counter_values
from sessions.store_hooks import StoreHooks

log = logging.getLogger(__name__)

_DROP_OPENING = (
    "DELETE FROM runs WHERE opening AND next_seq = 1 AND status IN ('running', 'paused') RETURNING run_id, session_key"
)


@dataclass(eq=False)
class PgState:
    """The store's one shared state: what ``PgStore.open`` was given, and the view of the keys."""

    settings: Settings
    clock: Clock
    pool: asyncpg.Pool
    where: str  # the database, for messages (no password)
    hooks: StoreHooks
    entries: dict[str, SessionEntry] = field(default_factory=dict)
    runs: dict[str, RunState] = field(default_factory=dict)  # the active runs by id
    dirty: set[str] = field(default_factory=set)  # keys whose entry row is behind
    flush_task: asyncio.Task[None] | None = None
    relay: EventRelay | None = None  # shared (``sessions.postgres.shared``): the events to other processes

    # -- lookups (in memory) --------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self.entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        return found_entry(self.entries.get(key), key)

    def active_run(self, key: str) -> RunState | None:
        entry = self.entries.get(key)
        if entry is None or entry.run_id is None:
            return None
        return self.runs.get(entry.run_id)

    # -- the entries' persistence ---------------------------------------------------------------

    def touch(self, key: str) -> None:
        """An entry changed; its row follows within ``sessions_flush_ms``."""
        self.dirty.add(key)
        if self.flush_task is None or self.flush_task.done():
            self.flush_task = asyncio.get_running_loop().create_task(self._flush_later())

    def mirror(self, run: RunState, *, own_only: bool = False) -> None:
        """The key's entry takes ``run``'s counters (``own_only``: only while it names the run);
        its row follows (``touch``)."""
        entry = self.entries.get(run.key)
        if entry is not None and (not own_only or entry.run_id == run.run_id):
            copy_counters(run, entry)
            self.touch(run.key)

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.settings.storage.sessions_flush_ms / 1000)
        try:
            await self.flush_entries()
        except Exception as exc:  # written again on the next change; the runs table is the truth
            log.warning("session entries not written to the database (%s); retried on the next change", exc)

    async def flush_entries(self, *keys: str) -> None:
        """Write the changed entries (and ``keys``) now: one statement, removed entries deleted."""
        wanted, self.dirty = self.dirty | set(keys), set()
        if not wanted:
            return
        bodies = {k: encode_entry(e) for k in wanted if (e := self.entries.get(k)) is not None}
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
            self.dirty |= wanted  # not lost: written on the next flush
            raise

    def new_entry(self, key: str, agent_id: str | None, chat_type: str, channel: str | None) -> SessionEntry:
        now = iso(self.clock())
        return SessionEntry(
            key=key, agent_id=agent_id, chat_type=chat_type, channel=channel, created_at=now, updated_at=now
        )

    # -- events ---------------------------------------------------------------------------------

    def emit_run(self, event_type: EventType, run: RunState, *, at: str | None = None, **fields: object) -> None:
        at = at or iso(self.clock())
        self.emit(cast(StoreEvent, {"type": event_type, "key": run.key, "run_id": run.run_id, "at": at, **fields}))

    def emit(self, event: StoreEvent) -> None:
        """To the listeners, and to the other processes when shared (``relay``)."""
        for listener in self.hooks.listeners:
            listener(event)
        if self.relay is not None:
            self.relay.send(event)


async def load_view(state: PgState, *, shared: bool = False) -> None:
    """The view at open: runs a start left without their first message removed (alone), the
    entries and the active runs read, the entries made to agree with the runs."""
    with unavailable("nothing was stored"):
        async with state.pool.acquire() as conn:
            # a start that never stored its first message (a crash, a failed append) leaves nothing;
            # shared, such a run may be another process's start under way: the key's next message uses it
            dropped = [] if shared else await conn.fetch(_DROP_OPENING)
            entries = await conn.fetch("SELECT key, body::text FROM entries")
            rows = await conn.fetch("SELECT * FROM runs WHERE status IN ('running', 'paused')")
    for row in dropped:
        log.warning("run %s of %r never stored its first message: removed", row[0], row[1])
    state.entries = {row[0]: decode_entry(row[1]) for row in entries}
    for row in rows:
        run = state_from_row(dict(row))
        entry = state.entries.get(run.key)
        if entry is not None and entry.run_id == run.run_id and _same_but_tokens(entry, run):
            run.context_tokens = entry.context_tokens  # a calibration the row does not hold
        state.runs[run.run_id] = run
    _reconcile_entries(state)
    if state.dirty:
        await state.flush_entries()


def _reconcile_entries(state: PgState) -> None:
    """Make the entries agree with the active runs (the runs table is the truth)."""
    for run in state.runs.values():
        entry = state.entries.get(run.key)
        if entry is None:
            entry = state.entries[run.key] = state.new_entry(run.key, run.agent_id, run.chat_type, run.channel)
        if entry.run_id != run.run_id:
            entry.inherit_next = True
        before = (entry.run_id, entry.status, entry.started_at, counter_values(entry))
        entry.run_id, entry.status, entry.started_at = run.run_id, run.status, run.started_at
        copy_counters(run, entry)
        if (entry.run_id, entry.status, entry.started_at, counter_values(entry)) != before:
            state.dirty.add(run.key)
    for entry in state.entries.values():
        if entry.run_id is not None and entry.run_id not in state.runs:
            entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
            state.dirty.add(entry.key)


def _same_but_tokens(entry: SessionEntry, run: RunState) -> bool:
    """Whether the entry's checkpoint describes the stored run (its token count may then be a
    provider's calibration, which the run's row does not keep)."""
    return Counters._make(counter_values(entry))._replace(context_tokens=0) == run.counters._replace(context_tokens=0)


def encode_entry(entry: SessionEntry) -> str:
    return json.dumps(entry.to_dict(), ensure_ascii=False, separators=(",", ":"))


def decode_entry(text: str) -> SessionEntry:
    data = json.loads(text)
    key = data.pop("key")
    return SessionEntry.from_dict(data, key=key)


def state_from_row(row: Mapping[str, Any]) -> RunState:
    """A run's state from its ``runs`` row."""
    run = RunState(
        run_id=row["run_id"], key=row["session_key"] or "", agent_id=row["agent_id"],
        chat_type=row["chat_type"] or "direct", channel=row["channel"], status=row["status"],
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
