"""The store's appends: messages (the performance-critical path: seqs and counters on the loop,
the line to the writer thread's group commit), tool and plan records, usage, context calibration,
and a compaction's rewrite of current.jsonl."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.clock import iso
from home import layout
from home.probe import probe_writable
from sessions import usage as usage_days
from sessions.appends import check_writable, event_fields, message_record, tool_record
from sessions.bookkeeping import add_usage_counts, count_append, note_message, plan_record
from sessions.codec import encode, encode_plain
from sessions.deliveries import (
    DELIVERY_WINDOW,
    AlreadyDelivered,
    Delivery,
    PriorDelivery,
    RecordedId,
    RunDeliveries,
    prior_of,
)
from sessions.faults import storage_error
from sessions.files import context_rewrite, leftovers
from sessions.files.jsonl import iter_records
from sessions.files.recovery import context_line, in_context
from sessions.files.run_folder import folder_of
from sessions.files.store_records import Records
from sessions.files.store_state import StoreState
from sessions.records import (
    ContextRewrite,
    MessageRecord,
    NewMessage,
    PlanRecord,
    RunState,
    ToolUse,
    copy_counters,
)
from sessions.rewrites import ContextChange

log = logging.getLogger(__name__)


class Appends:
    """Messages, tool and plan records, usage and the context's counters of the active runs, and
    the check of a delivery marked ``once`` (over ``records``' idempotency records)."""

    def __init__(self, state: StoreState, records: Records) -> None:
        self.state = state
        self.records = records
        self._probed: tuple[float, str | None] = (float("-inf"), None)  # (monotonic time, problem)

    def check_writable(self, run: RunState, message: NewMessage) -> None:
        check_writable(run, message)

    async def append(self, run: RunState, message: NewMessage) -> MessageRecord:
        """Append a message; returns its messages.jsonl record once durable under the fsync
        policy. The seq is assigned here, on the loop, so arrival order is file order.

        A failed append (full disk, read-only file system) raises ``InsufficientStorage`` or
        ``StorageUnavailable``; the writer cut the files back, and once every append that was
        pending meanwhile has settled, the seq and the counters go back to where they were:
        a failed message consumes no seq and is not counted."""
        record, durable = self.queue_append(run, message)
        return await self.finish_append(run, message, record, durable)

    def queue_append(self, run: RunState, message: NewMessage) -> tuple[MessageRecord, asyncio.Future[None]]:
        """The first half of ``append``: assign the seq and queue the line; the record and the
        future that resolves once it is durable. A caller that holds the key's lock can release
        it before awaiting, so the next message on the key joins the same group commit; it must
        then await ``finish_append``."""
        check_writable(run, message)
        state = self.state
        once = message.once and message.client_message_id is not None
        if once:
            prior = self._stored_before(run, str(message.client_message_id))
            if prior is not None:
                raise AlreadyDelivered(prior)
        stamp = iso(state.clock())
        record = message_record(run.next_seq, message, stamp)
        run.next_seq += 1
        if once:  # known from now on: a repeat queued before this one is durable is refused too
            _deliveries(run).add(record)
        dump = encode if message.tool_calls else encode_plain  # no floats without tool calls
        data = dump(record)
        _, messages, current = self._run_files(run)
        line = dump(context_line(record)) if in_context(record) else b""
        undo = _Undo(record["seq"], len(data), len(line), record["tokens"] if line else 0, run.last_context_seq)
        durable = state.writer.append(
            messages,
            data,
            durable=True,
            also=(current, line) if line else None,
            guarded=True,
            on_done=lambda error: self._settle_append(run, undo, error, record if once else None),
        )
        count_append(run, record, len(data), len(line) if line else None)
        entry = state.registry.entries.get(run.key)
        if entry is not None:
            note_message(entry, message, stamp)
            copy_counters(run, entry)
            state.registry.touch(run.key)
        return record, durable

    async def finish_append(
        self, run: RunState, message: NewMessage, record: MessageRecord, durable: asyncio.Future[None]
    ) -> MessageRecord:
        """The second half of ``append``: wait until the line is durable (a failed write raises the
        typed storage error), then tell the listeners and the event hub. A caller cancelled while
        it waits cancels only its wait: the counters follow the writer (``_settle_append``)."""
        try:
            await durable
        except OSError as exc:
            raise storage_error(exc) from exc
        if message.client_message_id is not None or message.reply_to is not None:
            _deliveries(run).add(record)
        if run.opening:
            run.opening = False
            marker = folder_of(run) / leftovers.OPENING
            self.state.writer.call(lambda: marker.unlink(missing_ok=True)).add_done_callback(_log_failure)
        for durable_listener in self.state.hooks.durable_listeners:
            durable_listener(run, record)
        self.state.emit_run("message", run, at=record["timestamp"], **event_fields(record))
        return record

    def _run_files(self, run: RunState) -> tuple[Path, Path, Path]:
        """The run's folder and its two message stores, joined once per folder (not per append)."""
        files = self.state.files.get(run.run_id)
        folder = folder_of(run)
        if files is None or files[0] is not folder:
            files = self.state.files[run.run_id] = (folder, folder / layout.MESSAGES, folder / layout.CURRENT)
        return files

    async def record_deliveries(self, run: RunState) -> None:
        """Before a run leaves the active set, make sure every client_message_id it stored has
        its idempotency record (one may be missing after a crash or a tasks.db error): a
        redelivery after the run ended is then still recognised."""
        deliveries = _deliveries(run)
        if not deliveries.scanned and run.messages_bytes:
            path = folder_of(run) / layout.MESSAGES
            deliveries.merge(await self.state.writer.call(lambda: scan_deliveries(path)))
        rows = [(run.key, cmid, stamp, run.run_id, seq) for cmid, (seq, stamp) in deliveries.by_id.items()]
        if not rows:
            return
        # a record of the same delivery (a reply's) stays; an older one of another delivery was
        # expired when the message was stored (else the message was refused): it is replaced
        sql = (
            "INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_key, client_message_id) DO UPDATE SET"
            " created_at = excluded.created_at, run_id = excluded.run_id, message_seq = excluded.message_seq,"
            " response = NULL WHERE (idempotency.run_id IS NOT excluded.run_id OR idempotency.message_seq IS NOT"
            " excluded.message_seq)"
            " AND idempotency.created_at < excluded.created_at"
        )
        try:
            await self.state.ledger.execute(lambda c: c.executemany(sql, rows))
        except sqlite3.Error as exc:
            log.warning("idempotency records of run %s not written at completion (%s)", run.run_id, exc)
            self.state.forget_recorded(run.key)
            return
        known = self.state.recorded_ids.get(run.key)
        if known is not None:
            for _key, cmid, stamp, run_id, seq in rows:
                before = known.get(cmid)
                if before is None or ((before.run_id, before.seq) != (run_id, seq) and before.created_at < stamp):
                    known[cmid] = RecordedId(stamp, run_id, seq)

    # -- deliveries: the check of an append marked ``once``, and the lookup before one ---------

    def checks_deliveries(self, key: str) -> bool:
        """True once the key's recorded ids and its active run's transcript are in memory (the
        first ``recall_delivery`` of a key reads them): the append then checks without a lookup."""
        run = self.state.active_run(key)
        known = key in self.state.recorded_ids
        return run is not None and known and run.deliveries is not None and run.deliveries.scanned

    def _stored_before(self, run: RunState, cmid: str) -> PriorDelivery | None:
        """``cmid`` stored on the run's key within the window, from what is in memory: the run's
        deliveries (every durable append of this process, and the file's earlier lines once read)
        and the key's recorded ids once read (``checks_deliveries`` says when both are)."""
        since = iso(self.state.clock() - DELIVERY_WINDOW)
        known = self.state.recorded_ids.get(run.key)
        found = known.get(cmid) if known is not None else None
        if found is not None and found.created_at >= since:
            return PriorDelivery(found.run_id, found.seq)
        delivered = _deliveries(run).find(run.run_id, cmid, since)
        return None if delivered is None else prior_of(delivered)

    async def recall_delivery(self, key: str, client_message_id: str, *, since: str) -> PriorDelivery | None:
        """Its record in tasks.db (read in full only when the key's recorded ids name it), else
        the message in the active run's transcript; reads what the check of an append needs
        into memory the first time a key (and its run) is asked."""
        known = await self.records.recorded(key)
        found = known.get(client_message_id)
        if found is not None and found.created_at >= since:
            record = await self.records.find_idempotency(key, client_message_id, since=since)
            if record is not None:
                return PriorDelivery(record.run_id, record.message_seq, record.response)
        delivered = await self.find_delivery(key, client_message_id, since=since)
        return None if delivered is None else prior_of(delivered)

    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None:
        """The message of the key's active run that carried ``client_message_id`` (stored at or
        after ``since``), read from messages.jsonl itself the first time a run is asked."""
        run = self.state.active_run(key)
        if run is None:
            return None
        deliveries = _deliveries(run)
        if not deliveries.scanned:
            path = folder_of(run) / layout.MESSAGES
            deliveries.merge(await self.state.writer.call(lambda: scan_deliveries(path)))
        return deliveries.find(run.run_id, client_message_id, since)

    def _settle_append(
        self, run: RunState, undo: _Undo, error: BaseException | None, once: MessageRecord | None = None
    ) -> None:
        """On the loop, once an append is durable or failed (``error``): take a failed one out of
        the counters (and out of the run's deliveries, ``once``: its record, known since it was
        queued); when nothing is pending any more, give its seq back and reopen the file."""
        run.appends_pending -= 1
        if error is not None and once is not None and run.deliveries is not None:
            run.deliveries.forget(once)
        if error is not None:
            run.messages_bytes -= undo.messages_bytes
            if undo.context_bytes:
                run.context_bytes -= undo.context_bytes
                run.context_tokens = max(0, run.context_tokens - undo.tokens)
                run.context_lines -= 1
            if run.failed_seq is None or undo.seq < run.failed_seq:
                run.failed_seq, run.failed_context_seq = undo.seq, undo.last_context_seq
        if run.appends_pending == 0 and run.failed_seq is not None:
            run.next_seq, run.last_context_seq = run.failed_seq, run.failed_context_seq
            run.failed_seq = None
            self.state.writer.reopen(folder_of(run) / layout.MESSAGES)
            entry = self.state.entry(run.key)
            if entry is not None and entry.run_id == run.run_id:
                copy_counters(run, entry)
                self.state.registry.touch(run.key)

    async def writable(self) -> str | None:
        """None when the store can write now; else why not (for ``/readyz``). Probed on the
        writer thread: no thread is started per call (starting one waits for the GIL, which a
        loading model can hold for seconds), and the probe sees the disk as the appends do."""
        contexts = self.state.home.contexts
        problem = await self.state.writer.call(lambda: probe_writable(contexts))
        self._probed = (time.monotonic(), problem)
        return problem

    def recently_writable(self, max_age_s: float) -> bool:
        """True when a probe within ``max_age_s`` found the store writable and no append has
        failed since the last that succeeded (``/readyz`` then answers without a new probe)."""
        at, problem = self._probed
        return problem is None and self.state.writer.last_error is None and time.monotonic() - at < max_age_s

    async def record_tool(self, run: RunState, use: ToolUse) -> dict[str, Any]:
        record = tool_record(run, use, iso(self.state.clock()))
        await self.state.writer.append(folder_of(run) / layout.TOOLS, encode(record), durable=True)
        return record

    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> PlanRecord:
        record = plan_record(run, plan_type, plan_content, iso(self.state.clock()))
        await self.state.writer.append(folder_of(run) / layout.PLANNING, encode(record), durable=True)
        return record

    async def add_usage(self, run: RunState, usage: Mapping[str, int]) -> None:
        """Cumulative usage per run (tasks.db) and per key (sessions.json)."""
        entry = self.state.entry(run.key)
        clean = add_usage_counts(run, entry, usage)
        if entry is not None:
            self.state.registry.touch(run.key)
        try:
            now = self.state.clock()
            daily = usage_days.DailyKey(usage_days.usage_day(now), run.agent_id or "main", run.key)
            await self.state.ledger.add_usage(run.run_id, clean, iso(now), daily)
        except sqlite3.Error as exc:  # the turn goes on: its message and reply are stored already
            log.warning("usage of run %s not added to tasks.db (%s); sessions.json keeps it", run.run_id, exc)

    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None:
        """Replace the estimate with the provider's count of the context just sent, plus the
        ``appended_since`` tokens of what was appended after that context was read."""
        run.context_tokens = max(0, prompt_tokens - overhead_tokens) + max(0, appended_since)
        self.state.checkpoint(run)

    async def rewrite_context(self, run: RunState, change: ContextChange) -> ContextRewrite | None:
        """Carry out a compaction's (or an uncompact's) rewrite of current.jsonl on the writer
        thread (``sessions.files.context_rewrite``), after every append queued before it and with
        the append handle of current.jsonl closed; then count what it did into the run (appends
        queued meanwhile are kept on top) and checkpoint the counters. None: it changed nothing."""
        folder = folder_of(run)
        current = folder / layout.CURRENT
        tokens_at_call, bytes_at_call = run.context_tokens, run.context_bytes

        def _do() -> ContextRewrite | None:
            self.state.writer.close_handle(current)
            return context_rewrite.commit(folder, change)

        future = self.state.writer.call(_do)
        try:
            done = await asyncio.shield(future)
        except asyncio.CancelledError:
            # The commit goes on on the writer thread: count it in once it is done, or the run's
            # counters (its compaction count, its next summary id) fall behind its files, and the
            # next compaction would reuse this one's summary id and archive name.
            future.add_done_callback(lambda f: self._count_late_rewrite(run, f, tokens_at_call, bytes_at_call))
            raise
        if done is None:
            return None
        self._count_rewrite(run, done, tokens_at_call, bytes_at_call)
        await self.state.ledger.update_run(run.run_id, compaction_count=run.compaction_count)
        return done

    def _count_rewrite(self, run: RunState, done: ContextRewrite, tokens_at_call: int, bytes_at_call: int) -> None:
        run.context_bytes = done.context_bytes + (run.context_bytes - bytes_at_call)
        run.context_tokens = done.tokens_after + (run.context_tokens - tokens_at_call)
        run.context_lines += done.line_delta
        run.compaction_count = done.compaction_count
        run.next_summary_id = done.summary_id + 1
        self.state.checkpoint(run)

    def _count_late_rewrite(
        self, run: RunState, future: asyncio.Future[ContextRewrite | None], tokens_at_call: int, bytes_at_call: int
    ) -> None:
        """A rewrite whose caller was cancelled while the writer thread carried it out."""
        if future.cancelled() or future.exception() is not None:
            return
        done = future.result()
        if done is None:
            return
        self._count_rewrite(run, done, tokens_at_call, bytes_at_call)
        task = asyncio.ensure_future(self.state.ledger.update_run(run.run_id, compaction_count=run.compaction_count))
        _LATE_UPDATES.add(task)
        task.add_done_callback(_ledger_updated)


@dataclass(frozen=True)
class _Undo:
    """What one append added to a run's counters (taken back if it fails)."""

    seq: int
    messages_bytes: int
    context_bytes: int
    tokens: int
    last_context_seq: int


def _deliveries(run: RunState) -> RunDeliveries:
    if run.deliveries is None:  # a run with nothing stored yet has nothing to read back
        run.deliveries = RunDeliveries(scanned=run.messages_bytes == 0)
    deliveries: RunDeliveries = run.deliveries
    return deliveries


_LATE_UPDATES: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)


def _ledger_updated(task: asyncio.Task[None]) -> None:
    _LATE_UPDATES.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("compaction count not written to tasks.db: %s", task.exception())


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("could not remove a run's opening marker: %s", future.exception())


def scan_deliveries(path: Path) -> RunDeliveries:
    """Read a messages.jsonl for its deliveries (blocking)."""
    out = RunDeliveries(scanned=True)
    for record in iter_records(path):
        if "client_message_id" in record or "reply_to" in record:
            out.add(record)
    return out
