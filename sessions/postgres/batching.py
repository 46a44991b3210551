"""The PostgreSQL store's append queue: the database's group commit.

Each run has a queue of appends (and of calls that must come after them: a context rewrite, a read
of the context). One flusher task sends the queued appends of EVERY run in one statement, at most
``in_flight_per_process`` statements under way (a run in one of them at a time, so its order
holds; ``MAX_IN_FLIGHT`` in one process, shared out over the workers of a fleet):
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

from config.clock import iso
from config.errors import Conflict, StorageUnavailable
from sessions.bookkeeping import count_append
from sessions.codec import encode, encode_plain
from sessions.context_order import context_line, in_context
from sessions.deliveries import DELIVERY_WINDOW, AlreadyDelivered, PriorDelivery
from sessions.postgres.faults import RETRY_AFTER_S, database_error
from sessions.postgres.repeats import RECORD, SEEN, ReplyRecord, claims, reply_arguments, take_replies
from sessions.postgres.state import PgState
from sessions.records import MessageRecord, RunState

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_BATCH = 1024  # messages in one statement
MAX_IN_FLIGHT = 2  # statements under way at once (on disjoint runs) in the whole fleet: the database
# works on one while the loop encodes the next


def in_flight_per_process(workers: int) -> int:
    """The statements under way at once in each of ``workers`` gateway processes: the fleet's
    ``MAX_IN_FLIGHT`` shared out, at least one each. Each process's messages gather while its
    statements are under way, so N processes with two each sent N times the statements of one,
    each of 1/N of its messages: more commits, and more CPU per message on both sides."""
    return max(1, MAX_IN_FLIGHT // max(1, workers))

_APPEND = f"""
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
        $7::bigint[], $8::bigint[], $9::text[]) AS b(run_id, first, n, nctx, tokens, cbytes, lastctx, mbytes, at)
), u AS (
    SELECT * FROM unnest($10::text[], $11::bigint[], $12::text[], $13::text[], $14::bigint[], $15::json[],
        $19::text[]) AS u(run_id, seq, at, cmid, reply_to, rec, once_key)
), {SEEN}), r AS (
    UPDATE runs SET next_seq = b.first + b.n, next_pos = runs.next_pos + b.nctx,
        context_tokens = runs.context_tokens + b.tokens, context_bytes = runs.context_bytes + b.cbytes,
        context_lines = runs.context_lines + b.nctx,
        last_context_seq = CASE WHEN b.lastctx > 0 THEN b.lastctx ELSE runs.last_context_seq END,
        messages_bytes = runs.messages_bytes + b.mbytes, updated_at = b.at, opening = false
    FROM b WHERE runs.run_id = b.run_id AND runs.next_seq = b.first AND runs.status IN ('running', 'paused')
        AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.run_id = b.run_id)
    RETURNING runs.run_id, runs.next_pos - b.nctx AS pos0
), m AS (
    INSERT INTO messages (run_id, seq, created_at, client_message_id, reply_to, record)
    SELECT u.run_id, u.seq, u.at, u.cmid, u.reply_to, u.rec FROM u
    WHERE u.run_id IN (SELECT run_id FROM r)
), c AS (
    INSERT INTO context_lines (run_id, pos, line)
    SELECT u.run_id, r.pos0 + u.ord, u.line
    FROM unnest($16::text[], $17::bigint[], $18::json[]) AS u(run_id, ord, line) JOIN r USING (run_id)
), {RECORD})
SELECT run_id, NULL::bigint AS seq, 0 AS src, NULL::text AS prior_run, NULL::bigint AS prior_seq,
    NULL::text AS prior_response, NULL::text AS prior_reply FROM r
UNION ALL SELECT * FROM seen
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
    once: bool = False  # its client_message_id is checked by the statement (``NewMessage.once``)


def make_append(record: MessageRecord, last_context_seq: int, future: asyncio.Future[None], once: bool) -> Append:
    """The queued form of a message record: its line and context line encoded, what it counts."""
    dump = encode if record.get("tool_calls") else encode_plain  # no floats without tool calls
    data = dump(record)
    line = dump(context_line(record)) if in_context(record) else b""
    undo = Undo(record["seq"], len(data), len(line), record["tokens"] if line else 0, last_context_seq)
    return Append(record, data[:-1].decode(), line[:-1].decode() if line else None, undo, future, once)


@dataclass
class Call:
    fn: Callable[[], Awaitable[Any]]
    future: asyncio.Future[Any]


@dataclass
class RunQueue:
    run: RunState
    items: collections.deque[Append | Call] = field(default_factory=collections.deque)
    busy: bool = False  # a call of the run is under way


class AppendQueue:
    """The runs' queues of appends and calls, and the statements that store them (see the module's
    doc); over the store's ``PgState``."""

    def __init__(self, state: PgState) -> None:
        self.state = state
        self.max_in_flight = in_flight_per_process(state.settings.gateway.appenders)
        self.queues: dict[str, RunQueue] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._calls: set[asyncio.Task[None]] = set()
        self.in_flight: set[str] = set()  # runs with a statement under way
        self._sending: set[asyncio.Task[None]] = set()  # the statements under way
        self.unsure: set[str] = set()  # runs whose last statement's outcome is unknown (checked before their next)
        self.error: BaseException | None = None  # the last failure of an append (None once a statement succeeds)
        self._replies: list[ReplyRecord] = []  # reply records waiting for the next statement

    def queue_reply(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None, response: str
    ) -> asyncio.Future[None]:
        """Record a reply body in the next append statement (the group commit): it resolves once
        committed, with the typed error when that statement fails."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stamp = iso(self.state.clock())
        self._replies.append(ReplyRecord(key, client_message_id, stamp, run_id, seq, response, future))
        self._kick()
        return future

    def _take_replies(self) -> list[ReplyRecord]:
        """The reply records for the next statement: one per (key, id) (a later one waits)."""
        taken, self._replies = take_replies(self._replies)
        return taken

    def enqueue(self, run: RunState, item: Append | Call) -> None:
        queue = self.queues.get(run.run_id)
        if queue is None:
            queue = self.queues[run.run_id] = RunQueue(run)
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
        self.enqueue(run, Call(fn, future))
        return future

    def busy(self, run: RunState) -> bool:
        """Whether ``run`` has appends not yet stored (queued, or in a statement under way)."""
        return run.appends_pending > 0 or run.run_id in self.queues or run.run_id in self.in_flight

    async def settled(self, run: RunState) -> None:
        """Wait for the appends queued for ``run`` (before a lifecycle change: they land first)."""
        if run.appends_pending or run.run_id in self.queues:
            await self.after_queued(run, nothing)

    async def settle(self) -> None:
        """Wait until every queued append and call is done (before a close)."""
        while (self._flusher is not None and not self._flusher.done()) or self._calls:
            await asyncio.gather(*([self._flusher] if self._flusher else []), *self._calls, return_exceptions=True)

    async def _flush(self) -> None:
        try:
            while True:
                self._wake.clear()
                room = len(self._sending) < self.max_in_flight
                batch = self._take() if room else []
                replies = self._take_replies() if room and self._replies else []
                if batch or replies:
                    self.in_flight.update(run.run_id for run, _ in batch)
                    self._sending.add(asyncio.get_running_loop().create_task(self._send_then_release(batch, replies)))
                    continue
                if not self.queues and not self._sending and not self._replies:
                    return
                await self._wake.wait()  # a statement or a call to finish, or appends to come
        except asyncio.CancelledError:  # the loop is closing: nothing queued will be written
            for queue in list(self.queues.values()):
                self._fail(queue.run, [], ConnectionError("the store closed"))
                for item in queue.items:
                    _settle(item.future, ConnectionError("the store closed"))
            self.queues.clear()
            for reply in self._replies:
                _settle(reply.future, ConnectionError("the store closed"))
            self._replies = []
            raise

    async def _send_then_release(
        self, batch: list[tuple[RunState, list[Append]]], replies: list[ReplyRecord] | None = None
    ) -> None:
        try:
            await self._send(batch, replies or [])
        finally:  # before the flusher looks again (a done callback would come after it)
            self.in_flight.difference_update(run.run_id for run, _ in batch)
            task = asyncio.current_task()
            if task is not None:
                self._sending.discard(task)
            self._wake.set()

    def _take(self) -> list[tuple[RunState, list[Append]]]:
        """The leading appends of every run not busy (up to ``MAX_BATCH`` in all); a call at the
        head of a queue is started (the appends before it are stored)."""
        batch: list[tuple[RunState, list[Append]]] = []
        total = 0
        for run_id, queue in list(self.queues.items()):
            if queue.busy or run_id in self.in_flight:  # a run is in one statement at a time
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
            once_ids: set[str] | None = None  # ids the statement checks: a repeat waits for the next
            while queue.items and total < MAX_BATCH:
                item = queue.items[0]
                if not isinstance(item, Append):
                    break
                if item.once:
                    cmid = item.record.get("client_message_id")
                    once_ids = once_ids if once_ids is not None else set()
                    if cmid in once_ids:
                        break
                    once_ids.add(str(cmid))
                taken.append(item)
                queue.items.popleft()
                total += 1
            if taken:
                batch.append((queue.run, taken))
            if not queue.items:
                del self.queues[run_id]
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
            if queue.items and self.queues.get(queue.run.run_id) is not queue:
                self.queues[queue.run.run_id] = queue  # it was dropped when empty; items came since
            self._kick()

    async def _send(self, batch: list[tuple[RunState, list[Append]]], replies: list[ReplyRecord]) -> None:
        sent = False
        try:
            async with self.state.pool.acquire() as conn:
                if self.unsure:
                    batch = await self._verify(conn, batch)
                    if not batch and not replies:
                        return
                sent = True
                since = iso(self.state.clock() - DELIVERY_WINDOW)
                arguments = [*_arguments(batch), since, *reply_arguments(replies)]
                claimed, repeats = claims(await conn.fetch(_APPEND, *arguments))
                lost = [(run, items) for run, items in batch if run.run_id not in claimed and run.run_id not in repeats]
                rows = await _counters(conn, [run.run_id for run, _ in lost]) if lost else {}
        except Exception as exc:  # the statement may have committed or not: check before the next
            typed = database_error(exc)
            if sent and isinstance(typed, StorageUnavailable):  # the answer is lost, not the commit
                exc = unsure_commit(exc)
            for run, items in batch:
                self._fail(run, items, exc)
                self.unsure.add(run.run_id)
            for reply in replies:
                _settle(reply.future, database_error(exc) or exc)
            return
        for reply in replies:
            if not reply.future.done():
                reply.future.set_result(None)
        self.error = None
        for run, items in batch:
            if run.run_id in repeats:
                self._drop_repeats(run, items, repeats[run.run_id])
                continue
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
        unsure = [run.run_id for run, _ in batch if run.run_id in self.unsure]
        if not unsure:
            return batch
        rows = await _counters(conn, unsure)
        kept = []
        for run, items in batch:
            if run.run_id not in self.unsure:
                kept.append((run, items))
                continue
            self.unsure.discard(run.run_id)
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
        self.state.mirror(run, own_only=True)

    def _drop_repeats(self, run: RunState, taken: list[Append], priors: Mapping[int, PriorDelivery]) -> None:
        """The statement stored nothing of ``run``: appends in ``taken`` repeat a delivery
        (``priors``, by seq). Those, and a reply to one of them, are refused (``AlreadyDelivered``);
        the others, and every append queued behind them, are queued again in their order with the
        seqs that follow (a ``reply_to`` follows its message), as if the repeats had never come."""
        queue = self.queues.get(run.run_id)
        behind = list(queue.items) if queue is not None else []
        self._take_back(run, [*taken, *(item for item in behind if isinstance(item, Append))])
        dropped: dict[int, PriorDelivery] = {}
        moved: dict[int, int] = {}
        kept: collections.deque[Append | Call] = collections.deque()
        for item in [*taken, *behind]:
            if isinstance(item, Call):
                kept.append(item)
                continue
            record = item.record
            seq, answers = record["seq"], record.get("reply_to")
            prior = priors.get(seq) or (dropped.get(answers) if answers is not None else None)
            if prior is not None:
                dropped[seq] = prior
                _settle(item.future, AlreadyDelivered(prior))
                continue
            record["seq"] = moved[seq] = run.next_seq
            run.next_seq += 1
            if answers is not None and answers in moved:
                record["reply_to"] = moved[answers]
            again = make_append(record, run.last_context_seq, item.future, item.once)
            count_append(run, record, again.undo.messages_bytes, again.undo.context_bytes or None)
            kept.append(again)
        if queue is None:
            queue = RunQueue(run)
        queue.items = kept
        if kept:
            self.queues[run.run_id] = queue
        self.state.mirror(run, own_only=True)

    def _take_back(self, run: RunState, appends: list[Append]) -> None:
        """The run's counters as they were before ``appends`` (queued in a row) were counted."""
        if not appends:
            return
        for item in appends:
            undo = item.undo
            run.messages_bytes -= undo.messages_bytes
            if undo.context_bytes:
                run.context_bytes -= undo.context_bytes
                run.context_tokens = max(0, run.context_tokens - undo.tokens)
                run.context_lines -= 1
        run.appends_pending -= len(appends)
        run.next_seq, run.last_context_seq = appends[0].undo.seq, appends[0].undo.last_context_seq

    def _fail(self, run: RunState, taken: list[Append], exc: BaseException) -> None:
        """``taken`` failed: it and every append queued behind it fail; the run's counters go
        back to before the first of them."""
        queue = self.queues.get(run.run_id)
        failed = list(taken)
        if queue is not None:
            failed += [item for item in queue.items if isinstance(item, Append)]
            queue.items = collections.deque(item for item in queue.items if isinstance(item, Call))
        if not failed:
            return
        self.error = exc
        typed = database_error(exc) or exc
        self._take_back(run, failed)
        for item in failed:
            _settle(item.future, typed)
        self.state.mirror(run, own_only=True)


_COUNTERS = (
    "SELECT run_id, next_seq, messages_bytes, context_tokens, context_bytes, context_lines, last_context_seq"
    " FROM runs WHERE run_id = ANY($1::text[])"
)


async def _counters(conn: asyncpg.Connection, run_ids: list[str]) -> dict[str, asyncpg.Record]:
    return {row["run_id"]: row for row in await conn.fetch(_COUNTERS, run_ids)}


def _arguments(batch: list[tuple[RunState, list[Append]]]) -> list[list[Any]]:
    """The statement's 19 arrays: per run, per message line, per context line, and the key of
    each line whose client_message_id is checked (None for the others)."""
    runs: list[list[Any]] = [[] for _ in range(9)]
    lines: list[list[Any]] = [[] for _ in range(6)]
    context: list[list[Any]] = [[] for _ in range(3)]
    once_keys: list[str | None] = []
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
            once_keys.append(run.key if item.once else None)
        for ordinal, item in enumerate(in_context):
            for column, value in zip(context, (run.run_id, ordinal, item.line), strict=True):
                column.append(value)
    return [*runs, *lines, *context, once_keys]


async def nothing() -> None:
    return None


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
