"""The gateway's log, live: ``GET /v1/admin/logs`` (the console's log page polls it)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from config.errors import BadRequest
from gateway import keys as K
from gateway.contract import STR, Answer, IntParam, operation
from gateway.http import json_response
from gateway.log_tail import read_tail

routes = web.RouteTableDef()

LINES = IntParam("lines", "how many of the last lines a first call gets", default=200, low=0, high=5000)
AFTER = IntParam(
    "after", "the `offset` of the previous answer: only what was written since", default=0, low=0, high=2**62
)
INODE = IntParam(
    "inode", "the `inode` of the previous answer (another one: the log was rotated)", default=0, low=0, high=2**62
)
LOG_TAIL = Answer(
    "LogTail",
    {
        "type": "object",
        "required": ["file", "lines", "offset", "rotated"],
        "properties": {
            "file": STR,
            "lines": {"type": "array", "items": STR},
            "offset": {"type": "integer", "description": "pass it back as `after` for the lines written next"},
            "inode": {"type": ["integer", "null"]},
            "rotated": {"type": "boolean", "description": "the log was rotated since `after`: read from its start"},
        },
    },
)


@routes.get("/v1/admin/logs")
@operation(
    "The end of the gateway's log (logs/gateway.log)",
    "admin",
    "A first call answers the last `lines` lines; a call with `after` (and `inode`) of the previous answer"
    " answers only the whole lines written since (at most 256 KiB), so polling it follows the log live.",
    params=(LINES, AFTER, INODE),
    answer=LOG_TAIL,
    errors=(BadRequest,),
)
async def log_tail(request: web.Request) -> web.Response:
    lines = LINES.read(request)
    after = AFTER.read(request) if AFTER.raw(request) else None
    inode = INODE.read(request) if INODE.raw(request) else None
    path = request.app[K.CONFIG].home / "logs" / "gateway.log"
    tail = await asyncio.to_thread(read_tail, path, lines=lines, after=after, inode=inode)
    return json_response(tail.as_json(path.name))
