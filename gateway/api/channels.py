"""Chat connectors: ``GET /v1/channels`` (each account: connected, last update, last error,
messages in and out) and ``POST /v1/channels/approve`` (a pairing code an unknown sender got)."""

from __future__ import annotations

import dataclasses

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from config.errors import PairingCodeNotFound
from gateway import keys as K
from gateway.contract import operation
from gateway.http import json_response, parse_body

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
