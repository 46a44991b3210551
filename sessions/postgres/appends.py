"""The PostgreSQL store's appends (core capability): messages through a per-run queue, tool and plan
records, usage, calibration, the context rewrite, and the writability probe.

A message's seq is given on the loop (``queue_append`` returns the record at once, as the protocol
says) and *claimed* in the database by the statement that stores it (``sessions.postgres.batching``:
the queue, the group commit, what a failure gives back). A context rewrite or a read that must see
the queued appends is a call in the same per-run queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from config.clock import iso
from sessions.appends import check_writable, event_fields, message_record, tool_record
from sessions.bookkeeping import add_usage_counts, count_append, counted_rewrite, note_message, plan_record
from sessions.codec import decode, encode
from sessions.context_lines import ContextLine, read_back
from sessions.deliveries import Delivery
from sessions.postgres.batching import AppendQueue, make_append
from sessions.postgres.faults import database_error, unavailable
from sessions.postgres.rewrite import apply_change
from sessions.postgres.state import PgState
from sessions.postgres.usage import add_daily
from sessions.records import (
    USAGE_KEYS,
    ContextRewrite,
    MessageRecord,
    NewMessage,
    PlanRecord,
    RunState,
    StoredRecord,
    ToolUse,
    copy_counters,
)
from sessions.rewrites import ContextChange
from sessions.usage import DailyKey, usage_day

log = logging.getLogger(__name__)


class PgAppends:
    """Messages (through ``queue``), tool and plan records, usage, calibration, the context rewrite
    and read, the health probe."""

    def __init__(self, state: PgState, queue: AppendQueue) -> None:
        self.state = state
        self.queue = queue
        self._probed: tuple[float, str | None] = (float("-inf"), None)

    # -- messages -------------------------------------------------------------------------------

    def queue_append(self, run: RunState, message: NewMessage) -> tuple[MessageRecord, asyncio.Future[None]]:
        check_writable(run, message)
        stamp = iso(self.state.clock())
        record = message_record(run.next_seq, message, stamp)
        run.next_seq += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        once = message.once and message.client_message_id is not None  # checked by the statement
        item = make_append(record, run.last_context_seq, future, once)
        self.queue.enqueue(run, item)
        count_append(run, record, item.undo.messages_bytes, item.undo.context_bytes or None)
        entry = self.state.entry(run.key)
        if entry is not None:
            note_message(entry, message, stamp)
            copy_counters(run, entry)
            self.state.touch(run.key)
        return record, future

    async def finish_append(self, run: RunState, record: MessageRecord, durable: asyncio.Future[None]) -> MessageRecord:
        """Once ``durable``: the durable listeners and the message event."""
        await durable
        run.opening = False
        for durable_listener in self.state.hooks.durable_listeners:
            durable_listener(run, record)
        self.state.emit_run("message", run, at=record["timestamp"], **event_fields(record))
        return record

    # -- deliveries found in the transcript -----------------------------------------------------

    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None:
        run = self.state.active_run(key)
        if run is None:
            return None
        with unavailable("nothing was stored"):
            row = await self.state.pool.fetchrow(
                "SELECT m.seq, m.created_at, (SELECT r.record::text FROM messages r WHERE r.run_id = m.run_id"
                " AND r.reply_to = m.seq AND r.record->'tool_calls' IS NULL ORDER BY r.seq LIMIT 1) AS reply"
                " FROM messages m WHERE m.run_id = $1 AND m.client_message_id = $2 ORDER BY m.seq DESC LIMIT 1",
                run.run_id,
                client_message_id,
            )
        if row is None or row["created_at"] < since:
            return None
        reply = None
        if row["reply"] is not None:
            answer = decode(row["reply"].encode())
            reply = {"content": answer.get("content"), "seq": answer.get("seq")}
        return Delivery(run.run_id, int(row["seq"]), row["created_at"], reply)

    # -- tool and plan records, usage -----------------------------------------------------------

    async def record_tool(self, run: RunState, use: ToolUse) -> StoredRecord:
        record = tool_record(run, use, iso(self.state.clock()))
        sql = (
            "WITH r AS (UPDATE runs SET next_tool_seq = greatest(next_tool_seq, $2::bigint + 1) WHERE run_id = $1"
            " RETURNING run_id) INSERT INTO tool_calls (run_id, seq, record) SELECT run_id, $2, $3::json FROM r"
        )
        with unavailable("the tool call's record was not stored"):
            await self.state.pool.execute(sql, run.run_id, record["seq"], encode(record)[:-1].decode())
        return record

    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> PlanRecord:
        record = plan_record(run, plan_type, plan_content, iso(self.state.clock()))
        sql = (
            "WITH r AS (UPDATE runs SET next_plan_id = greatest(next_plan_id, $2::bigint + 1) WHERE run_id = $1"
            " RETURNING run_id) INSERT INTO plans (run_id, id, record) SELECT run_id, $2, $3::json FROM r"
        )
        with unavailable("the plan was not stored"):
            await self.state.pool.execute(sql, run.run_id, record["id"], encode(dict(record))[:-1].decode())
        return record

    async def add_usage(self, run: RunState, usage: Mapping[str, int]) -> None:
        entry = self.state.entry(run.key)
        clean = add_usage_counts(run, entry, usage)
        if entry is not None:
            self.state.touch(run.key)
        sets = ", ".join(f"{k} = {k} + ${i}" for i, k in enumerate(USAGE_KEYS, start=2))
        daily = DailyKey(usage_day(self.state.clock()), run.agent_id or "main", run.key)
        try:
            with unavailable("the usage was not stored"):
                async with self.state.pool.acquire() as conn, conn.transaction():
                    await conn.execute(f"UPDATE runs SET {sets} WHERE run_id = $1", run.run_id, *clean.values())
                    await add_daily(conn, daily, clean)
        except Exception as exc:  # the turn goes on: its message and reply are stored already
            log.warning("usage of run %s not added to the database (%s); the entry keeps it", run.run_id, exc)

    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None:
        run.context_tokens = max(0, prompt_tokens - overhead_tokens) + max(0, appended_since)
        self.state.mirror(run)

    # -- the context rewrite (compaction, uncompact) --------------------------------------------

    async def rewrite_context(self, run: RunState, change: ContextChange) -> ContextRewrite | None:
        """After every append queued before it, in one transaction (``sessions.postgres.rewrite``)."""
        future = self.queue.after_queued(run, lambda: apply_change(self.state.pool, run, change))
        return await counted_rewrite(run, future, lambda: self.state.mirror(run))

    # -- reads of the context -------------------------------------------------------------------

    async def read_context(self, run: RunState) -> list[ContextLine]:
        """The context as the model will see it; with appends of the run queued, read after them."""

        async def _read() -> list[ContextLine]:
            with unavailable("the context was not stored"):
                rows = await self.state.pool.fetch(
                    "SELECT line::text FROM context_lines WHERE run_id = $1 ORDER BY pos", run.run_id
                )
            return read_back([decode(row[0].encode()) for row in rows])

        if run.appends_pending == 0:
            return await _read()
        return await self.queue.after_queued(run, _read)

    # -- health ---------------------------------------------------------------------------------

    async def writable(self) -> str | None:
        """None when the database takes a write now; else why not (for ``/readyz``)."""
        try:
            async with self.state.pool.acquire(timeout=5) as conn:
                await conn.fetchval("SELECT 1", timeout=5)
            problem = None
        except Exception as exc:
            typed = database_error(exc)
            if typed is None:
                raise
            problem = typed.message
        self._probed = (time.monotonic(), problem)
        return problem

    def recently_writable(self, max_age_s: float) -> bool:
        at, problem = self._probed
        return problem is None and self.queue.error is None and time.monotonic() - at < max_age_s
