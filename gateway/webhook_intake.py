"""Webhook deliveries in progress (``POST /hooks/{name}``, routes in gateway/api/hooks.py): a
delivery id or signature seen before answers ``duplicate`` (``hook_deliveries`` in tasks.db); a
new one is stored, answered 202 once durable, and its model turn goes on in a background task
whose answer is POSTed to the hook's ``deliver_to``. Shutdown cancels the background turns."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from config.clock import Clock
from config.errors import HookNotFound, HookSecretMissing, NeotaskError, ShuttingDown
from config.settings import HookMapping, Settings
from conversations.turns import Conversations, Outcome, Post
from gateway.delivery import Deliverer
from gateway.http import json_response
from gateway.webhooks import plan

log = logging.getLogger(__name__)
DELIVER_TIMEOUT_S = 10.0


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
        self._claimed: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()

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
    ) -> web.Response:
        """Store one delivery; a delivery id or a signature seen before answers ``duplicate``."""
        hook_plan = plan(name, mapping, payload, agents=self.settings.agents)
        post = Post(
            key=hook_plan.key,
            role="user",
            content=hook_plan.message,
            name=hook_plan.task_key.user,
            sender_id=hook_plan.task_key.user,
            task_key=hook_plan.task_key,
        )
        marks = [m for m in (delivery_id, f"sig:{name}:{signature}" if signature else None) if m]
        claimed: list[str] = []
        try:
            for mark in marks:
                seen = await self._claim(mark)
                if seen is not None:
                    what = "a replay of a signature" if mark.startswith("sig:") else f"delivery {delivery_id}"
                    log.info("hook %s: %s seen before; nothing stored", name, what)
                    return json_response({"status": "duplicate", "delivery_id": delivery_id, **seen})
                claimed.append(mark)
            outcome = await self._store(name, mapping, post)
            for mark in claimed:
                await self._record(mark, name, outcome)
        finally:
            for mark in claimed:
                self._claimed.pop(mark).set()
        answer = {"status": "accepted", "session_key": outcome.session_key, "run_id": outcome.run_id,
                  "message_seq": outcome.message_seq}  # fmt: skip
        return json_response(answer, status=202)

    # -- duplicates -----------------------------------------------------------------------------

    async def _claim(self, delivery_id: str) -> dict[str, Any] | None:
        """The stored delivery if ``delivery_id`` was seen; otherwise claim it (the caller releases)."""
        while True:
            pending = self._claimed.get(delivery_id)
            if pending is not None:  # the same delivery is being stored right now
                await pending.wait()
                continue
            seen = await self._seen(delivery_id)
            if seen is not None:
                return seen
            if delivery_id not in self._claimed:
                self._claimed[delivery_id] = asyncio.Event()
                return None

    async def _seen(self, delivery_id: str) -> dict[str, Any] | None:
        found = await self.conv.store.hook_delivery(delivery_id)
        return None if found is None else {"session_key": found.session_key, "message_seq": found.message_seq}

    async def _record(self, delivery_id: str, name: str, outcome: Outcome) -> None:
        await self.conv.store.record_hook_delivery(
            delivery_id, name, session_key=outcome.session_key, message_seq=outcome.message_seq
        )

    # -- storing now, the turn in the background ------------------------------------------------

    async def _store(self, name: str, mapping: HookMapping, post: Post) -> Outcome:
        """Start the post in a background task and return once its message is durable; an error
        raised before that (paused session, queue full) is this call's error."""
        stored: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._post(name, mapping, post, stored), name=f"hook {name} {post.key.raw}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(stored)

    async def _post(self, name: str, mapping: HookMapping, post: Post, stored: asyncio.Future[Outcome]) -> None:
        def on_stored(outcome: Outcome) -> None:
            if not stored.done():
                stored.set_result(outcome)

        turn = self.conv.needs_turn(post)
        try:
            outcome = await self.conv.post(post, on_stored=on_stored)
        except asyncio.CancelledError:
            if not stored.done():
                stored.cancel()
            raise
        except Exception as exc:
            if not stored.done():  # nothing stored: the request answers the error
                stored.set_exception(exc)
                return
            stored_outcome = stored.result()
            if isinstance(exc, ShuttingDown):  # the turn was stopped, not failed
                log.info("hook %s: shutdown stopped the turn on %s (seq %s stored)", name, post.key.raw,
                         stored_outcome.message_seq)  # fmt: skip
                return
            if isinstance(exc, NeotaskError):
                log.warning("hook %s: the turn on %s failed after seq %s was stored: %s", name,
                            post.key.raw, stored_outcome.message_seq, exc.message)  # fmt: skip
                error = {"code": exc.code, "message": exc.message}
            else:
                log.exception("hook %s: the turn on %s failed", name, post.key.raw)
                error = {"code": NeotaskError.code, "message": "the gateway failed on this turn; see its log"}
            if turn and mapping.deliver_to:
                body = {**stored_outcome.body(), "error": error}
                await self.deliverer.deliver(mapping.deliver_to, body, timeout=self.deliver_timeout_s)
            return
        if turn and mapping.deliver_to:
            await self.deliverer.deliver(mapping.deliver_to, outcome.body(), timeout=self.deliver_timeout_s)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("webhook task %s failed", task.get_name(), exc_info=exc)

    async def idle(self) -> None:
        """Wait until every background turn (and its delivery) has finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        """Cancel the background turns and wait for them (shutdown)."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            log.info("cancelling %d webhook turn(s) for shutdown", len(tasks))
            await asyncio.gather(*tasks, return_exceptions=True)
