"""Idempotent redelivery of posted messages and commands (SPEC section 8)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from config.clock import iso
from config.errors import StorageUnavailable
from conversations.posts import Outcome, Post, ReplyBody, outcome_from
from conversations.turn_core import ConversationCore
from sessions.deliveries import DELIVERY_WINDOW, PriorDelivery, prior_of

log = logging.getLogger(__name__)

IDEMPOTENCY_WINDOW = DELIVERY_WINDOW


class Idempotency:
    """A delivery with a client_message_id is stored and answered once: a repeat within
    ``IDEMPOTENCY_WINDOW`` gets the first one's answer (its ``idempotency`` record, or the
    transcript, which is the durable truth, when there is none). The message is its own delivery
    record; a store whose append checks the id itself (``checks_deliveries``) is not asked first:
    the repeat comes back from the append as ``AlreadyDelivered``."""

    def __init__(self, core: ConversationCore) -> None:
        self.core = core
        self._inflight: dict[tuple[str, str], asyncio.Future[ReplyBody]] = {}

    async def once(self, post: Post, work: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """Run ``work`` for a delivery with a client_message_id; a second delivery of the same id
        arriving while the first is handled waits for the first one's answer."""
        assert post.message.client_message_id is not None
        marker = (post.key.raw, post.message.client_message_id)
        if marker in self._inflight:  # the same delivery is being handled right now
            return outcome_from(await asyncio.shield(self._inflight[marker]))
        future: asyncio.Future[ReplyBody] = asyncio.get_running_loop().create_future()
        self._inflight[marker] = future
        try:
            outcome = await work()
            future.set_result(outcome.body())
            return outcome
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._inflight[marker]

    async def find_previous(self, key: str, cmid: str) -> dict[str, Any] | None:
        """An earlier delivery of ``cmid`` on ``key`` within the window, in one lookup
        (``recall_delivery``): its idempotency record, else the message found in the active run's
        transcript (the durable truth) with its reply if one was stored. When the records cannot
        be read, the transcript alone."""
        since = iso(self.core.clock() - IDEMPOTENCY_WINDOW)
        try:
            prior = await self.core.store.recall_delivery(key, cmid, since=since)
        except StorageUnavailable as exc:
            log.warning("idempotency lookup on %r failed (%s): checking the transcript instead", key, exc)
            found = await self.core.store.find_delivery(key, cmid, since=since)
            prior = None if found is None else prior_of(found)
        return None if prior is None else previous_of(prior)

    async def find_in_run(self, key: str, cmid: str) -> dict[str, Any] | None:
        """A delivery of ``cmid`` in the key's active run, from its transcript alone and at any
        age (ids scoped to the run: ``Post.id_scope``), with its reply if one was stored."""
        found = await self.core.store.find_delivery(key, cmid, since="")
        if found is None:
            return None
        return {"run_id": found.run_id, "message_seq": found.seq, "response": None, "reply": found.reply}

    async def remember_delivery(self, key: str, cmid: str, *, run_id: str, seq: int) -> None:
        """Record that ``seq`` was stored as delivery ``cmid`` without an answer, as if it had been
        posted with that id: a repeat within the window then runs the turn again, storing nothing."""
        await self.remember(key, cmid, None, run_id=run_id, seq=seq)

    async def remember(
        self, key: str, cmid: str, outcome: Outcome | None, *, run_id: str | None = None, seq: int | None = None
    ) -> None:
        if outcome is not None and not worth_recording(outcome):
            return  # the stored message alone answers a repeat the same way (see worth_recording)
        try:
            if outcome is None:  # a new delivery (none within the window): its window starts now
                await self.core.store.remember_delivery(key, cmid, run_id=run_id, seq=seq)
            else:
                body = json.dumps(outcome.body(), ensure_ascii=False)
                await self.core.store.remember_reply(
                    key, cmid, run_id=outcome.run_id, seq=outcome.message_seq, response=body
                )
        except StorageUnavailable as exc:
            # The message is durable and carries its client_message_id: a redelivery is still
            # recognised from the transcript, so the caller gets its answer, not an error.
            log.warning("idempotency record of %r on %r not saved (%s)", cmid, key, exc)


def previous_of(prior: PriorDelivery) -> dict[str, Any]:
    return {"run_id": prior.run_id, "message_seq": prior.seq, "response": prior.response, "reply": prior.reply}


def worth_recording(outcome: Outcome) -> bool:
    """Whether a reply body says more than its stored message does. A post answered with no
    reply, no event and no usage (a store-only post) is answered to a repeat from the message
    itself, identically (``Outcome(key, run_id, seq)``): recording it would cost a write per
    message and say nothing new."""
    return outcome.reply is not None or bool(outcome.events) or any(outcome.usage.values())
