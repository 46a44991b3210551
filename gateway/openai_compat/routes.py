"""``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/responses`` (opt-in:
``gateway.openai_compat.enabled``; off, they answer 404 ``not_found``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from config.errors import InvalidKey, ModelNotFound, NeotaskError, NotFound, ResponseNotFound, ResponseNotLatest
from gateway import contract
from gateway import keys as K
from gateway.contract import OBJ, STR, TURN_ERRORS, operation
from gateway.http import REQUEST_ID, json_response, parse_body
from gateway.keys import COMPAT
from gateway.openai_compat.bodies import (
    ChatCompletionBody,
    ResponsesBody,
    chat_conversation,
    chat_tools,
    responses_conversation,
    tool_choice,
)
from gateway.openai_compat.errors import from_exception
from gateway.openai_compat.service import MODEL_PREFIX, Answer, Call, OpenAICompat, Progress, Target
from gateway.openai_compat.shapes import (
    ResponseEvents,
    chunk,
    completion,
    output_items,
    response,
    sse_data,
    tool_call_deltas,
    usage_chunk,
)

routes = web.RouteTableDef()
SESSION_HEADER = "X-Neotask-Session-Key"
SESSION_PARAM = contract.Param(
    SESSION_HEADER, "the session key to post into (else `user`, else a one-off run)", "header"
)
COMPAT_ERRORS = (NotFound, ModelNotFound, InvalidKey)
CHAT_COMPLETION = contract.Answer(
    "ChatCompletion",
    {
        "type": "object",
        "description": "OpenAI's `chat.completion`",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": STR,
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": STR,
            "system_fingerprint": {"type": ["string", "null"]},
            "choices": {"type": "array", "items": OBJ},
            "usage": OBJ,
        },
    },
)
OPENAI_RESPONSE = contract.Answer(
    "OpenAIResponse",
    {
        "type": "object",
        "description": "OpenAI's Responses `response` object",
        "required": ["id", "object", "created_at", "status", "model", "output"],
        "properties": {
            "id": STR,
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": STR,
            "model": STR,
            "output": {"type": "array", "items": OBJ},
            "previous_response_id": contract.NULLABLE_STR,
            "usage": {"oneOf": [OBJ, {"type": "null"}]},
            "error": {"oneOf": [OBJ, {"type": "null"}]},
            "incomplete_details": {"oneOf": [OBJ, {"type": "null"}]},
            "instructions": {"description": "as the call sent it (text, a list of items, or null)"},
            "max_output_tokens": {"type": ["integer", "null"]},
            "parallel_tool_calls": {"type": "boolean"},
            "reasoning": OBJ,
            "store": {"type": "boolean"},
            "temperature": {"type": ["number", "null"]},
            "text": OBJ,
            "tool_choice": {"description": "as the call sent it, else `auto`"},
            "tools": {"type": "array", "items": OBJ},
            "top_p": {"type": ["number", "null"]},
            "truncation": STR,
            "user": contract.NULLABLE_STR,
            "metadata": OBJ,
        },
    },
)
MODEL = contract.Answer(
    "Model",
    {
        "type": "object",
        "properties": {"id": STR, "object": {"const": "model"}, "created": {"type": "integer"}, "owned_by": STR},
    },
)
MODEL_LIST = contract.Answer(
    "ModelList",
    {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL.ref}}},
    parts=(MODEL,),
)
STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def service(request: web.Request) -> OpenAICompat:
    if not request.app[K.CONFIG].settings.gateway.openai_compat.enabled:
        raise NotFound(
            "the OpenAI-compatible routes are off; set gateway.openai_compat.enabled: true (docs/openai-compat.md)"
        )
    return request.app[COMPAT]


def _created(request: web.Request) -> int:
    return int(request.app[K.CLOCK]().timestamp())


def _headers(target: Target, answer: Answer | None = None, progress: Progress | None = None) -> dict[str, str]:
    """The session key, the run and (``X-Neotask-New-Run: diverged``) a new run the call started
    because its history diverged from the stored one."""
    headers = {SESSION_HEADER: target.key.raw}
    if answer is not None and answer.outcome.run_id:
        headers["X-Neotask-Run-Id"] = answer.outcome.run_id
    known = progress or answer
    if known is not None and known.new_run:
        headers["X-Neotask-New-Run"] = "diverged"
        if known.previous_run_id:
            headers["X-Neotask-Previous-Run-Id"] = known.previous_run_id
    return headers


# -- models -------------------------------------------------------------------------------------


def _model(request: web.Request, agent_id: str) -> dict[str, Any]:
    return {"id": MODEL_PREFIX + agent_id, "object": "model", "created": _created(request), "owned_by": "neotask"}


@routes.get("/v1/models")
@operation(
    "OpenAI-compatible model list: one `neotask/<agent id>` per agent", "openai", answer=MODEL_LIST, errors=(NotFound,)
)
async def list_models(request: web.Request) -> web.Response:
    service(request)
    agents = request.app[K.CONFIG].settings.agents
    return json_response({"object": "list", "data": [_model(request, a) for a in agents]})


@routes.get("/v1/models/{model:.+}")
@operation("One OpenAI-compatible model (an agent)", "openai", answer=MODEL, errors=(NotFound, ModelNotFound))
async def get_model(request: web.Request) -> web.Response:
    agent_id = service(request).agent_for(request.match_info["model"])
    return json_response(_model(request, agent_id))


# -- chat completions ---------------------------------------------------------------------------


@routes.post("/v1/chat/completions")
@operation(
    "OpenAI-compatible chat completions",
    "openai",
    "Off unless `gateway.openai_compat.enabled` (then 404 `not_found`). OpenAI's body and answer "
    "(`chat.completion`; with `stream: true` server-sent `chat.completion.chunk` events ending with "
    "`data: [DONE]`, and a usage chunk with `stream_options.include_usage`). The session: the "
    "`X-Neotask-Session-Key` header, else `user` (`agent:<id>:openai:dm:<user>`), else a one-off run. "
    "Only what is new in the resent history is stored; a diverged history starts a new run and answers "
    "`X-Neotask-New-Run: diverged`. Errors are OpenAI's shape (`message`, `type`, `code`, `param`) plus "
    "`request_id`. See docs/openai-compat.md.",
    body=ChatCompletionBody,
    params=(SESSION_PARAM,),
    answer=CHAT_COMPLETION,
    errors=(*COMPAT_ERRORS, *TURN_ERRORS),
)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    compat = service(request)
    body = await parse_body(request, ChatCompletionBody, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    agent_id = compat.agent_for(body.model)
    instructions, messages = chat_conversation(body.messages)
    tools = chat_tools(body.tools, compat.own_tools()) if body.tools else ()
    choice = tool_choice(body.tool_choice, {t["function"]["name"] for t in tools})
    target = compat.target(agent_id, header_key=SESSION_PARAM.raw(request), user=body.user)
    call = Call(target, instructions, messages, tools, choice)
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", _created(request)
    if not body.stream:
        answer = await compat.chat(call)
        headers = _headers(target, answer)
        return json_response(completion(ident, created, body.model, answer), headers=headers)

    include_usage = body.stream_options is not None and body.stream_options.include_usage
    progress = Progress()
    stream = _Stream(request, lambda: _headers(target, progress=progress))
    streamed = False

    async def on_delta(text: str) -> None:
        nonlocal streamed
        if not streamed:
            await stream.write(
                sse_data(chunk(ident, created, body.model, {"role": "assistant", "content": ""}, usage=include_usage))
            )
        streamed = True
        await stream.write(sse_data(chunk(ident, created, body.model, {"content": text}, usage=include_usage)))

    try:
        answer = await compat.chat(call, on_delta=on_delta, progress=progress)
    except NeotaskError as exc:
        if not stream.started:
            raise
        await stream.write(sse_data(from_exception(exc, request[REQUEST_ID])))
        return await stream.close()
    if not streamed:
        first = {"role": "assistant", "content": answer.content}
        await stream.write(
            sse_data(chunk(ident, created, body.model, first, usage=include_usage)),
            headers=_headers(target, answer),
        )
    if answer.tool_calls:
        delta = {"tool_calls": tool_call_deltas(answer.tool_calls)}
        await stream.write(sse_data(chunk(ident, created, body.model, delta, usage=include_usage)))
    await stream.write(sse_data(chunk(ident, created, body.model, {}, answer.finish_reason, usage=include_usage)))
    if include_usage:
        await stream.write(sse_data(usage_chunk(ident, created, body.model, answer)))
    await stream.write(sse_data("[DONE]"))
    return await stream.close()


class _Stream:
    """A server-sent events answer, started by its first write (so errors before it are plain
    HTTP errors)."""

    def __init__(self, request: web.Request, headers: Callable[[], dict[str, str]]) -> None:
        self.request = request
        self.headers = headers
        self.response: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None

    async def write(self, data: bytes, *, headers: dict[str, str] | None = None) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers={**STREAM_HEADERS, **(headers or self.headers())})
            await self.response.prepare(self.request)
        await self.response.write(data)

    async def close(self) -> web.StreamResponse:
        assert self.response is not None
        await self.response.write_eof()
        return self.response


# -- responses ----------------------------------------------------------------------------------


@routes.post("/v1/responses")
@operation(
    "OpenAI-compatible Responses",
    "openai",
    "Off unless `gateway.openai_compat.enabled`. `previous_response_id` continues the session of that "
    "response (each id maps to its session key and seq); `store: false` keeps no id; `stream: true` answers "
    "`response.*` server-sent events. Without `previous_response_id` the session is chosen as for chat "
    "completions, or a new one-off session.",
    body=ResponsesBody,
    params=(SESSION_PARAM,),
    answer=OPENAI_RESPONSE,
    errors=(*COMPAT_ERRORS, ResponseNotFound, ResponseNotLatest, *TURN_ERRORS),
)
async def create_response(request: web.Request) -> web.StreamResponse:
    compat = service(request)
    body = await parse_body(request, ResponsesBody, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    instructions, messages = responses_conversation(body)
    tools = chat_tools(body.tools, compat.own_tools()) if body.tools else ()
    choice = tool_choice(body.tool_choice, {t["function"]["name"] for t in tools})
    if body.previous_response_id:
        ref = await compat.previous(body.previous_response_id)
        agent_id = compat.agent_for(body.model)
        target = compat.target(agent_id, header_key=ref.session_key, user=body.user)
    else:
        agent_id = compat.agent_for(body.model)
        target = compat.target(agent_id, header_key=SESSION_PARAM.raw(request), user=body.user)
    call = Call(target, instructions, messages, tools, choice, previous_response_id=body.previous_response_id)
    created = _created(request)
    echo = body.model_dump(include={"instructions", "previous_response_id", "store", "user", "tools", "tool_choice"})
    echo["metadata"] = body.model_extra.get("metadata") if body.model_extra else None

    if not body.stream:
        answer, response_id = await compat.respond(call, store=body.store)
        output = output_items(answer, "msg_" + uuid.uuid4().hex)
        result = response(
            response_id, created, body.model, echo, status="completed", output=output, usage=answer.outcome.usage
        )
        return json_response(result, headers=_headers(target, answer))

    events: ResponseEvents | None = None
    stream = _Stream(request, lambda: _headers(target))

    async def send(chunks: list[bytes]) -> None:
        for data in chunks:
            await stream.write(data)

    def ensure(response_id: str) -> ResponseEvents:
        nonlocal events
        if events is None:
            events = ResponseEvents(response_id, created, body.model, echo)
        return events

    pending_id = f"resp_{uuid.uuid4().hex}"

    async def on_delta(text: str) -> None:
        ev = ensure(pending_id)
        if ev.sequence == 0:
            await send(ev.start())
        await send(ev.delta(text))

    try:
        answer, _ = await compat.respond(call, store=body.store, on_delta=on_delta, response_id=pending_id)
    except NeotaskError as exc:
        if not stream.started:
            raise
        await stream.write(ensure(pending_id).failed(from_exception(exc, request[REQUEST_ID])["error"]))
        return await stream.close()
    ev = ensure(pending_id)
    if ev.sequence == 0:
        await send(ev.start())
    await send(ev.finish(answer))
    return await stream.close()
