"""``POST /hooks/{name}``: signed webhook deliveries (SPEC section 8).

The route checks the hook, its secret and the signature of the raw body (GitHub's
``X-Hub-Signature-256``, or Standard Webhooks' timestamped ``webhook-signature``), parses the JSON,
skips a delivery whose id or signature it has seen (``hook_deliveries`` in tasks.db: a captured body
replayed with its delivery id dropped or changed carries the same signature), applies the mapping
(``gateway.webhooks.plan``) and stores the message. It answers 202 as soon as the message is
durable; the model turn goes on in a background task that shutdown cancels, and its answer is
POSTed to the hook's ``deliver_to``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from config.clock import Clock, iso
from config.errors import (
    ConfigError,
    HookNotFound,
    HookSecretMissing,
    InsufficientStorage,
    InvalidKey,
    InvalidSignature,
    NeotaskError,
    ShuttingDown,
    StorageUnavailable,
)
from config.settings import HookMapping, Settings
from gateway import keys as K
from gateway.contract import NULLABLE_STR, STR, TURN_ERRORS, Answer, Param, operation
from gateway.delivery import DELIVERY, Deliverer
from gateway.http import json_response, read_body
from gateway.turns import Conversations, Outcome, Post
from gateway.webhooks import (
    STANDARD_ID,
    STANDARD_SIGNATURE,
    STANDARD_TIMESTAMP,
    SignatureError,
    TemplateError,
    check_mapping,
    parse_payload,
    plan,
    verify,
    verify_standard,
)

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"
DELIVER_TIMEOUT_S = 10.0
HOOK_PARAMS = (
    Param(SIGNATURE_HEADER, "`sha256=<hex>` (required when the hook has a secret)", "header"),
    Param(DELIVERY_HEADER, "delivery id, for duplicates", "header"),
    Param(STANDARD_ID, "Standard Webhooks delivery id (signed)", "header"),
    Param(STANDARD_TIMESTAMP, "Standard Webhooks unix seconds (signed; within `tolerance_s`)", "header"),
    Param(STANDARD_SIGNATURE, "Standard Webhooks `v1,<base64>` entries, space-separated", "header"),
)
STORAGE_ERRORS = (InsufficientStorage, StorageUnavailable)
HOOK_ANSWER = Answer(
    "HookAnswer",
    {
        "type": "object",
        "properties": {
            "status": {"enum": ["accepted", "duplicate"]},
            "session_key": STR,
            "run_id": NULLABLE_STR,
            "message_seq": {"type": ["integer", "null"]},
            "delivery_id": STR,
        },
    },
)


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
        def _find(conn: Any) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT session_key, message_seq FROM hook_deliveries WHERE delivery_id = ?", (delivery_id,)
            ).fetchone()
            return dict(row) if row else None

        return await self.conv.store.ledger.execute(_find)

    async def _record(self, delivery_id: str, name: str, outcome: Outcome) -> None:
        row = (delivery_id, name, iso(self.clock()), outcome.session_key, outcome.message_seq)

        def _insert(conn: Any) -> None:
            conn.execute(
                "INSERT INTO hook_deliveries (delivery_id, hook, created_at, session_key, message_seq)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (delivery_id) DO NOTHING",
                row,
            )

        await self.conv.store.ledger.execute(_insert)

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


WEBHOOKS = web.AppKey("webhooks", Webhooks)


@routes.post("/hooks/{name}")
@operation(
    "Webhook",
    "hooks",
    "HMAC-SHA256 of the raw body in `X-Hub-Signature-256` with the hook's secret, or a Standard Webhooks "
    "timestamped signature (`webhook-id`, `webhook-timestamp` within the hook's `tolerance_s`, "
    "`webhook-signature`). Answers 202 once stored and runs the turn in the background; a repeated delivery id "
    "(`X-GitHub-Delivery` or `webhook-id`), or a signature seen before (a replay with the id dropped or changed), "
    "answers 200 `duplicate` without storing.",
    body={"description": "any JSON payload; the hook's templates read it"},
    status=202,
    answer=HOOK_ANSWER,
    params=HOOK_PARAMS,
    errors=(InvalidSignature, HookNotFound, HookSecretMissing, InvalidKey, *TURN_ERRORS[:3], *STORAGE_ERRORS),
    extra_answers=((200, HOOK_ANSWER, "a duplicate delivery: `status: duplicate`, nothing stored"),),
)
async def receive_hook(request: web.Request) -> web.Response:
    hooks = request.app[WEBHOOKS]
    name = request.match_info["name"]
    mapping = hooks.mapping(name)
    secret = hooks.secret(name, mapping)
    body = await read_body(request, hooks.settings.gateway.max_body_bytes)
    signature = None if secret is None else _check_signature(request, hooks, name, mapping, secret, body)
    payload = parse_payload(body, request.content_type)
    delivery_id = request.headers.get(DELIVERY_HEADER) or request.headers.get(STANDARD_ID) or None
    return await hooks.receive(name, mapping, payload, delivery_id, signature)


def _check_signature(
    request: web.Request, hooks: Webhooks, name: str, mapping: HookMapping, secret: bytes, body: bytes
) -> str:
    """The delivery's verified signature (the replay cache's key); Unauthorized otherwise."""
    headers = request.headers
    standard = headers.get(STANDARD_SIGNATURE)
    if standard is not None:
        try:
            return verify_standard(
                secret,
                body,
                msg_id=headers.get(STANDARD_ID),
                timestamp=headers.get(STANDARD_TIMESTAMP),
                header=standard,
                now=hooks.clock().timestamp(),
                tolerance_s=mapping.tolerance_s,
            )
        except SignatureError as exc:
            raise InvalidSignature(str(exc)) from None
    if mapping.require_timestamp:
        raise InvalidSignature(
            f"webhook {name!r} takes timestamped signatures only (hooks.{name}.require_timestamp): send"
            f" {STANDARD_ID}, {STANDARD_TIMESTAMP} and {STANDARD_SIGNATURE} (Standard Webhooks)",
        )
    offered = headers.get(SIGNATURE_HEADER)
    if not verify(secret, body, offered):
        raise InvalidSignature(
            f"{'a wrong' if offered else 'no'} {SIGNATURE_HEADER} header: send 'sha256=' and the hex HMAC-SHA256 of"
            f" the raw body keyed with the secret in {mapping.secret_env} (or a Standard Webhooks"
            f" {STANDARD_SIGNATURE})",
        )
    assert offered is not None
    return offered.strip().lower()


async def hooks_context(app: web.Application) -> AsyncIterator[None]:
    """Check the hook mappings, open the ``deliver_to`` HTTP client and the webhook state; on
    shutdown cancel the background turns first, then close the client."""
    settings = app[K.CONFIG].settings
    env = app[K.ENV]
    for name, mapping in settings.hooks.items():
        try:
            check_mapping(name, mapping)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from None
        if mapping.secret_env is not None and not env.get(mapping.secret_env):
            log.warning("hook %s: %s is not set; its deliveries are refused (503) until it is", name,
                        mapping.secret_env)  # fmt: skip
        elif mapping.secret_env is None:
            log.warning("hook %s has no secret_env: it accepts unsigned deliveries", name)
    async with aiohttp.ClientSession(headers={"User-Agent": "neotask-gateway"}) as session:
        deliverer = Deliverer(session)
        app[DELIVERY] = deliverer
        hooks = Webhooks(app[K.CONVERSATIONS], settings, env, deliverer, clock=app[K.CLOCK])
        app[WEBHOOKS] = hooks
        try:
            yield
        finally:
            await hooks.close()
