"""Chat connectors: ``GET /v1/channels`` (each account: connected, last update, last error,
messages in and out), ``GET /v1/channels/pairings`` (the pairing codes given out, pending, approved
or expired), ``POST /v1/channels/approve`` (a pairing code an unknown sender got; the sender is told
through the running connector), ``POST /v1/channels/revoke`` (a pairing forgotten) and
``POST /hooks/telegram/{account}`` (Telegram's webhook calls, checked by their secret token) and
``POST /hooks/slack/{account}`` (Slack's Events API calls, checked by their signature)."""

from __future__ import annotations

from aiohttp import web
from pydantic import Field

from channels.pairing import STATES
from config.errors import (
    BadRequest,
    ChannelNotReady,
    InvalidBody,
    InvalidSignature,
    NotFound,
    PairingCodeExpired,
    PairingCodeNotFound,
)
from gateway import keys as K
from gateway.contract import NULLABLE_STR, STR, Answer, ChoiceParam, operation
from gateway.http import Strict, json_response, parse_body, read_body

routes = web.RouteTableDef()
PAIRING_STATE = ChoiceParam("state", "only the pairings in this state", choices=STATES, blank=False)
_PAIRING_FIELDS = {
    "code": STR, "channel": STR, "account": STR, "sender_id": STR, "sender_name": NULLABLE_STR,
    "state": {"type": "string", "enum": list(STATES)}, "approved": {"type": "boolean"}, "created_at": STR,
    "expires_at": {**NULLABLE_STR, "description": "when a pending code stops being good"}, "approved_at": NULLABLE_STR,
}  # fmt: skip
_REQUIRED = ["code", "channel", "account", "sender_id", "state", "created_at"]
PAIRING = Answer("Pairing", {"type": "object", "properties": _PAIRING_FIELDS, "required": _REQUIRED})
PAIRING_LIST = Answer(
    "PairingList",
    {"type": "object", "properties": {"pairings": {"type": "array", "items": PAIRING.ref}}},
    parts=(PAIRING,),
)
NOTIFIED = {
    "type": "boolean",
    "description": "the sender was told through the channel (false: the account is not running or the platform did not"
    " take the notice; they are told when the account next starts)",
}
APPROVED = Answer("Approved", {"type": "object", "properties": {**_PAIRING_FIELDS, "notified": NOTIFIED},
                               "required": [*_REQUIRED, "notified"]})  # fmt: skip
REVOKED = Answer("Revoked", {"type": "object", "properties": {**_PAIRING_FIELDS, "revoked": {"type": "boolean"}},
                             "required": [*_REQUIRED, "revoked"]})  # fmt: skip


class CodeBody(Strict):
    code: str = Field(min_length=1, max_length=64)


@routes.get("/v1/channels")
@operation("Chat channel accounts and their state", "channels")
async def channel_status(request: web.Request) -> web.Response:
    return json_response({"accounts": request.app[K.CHANNELS].status()})


@routes.get("/v1/channels/pairings")
@operation(
    "Pairing codes",
    "channels",
    "Every sender who wrote to an account with `dm_policy: pairing`: `pending` (a code not yet approved, good until "
    "`expires_at`), `approved`, or `expired` (the sender gets a new code when they write again).",
    params=(PAIRING_STATE,),
    answer=PAIRING_LIST,
    errors=(BadRequest,),
)
async def pairings(request: web.Request) -> web.Response:
    state = PAIRING_STATE.read(request)
    now = request.app[K.CLOCK]()
    listed = [p.as_json(now) for p in await request.app[K.CHANNELS].pairings()]
    return json_response({"pairings": [p for p in listed if state is None or p["state"] == state]})


@routes.post("/v1/channels/approve")
@operation(
    "Approve a pairing code",
    "channels",
    "An unknown sender writing to an account with `dm_policy: pairing` gets a code (good for the account's "
    "`pairing_code_lifetime_s`); approving it lets that sender talk to the bot from then on, and tells them so "
    "through the channel (`notified`). An expired code is refused (`pairing_code_expired`).",
    body=CodeBody,
    answer=APPROVED,
    errors=(BadRequest, PairingCodeNotFound, PairingCodeExpired),
)
async def approve(request: web.Request) -> web.Response:
    body = await parse_body(request, CodeBody, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    pairing, notified = await request.app[K.CHANNELS].approve(body.code)
    return json_response({**pairing.as_json(request.app[K.CLOCK]()), "notified": notified})


@routes.post("/v1/channels/revoke")
@operation(
    "Revoke a pairing",
    "channels",
    "Forget the sender of a code, approved or pending: the bot no longer takes their direct messages (from the next "
    "one); if they write again they get a new code.",
    body=CodeBody,
    answer=REVOKED,
    errors=(BadRequest, PairingCodeNotFound),
)
async def revoke(request: web.Request) -> web.Response:
    body = await parse_body(request, CodeBody, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    pairing = await request.app[K.CHANNELS].revoke(body.code)
    return json_response({**pairing.as_json(request.app[K.CLOCK]()), "revoked": True})


@routes.post("/hooks/telegram/{account}")
@operation(
    "Telegram webhook",
    "channels",
    "Telegram's calls for an account with `mode: webhook`: the `X-Telegram-Bot-Api-Secret-Token` header must be the "
    "account's secret; answered 200 once the update is durable (else an error, and Telegram retries).",
    errors=(BadRequest, InvalidBody, InvalidSignature, NotFound, ChannelNotReady),
)
async def telegram_webhook(request: web.Request) -> web.Response:
    return await _called(request, "telegram")


@routes.post("/hooks/slack/{account}")
@operation(
    "Slack Events API",
    "channels",
    "Slack's calls for an account with `mode: events`, signed with the app's signing secret (`X-Slack-Signature`, "
    "`X-Slack-Request-Timestamp` within 5 minutes); `url_verification` is answered with its challenge; an event is "
    "answered 200 once durable (else an error, and Slack retries); a slash command (form-encoded, to the same "
    "Request URL) is acknowledged with an empty 200 and answered in the conversation it was typed in.",
    errors=(BadRequest, InvalidBody, InvalidSignature, NotFound, ChannelNotReady),
)
async def slack_events(request: web.Request) -> web.Response:
    return await _called(request, "slack")


async def _called(request: web.Request, channel: str) -> web.Response:
    connector = request.app[K.CHANNELS].called(channel, request.match_info["account"])
    body = await read_body(request, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    answer = await connector.receive(body, request.headers)
    return web.Response(status=200) if answer is None else json_response(answer)
