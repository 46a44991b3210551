"""Chat connectors: ``GET /v1/channels`` (each account: connected, last update, last error,
messages in and out), ``POST /v1/channels/approve`` (a pairing code an unknown sender got) and
``POST /hooks/telegram/{account}`` (Telegram's webhook calls, checked by their secret token) and
``POST /hooks/slack/{account}`` (Slack's Events API calls, checked by their signature)."""

from __future__ import annotations

import dataclasses

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from config.errors import BadRequest, ChannelNotReady, InvalidBody, InvalidSignature, NotFound, PairingCodeNotFound
from gateway import keys as K
from gateway.contract import operation
from gateway.http import json_response, parse_body, read_body

routes = web.RouteTableDef()


class ApproveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str = Field(min_length=1, max_length=64)


@routes.get("/v1/channels")
@operation("Chat channel accounts and their state", "channels")
async def channel_status(request: web.Request) -> web.Response:
    return json_response({"accounts": request.app[K.CHANNELS].status()})


@routes.post("/v1/channels/approve")
@operation(
    "Approve a pairing code",
    "channels",
    "An unknown sender writing to an account with `dm_policy: pairing` gets a one-time code; approving it lets "
    "that sender talk to the bot from then on.",
    body=ApproveBody,
    errors=(PairingCodeNotFound,),
)
async def approve(request: web.Request) -> web.Response:
    body = await parse_body(request, ApproveBody, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    pairing = await request.app[K.CHANNELS].approve(body.code)
    return json_response({**dataclasses.asdict(pairing), "approved": True})


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
