"""The in-memory backend's records beside the runs: idempotency records, deliveries found in the
active run's transcript, webhook delivery ids, the OpenAI-compatible routes' records, and token
usage per UTC day."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from config.clock import Clock, iso
from sessions import usage as usage_days
from sessions.deliveries import Delivery, PriorDelivery, RunDeliveries, prior_of
from sessions.inmemory.data import Idempotency, MemoryData
from sessions.records import CompatConversation, HookDelivery, IdempotencyRecord, ResponseRef, RunState
from sessions.usage import DailyUsage, UsageQuery


class MemoryRecords:
    """A part of ``MemoryStore``: the records beside its runs, over its ``MemoryData``; a delivery
    is looked for in the active run ``active_run`` names."""

    def __init__(self, data: MemoryData, clock: Clock, active_run: Callable[[str], RunState | None]) -> None:
        self.data = data
        self.clock = clock
        self.active_run = active_run

    # -- deliveries and idempotency records -------------------------------------------------------

    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None:
        return self._delivery(key, client_message_id, since)

    def _delivery(self, key: str, client_message_id: str, since: str) -> Delivery | None:
        """The message ``client_message_id`` delivered on ``key``'s active run at or after ``since``."""
        run = self.active_run(key)
        if run is None:
            return None
        deliveries = RunDeliveries(scanned=True)
        for record in self.data.runs[run.run_id].messages:
            if "client_message_id" in record or "reply_to" in record:
                deliveries.add(record)
        return deliveries.find(run.run_id, client_message_id, since)

    async def recall_delivery(self, key: str, client_message_id: str, *, since: str) -> PriorDelivery | None:
        return self.stored_before(key, client_message_id, since)

    def checks_deliveries(self, key: str) -> bool:
        return True  # everything is in memory: the append checks

    def stored_before(self, key: str, client_message_id: str, since: str) -> PriorDelivery | None:
        """The idempotency record of ``client_message_id`` on ``key``, else its message in the
        active run, stored at or after ``since``."""
        found = self.data.idempotency.get((key, client_message_id))
        if found is not None and found.created_at >= since:
            return PriorDelivery(found.run_id, found.seq, found.response)
        delivered = self._delivery(key, client_message_id, since)
        return None if delivered is None else prior_of(delivered)

    async def find_idempotency(self, key: str, client_message_id: str, *, since: str) -> IdempotencyRecord | None:
        found = self.data.idempotency.get((key, client_message_id))
        if found is None or found.created_at < since:
            return None
        return IdempotencyRecord(found.run_id, found.seq, found.response)

    async def remember_delivery(self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None) -> None:
        """A new delivery replaces a record whole: its window starts now, no reply yet."""
        self.data.idempotency[(key, client_message_id)] = Idempotency(iso(self.clock()), run_id, seq)

    async def remember_reply(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None, response: str
    ) -> None:
        found = self.data.idempotency.get((key, client_message_id))
        if found is None:
            self.data.idempotency[(key, client_message_id)] = Idempotency(iso(self.clock()), run_id, seq, response)
        else:
            found.run_id, found.seq, found.response = run_id, seq, response

    def keep_deliveries(self, run: RunState) -> None:
        """A run that ends keeps an idempotency record of each client_message_id it stored (a record
        of the same delivery, a reply's, stays; an older one of another delivery, expired when the
        message was stored, is replaced), so a redelivery after it ended is still recognised."""
        latest = RunDeliveries(scanned=True)
        for record in self.data.runs[run.run_id].messages:
            latest.add(record)
        for cmid, (seq, stamp) in latest.by_id.items():
            before = self.data.idempotency.get((run.key, cmid))
            if before is None or ((before.run_id, before.seq) != (run.run_id, seq) and before.created_at < stamp):
                self.data.idempotency[(run.key, cmid)] = Idempotency(stamp, run.run_id, seq)

    async def hook_delivery(self, delivery_id: str) -> HookDelivery | None:
        found = self.data.hook_deliveries.get(delivery_id)
        return HookDelivery(found[2], found[3]) if found else None

    async def record_hook_delivery(
        self, delivery_id: str, hook: str, *, session_key: str | None, message_seq: int | None
    ) -> None:
        self.data.hook_deliveries.setdefault(delivery_id, (hook, iso(self.clock()), session_key, message_seq))

    # -- the OpenAI-compatible routes' records ----------------------------------------------------

    async def compat_conversation(self, key: str) -> CompatConversation | None:
        return self.data.compat_conversations.get(key)

    async def save_compat_conversation(self, key: str, record: CompatConversation) -> None:
        self.data.compat_conversations[key] = record

    async def compat_response(self, response_id: str) -> ResponseRef | None:
        return next((ref for ref, _ in self.data.compat_responses if ref.response_id == response_id), None)

    async def latest_compat_response(self, key: str) -> str | None:
        mine = [ref.response_id for ref, _ in self.data.compat_responses if ref.session_key == key]
        return mine[-1] if mine else None

    async def save_compat_response(self, ref: ResponseRef) -> None:
        self.data.compat_responses.append((ref, iso(self.clock())))

    # -- token usage per UTC day ------------------------------------------------------------------

    def count_usage(self, run: RunState, usage: Mapping[str, int]) -> None:
        """One model call's usage added to the day it answered on (``add_usage``)."""
        where = usage_days.DailyKey(usage_days.usage_day(self.clock()), run.agent_id or "main", run.key)
        sums = self.data.usage_daily.setdefault(where, {})
        for k, v in usage.items():
            sums[k] = sums.get(k, 0) + int(v)
        sums["calls"] = sums.get("calls", 0) + 1

    async def usage_rows(self, query: UsageQuery) -> list[DailyUsage]:
        return usage_days.tally(self.data.usage_daily.items(), query)

    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
        return usage_days.tokens_of(self.data.usage_daily.items(), day, agent_id, session_key)
