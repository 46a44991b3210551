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

from aiohttp import web

from config.settings import HookMapping
from gateway.http import Unauthorized, read_body
from gateway.keys import WEBHOOKS
from gateway.webhook_intake import Webhooks
from gateway.webhooks import (
    STANDARD_ID,
    STANDARD_SIGNATURE,
    STANDARD_TIMESTAMP,
    SignatureError,
    parse_payload,
    verify,
    verify_standard,
)

routes = web.RouteTableDef()

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"


@routes.post("/hooks/{name}")
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
            raise Unauthorized(str(exc), code="invalid_signature") from None
    if mapping.require_timestamp:
        raise Unauthorized(
            f"webhook {name!r} takes timestamped signatures only (hooks.{name}.require_timestamp): send"
            f" {STANDARD_ID}, {STANDARD_TIMESTAMP} and {STANDARD_SIGNATURE} (Standard Webhooks)",
            code="invalid_signature",
        )
    offered = headers.get(SIGNATURE_HEADER)
    if not verify(secret, body, offered):
        raise Unauthorized(
            f"{'a wrong' if offered else 'no'} {SIGNATURE_HEADER} header: send 'sha256=' and the hex HMAC-SHA256 of"
            f" the raw body keyed with the secret in {mapping.secret_env} (or a Standard Webhooks"
            f" {STANDARD_SIGNATURE})",
            code="invalid_signature",
        )
    assert offered is not None
    return offered.strip().lower()
