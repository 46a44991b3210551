"""Answering a posted message: a JSON body, or (``stream: true``) server-sent events — text
deltas, then one ``final`` event carrying the same body as the JSON answer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from config.errors import NeotaskError
from conversations.commands import dispatch
from conversations.turns import Post
from gateway import keys as K
from gateway.contract import OBJ, STR, Answer, ref
from gateway.http import REQUEST_ID, error_body, message_response
from sessions.records import USAGE_KEYS

_USAGE = {k: {"type": "integer"} for k in USAGE_KEYS}
MESSAGE_ANSWER = Answer(
    "MessageAnswer",
    {
        "type": "object",
        "required": ["session_key", "run_id", "message_seq", "reply", "events", "usage"],
        "properties": {
            "session_key": STR,
            "run_id": {"type": ["string", "null"]},
            "message_seq": {"type": ["integer", "null"], "description": "messages.jsonl seq of the posted message"},
            "reply": {
                "description": "the model's answer, or a command's; with queue mode `collect` or `steer` several "
                "calls answer the same reply (same `seq`), each with its own `message_seq`",
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["content", "seq"],
                        "properties": {"content": STR, "seq": {"type": "integer"}},
                    },
                    {"type": "null"},
                ],
            },
            "events": {"type": "array", "items": OBJ},
            "usage": {"type": "object", "properties": _USAGE},
        },
    },
)
STREAM_EVENT = Answer(
    "StreamEvent",
    {
        "type": "string",
        "description": '`event: delta` with `data: {"content": "..."}` per text delta, then one `event: final` whose '
        "data is a `MessageAnswer`; a failure after the stream started is an `event: error` with an `Error`.",
        "x-events": {
            "delta": {"type": "object", "properties": {"content": STR}},
            "final": MESSAGE_ANSWER.ref,
            "error": ref("Error"),
        },
    },
    parts=(MESSAGE_ANSWER,),
)


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def answer(request: web.Request, post: Post, *, stream: bool) -> web.StreamResponse:
    commands = request.app[K.COMMANDS]
    handoff = request.app.get(K.HANDOFF)  # a key another worker owns: stored there (gateway.handoff)
    if not stream:
        if handoff is not None and (body := await handoff.post(post)) is not None:
            return message_response(body)
        outcome = await dispatch(commands, post)
        return message_response(outcome.body())

    response: web.StreamResponse | None = None

    async def start() -> web.StreamResponse:
        nonlocal response
        if response is None:
            response = await _open_stream(request)
        return response

    async def on_delta(text: str) -> None:
        await (await start()).write(sse("delta", {"content": text}))

    try:
        handed = None if handoff is None else await handoff.post(post, on_delta)
        final = handed if handed is not None else (await dispatch(commands, post, on_delta=on_delta)).body()
    except NeotaskError as exc:
        if response is None:
            raise
        body = error_body(exc.code, exc.message, request[REQUEST_ID], **exc.extra)
        await response.write(sse("error", body))
        await response.write_eof()
        return response
    stream_response = await start()
    await stream_response.write(sse("final", final))
    await stream_response.write_eof()
    return stream_response


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def final_only(request: web.Request, body: Mapping[str, Any]) -> web.StreamResponse:
    """A ``stream: true`` call whose answer had no deltas (a command answered without the model):
    the one ``final`` event."""
    response = await _open_stream(request)
    await response.write(sse("final", body))
    await response.write_eof()
    return response
