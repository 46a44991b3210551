"""The PostgreSQL store's append queue: the database's group commit.

Each run has a queue of appends (and of calls that must come after them: a context rewrite, a read
of the context). One flusher task sends the queued appends of EVERY run in one statement, at most
``MAX_IN_FLIGHT`` statements under way (a run in one of them at a time, so its order holds):
while a round trip is under way the next messages gather, so a busy gateway sends dozens of
messages per COMMIT instead of one (the files backend's writer thread does the same with its
fdatasync). The statement claims each run's seqs on its row (the
row's ``next_seq`` must be the first seq sent) and inserts that run's lines only if the claim
held; it commits before its answer comes back, so a message is acknowledged after its COMMIT.
A run whose claim failed, or every run of a statement that failed, fails its appends and every
append queued behind them (their seqs follow), and its counters go back: no seq is consumed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from config.errors import Conflict, StorageUnavailable
from sessions.postgres.base import PgBase
from sessions.postgres.faults import RETRY_AFTER_S, database_error
from sessions.records import MessageRecord, RunState

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_BATCH = 1024  # messages in one statement
MAX_IN_FLIGHT = 2  # statements under way at once (on disjoint runs): the database works on one
# while the loop encodes the next

_APPEND = """
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
        $7::bigint[], $8::bigint[], $9::text[]) AS b(run_id, first, n, nctx, tokens, cbytes, lastctx, mbytes, at)
), r AS (
    UPDATE runs SET next_seq = b.first + b.n, next_pos = runs.next_pos + b.nctx,
        context_tokens = runs.context_tokens + b.tokens, context_bytes = runs.context_bytes + b.cbytes,
        context_lines = runs.context_lines + b.nctx,
        last_context_seq = CASE WHEN b.lastctx > 0 THEN b.lastctx ELSE runs.last_context_seq END,
        messages_bytes = runs.messages_bytes + b.mbytes, updated_at = b.at, opening = false
    FROM b WHERE runs.run_id = b.run_id AND runs.next_seq = b.first AND runs.status IN ('running', 'paused')
    RETURNING runs.run_id, runs.next_pos - b.nctx AS pos0
), m AS (
    INSERT INTO messages (run_id, seq, created_at, client_message_id, reply_to, record)
    SELECT u.run_id, u.seq, u.at, u.cmid, u.reply_to, u.rec
    FROM unnest($10::text[], $11::bigint[], $12::text[], $13::text[], $14::bigint[], $15::json[])
        AS u(run_id, seq, at, cmid, reply_to, rec)
    WHERE u.run_id IN (SELECT run_id FROM r)
), c AS (
    INSERT INTO context_lines (run_id, pos, line)
    SELECT u.run_id, r.pos0 + u.ord, u.line
    FROM unnest($16::text[], $17::bigint[], $18::json[]) AS u(run_id, ord, line) JOIN r USING (run_id)
)
SELECT run_id FROM r
"""


@dataclass(frozen=True)
class Undo:
    """What one append added to its run's counters (taken back if it fails)."""

    seq: int
    messages_bytes: int
    context_bytes: int
    tokens: int
    last_context_seq: int


@dataclass
class Append:
    record: MessageRecord
    text: str  # the message line (JSON)
    line: str | None  # the context line (JSON), None for a command
    undo: Undo
    future: asyncio.Future[None]


@dataclass
class Call:
    fn: Callable[[], Awaitable[Any]]
    future: asyncio.Future[Any]


@dataclass
class RunQueue:
    run: RunState
    items: collections.deque[Append | Call] = field(default_factory=collections.deque)
    busy: bool = False  # a call of the run is under way


class PgQueue(PgBase):
    _queues: dict[str, RunQueue]
    _flusher: asyncio.Task[None] | None
    _wake: asyncio.Event
    _calls: set[asyncio.Task[None]]
    _in_flight: set[str]  # runs with a statement under way
    _sending: set[asyncio.Task[None]]  # the statements under way
    _unsure: set[str]  # runs whose last statement's outcome is unknown (checked before their next)
    _append_error: BaseException | None

    def _enqueue(self, run: RunState, item: Append | Call) -> None:
        queue = self._queues.get(run.run_id)
        if queue is None:
            queue = self._queues[run.run_id] = RunQueue(run)
        queue.items.append(item)
        self._kick()

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush(), name="postgres-appends")
        else:
            self._wake.set()

    def after_queued(self, run: RunState, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """Run ``fn`` once every append queued for ``run`` before it is stored (in queue order)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._enqueue(run, Call(fn, future))
        return future

    async def settle_queues(self) -> None:
        """Wait until every queued append and call is done (before a close)."""
        while (self._flusher is not None and not self._flusher.done()) or self._calls:
            await asyncio.gather(*([self._flusher] if self._flusher else []), *self._calls, return_exceptions=True)

    async def _flush(self) -> None:
        try:
            while True:
                self._wake.clear()
                batch = self._take() if len(self._sending) < MAX_IN_FLIGHT else []
                if batch:
                    self._in_flight.update(run.run_id for run, _ in batch)
                    self._sending.add(asyncio.get_running_loop().create_task(self._send_then_release(batch)))
                    continue
                if not self._queues and not self._sending:
                    return
                await self._wake.wait()  # a statement or a call to finish, or appends to come
        except asyncio.CancelledError:  # the loop is closing: nothing queued will be written
            for queue in list(self._queues.values()):
                self._fail(queue.run, [], ConnectionError("the store closed"))
                for item in queue.items:
                    _settle(item.future, ConnectionError("the store closed"))
            self._queues.clear()
            raise

    async def _send_then_release(self, batch: list[tuple[RunState, list[Append]]]) -> None:
        try:
            await self._send(batch)
        finally:  # before the flusher looks again (a done callback would come after it)
            self._in_flight.difference_update(run.run_id for run, _ in batch)
            task = asyncio.current_task()
            if task is not None:
                self._sending.discard(task)
            self._wake.set()

    def _take(self) -> list[tuple[RunState, list[Append]]]:
        """The leading appends of every run not busy (up to ``MAX_BATCH`` in all); a call at the
        head of a queue is started (the appends before it are stored)."""
        batch: list[tuple[RunState, list[Append]]] = []
        total = 0
        for run_id, queue in list(self._queues.items()):
            if queue.busy or run_id in self._in_flight:  # a run is in one statement at a time
                continue
            head = queue.items[0] if queue.items else None
            if isinstance(head, Call):
                queue.items.popleft()
                queue.busy = True
                task = asyncio.get_running_loop().create_task(self._call(queue, head))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
                continue
            taken: list[Append] = []
            while queue.items and total < MAX_BATCH:
                item = queue.items[0]
                if not isinstance(item, Append):
                    break
                taken.append(item)
                queue.items.popleft()
                total += 1
            if taken:
                batch.append((queue.run, taken))
            if not queue.items:
                del self._queues[run_id]
        return batch

    async def _call(self, queue: RunQueue, call: Call) -> None:
        try:
            result = await call.fn()
        except Exception as exc:
            _settle(call.future, exc)
        else:
            if not call.future.done():
                call.future.set_result(result)
        finally:
            queue.busy = False
            if queue.items and self._queues.get(queue.run.run_id) is not queue:
                self._queues[queue.run.run_id] = queue  # it was dropped when empty; items came since
            self._kick()

    async def _send(self, batch: list[tuple[RunState, list[Append]]]) -> None:
        sent = False
        try:
            async with self.pool.acquire() as conn:
                if self._unsure:
                    batch = await self._verify(conn, batch)
                    if not batch:
                        return
                sent = True
                claimed = {row[0] for row in await conn.fetch(_APPEND, *_arguments(batch))}
                lost = [(run, items) for run, items in batch if run.run_id not in claimed]
                rows = await _counters(conn, [run.run_id for run, _ in lost]) if lost else {}
        except Exception as exc:  # the statement may have committed or not: check before the next
            typed = database_error(exc)
            if sent and isinstance(typed, StorageUnavailable):  # the answer is lost, not the commit
                exc = unsure_commit(exc)
            for run, items in batch:
                self._fail(run, items, exc)
                self._unsure.add(run.run_id)
            return
        self._append_error = None
        for run, items in batch:
            if run.run_id not in claimed:
                first = items[0].record["seq"]
                self._fail(run, items, Conflict(
                    f"run {run.run_id} no longer takes seq {first} (completed, or written by another process):"
                    " the message was not stored; send it again"
                ))  # fmt: skip
                self._resync(run, rows.get(run.run_id))
                continue
            run.appends_pending -= len(items)
            for item in items:
                if not item.future.done():
                    item.future.set_result(None)

    async def _verify(
        self, conn: asyncpg.Connection, batch: list[tuple[RunState, list[Append]]]
    ) -> list[tuple[RunState, list[Append]]]:
        """After a statement whose outcome is unknown (the connection broke under it): a run whose
        row is not where this process counted it (the lost statement did commit) fails what it
        queued since, and takes its counters from the row; the rest of the batch is sent."""
        unsure = [run.run_id for run, _ in batch if run.run_id in self._unsure]
        if not unsure:
            return batch
        rows = await _counters(conn, unsure)
        kept = []
        for run, items in batch:
            if run.run_id not in self._unsure:
                kept.append((run, items))
                continue
            self._unsure.discard(run.run_id)
            row = rows.get(run.run_id)
            if row is not None and row["next_seq"] == items[0].record["seq"]:
                kept.append((run, items))
                continue
            self._fail(run, items, StorageUnavailable(
                f"run {run.run_id} holds messages this process did not count (an earlier append's answer was"
                " lost with the connection, after its commit): the message was not stored; send it again",
                stored=False, retry_after_s=1,
            ))  # fmt: skip
            self._resync(run, row)
        return kept

    def _resync(self, run: RunState, row: Mapping[str, Any] | None) -> None:
        """Take the run's counters from its row (what is committed is the truth)."""
        if row is None or run.appends_pending:
            return
        run.next_seq, run.messages_bytes = int(row["next_seq"]), int(row["messages_bytes"])
        run.context_tokens, run.context_bytes = int(row["context_tokens"]), int(row["context_bytes"])
        run.context_lines, run.last_context_seq = int(row["context_lines"]), int(row["last_context_seq"])
        entry = self.entry(run.key)
        if entry is not None and entry.run_id == run.run_id:
            self.sync_counters(entry, run)
            self.touch(run.key)

    def _fail(self, run: RunState, taken: list[Append], exc: BaseException) -> None:
        """``taken`` failed: it and every append queued behind it fail; the run's counters go
        back to before the first of them."""
        queue = self._queues.get(run.run_id)
        failed = list(taken)
        if queue is not None:
            failed += [item for item in queue.items if isinstance(item, Append)]
            queue.items = collections.deque(item for item in queue.items if isinstance(item, Call))
        if not failed:
            return
        self._append_error = exc
        typed = database_error(exc) or exc
        for item in failed:
            undo = item.undo
            run.messages_bytes -= undo.messages_bytes
            if undo.context_bytes:
                run.context_bytes -= undo.context_bytes
                run.context_tokens = max(0, run.context_tokens - undo.tokens)
                run.context_lines -= 1
            _settle(item.future, typed)
        run.appends_pending -= len(failed)
        run.next_seq, run.last_context_seq = failed[0].undo.seq, failed[0].undo.last_context_seq
        entry = self.entry(run.key)
        if entry is not None and entry.run_id == run.run_id:
            self.sync_counters(entry, run)
            self.touch(run.key)


_COUNTERS = (
    "SELECT run_id, next_seq, messages_bytes, context_tokens, context_bytes, context_lines, last_context_seq"
    " FROM runs WHERE run_id = ANY($1::text[])"
)


async def _counters(conn: asyncpg.Connection, run_ids: list[str]) -> dict[str, asyncpg.Record]:
    return {row["run_id"]: row for row in await conn.fetch(_COUNTERS, run_ids)}


def _arguments(batch: list[tuple[RunState, list[Append]]]) -> list[list[Any]]:
    """The statement's 18 arrays: per run, per message line, per context line."""
    runs: list[list[Any]] = [[] for _ in range(9)]
    lines: list[list[Any]] = [[] for _ in range(6)]
    context: list[list[Any]] = [[] for _ in range(3)]
    for run, items in batch:
        in_context = [item for item in items if item.line is not None]
        for column, value in zip(runs, (
            run.run_id, items[0].record["seq"], len(items), len(in_context),
            sum(i.undo.tokens for i in items), sum(i.undo.context_bytes for i in items),
            in_context[-1].record["seq"] if in_context else 0, sum(i.undo.messages_bytes for i in items),
            items[-1].record["timestamp"],
        ), strict=True):  # fmt: skip
            column.append(value)
        for item in items:
            record = item.record
            for column, value in zip(lines, (
                run.run_id, record["seq"], record["timestamp"], record.get("client_message_id"),
                record.get("reply_to"), item.text,
            ), strict=True):  # fmt: skip
                column.append(value)
        for ordinal, item in enumerate(in_context):
            for column, value in zip(context, (run.run_id, ordinal, item.line), strict=True):
                column.append(value)
    return [*runs, *lines, *context]


def _settle(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def unsure_commit(exc: BaseException) -> StorageUnavailable:
    """The connection broke while the statement storing the message ran: the server may have
    committed it or not, and cannot be asked now. The answer says so (no ``stored: false``): a
    retry with the same ``client_message_id`` is stored once either way."""
    typed = StorageUnavailable(
        f"the connection to the database broke while the message was being stored ({exc or type(exc).__name__}):"
        " it may be stored; send it again shortly with the same client_message_id (stored once either way)",
        retry_after_s=RETRY_AFTER_S,
    )
    del typed.extra["stored"]  # not known: the class's ``stored: false`` would invite a resend under a new id
    typed.__cause__ = exc
    return typed
