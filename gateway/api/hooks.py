"""``POST /hooks/{name}``: signed webhook deliveries (SPEC section 8).

The route checks the hook, its secret and the signature of the raw body (GitHub's
``X-Hub-Signature-256``, or Standard Webhooks' timestamped ``webhook-signature``), parses the JSON,
skips a delivery whose id or signature it has seen (``hook_deliveries`` in tasks.db: a captured body
replayed with its delivery id dropped or changed carries the same signature), applies the mapping
(``channels.webhooks.plan``) and stores the message. It answers 202 as soon as the message is
durable; the model turn goes on in a background task that shutdown cancels, and its answer is
POSTed to the hook's ``deliver_to``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from channels.hooks import Accepted, HookOutcome, Webhooks
from channels.webhooks import (
    STANDARD_ID,
    STANDARD_SIGNATURE,
    STANDARD_TIMESTAMP,
    SignatureError,
    sign,
    verify,
    verify_standard,
)
from config.errors import (
    HookNotFound,
    HookSecretMissing,
    InsufficientStorage,
    InvalidKey,
    InvalidSignature,
    StorageUnavailable,
)
from config.settings import HookMapping
from gateway.contract import NULLABLE_STR, STR, TURN_ERRORS, Answer, Param, operation
from gateway.http import content_type_of, decode_json, json_response, read_body
from gateway.keys import WEBHOOKS

routes = web.RouteTableDef()


def parse_payload(body: bytes, content_type: str) -> Any:
    """The JSON value of a hook body; BadRequest ``invalid_body`` otherwise."""
    return decode_json(body, content_type, hint=" (on GitHub, set the webhook's content type to application/json)")

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"
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
    payload = parse_payload(body, content_type_of(request))
    delivery_id = request.headers.get(DELIVERY_HEADER) or request.headers.get(STANDARD_ID) or None
    return render(await hooks.receive(name, mapping, payload, delivery_id, signature))


def render(outcome: HookOutcome) -> web.Response:
    """202 for a delivery stored now, 200 for a duplicate (SPEC section 8)."""
    if isinstance(outcome, Accepted):
        body = {"status": outcome.status, "session_key": outcome.session_key, "run_id": outcome.run_id,
                "message_seq": outcome.message_seq}  # fmt: skip
        return json_response(body, status=202)
    body = {"status": outcome.status, "delivery_id": outcome.delivery_id, "session_key": outcome.session_key,
            "message_seq": outcome.message_seq}  # fmt: skip
    return json_response(body)


def _check_signature(
    request: web.Request, hooks: Webhooks, name: str, mapping: HookMapping, secret: bytes, body: bytes
) -> str:
    """The delivery's verified signature in one spelling (the replay cache's key): the digest the
    gateway computed, never the header as sent, so a space, a tab or upper-case hex after
    ``sha256=`` is the same delivery; Unauthorized otherwise."""
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
    return sign(secret, body)
