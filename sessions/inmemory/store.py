"""The in-memory store: the base capability (keys, runs, lifecycle, appends, reads, the context
rewrite) over a ``MemoryData``. An append is "durable" when it is in the data; nothing can fail
for want of storage, so ``writable`` is always None."""

from __future__ import annotations

import asyncio
import logging
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from typing import Any, cast

from config.clock import Clock, iso
from sessions import bookkeeping
from sessions.appends import check_writable, event_fields, message_record, tool_record
from sessions.compaction import COMPACTIONS
from sessions.context_order import context_line, in_context
from sessions.delegate import Delegate
from sessions.deliveries import DELIVERY_WINDOW, AlreadyDelivered
from sessions.entries import SessionEntry
from sessions.events import EventType, StoreEvent
from sessions.inmemory.data import MemoryData, StoredRun, line_size
from sessions.inmemory.history import MemoryHistory
from sessions.inmemory.maintenance import MemoryMaintenance
from sessions.inmemory.reads import MemoryReads
from sessions.inmemory.records import MemoryRecords
from sessions.protocol import ConversationStore
from sessions.records import (
    ACTIVE_STATUSES,
    PLAIN_FINISH,
    USAGE_KEYS,
    ContextRewrite,
    EntryChange,
    MessageRecord,
    NewMessage,
    PlanRecord,
    RunFinish,
    RunRow,
    RunStart,
    RunState,
    RunStatus,
    StoredRecord,
    TaskKey,
    ToolUse,
    copy_counters,
    restore_counters,
)
from sessions.rewrites import Compaction, ContextChange, compacted, to_undo, tokens_of, uncompacted
from sessions.store_hooks import StoreHooks
from sessions.usage import UsageBook

log = logging.getLogger(__name__)


class MemoryStore:
    """Every capability but ``Backup`` over a ``MemoryData``: keys, runs, lifecycle and appends
    here, with its parts ``reads``, ``records``, ``history`` and ``maintenance``."""

    # reads by run id
    get_run = Delegate("reads", MemoryReads.get_run)
    require_run = Delegate("reads", MemoryReads.require_run)
    list_runs = Delegate("reads", MemoryReads.list_runs)
    known_keys = Delegate("reads", MemoryReads.known_keys)
    previous_runs = Delegate("reads", MemoryReads.previous_runs)
    read_messages = Delegate("reads", MemoryReads.read_messages)
    read_records = Delegate("reads", MemoryReads.read_records)
    read_final_summary = Delegate("reads", MemoryReads.read_final_summary)
    read_context = Delegate("reads", MemoryReads.read_context)
    # the records beside the runs, usage
    find_delivery = Delegate("records", MemoryRecords.find_delivery)
    recall_delivery = Delegate("records", MemoryRecords.recall_delivery)
    checks_deliveries = Delegate("records", MemoryRecords.checks_deliveries)
    find_idempotency = Delegate("records", MemoryRecords.find_idempotency)
    remember_delivery = Delegate("records", MemoryRecords.remember_delivery)
    remember_reply = Delegate("records", MemoryRecords.remember_reply)
    hook_delivery = Delegate("records", MemoryRecords.hook_delivery)
    record_hook_delivery = Delegate("records", MemoryRecords.record_hook_delivery)
    compat_conversation = Delegate("records", MemoryRecords.compat_conversation)
    save_compat_conversation = Delegate("records", MemoryRecords.save_compat_conversation)
    compat_response = Delegate("records", MemoryRecords.compat_response)
    latest_compat_response = Delegate("records", MemoryRecords.latest_compat_response)
    save_compat_response = Delegate("records", MemoryRecords.save_compat_response)
    daily_usage = Delegate("usage", UsageBook.daily_usage)
    tokens_spent = Delegate("usage", UsageBook.tokens_spent)
    # HistorySource, Maintenance
    open_history = Delegate("history", MemoryHistory.open_history)
    rebuild_history = Delegate("history", MemoryHistory.rebuild_history)
    catch_up_history = Delegate("history", MemoryHistory.catch_up_history)
    check_history = Delegate("history", MemoryHistory.check_history)
    check = Delegate("maintenance", MemoryMaintenance.check)
    cleanup = Delegate("maintenance", MemoryMaintenance.cleanup)
    export_runs = Delegate("maintenance", MemoryMaintenance.export_runs)
    purge = Delegate("maintenance", MemoryMaintenance.purge)

    def __init__(self, data: MemoryData, *, clock: Clock, hooks: StoreHooks) -> None:
        self.data, self.clock, self.hooks = data, clock, hooks
        self.reads = MemoryReads(data, clock)
        self.records = MemoryRecords(data, clock, self.active_run)
        self.usage = UsageBook(self.records.usage_rows, self.records.tokens_spent)
        self.history = MemoryHistory(data)
        self.maintenance = MemoryMaintenance(self)
        self._entries = {key: SessionEntry.from_dict(dict(raw)) for key, raw in data.entries.items()}
        self._runs: dict[str, RunState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        for run_id, stored in data.runs.items():
            if stored.row["status"] in ACTIVE_STATUSES:
                self._runs[run_id] = _state_of(stored)

    @classmethod
    async def open(cls, data: MemoryData, *, clock: Clock, hooks: StoreHooks | None = None) -> MemoryStore:
        return cls(data, clock=clock, hooks=hooks or StoreHooks())

    async def close(self) -> None:
        self._save_entries()

    def _save_entries(self) -> None:
        self.data.entries = {key: entry.to_dict() for key, entry in self._entries.items()}

    # -- lookups ----------------------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self._entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        return bookkeeping.found_entry(self._entries.get(key), key)

    def entries(self) -> Iterable[SessionEntry]:
        return self._entries.values()

    def active_run(self, key: str) -> RunState | None:
        entry = self._entries.get(key)
        return None if entry is None or entry.run_id is None else self._runs.get(entry.run_id)

    def run_state(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def active_runs(self) -> Iterable[RunState]:
        return self._runs.values()

    def lock_for(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    # -- the entry outside a run's lifecycle ------------------------------------------------------

    async def update_entry(self, key: str, change: EntryChange) -> SessionEntry:
        entry = self.require_entry(key)
        pinned = change.pinned
        if pinned is not None and pinned != entry.pinned:
            entry.pinned = pinned
            for stored in self.data.runs.values():
                if stored.row.get("session_key") == key:
                    stored.row["pinned"] = int(pinned)
        entry.relabel(change)
        entry.updated_at = iso(self.clock())
        self._save_entries()
        return entry

    async def set_inherit_next(self, key: str, inherit: bool) -> bool:
        return bookkeeping.inherit_next(self._entries.get(key), inherit)

    async def set_reset_boundary(self, key: str, boundary: str) -> None:
        if bookkeeping.mark_reset_boundary(self._entries.get(key), boundary):
            self._save_entries()

    # -- lifecycle --------------------------------------------------------------------------------

    async def start_run(self, start: RunStart) -> RunState:
        key = start.key
        entry = self._entries.get(key)
        bookkeeping.refuse_second_run(entry, key)
        now = iso(self.clock())
        run_id = str(uuidlib.uuid4())
        run = RunState(
            run_id=run_id, key=key, agent_id=start.agent_id, chat_type=start.chat_type, channel=start.channel,
            status="running", started_at=now, task_key=start.task_key, parent_uuid=start.parent_uuid,
        )  # fmt: skip
        pinned = entry is not None and entry.pinned
        row = cast(RunRow, {
            "uuid": run_id, "status": "running", **start.task_key.as_dict(), "created_at": now, "updated_at": now,
            "completed_at": None, "metadata": None, "total_messages": 0, "total_summaries": 0, "total_tool_calls": 0,
            "final_token_count": None, "final_message_count": None, "error_message": None, "session_key": key,
            "agent_id": start.agent_id, "channel": start.channel, "chat_type": start.chat_type,
            "parent_uuid": start.parent_uuid,
            **dict.fromkeys(USAGE_KEYS, 0), "compaction_count": 0, "pinned": int(pinned), "archived_at": None,
        })  # fmt: skip
        self.data.runs[run_id] = StoredRun(row, {"session_key": key, **start.task_key.as_dict()})
        self._runs[run_id] = run
        if entry is None:
            entry = self._entries[key] = SessionEntry(
                key=key, agent_id=start.agent_id, chat_type=start.chat_type, channel=start.channel, created_at=now,
                updated_at=now,
            )
        bookkeeping.start_entry(entry, run_id, now)
        self._checkpoint(run)
        self._emit("lifecycle", run, action="start", parent_uuid=start.parent_uuid)
        return run

    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None:
        self._runs.pop(run.run_id, None)
        self.data.runs.pop(run.run_id, None)
        entry = self._entries.get(run.key)
        if entry is not None and entry.run_id == run.run_id:
            if remove_entry:
                del self._entries[run.key]
            else:
                bookkeeping.idle_entry(entry)
        self._save_entries()
        self._emit("lifecycle", run, action="discard")

    async def pause(self, key: str) -> RunState:
        run, pausing = await bookkeeping.to_pause(self, key, self.hooks)
        if not pausing:
            return run
        self._set_status(run, "paused", **bookkeeping.run_stats(run))
        self._emit("lifecycle", run, action="pause")
        return run

    async def resume(self, key: str) -> RunState:
        run = bookkeeping.require_active(self, key)
        if run.status == "running":
            return run
        self._set_status(run, "running")
        self._emit("lifecycle", run, action="resume")
        return run

    async def complete(self, key: str, end: RunFinish = PLAIN_FINISH) -> RunState:
        run, status = await bookkeeping.to_complete(self, key, self.hooks, end)
        if end.final_summary is not None and end.summarize:
            self.data.runs[run.run_id].final_summary = end.final_summary
        self.records.keep_deliveries(run)
        now = iso(self.clock())
        cast(dict[str, Any], self._row(run)).update(
            status=status, completed_at=now, updated_at=now, error_message=end.error,
            compaction_count=run.compaction_count, **bookkeeping.run_stats(run),
        )  # fmt: skip
        del self._runs[run.run_id]
        entry = self._entries.get(key)
        if entry is not None:
            bookkeeping.end_entry(entry, run.run_id, now)
        self._save_entries()
        run.status = status
        self._emit("lifecycle", run, action=status, reason=end.reason, error=end.error)
        return run

    async def delete(self, key: str) -> str | None:
        completed = await bookkeeping.end_to_delete(self, key, self.complete)
        self._entries.pop(key, None)
        self._save_entries()
        for stored in self.data.runs.values():  # a new session on the key starts clean
            if stored.row.get("session_key") == key:
                stored.metadata["inherit"] = False
        return completed

    def _set_status(self, run: RunState, status: RunStatus, **stats: int) -> None:
        run.status = status
        cast(dict[str, Any], self._row(run)).update(status=status, updated_at=iso(self.clock()), **stats)
        entry = self._entries.get(run.key)
        if entry is not None:
            entry.status, entry.updated_at = status, iso(self.clock())
        self._save_entries()

    # -- appends ----------------------------------------------------------------------------------

    def check_writable(self, run: RunState, message: NewMessage) -> None:
        check_writable(run, message)

    async def append(self, run: RunState, message: NewMessage) -> MessageRecord:
        record, durable = self.queue_append(run, message)
        return await self.finish_append(run, message, record, durable)

    def queue_append(self, run: RunState, message: NewMessage) -> tuple[MessageRecord, asyncio.Future[None]]:
        check_writable(run, message)
        if message.once and message.client_message_id is not None:
            since = iso(self.clock() - DELIVERY_WINDOW)
            prior = self.records.stored_before(run.key, message.client_message_id, since)
            if prior is not None:
                raise AlreadyDelivered(prior)
        stamp = iso(self.clock())
        record = message_record(run.next_seq, message, stamp)
        stored = self.data.runs[run.run_id]
        run.next_seq += 1
        stored.messages.append(dict(record))
        line = context_line(record) if in_context(record) else None
        if line is not None:
            stored.context.append(line)
        bookkeeping.count_append(run, record, line_size(dict(record)), None if line is None else line_size(line))
        entry = self._entries.get(run.key)
        if entry is not None:
            bookkeeping.note_message(entry, message, stamp)
        self._checkpoint(run)
        # Durable at once, settled on the loop's next turn, as a writer thread would settle it.
        loop = asyncio.get_running_loop()
        durable: asyncio.Future[None] = loop.create_future()
        loop.call_soon(_settle, run, durable)
        return record, durable

    async def finish_append(
        self, run: RunState, message: NewMessage, record: MessageRecord, durable: asyncio.Future[None]
    ) -> MessageRecord:
        await durable
        run.opening = False
        for listener in self.hooks.durable_listeners:
            listener(run, record)
        self._emit("message", run, at=record["timestamp"], **event_fields(record))
        return record

    async def record_tool(self, run: RunState, use: ToolUse) -> StoredRecord:
        record = tool_record(run, use, iso(self.clock()))
        self.data.runs[run.run_id].tools.append(record)
        return record

    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> PlanRecord:
        record = bookkeeping.plan_record(run, plan_type, plan_content, iso(self.clock()))
        self.data.runs[run.run_id].planning.append(dict(record))
        return record

    async def add_usage(self, run: RunState, usage: Mapping[str, int]) -> None:
        clean = bookkeeping.add_usage_counts(run, self._entries.get(run.key), usage)
        row = cast(dict[str, Any], self._row(run))
        for k, v in clean.items():
            row[k] = int(row.get(k) or 0) + v
        self.records.count_usage(run, clean)

    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None:
        run.context_tokens = max(0, prompt_tokens - overhead_tokens) + max(0, appended_since)
        self._checkpoint(run)

    async def rewrite_context(self, run: RunState, change: ContextChange) -> ContextRewrite | None:
        stored = self.data.runs[run.run_id]
        current = stored.context
        if isinstance(change, Compaction):
            done = compacted(change, current)
            if done is None:
                return None
            new_lines, record = done
            stored.saved_contexts[str(record.get("archive") or f"{COMPACTIONS}/{change.summary_id}.jsonl")] = current
            count, before = change.compaction_count, int(record["tokens_before"])
        else:
            found = to_undo(stored.summaries)
            if found is None or found[1] not in stored.saved_contexts:
                return None
            undone, archive = found
            new_lines, record = uncompacted(change, undone, archive, stored.saved_contexts[archive], current)
            count, before = change.compaction_count - 1, 0
        stored.summaries.append(record)
        stored.context = new_lines
        size = sum(line_size(line) for line in new_lines)
        rewrite = ContextRewrite(
            tokens_of(new_lines), len(new_lines) - len(current), size, count, change.summary_id, tokens_before=before
        )
        run.context_bytes, run.context_tokens = rewrite.context_bytes, rewrite.tokens_after
        run.context_lines += rewrite.line_delta
        run.compaction_count, run.next_summary_id = count, change.summary_id + 1
        self._row(run)["compaction_count"] = count
        self._checkpoint(run)
        return rewrite

    async def writable(self) -> str | None:
        return None

    def recently_writable(self, max_age_s: float) -> bool:
        return True

    def emit(self, event: StoreEvent) -> None:
        for listener in self.hooks.listeners:
            listener(event)

    def _emit(self, event_type: EventType, run: RunState, *, at: str | None = None, **fields: object) -> None:
        event = {"type": event_type, "key": run.key, "run_id": run.run_id, "at": at or iso(self.clock()), **fields}
        for listener in self.hooks.listeners:
            listener(cast(StoreEvent, event))

    def _checkpoint(self, run: RunState) -> None:
        """The run's counters, in its entry and in the data (what a reopen restores)."""
        stored = self.data.runs.get(run.run_id)
        if stored is not None:
            stored.counters = run.counters
        entry = self._entries.get(run.key)
        if entry is not None and entry.run_id == run.run_id:
            copy_counters(run, entry)

    def _row(self, run: RunState) -> RunRow:
        return self.data.runs[run.run_id].row


def _state_of(stored: StoredRun) -> RunState:
    """An active run as a reopen finds it: its counters as last checkpointed."""
    row = stored.row
    run = RunState(
        run_id=row["uuid"], key=str(row.get("session_key") or ""), agent_id=row.get("agent_id"),
        chat_type=str(row.get("chat_type") or "direct"), channel=row.get("channel"), status=row["status"],
        started_at=row["created_at"],
        task_key=TaskKey(
            task_type=str(row.get("task_type") or "agent"), task_identifier=row.get("task_identifier"),
            repository=row.get("repository"), user=row.get("user"),
        ),
        parent_uuid=row.get("parent_uuid"), next_tool_seq=len(stored.tools) + 1,
        next_plan_id=len(stored.planning) + 1,
    )  # fmt: skip
    restore_counters(run, stored.counters)
    run.usage = {k: int(cast(dict[str, Any], row).get(k) or 0) for k in USAGE_KEYS}
    return run


def _settle(run: RunState, durable: asyncio.Future[None]) -> None:
    run.appends_pending -= 1
    if not durable.done():
        durable.set_result(None)


def _conforms(store: MemoryStore) -> ConversationStore:
    return store  # mypy checks here that MemoryStore implements the base and record capabilities
