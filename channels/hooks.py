"""Webhook deliveries in progress (``POST /hooks/{name}``; the route, which renders the answer, is
gateway/api/hooks.py): a delivery id or signature seen before is a :class:`Duplicate`
(``hook_deliveries`` in tasks.db); a new one is stored and is :class:`Accepted` once durable, and
its model turn goes on in the background (``channels/background.py``), its answer POSTed to the
hook's ``deliver_to``. Shutdown cancels the background turns."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Literal

from channels.background import BackgroundTurns, Conversations, Deliver, Outcome, Post, TurnFailure
from channels.delivery import Deliverer
from channels.webhooks import plan
from config.clock import Clock
from config.errors import HookNotFound, HookSecretMissing
from config.settings import HookMapping, Settings
from sessions.records import NewMessage

log = logging.getLogger(__name__)
DELIVER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Accepted:
    """The delivery's message is durable; its turn runs in the background."""

    session_key: str
    run_id: str | None
    message_seq: int | None
    status: Literal["accepted"] = "accepted"


@dataclass(frozen=True)
class Duplicate:
    """The delivery (by its id, or its signature) was stored before: nothing stored now."""

    delivery_id: str | None
    session_key: str | None
    message_seq: int | None
    status: Literal["duplicate"] = "duplicate"


HookOutcome = Accepted | Duplicate


class Webhooks:
    """Deliveries in progress and the background turns they started."""

    def __init__(
        self,
        conversations: Conversations,
        settings: Settings,
        env: dict[str, str],
        deliverer: Deliverer,
        *,
        clock: Clock,
        deliver_timeout_s: float = DELIVER_TIMEOUT_S,
    ) -> None:
        self.conv = conversations
        self.settings = settings
        self.env = env
        self.deliverer = deliverer
        self.clock = clock
        self.deliver_timeout_s = deliver_timeout_s
        self.turns = BackgroundTurns(conversations)
        self._claimed: dict[str, asyncio.Event] = {}

    def mapping(self, name: str) -> HookMapping:
        mapping = self.settings.hooks.get(name)
        if mapping is None:
            known = ", ".join(sorted(self.settings.hooks)) or "none"
            raise HookNotFound(f"no webhook named {name!r} (configured: {known}); add it under hooks.{name}")
        return mapping

    def secret(self, name: str, mapping: HookMapping) -> bytes | None:
        """The hook's HMAC secret; None when the hook takes unsigned deliveries."""
        if mapping.secret_env is None:
            return None
        value = self.env.get(mapping.secret_env)
        if not value:
            raise HookSecretMissing(
                f"webhook {name!r} cannot check signatures: set the environment variable {mapping.secret_env}"
                f" (hooks.{name}.secret_env) to the hook's secret and restart the gateway",
            )
        return value.encode()

    async def receive(
        self, name: str, mapping: HookMapping, payload: Any, delivery_id: str | None, signature: str | None = None
    ) -> HookOutcome:
        """Store one delivery; a delivery id or a signature seen before is a :class:`Duplicate`."""
        hook_plan = plan(name, mapping, payload, agents=self.settings.agents)
        message = NewMessage(
            role="user", content=hook_plan.message, name=hook_plan.task_key.user, sender_id=hook_plan.task_key.user
        )
        post = Post(key=hook_plan.key, message=message, task_key=hook_plan.task_key)
        marks = [m for m in (delivery_id, f"sig:{name}:{signature}" if signature else None) if m]
        claimed: list[str] = []
        try:
            for mark in marks:
                seen = await self._claim(mark)
                if seen is not None:
                    what = "a replay of a signature" if mark.startswith("sig:") else f"delivery {delivery_id}"
                    log.info("hook %s: %s seen before; nothing stored", name, what)
                    return Duplicate(delivery_id, seen.session_key, seen.message_seq)
                claimed.append(mark)
            deliver = self._deliverer(mapping) if self.conv.needs_turn(post) else None
            outcome = await self.turns.post_and_deliver(post, deliver, name=f"hook {name}")
            for mark in claimed:
                await self._record(mark, name, outcome)
        finally:
            for mark in claimed:
                self._claimed.pop(mark).set()
        return Accepted(outcome.session_key, outcome.run_id, outcome.message_seq)

    def _deliverer(self, mapping: HookMapping) -> Deliver | None:
        url = mapping.deliver_to
        if not url:
            return None

        async def deliver(outcome: Outcome, failure: TurnFailure | None) -> None:
            body: dict[str, Any] = dict(outcome.body())
            if failure is not None:
                body["error"] = failure.as_json()
            await self.deliverer.deliver(url, body, timeout=self.deliver_timeout_s)

        return deliver

    # -- duplicates -----------------------------------------------------------------------------

    async def _claim(self, delivery_id: str) -> Duplicate | None:
        """The stored delivery if ``delivery_id`` was seen; otherwise claim it (the caller releases)."""
        while True:
            pending = self._claimed.get(delivery_id)
            if pending is not None:  # the same delivery is being stored right now
                await pending.wait()
                continue
            found = await self.conv.store.hook_delivery(delivery_id)
            if found is not None:
                return Duplicate(delivery_id, found.session_key, found.message_seq)
            if delivery_id not in self._claimed:
                self._claimed[delivery_id] = asyncio.Event()
                return None

    async def _record(self, delivery_id: str, name: str, outcome: Outcome) -> None:
        await self.conv.store.record_hook_delivery(
            delivery_id, name, session_key=outcome.session_key, message_seq=outcome.message_seq
        )

    async def idle(self) -> None:
        """Wait until every background turn (and its delivery) has finished."""
        await self.turns.idle()

    async def close(self) -> None:
        """Cancel the background turns and wait for them (shutdown)."""
        await self.turns.close()
