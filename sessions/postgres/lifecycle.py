"""The run lifecycle in PostgreSQL (core capability): start (and undo a start), pause, resume,
complete and delete. Each change is one transaction over the run's row and the key's entry; the
partial unique index ``runs_one_active_per_key`` refuses a second active run on a key, also when
another process started it."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid as uuidlib
from typing import Any

import asyncpg

from config.clock import iso
from config.errors import RunActive
from sessions import bookkeeping
from sessions.entries import SessionEntry
from sessions.postgres.batching import AppendQueue
from sessions.postgres.faults import unavailable
from sessions.postgres.state import PgState, encode_entry
from sessions.records import PLAIN_FINISH, EntryChange, RunFinish, RunStart, RunState, RunStatus, copy_counters
from sessions.store_hooks import run_hook

log = logging.getLogger(__name__)

METADATA_FORMAT_VERSION = 1
_UPSERT_ENTRY = (
    "INSERT INTO entries (key, body) VALUES ($1, $2::json) ON CONFLICT (key) DO UPDATE SET body = excluded.body"
)


class PgLifecycle:
    def __init__(self, state: PgState, queue: AppendQueue) -> None:
        self.state = state
        self.queue = queue
        self._undiscarded: dict[str, str] = {}  # key -> a run discard_run could not delete (the database was away)

    async def start_run(self, start: RunStart) -> RunState:
        key, task_key = start.key, start.task_key
        entry = self.state.entry(key)
        bookkeeping.refuse_second_run(entry, key)
        now = iso(self.state.clock())
        run_id = str(uuidlib.uuid4())
        run = RunState(
            run_id=run_id, key=key, agent_id=start.agent_id, chat_type=start.chat_type, channel=start.channel,
            status="running", started_at=now, task_key=start.task_key, parent_uuid=start.parent_uuid,
        )  # fmt: skip
        metadata: dict[str, Any] = {
            "format_version": METADATA_FORMAT_VERSION, "uuid": run_id, "created_at": now, **task_key.as_dict(),
            "session_key": key, "agent_id": start.agent_id, "chat_type": start.chat_type, "channel": start.channel,
            "parent_uuid": start.parent_uuid,
        }  # fmt: skip
        if entry is not None and (entry.label is not None or entry.settings):
            metadata |= {"label": entry.label, "settings": entry.settings}
        stale = self._undiscarded.get(key)
        if stale is not None:  # its row still holds the key's one active place: it goes first
            with unavailable("the message was not stored"):
                await self.state.pool.execute("DELETE FROM runs WHERE run_id = $1 AND opening AND next_seq = 1", stale)
            del self._undiscarded[key]
        try:
            with unavailable("the message was not stored"):
                await self.state.pool.execute(
                    "INSERT INTO runs (run_id, session_key, status, task_type, task_identifier, repository, \"user\","
                    " created_at, updated_at, metadata, agent_id, channel, chat_type, parent_uuid, pinned, opening)"
                    " VALUES ($1, $2, 'running', $3, $4, $5, $6, $7, $7, $8, $9, $10, $11, $12, $13, $14)",
                    run_id, key, task_key.task_type, task_key.task_identifier, task_key.repository, task_key.user,
                    now, json.dumps(metadata, ensure_ascii=False), start.agent_id, start.channel, start.chat_type,
                    start.parent_uuid, int(bool(entry and entry.pinned)), start.opening,
                )  # fmt: skip
        except asyncpg.UniqueViolationError:
            raise RunActive(f"session {key!r} already has an active run (started by another gateway process)") from None
        run.opening = start.opening
        self.state.runs[run_id] = run
        if entry is None:
            entry = self.state.new_entry(key, start.agent_id, start.chat_type, start.channel)
            self.state.entries[key] = entry
        bookkeeping.start_entry(entry, run_id, now)
        copy_counters(run, entry)
        self.state.touch(key)  # the run's row is the truth; recovery rebuilds the entry from it
        self.state.emit_run("lifecycle", run, action="start", parent_uuid=start.parent_uuid)
        return run

    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None:
        """Undo ``start_run`` for a run whose first message could not be stored: its row (and
        everything under it) goes; the entry is removed or set idle."""
        self.state.runs.pop(run.run_id, None)
        entry = self.state.entry(run.key)
        if entry is not None and entry.run_id == run.run_id:
            if remove_entry:
                del self.state.entries[run.key]
            else:
                bookkeeping.idle_entry(entry)
        try:
            with unavailable("the discarded run was not stored"):
                await self.state.pool.execute("DELETE FROM runs WHERE run_id = $1", run.run_id)
            await self.state.flush_entries(run.key)
        except Exception as exc:  # an opening run with no message: the key's next start or start-up removes it
            self._undiscarded[run.key] = run.run_id
            log.error("could not remove discarded run %s (%s): the key's next start will", run.run_id, exc)
        self.state.emit_run("lifecycle", run, action="discard")

    async def pause(self, key: str) -> RunState:
        run = bookkeeping.require_active(self.state, key)
        if run.status == "paused":
            return run
        for name, hook in self.state.hooks.stop_hooks.items():
            await run_hook("stop", name, hook, run)
        await self._set_status(run, "paused", stats=True)
        self.state.emit_run("lifecycle", run, action="pause")
        return run

    async def resume(self, key: str) -> RunState:
        run = bookkeeping.require_active(self.state, key)
        if run.status == "running":
            return run
        await self._set_status(run, "running", stats=False)
        self.state.emit_run("lifecycle", run, action="resume")
        return run

    async def _set_status(self, run: RunState, status: RunStatus, *, stats: bool) -> None:
        await self.queue.settled(run)
        now = iso(self.state.clock())
        entry = self.state.entry(run.key)
        after = dataclasses.replace(entry, status=status, updated_at=now) if entry is not None else None
        extra = bookkeeping.run_stats(run) if stats else {}
        sets = ", ".join(f"{k} = ${i}" for i, k in enumerate(extra, start=4))
        with unavailable("the change was not stored"):
            async with self.state.pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    f"UPDATE runs SET status = $2, updated_at = $3{', ' + sets if sets else ''} WHERE run_id = $1",
                    run.run_id, status, now, *extra.values(),
                )  # fmt: skip
                if after is not None:
                    await conn.execute(_UPSERT_ENTRY, after.key, encode_entry(after))
        run.status = status
        if entry is not None and after is not None:
            entry.status, entry.updated_at = after.status, after.updated_at

    async def complete(self, key: str, end: RunFinish = PLAIN_FINISH) -> RunState:
        """Complete (or fail) the key's run, keeping the final summary it is given (the engine's
        ``conversations/run_end.py`` writes it; the store summarizes nothing)."""
        run = bookkeeping.require_active(self.state, key)
        run.closing = True
        try:
            return await self._complete(run, key, end)
        except BaseException:
            if run.run_id in self.state.runs:
                run.closing = False  # not completed: the run goes on
            raise

    async def _complete(self, run: RunState, key: str, end: RunFinish) -> RunState:
        status: RunStatus = "failed" if end.error is not None else "completed"
        text = end.final_summary if end.summarize else None
        for name, hook in self.state.hooks.completion_hooks.items() if end.summarize else ():
            await run_hook("completion", name, hook, run)
        await self.queue.settled(run)
        now = iso(self.state.clock())
        entry = self.state.entry(key)
        after = None
        if entry is not None:
            after = dataclasses.replace(entry)
            bookkeeping.end_entry(after, run.run_id, now)
        stats = bookkeeping.run_stats(run)
        sets = ", ".join(f"{k} = ${i}" for i, k in enumerate(stats, start=8))
        with unavailable("the run's completion was not stored"):
            async with self.state.pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    f"UPDATE runs SET status = $2, completed_at = $3, updated_at = $3, error_message = $4,"
                    f" compaction_count = $5, final_summary = $6, opening = $7, {sets} WHERE run_id = $1",
                    run.run_id, status, now, end.error, run.compaction_count, text, False, *stats.values(),
                )  # fmt: skip
                # every client_message_id the run stored keeps its idempotency record after the run (a
                # record of the same delivery stays; an expired one of an earlier delivery is replaced)
                await conn.execute(
                    "INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq)"
                    " SELECT DISTINCT ON (client_message_id) $2, client_message_id, created_at, $1, seq FROM messages"
                    " WHERE run_id = $1 AND client_message_id IS NOT NULL ORDER BY client_message_id, seq DESC"
                    " ON CONFLICT (session_key, client_message_id) DO UPDATE SET created_at = excluded.created_at,"
                    " run_id = excluded.run_id, message_seq = excluded.message_seq, response = NULL"
                    " WHERE (idempotency.run_id, idempotency.message_seq)"
                    " IS DISTINCT FROM (excluded.run_id, excluded.message_seq)"
                    " AND idempotency.created_at < excluded.created_at",
                    run.run_id, key,
                )  # fmt: skip
                if after is not None:
                    await conn.execute(_UPSERT_ENTRY, after.key, encode_entry(after))
        del self.state.runs[run.run_id]
        if entry is not None and after is not None:
            self.state.entries[key] = after
            self.state.dirty.discard(key)
        run.status = status
        self.state.emit_run("lifecycle", run, action=status, reason=end.reason, error=end.error)
        return run

    async def delete(self, key: str) -> str | None:
        """Complete the active run (if any) and remove the entry; the runs stay."""
        self.state.require_entry(key)
        completed = None
        if self.state.active_run(key) is not None:
            completed = (await self.complete(key, RunFinish(reason="delete"))).run_id
        self.state.entries.pop(key, None)
        with unavailable("the deletion was not stored"):  # a new session on the key inherits nothing of these runs
            await self.state.pool.execute("UPDATE runs SET inherit = false WHERE session_key = $1", key)
        await self.state.flush_entries(key)
        return completed

    async def update_entry(self, key: str, change: EntryChange) -> SessionEntry:
        entry = self.state.require_entry(key)
        pinned = change.pinned
        if pinned is not None and pinned != entry.pinned:
            entry.pinned = pinned
            with unavailable("the change was not stored"):
                await self.state.pool.execute("UPDATE runs SET pinned = $2 WHERE session_key = $1", key, int(pinned))
        entry.relabel(change)
        entry.updated_at = iso(self.state.clock())
        await self.state.flush_entries(key)
        return entry

    async def set_inherit_next(self, key: str, inherit: bool) -> bool:
        changed = bookkeeping.inherit_next(self.state.entry(key), inherit)
        if changed:
            self.state.touch(key)
        return changed

    async def set_reset_boundary(self, key: str, boundary: str) -> None:
        if bookkeeping.mark_reset_boundary(self.state.entry(key), boundary):
            await self.state.flush_entries(key)
