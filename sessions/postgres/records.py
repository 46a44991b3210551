"""The records beside the runs, in PostgreSQL: idempotency records and webhook delivery ids (the
delivery capability) and the OpenAI-compatible routes' conversations and response ids."""

from __future__ import annotations

from config.clock import iso
from sessions.codec import decode
from sessions.deliveries import PriorDelivery
from sessions.postgres.batching import AppendQueue
from sessions.postgres.faults import unavailable
from sessions.postgres.state import PgState
from sessions.records import CompatConversation, HookDelivery, IdempotencyRecord, ResponseRef

_SAVE_IDEMPOTENCY = (
    "INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq, response)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session_key, client_message_id) DO UPDATE SET"
    " run_id = excluded.run_id, message_seq = excluded.message_seq, "
)


_RECALL = (
    "SELECT 1 AS src, run_id, message_seq AS seq, response, NULL::text AS reply FROM idempotency"
    " WHERE session_key = $1 AND client_message_id = $2 AND created_at >= $3"
    " UNION ALL (SELECT 2, m.run_id, m.seq, NULL, (SELECT r.record::text FROM messages r WHERE r.run_id = m.run_id"
    " AND r.reply_to = m.seq AND r.record->'tool_calls' IS NULL ORDER BY r.seq LIMIT 1)"
    " FROM messages m WHERE m.run_id = $4 AND m.client_message_id = $2 AND m.client_message_id IS NOT NULL"
    " AND m.created_at >= $3 ORDER BY m.seq DESC LIMIT 1)"
)


class PgRecords:
    def __init__(self, state: PgState, queue: AppendQueue) -> None:
        self.state = state
        self.queue = queue

    # -- idempotency ----------------------------------------------------------------------------

    async def find_idempotency(self, key: str, client_message_id: str, *, since: str) -> IdempotencyRecord | None:
        with unavailable("nothing was stored"):
            row = await self.state.pool.fetchrow(
                "SELECT run_id, message_seq, response FROM idempotency"
                " WHERE session_key = $1 AND client_message_id = $2 AND created_at >= $3",
                key,
                client_message_id,
                since,
            )
        return IdempotencyRecord(row[0], row[1], row[2]) if row else None

    async def recall_delivery(self, key: str, client_message_id: str, *, since: str) -> PriorDelivery | None:
        """One statement: the idempotency record, else the message in the active run (and its reply)."""
        run = self.state.active_run(key)
        with unavailable("nothing was stored"):
            rows = await self.state.pool.fetch(_RECALL, key, client_message_id, since, run.run_id if run else None)
        if not rows:
            return None
        found = {row["src"]: row for row in rows}
        record, delivered = found.get(1), found.get(2)
        reply = None
        if delivered is not None and delivered["reply"] is not None:
            answer = decode(delivered["reply"].encode())
            reply = {"content": answer.get("content"), "seq": answer.get("seq")}
        first = record if record is not None else delivered
        assert first is not None
        return PriorDelivery(first["run_id"], first["seq"], record["response"] if record else None, reply)

    def checks_deliveries(self, key: str) -> bool:
        """The append statement checks an id marked ``once`` (``sessions.postgres.batching``): a
        key with an active run is looked up by nothing else."""
        return self.state.active_run(key) is not None

    async def remember_delivery(self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None) -> None:
        """A new delivery replaces an expired record whole (its window starts now, no old reply)."""
        update = "created_at = excluded.created_at, response = NULL"
        await self._save_idempotency(key, client_message_id, run_id, seq, None, update)

    async def remember_reply(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None, response: str
    ) -> None:
        """Rides in the next append statement (``sessions.postgres.batching``): no commit of its own."""
        await self.queue.queue_reply(key, client_message_id, run_id=run_id, seq=seq, response=response)

    async def _save_idempotency(
        self, key: str, cmid: str, run_id: str | None, seq: int | None, response: str | None, update: str
    ) -> None:
        with unavailable("the idempotency record was not stored"):
            stamp = iso(self.state.clock())
            await self.state.pool.execute(_SAVE_IDEMPOTENCY + update, key, cmid, stamp, run_id, seq, response)

    # -- webhook deliveries ---------------------------------------------------------------------

    async def hook_delivery(self, delivery_id: str) -> HookDelivery | None:
        with unavailable("nothing was stored"):
            row = await self.state.pool.fetchrow(
                "SELECT session_key, message_seq FROM hook_deliveries WHERE delivery_id = $1", delivery_id
            )
        return HookDelivery(row[0], row[1]) if row else None

    async def record_hook_delivery(
        self, delivery_id: str, hook: str, *, session_key: str | None, message_seq: int | None
    ) -> None:
        """Remember a delivery id (the first record of an id wins)."""
        with unavailable("the delivery record was not stored"):
            await self.state.pool.execute(
                "INSERT INTO hook_deliveries (delivery_id, hook, created_at, session_key, message_seq)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (delivery_id) DO NOTHING",
                delivery_id, hook, iso(self.state.clock()), session_key, message_seq,
            )  # fmt: skip

    # -- the OpenAI-compatible routes' records --------------------------------------------------

    async def compat_conversation(self, key: str) -> CompatConversation | None:
        with unavailable("nothing was stored"):
            row = await self.state.pool.fetchrow(
                "SELECT epoch, base_count, request_count, request_digest, answered_count, answered_digest, answer"
                " FROM openai_conversations WHERE session_key = $1",
                key,
            )
        return CompatConversation(*row) if row else None

    async def save_compat_conversation(self, key: str, record: CompatConversation) -> None:
        with unavailable("the conversation record was not stored"):
            await self.state.pool.execute(
                "INSERT INTO openai_conversations (session_key, epoch, base_count, request_count, request_digest,"
                " answered_count, answered_digest, answer, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                " ON CONFLICT (session_key) DO UPDATE SET epoch = excluded.epoch, base_count = excluded.base_count,"
                " request_count = excluded.request_count, request_digest = excluded.request_digest,"
                " answered_count = excluded.answered_count, answered_digest = excluded.answered_digest,"
                " answer = excluded.answer, updated_at = excluded.updated_at",
                key, record.epoch, record.base_count, record.request_count, record.request_digest,
                record.answered_count, record.answered_digest, record.answer, iso(self.state.clock()),
            )  # fmt: skip

    async def compat_response(self, response_id: str) -> ResponseRef | None:
        with unavailable("nothing was stored"):
            row = await self.state.pool.fetchrow(
                "SELECT response_id, session_key, run_id, seq FROM openai_responses WHERE response_id = $1",
                response_id,
            )
        return ResponseRef(*row) if row else None

    async def latest_compat_response(self, key: str) -> str | None:
        with unavailable("nothing was stored"):
            value = await self.state.pool.fetchval(
                "SELECT response_id FROM openai_responses WHERE session_key = $1 ORDER BY ord DESC LIMIT 1", key
            )
        return str(value) if value is not None else None

    async def save_compat_response(self, ref: ResponseRef) -> None:
        with unavailable("the response record was not stored"):
            await self.state.pool.execute(
                "INSERT INTO openai_responses (response_id, session_key, run_id, seq, created_at)"
                " VALUES ($1, $2, $3, $4, $5)",
                ref.response_id, ref.session_key, ref.run_id, ref.seq, iso(self.state.clock()),
            )  # fmt: skip
