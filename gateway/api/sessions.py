"""Sessions: channel ingress, messages to a key, listing, detail, settings, lifecycle, commands."""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BeforeValidator, Field, WithJsonSchema

from config.chat_commands import parse_command
from config.errors import BadRequest, InvalidBody, InvalidKey, NoActiveRun, SessionNotFound
from conversations.commands import model_name_problem
from conversations.queueing import QUEUE_MODES
from conversations.run_end import RunEnd, end_active_run
from conversations.turns import Post
from gateway import keys as K
from gateway import operations
from gateway.api import history
from gateway.api.fastbody import (
    MAX_CHANNEL,
    MAX_CHANNEL_ID,
    MAX_CLIENT_MESSAGE_ID,
    MAX_NAME,
    plain_ingress,
    plain_message,
)
from gateway.contract import AGENT, CURSOR, LIMIT, NULLABLE_STR, OBJ, STR, TURN_ERRORS, Answer, ChoiceParam, Param, page
from gateway.contract import operation as op
from gateway.http import Strict, json_response, parse_body, read_json, read_object, validate
from gateway.operations import describe_session, matching_sessions
from gateway.streaming import MESSAGE_ANSWER, STREAM_EVENT, answer, final_only
from gateway.views import SESSION
from sessions.keys import Ingress, SessionKey, parse_key, route
from sessions.records import CHAT_TYPES, ENTRY_STATUSES, EntryChange, NewMessage, Role, TaskKey
from sessions.thresholds import compaction_threshold

routes = web.RouteTableDef()


def _int_as_text(value: object) -> object:
    """Telegram and others send ids as integers: taken as their decimal text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


ChannelId = Annotated[
    str,
    BeforeValidator(_int_as_text),
    Field(min_length=1, max_length=MAX_CHANNEL_ID),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string", "minLength": 1, "maxLength": MAX_CHANNEL_ID}, {"type": "integer"}],
            "description": "an integer is taken as its decimal text; characters outside the key grammar are"
            " percent-encoded (UTF-8 %XX) in the key",
        }
    ),
]


class IngressBody(Strict):
    channel: str = Field(min_length=1, max_length=MAX_CHANNEL)
    chat_type: Literal["direct", "group", "channel"]
    chat_id: ChannelId
    sender_id: ChannelId
    sender_name: str | None = Field(None, max_length=MAX_NAME)
    text: str
    thread_id: ChannelId | None = None
    agent_id: str | None = Field(None, min_length=1)  # "" was taken for no agent: routed to main
    reply: bool = True
    stream: bool = False
    client_message_id: str | None = Field(None, min_length=1, max_length=MAX_CLIENT_MESSAGE_ID)


class MessageBody(Strict):
    role: Role = "user"
    content: str
    name: str | None = Field(None, max_length=MAX_NAME)
    tool_name: str | None = Field(None, max_length=MAX_NAME)
    tool_call_id: str | None = Field(None, max_length=MAX_NAME)
    reply: bool = True
    stream: bool = False
    client_message_id: str | None = Field(None, min_length=1, max_length=MAX_CLIENT_MESSAGE_ID)


class CommandBody(Strict):
    command: str = Field(min_length=2)
    stream: bool = False
    client_message_id: str | None = Field(None, min_length=1, max_length=MAX_CLIENT_MESSAGE_ID)


class PatchBody(Strict):
    pinned: bool | None = None
    label: str | None = Field(None, max_length=200)
    settings: dict[str, Any] | None = None


class FailBody(Strict):
    error: str = Field("failed by request", min_length=1, max_length=2000)


IDEMPOTENCY = Param(
    "Idempotency-Key",
    f"same as `client_message_id` (1 to {MAX_CLIENT_MESSAGE_ID} characters)",
    "header",
    schema={"type": "string", "maxLength": MAX_CLIENT_MESSAGE_ID},
)
CHAT_TYPE = ChoiceParam("type", "chat type", choices=CHAT_TYPES, blank=False)
ENTRY_STATUS = ChoiceParam("status", "entry status", choices=ENTRY_STATUSES, blank=False)
KEY_ERRORS = (InvalidKey, SessionNotFound)
QUEUE_MODES_DOC = (
    "Turns on one key run one at a time; what a message that arrives while a turn runs gets depends on the queue "
    "mode (`settings.queue_mode` of the session, else `agents.<id>.queue_mode`, else `session.queue.mode`): "
    "`collect` (default): the messages that waited are answered together by one turn once the running turn ends, "
    "and every one of those calls answers that same `reply` with its own `message_seq`; `followup`: one turn per "
    "message, each seeing the context only up to its own message; `steer`: the message joins the running turn (its "
    "next model call, after a tool round, sees it) and the call answers that turn's `reply`; when the turn has no "
    "further model call, the message gets a turn of its own."
)
SESSION_LIST = page("SessionList", "sessions", SESSION)
CONTEXT = Answer(
    "Context",
    {
        "type": "object",
        "properties": {
            "session_key": STR,
            "run_id": NULLABLE_STR,
            "messages": {"type": "array", "items": OBJ},
            "tokens": {"type": "integer"},
            "threshold": {"type": "integer"},
        },
    },
)
LIFECYCLE = Answer("Lifecycle", {"type": "object", "properties": {"session_key": STR, "run_id": STR, "status": STR}})
STOPPED = Answer("Stopped", {"type": "object", "properties": {"session_key": STR, "stopped": {"type": "boolean"}}})
SETTINGS_KEYS = {"model", "queue_mode"}
PARSED_KEYS_MAX = 16384  # parsed path keys kept per app (a frozen SessionKey per raw key)


def session_key(request: web.Request) -> SessionKey:
    """The key in the path; ``cron:`` and ``hook:`` keys name no agent and run on ``main``.
    Parsed once per raw key (the agents are fixed at start); bad keys are not kept."""
    raw = request.match_info["key"]
    cache: dict[str, SessionKey] = request.app[K.PARSED_KEYS]
    key = cache.get(raw)
    if key is None:
        key = parse_key(raw, agents=request.app[K.CONFIG].settings.agents)
        if key.agent_id is None:
            key = replace(key, agent_id="main")
        if len(cache) >= PARSED_KEYS_MAX:
            cache.clear()
        cache[raw] = key
    return key


def client_message_id(request: web.Request, body_value: str | None) -> str | None:
    """The body's ``client_message_id``, else the ``Idempotency-Key`` header, capped alike."""
    header = IDEMPOTENCY.raw(request)
    if header is not None and len(header) > MAX_CLIENT_MESSAGE_ID:
        raise BadRequest(
            f"the Idempotency-Key header is at most {MAX_CLIENT_MESSAGE_ID} characters, like client_message_id",
            field="Idempotency-Key",
        )
    return body_value or header or None


# What a route that posts a message reads beside its body, answers (whole or streamed) and may meet.
POSTING: dict[str, Any] = {
    "params": (IDEMPOTENCY,), "answer": MESSAGE_ANSWER, "stream": STREAM_EVENT, "errors": (InvalidKey, *TURN_ERRORS)
}  # fmt: skip


@routes.post("/v1/messages")
@op(
    "Channel ingress",
    "sessions",
    "Routed to a session key by `session.dm_scope` and `bindings` (SPEC section 1).",
    body=IngressBody,
    **POSTING,
)
async def ingress(request: web.Request) -> web.StreamResponse:
    settings = request.app[K.CONFIG].settings
    data = await read_object(request, settings.gateway.max_body_bytes)
    body = plain_ingress(data)  # the common body, as the model would take it; else the model decides
    if body is None:
        body = dict(validate(IngressBody, data))
    key = route(
        Ingress(body["channel"], body["chat_type"], body["chat_id"], body["sender_id"], body["thread_id"],
                body["agent_id"]),
        dm_scope=settings.session.dm_scope,
        bindings=settings.bindings,
        agents=settings.agents,
    )  # fmt: skip
    message = NewMessage(
        role="user",
        content=body["text"],
        name=body["sender_name"] or body["sender_id"],
        sender_id=body["sender_id"],
        client_message_id=client_message_id(request, body["client_message_id"]),
    )
    post = Post(key=key, message=message, reply=body["reply"])
    return await answer(request, post, stream=body["stream"])


@routes.post("/v1/sessions/{key}/messages")
@op(
    "Post a message to a key",
    "sessions",
    "A user message gets a model reply when a model is configured and `reply` is not false; a message starting "
    "with `/` is a chat command. " + QUEUE_MODES_DOC,
    body=MessageBody,
    **POSTING,
)
async def post_message(request: web.Request) -> web.StreamResponse:
    config = request.app[K.CONFIG]
    key = session_key(request)
    data = await read_object(request, config.settings.gateway.max_body_bytes)
    body = plain_message(data)  # the common body, as the model would take it; else the model decides
    if body is None:
        body = dict(validate(MessageBody, data))
    if body["role"] == "tool" and not body["tool_call_id"]:
        raise BadRequest("a tool message needs 'tool_call_id'", field="tool_call_id")
    message = NewMessage(
        role=body["role"],
        content=body["content"],
        name=body["name"],
        tool_name=body["tool_name"],
        tool_call_id=body["tool_call_id"],
        client_message_id=client_message_id(request, body["client_message_id"]),
    )
    task_key = TaskKey(task_type=key.family, task_identifier=key.raw)
    post = Post(key=key, message=message, reply=body["reply"], task_key=task_key)
    return await answer(request, post, stream=body["stream"])


@routes.post("/v1/sessions/{key}/commands")
@op(
    "Run a chat command",
    "sessions",
    "The command's answer is in `reply.content`, in store-only mode too. `stream: true` answers with server-sent"
    " events as a message does: a command's answer comes whole, in the one `final` event.",
    body=CommandBody,
    params=(IDEMPOTENCY,),
    answer=MESSAGE_ANSWER,
    stream=STREAM_EVENT,
    errors=(InvalidKey, NoActiveRun, *TURN_ERRORS),
)
async def post_command(request: web.Request) -> web.StreamResponse:
    config = request.app[K.CONFIG]
    key = session_key(request)
    body = await parse_body(request, CommandBody, config.settings.gateway.max_body_bytes)
    cmid = client_message_id(request, body.client_message_id)
    post = Post(key=key, message=NewMessage(role="user", content=body.command, client_message_id=cmid))
    commands = request.app[K.COMMANDS]
    if parse_command(body.command) is not None:
        return await answer(request, post, stream=body.stream)
    if not unicodedata.normalize("NFKC", body.command).lstrip().startswith("/"):
        raise BadRequest("'command' must start with '/' and a command name, e.g. /status", field="command")
    word = body.command.split(maxsplit=1)[0]  # e.g. "/2": answered with the help
    outcome = await commands.run(post, unicodedata.normalize("NFKC", word)[1:], "")
    return await final_only(request, outcome.body()) if body.stream else json_response(outcome.body())


@routes.get("/v1/sessions")
@op(
    "List sessions, newest interaction first",
    "sessions",
    answer=SESSION_LIST,
    errors=(BadRequest,),
    params=(AGENT, CHAT_TYPE, ENTRY_STATUS, LIMIT, CURSOR),
)
async def list_sessions(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    limit = LIMIT.read(request)
    agent = AGENT.raw(request)
    chat_type = CHAT_TYPE.read(request)
    status = ENTRY_STATUS.read(request)
    entries = matching_sessions(store, agent=agent, chat_type=chat_type, status=status)
    page, next_cursor = operations.page_of(entries, limit=limit, cursor=CURSOR.raw(request))
    return json_response({"sessions": [describe(request, e.key) for e in page], "next_cursor": next_cursor})


def describe(request: web.Request, key: str) -> dict[str, Any]:
    return describe_session(request.app[K.COMMANDS], key)


@routes.get("/v1/sessions/{key}")
@op("A session", "sessions", answer=SESSION, errors=KEY_ERRORS)
async def get_session(request: web.Request) -> web.Response:
    key = session_key(request)
    return json_response(describe(request, key.raw))


@routes.patch("/v1/sessions/{key}")
@op(
    "Pin, label or set per-session settings",
    "sessions",
    "`settings` takes `model` (the model override) and `queue_mode` (`collect`, `followup` or `steer`); null "
    "clears a setting.",
    body=PatchBody,
    answer=SESSION,
    errors=KEY_ERRORS,
)
async def patch_session(request: web.Request) -> web.Response:
    config = request.app[K.CONFIG]
    key = session_key(request)
    data = await read_json(request, config.settings.gateway.max_body_bytes)
    if not isinstance(data, dict):
        raise InvalidBody("the body must be a JSON object")
    body = validate(PatchBody, data)
    if body.settings is not None:
        unknown = set(body.settings) - SETTINGS_KEYS
        if unknown:
            raise BadRequest(
                f"unknown setting(s) {sorted(unknown)}; allowed: {sorted(SETTINGS_KEYS)}", field="settings"
            )
        model = body.settings.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest("settings.model must be a string, or null", field="settings.model")
        problem = model_name_problem(model) if model is not None else None
        if problem is not None:
            raise BadRequest(f"settings.model: {problem} Or null for the default.", field="settings.model")
        if model is not None:
            body.settings["model"] = model.strip()  # as /model takes its argument
        mode = body.settings.get("queue_mode")
        if mode is not None and mode not in QUEUE_MODES:
            raise BadRequest(
                f"settings.queue_mode must be one of {', '.join(QUEUE_MODES)}, or null", field="settings.queue_mode"
            )
    store = request.app[K.STORE]
    store.require_entry(key.raw)
    change = EntryChange(
        pinned=body.pinned, label=body.label, clear_label="label" in data and body.label is None, settings=body.settings
    )
    await store.update_entry(key.raw, change)
    return json_response(describe(request, key.raw))


@routes.delete("/v1/sessions/{key}")
@op(
    "Complete the run and remove the entry; with `purge=true` erase the key for good",
    "sessions",
    "`purge=true` removes every run of the key (folders and archives), its history index rows, its rows in "
    "every table of tasks.db (idempotency and webhook delivery records, the OpenAI-compatible routes' "
    "conversations and response ids) and its sessions.json entry, and leaves a tombstone in tasks.db (key, time, "
    "counts; no content). A purge also works on a key whose entry is already gone but whose runs remain.",
    params=(history.PURGE,),
    answer=history.DELETED,
    errors=(*KEY_ERRORS, BadRequest),
)
async def delete_session(request: web.Request) -> web.Response:
    key = session_key(request)
    if history.PURGE.read(request):
        return await history.purge(request, key.raw)
    return json_response(await operations.delete_session(request.app[K.CONVERSATIONS], key.raw))


@routes.get("/v1/sessions/{key}/context")
@op("The context as the model will see it", "sessions", answer=CONTEXT, errors=KEY_ERRORS)
async def get_context(request: web.Request) -> web.Response:
    key = session_key(request)
    store = request.app[K.STORE]
    conv = request.app[K.CONVERSATIONS]
    entry = store.require_entry(key.raw)
    run = store.active_run(key.raw)
    agent = conv.agent(entry.agent_id)
    lines = await store.read_context(run) if run else []
    system = {"role": "system", "content": agent.system_prompt, "kind": "system_prompt"}
    overhead = conv.context_overhead(entry.agent_id)
    return json_response(
        {
            "session_key": key.raw,
            "run_id": run.run_id if run else None,
            "messages": [system, *lines],
            "tokens": (run.context_tokens if run else 0) + overhead,
            "threshold": compaction_threshold(conv.settings.compaction, agent.model),
        }
    )


async def _lifecycle(request: web.Request, action: str) -> web.Response:
    key = session_key(request)
    store = request.app[K.STORE]
    conv = request.app[K.CONVERSATIONS]
    store.require_entry(key.raw)
    if action == "stop":
        return json_response({"session_key": key.raw, "stopped": conv.stop_turn(key.raw)})
    error = None
    if action == "fail":
        config = request.app[K.CONFIG]
        body = await parse_body(request, FailBody, config.settings.gateway.max_body_bytes, optional=True)
        error = body.error
    if action in ("complete", "fail"):
        conv.stop_turn(key.raw)
    async with conv.exclusive(key.raw):
        conv.ensure_active(key.raw)
        if action == "pause":
            run = await store.pause(key.raw)
        elif action == "resume":
            run = await store.resume(key.raw)
        else:
            run, _ = await end_active_run(conv, key.raw, RunEnd(action, error=error))
    return json_response({"session_key": key.raw, "run_id": run.run_id, "status": run.status})


def _lifecycle_route(action: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        return await _lifecycle(request, action)

    handler.__name__ = f"{action}_session"
    fail = action == "fail"
    describe = op(
        "Lifecycle: fail the run" if fail else f"Lifecycle: {action}",
        "sessions",
        body=FailBody if fail else None,
        body_required=False,
        answer=STOPPED if action == "stop" else LIFECYCLE,
        errors=(*KEY_ERRORS, NoActiveRun),
    )
    routes.post(f"/v1/sessions/{{key}}/{action}")(describe(handler))


for _action in ("pause", "resume", "complete", "fail", "stop"):
    _lifecycle_route(_action)
