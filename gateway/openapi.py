"""The OpenAPI 3.1 document of the gateway (``GET /openapi.json``).

The path list comes from the app's router when the document is built, so it can never miss a
registered route; a hand-written table (``OPERATIONS``) adds summaries, bodies, query parameters,
answers and error codes. A registered route with no entry in the table is still listed, with a
generic description and ``x-undescribed: true``. Request bodies are the routes' own pydantic
models, so the document and the validation cannot drift apart.
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from pydantic import BaseModel

from gateway.api.runs import PlanBody, ToolBody
from gateway.api.sessions import CommandBody, FailBody, IngressBody, MessageBody, PatchBody
from gateway.http import _needs_token as needs_token

Schema = dict[str, Any]

# Every error code an HTTP answer can carry, with its status. tests/gateway/test_openapi.py checks
# that each one is produced somewhere in the code base, and that the code base produces no other.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_body": (400, "invalid JSON, invalid UTF-8, a wrong content type, or not a JSON object"),
    "invalid_field": (400, "a missing, unknown or wrong field or query parameter; `error.field` names it"),
    "invalid_key": (400, "the session key breaks a rule of SPEC section 1; `error.rule` names it"),
    "unauthorized": (401, "missing or wrong bearer token (only when `gateway.tokens` is set)"),
    "invalid_signature": (
        401,
        "a missing, wrong or stale webhook signature (`X-Hub-Signature-256`, or Standard"
        " Webhooks `webhook-signature` with `webhook-timestamp` outside the hook's tolerance_s)",
    ),
    "host_not_allowed": (403, "the `Host` header is not a loopback name nor in `gateway.allowed_hosts` (no tokens)"),
    "not_found": (404, "no such route"),
    "hook_not_found": (404, "no webhook with this name under `hooks:`"),
    "session_not_found": (404, "no session with this key"),
    "run_not_found": (404, "no run with this uuid (or its folder is gone)"),
    "final_summary_not_found": (404, "the run has no final summary (yet)"),
    "unknown_agent": (404, "the agent is not configured"),
    "memory_file_not_found": (404, "no such memory file"),
    "job_not_found": (404, "no such scheduler job"),
    "model_not_found": (404, "OpenAI-compatible routes: `model` names no agent (GET /v1/models lists them)"),
    "response_not_found": (404, "`previous_response_id` names no stored response (or one made with `store: false`)"),
    "method_not_allowed": (405, "the path exists but not with this method; `Allow` lists the methods it takes"),
    "conflict": (409, "the request conflicts with the session's state"),
    "run_active": (409, "the session already has an active run"),
    "session_paused": (409, "the session is paused; resume it first"),
    "no_active_run": (409, "the session has no active run"),
    "run_closing": (409, "the run is completing; retry on the next run"),
    "run_not_active": (409, "tool calls and plans are recorded on active runs only"),
    "job_running": (409, "the job is already running"),
    "request_timeout": (408, "the request body did not arrive within `gateway.body_timeout_s`"),
    "response_not_latest": (409, "`previous_response_id` is not the latest response of its session (no forks)"),
    "payload_too_large": (413, "the body is larger than `gateway.max_body_bytes` (drained before the answer)"),
    "session_busy": (
        429,
        "more than `agents.<id>.max_queued_turns` calls would wait for a model turn on this key; the `Retry-After`"
        " header and `error.retry_after_s` say when to retry; nothing is stored",
    ),
    "internal_error": (500, "the gateway failed on this request; see its log"),
    "insufficient_storage": (
        507,
        "the disk is full: nothing was stored, nothing half written, no seq consumed; send again once space frees",
    ),
    "storage_unavailable": (503, "the store cannot write (read-only or refused): nothing was stored; send again later"),
    "provider_error": (502, "the model call failed; the message is stored (`error.message_seq`, `error.stored`)"),
    "turn_failed": (
        500,
        "the turn failed after the message was stored (a tool, compaction, the store): `error.stored` is true and"
        " `error.message_seq` its seq; do not send it again (a retry with the same `client_message_id` stores"
        " nothing new)",
    ),
    "unavailable": (503, "a resource the route needs is not ready"),
    "hook_secret_missing": (503, "the hook's `secret_env` is not set, so no signature can be checked"),
    "memory_not_ready": (503, "the memory index or embedding model is not ready yet"),
    "embedding_error": (503, "the embeddings endpoint failed"),
    "shutting_down": (
        503,
        "the gateway is shutting down: a new message is refused unstored; a waiting or running turn is stopped and"
        " its caller told `error.stored: true` with `error.message_seq`",
    ),
    "history_disabled": (503, "the history index is off (`history.enabled: false`)"),
}
BODY_ERRORS = ("invalid_body", "invalid_field", "payload_too_large", "request_timeout")
TURN_ERRORS = (
    "session_paused", "run_closing", "session_busy", "provider_error", "shutting_down", "insufficient_storage",
    "storage_unavailable", "turn_failed",
)  # fmt: skip
METHODS_OF_ANY = ("get", "post", "put", "patch", "delete")
QUEUE_MODES_DOC = (
    "Turns on one key run one at a time; what a message that arrives while a turn runs gets depends on the queue "
    "mode (`settings.queue_mode` of the session, else `agents.<id>.queue_mode`, else `session.queue.mode`): "
    "`collect` (default): the messages that waited are answered together by one turn once the running turn ends, "
    "and every one of those calls answers that same `reply` with its own `message_seq`; `followup`: one turn per "
    "message, each seeing the context only up to its own message; `steer`: the message joins the running turn (its "
    "next model call, after a tool round, sees it) and the call answers that turn's `reply`; when the turn has no "
    "further model call, the message gets a turn of its own."
)


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    schema: Schema
    where: str = "query"
    required: bool = False


@dataclass(frozen=True)
class Op:
    """What the table says about one method on one path."""

    summary: str
    tag: str
    description: str = ""
    # a model, "module:Model" for a route module imported only when its route is registered, or a schema
    body: type[BaseModel] | str | Schema | None = None
    body_required: bool = True
    params: tuple[Param, ...] = ()
    status: int = 200
    answer: str | None = "Object"  # a components/schemas name; None: no JSON body
    media: str = "application/json"
    streams: bool = False  # `stream: true` in the body answers server-sent events instead
    errors: tuple[str, ...] = ()
    extra_answers: tuple[tuple[int, str, str], ...] = ()  # (status, schema name, description)


def _int(low: int, high: int, default: int) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high, "default": default}


STR: Schema = {"type": "string"}
LIMIT = Param("limit", "page size", _int(1, 500, 50))
CURSOR = Param("cursor", "`next_cursor` of the previous page (opaque)", STR)
AGENT = Param("agent", "agent id", STR)
IDEMPOTENCY = Param(
    "Idempotency-Key", "same as `client_message_id` (1 to 200 characters)", {"type": "string", "maxLength": 200},
    where="header",
)
KEY_ERRORS = ("invalid_key", "session_not_found")
OPENAI_SESSION = Param(
    "X-Neotask-Session-Key", "the session key to post into (else `user`, else a one-off run)", STR, where="header"
)
OPENAI_ERRORS = ("not_found", "model_not_found", "invalid_key")

OPERATIONS: dict[tuple[str, str], Op] = {
    ("GET", "/healthz"): Op("Liveness (after recovery)", "system", answer="Health"),
    ("GET", "/readyz"): Op(
        "Readiness: store (and that it can write now), scheduler and memory index",
        "system",
        "`checks.store_writable` is false while a small file cannot be written and synced in contexts/ (a full "
        "or read-only disk); it turns true by itself once the disk can write. `/healthz` stays liveness only.",
        answer="Readiness",
        extra_answers=((503, "Readiness", "not ready; `checks` says what is missing"),),
    ),
    ("GET", "/metrics"): Op("Prometheus metrics", "system", answer=None, media="text/plain"),
    ("GET", "/openapi.json"): Op("This document", "system"),
    ("GET", "/v1/events"): Op(
        "Server-sent events",
        "system",
        "Events `message`, `reply`, `compaction`, `inheritance`, `reset`, `lifecycle`, `memory`; each `data:` is a "
        "JSON object with `type`, `key`, `run_id`, `at` and the event's fields; `id:` for `Last-Event-ID`; a "
        "heartbeat comment every 15 s. Also takes the token as `?access_token=`. `reset` comes from idle and daily "
        "resets and from `/reset` and `/new` (`reason: command`, `command`); `inheritance` carries the new run as "
        "`run_id` and the run it inherits from as `from_run_id`.",
        params=(
            Param("key", "only events of this session key", STR),
            Param("last_event_id", "resume after this event id", {"type": "integer"}),
            Param("Last-Event-ID", "resume after this event id", {"type": "integer"}, where="header"),
        ),
        answer=None,
        media="text/event-stream",
        errors=("invalid_field", "invalid_key"),
    ),
    ("POST", "/v1/messages"): Op(
        "Channel ingress",
        "sessions",
        "Routed to a session key by `session.dm_scope` and `bindings` (SPEC section 1).",
        body=IngressBody,
        params=(IDEMPOTENCY,),
        answer="MessageAnswer",
        streams=True,
        errors=("invalid_key", *TURN_ERRORS),
    ),
    ("POST", "/v1/sessions/{key}/messages"): Op(
        "Post a message to a key",
        "sessions",
        "A user message gets a model reply when a model is configured and `reply` is not false; a message starting "
        "with `/` is a chat command. " + QUEUE_MODES_DOC,
        body=MessageBody,
        params=(IDEMPOTENCY,),
        answer="MessageAnswer",
        streams=True,
        errors=("invalid_key", *TURN_ERRORS),
    ),
    ("POST", "/v1/sessions/{key}/commands"): Op(
        "Run a chat command",
        "sessions",
        "The command's answer is in `reply.content`, in store-only mode too.",
        body=CommandBody,
        params=(IDEMPOTENCY,),
        answer="MessageAnswer",
        errors=("invalid_key", "no_active_run", *TURN_ERRORS),
    ),
    ("GET", "/v1/sessions"): Op(
        "List sessions, newest interaction first",
        "sessions",
        answer="SessionList",
        errors=("invalid_field",),
        params=(
            AGENT,
            Param("type", "chat type", {"enum": ["direct", "group", "channel", "cron", "hook"]}),
            Param("status", "entry status", {"enum": ["running", "paused", "idle"]}),
            LIMIT,
            CURSOR,
        ),
    ),
    ("GET", "/v1/sessions/{key}"): Op("A session", "sessions", answer="Session", errors=KEY_ERRORS),
    ("PATCH", "/v1/sessions/{key}"): Op(
        "Pin, label or set per-session settings",
        "sessions",
        "`settings` takes `model` (the model override) and `queue_mode` (`collect`, `followup` or `steer`); null "
        "clears a setting.",
        body=PatchBody,
        answer="Session",
        errors=KEY_ERRORS,
    ),
    ("DELETE", "/v1/sessions/{key}"): Op(
        "Complete the run and remove the entry; with `purge=true` erase the key for good",
        "sessions",
        "`purge=true` removes every run of the key (folders and archives), its history index rows, idempotency "
        "and webhook delivery records and its sessions.json entry, and leaves a tombstone in tasks.db (key, time, "
        "counts; no content). A purge also works on a key whose entry is already gone but whose runs remain.",
        params=(Param("purge", "erase everything of the key", {"type": "boolean", "default": False}),),
        answer="Deleted",
        errors=(*KEY_ERRORS, "invalid_field"),
    ),
    ("GET", "/v1/sessions/{key}/export"): Op(
        "Export every run of a key (streamed)",
        "history",
        "JSON Lines (`type`: `run`, `message`, `compaction`, `uncompact`, `final_summary`) or Markdown, oldest run "
        "first, archived runs included; commands, tool calls and results, summaries and compaction markers kept.",
        params=(Param("format", "jsonl (default) or md", {"enum": ["jsonl", "md"], "default": "jsonl"}),),
        answer=None,
        media="application/x-ndjson",
        errors=("invalid_field", *KEY_ERRORS),
    ),
    ("GET", "/v1/runs/{uuid}/export"): Op(
        "Export one run (streamed)",
        "history",
        "As `GET /v1/sessions/{key}/export`, for one run (archived runs too).",
        params=(Param("format", "jsonl (default) or md", {"enum": ["jsonl", "md"], "default": "jsonl"}),),
        answer=None,
        media="application/x-ndjson",
        errors=("invalid_field",),
    ),
    ("GET", "/v1/history/search"): Op(
        "Full-text search over every message of every run",
        "history",
        "SQLite FTS5 over active, completed and archived runs (`contexts/history.db`); Latin words are stemmed, "
        "Japanese/Chinese/Korean text matches by character bigrams. Every word must match. Commands are not "
        "indexed; tool results are, marked `tool_result: true`. Best first (BM25; a query matching over 1,000 "
        "messages ranks its newest 300 by term frequency); `snippet` is HTML-escaped text "
        "with each match in `<mark>`; `link` opens the message in the console.",
        params=(
            Param("q", "the words to find", STR, required=True),
            AGENT,
            Param("key", "only this session key", STR),
            Param("role", "only this role", {"enum": ["user", "assistant", "tool", "system"]}),
            Param("since", "only messages at or after this ISO 8601 time", STR),
            Param("until", "only messages before this ISO 8601 time", STR),
            Param("limit", "page size, 1 to history.max_limit", _int(1, 1000, 20)),
            CURSOR,
        ),
        answer="HistorySearch",
        errors=("invalid_field", "invalid_key", "history_disabled"),
    ),
    ("GET", "/v1/sessions/{key}/context"): Op(
        "The context as the model will see it", "sessions", answer="Context", errors=KEY_ERRORS
    ),
    ("GET", "/v1/runs"): Op(
        "List runs (archived ones too)",
        "runs",
        answer="RunList",
        errors=("invalid_field",),
        params=(
            Param("key", "session key", STR),
            Param("status", "comma-separated: running, paused, completed, failed", STR),
            LIMIT,
            CURSOR,
        ),
    ),
    ("GET", "/v1/runs/{uuid}"): Op("A run's ledger row", "runs", answer="Run"),
    ("GET", "/v1/runs/{uuid}/messages"): Op(
        "A run's messages, by seq",
        "runs",
        answer="RunMessages",
        errors=("invalid_field",),
        params=(
            Param("after_seq", "messages after this seq", _int(0, 2**62, 0)),
            Param("limit", "page size", _int(1, 1000, 100)),
        ),
    ),
    ("GET", "/v1/runs/{uuid}/final-summary"): Op(
        "A completed run's final summary", "runs", answer="FinalSummary", errors=("final_summary_not_found",)
    ),
    ("POST", "/v1/runs/{uuid}/tools"): Op(
        "Record a tool call", "runs", body=ToolBody, status=201, errors=("run_not_active",)
    ),
    ("POST", "/v1/runs/{uuid}/planning"): Op(
        "Record a plan", "runs", body=PlanBody, status=201, errors=("run_not_active",)
    ),
    # Routes of later issues: described here so they are documented the day they are registered.
    ("POST", "/hooks/{name}"): Op(
        "Webhook",
        "hooks",
        "HMAC-SHA256 of the raw body in `X-Hub-Signature-256` with the hook's secret, or a Standard Webhooks "
        "timestamped signature (`webhook-id`, `webhook-timestamp` within the hook's `tolerance_s`, "
        "`webhook-signature`)."
        " Answers 202 once stored and runs the turn in the background; a repeated delivery id (`X-GitHub-Delivery` or "
        "`webhook-id`), or a signature seen before (a replay with the id dropped or changed), answers 200 `duplicate` "
        "without storing.",
        body={"description": "any JSON payload; the hook's templates read it"},
        status=202,
        answer="HookAnswer",
        params=(
            Param("X-Hub-Signature-256", "`sha256=<hex>` (required when the hook has a secret)", STR, where="header"),
            Param("X-GitHub-Delivery", "delivery id, for duplicates", STR, where="header"),
            Param("webhook-id", "Standard Webhooks delivery id (signed)", STR, where="header"),
            Param(
                "webhook-timestamp",
                "Standard Webhooks unix seconds (signed; within `tolerance_s`)",
                STR,
                where="header",
            ),
            Param("webhook-signature", "Standard Webhooks `v1,<base64>` entries, space-separated", STR, where="header"),
        ),
        errors=(
            "invalid_signature", "hook_not_found", "hook_secret_missing", "invalid_key", *TURN_ERRORS[:3],
            "insufficient_storage", "storage_unavailable",
        ),
        extra_answers=((200, "HookAnswer", "a duplicate delivery: `status: duplicate`, nothing stored"),),
    ),
    ("GET", "/v1/memory/search"): Op(
        "Hybrid memory search",
        "memory",
        answer="MemorySearch",
        params=(
            Param("q", "the query", STR, required=True),
            Param("agent", "agent id (default main)", STR),
            Param("k", "how many results, 1 to memory.search.candidates", {"type": "integer", "minimum": 1}),
        ),
        errors=("invalid_field", "memory_not_ready", "embedding_error"),
    ),
    ("GET", "/v1/memory/files"): Op("Memory files", "memory", params=(AGENT,), errors=("invalid_field",)),
    ("GET", "/v1/memory/files/{path}"): Op(
        "A memory file's text", "memory", params=(AGENT,), errors=("invalid_field", "memory_file_not_found")
    ),
    ("POST", "/v1/memory/reindex"): Op(
        "Reindex memory",
        "memory",
        body="gateway.api.memory:ReindexBody",
        body_required=False,
        errors=("memory_not_ready", "embedding_error"),
    ),
    ("GET", "/v1/memory/status"): Op("Memory index state", "memory"),
    ("GET", "/v1/scheduler/jobs"): Op("Scheduled jobs and their next run times", "scheduler"),
    ("POST", "/v1/scheduler/jobs/{job_id}/run"): Op(
        "Run a job now", "scheduler", errors=("job_not_found", "job_running", "payload_too_large")
    ),
    ("POST", "/v1/admin/cleanup"): Op(
        "Cleanup (answers the actions)", "admin", body="gateway.api.scheduler:CleanupBody", body_required=False
    ),
    ("POST", "/v1/admin/doctor"): Op(
        "Consistency checks (answers the actions)", "admin", body="gateway.api.admin:DoctorBody", body_required=False
    ),
    ("POST", "/v1/chat/completions"): Op(
        "OpenAI-compatible chat completions",
        "openai",
        "Off unless `gateway.openai_compat.enabled` (then 404 `not_found`). OpenAI's body and answer "
        "(`chat.completion`; with `stream: true` server-sent `chat.completion.chunk` events ending with "
        "`data: [DONE]`, and a usage chunk with `stream_options.include_usage`). The session: the "
        "`X-Neotask-Session-Key` header, else `user` (`agent:<id>:openai:dm:<user>`), else a one-off run. "
        "Only what is new in the resent history is stored; a diverged history starts a new run and answers "
        "`X-Neotask-New-Run: diverged`. Errors are OpenAI's shape (`message`, `type`, `code`, `param`) plus "
        "`request_id`. See docs/openai-compat.md.",
        body="gateway.openai_compat.bodies:ChatCompletionBody",
        params=(OPENAI_SESSION,),
        answer="ChatCompletion",
        errors=(*OPENAI_ERRORS, *TURN_ERRORS),
    ),
    ("POST", "/v1/responses"): Op(
        "OpenAI-compatible Responses",
        "openai",
        "Off unless `gateway.openai_compat.enabled`. `previous_response_id` continues the session of that "
        "response (each id maps to its session key and seq); `store: false` keeps no id; `stream: true` answers "
        "`response.*` server-sent events. Without `previous_response_id` the session is chosen as for chat "
        "completions, or a new one-off session.",
        body="gateway.openai_compat.bodies:ResponsesBody",
        params=(OPENAI_SESSION,),
        answer="OpenAIResponse",
        errors=(*OPENAI_ERRORS, "response_not_found", "response_not_latest", *TURN_ERRORS),
    ),
    ("GET", "/v1/models"): Op(
        "OpenAI-compatible model list: one `neotask/<agent id>` per agent",
        "openai",
        answer="ModelList",
        errors=("not_found",),
    ),
    ("GET", "/v1/models/{model}"): Op(
        "One OpenAI-compatible model (an agent)", "openai", answer="Model", errors=("not_found", "model_not_found")
    ),
    ("GET", "/ui"): Op("The web console", "ui", answer=None, media="text/html"),
    ("GET", "/ui/{file}"): Op(
        "The web console's scripts and styles (no token)", "ui", answer=None, media="*/*", errors=("not_found",)
    ),
}
for _action in ("pause", "resume", "complete", "stop"):
    OPERATIONS[("POST", f"/v1/sessions/{{key}}/{_action}")] = Op(
        f"Lifecycle: {_action}",
        "sessions",
        answer="Stopped" if _action == "stop" else "Lifecycle",
        errors=(*KEY_ERRORS, "no_active_run"),
    )
OPERATIONS[("POST", "/v1/sessions/{key}/fail")] = Op(
    "Lifecycle: fail the run",
    "sessions",
    body=FailBody,
    body_required=False,
    answer="Lifecycle",
    errors=(*KEY_ERRORS, "no_active_run"),
)
for _store in ("summaries", "tools", "planning"):
    OPERATIONS[("GET", f"/v1/runs/{{uuid}}/{_store}")] = Op(f"A run's {_store} records", "runs", answer="RunRecords")

PATH_PARAMS: dict[str, Param] = {
    "key": Param("key", "the session key as ONE percent-encoded segment (`:` as %3A, `/` as %2F)", STR, "path", True),
    "uuid": Param("uuid", "the run id", {"type": "string", "format": "uuid"}, "path", True),
    "job_id": Param("job_id", "a job id of GET /v1/scheduler/jobs", STR, "path", True),
}
PATH_ERRORS = {"key": ("invalid_key",), "uuid": ("run_not_found",)}


def route_list(routes: Iterable[web.AbstractRoute]) -> list[tuple[str, str, str]]:
    """(METHOD, path template, handler name) of every route, ``*`` spread over the usual methods."""
    out: list[tuple[str, str, str]] = []
    for route in routes:
        resource = route.resource
        if resource is None:
            continue
        path = resource.canonical
        if isinstance(resource, web.StaticResource):
            path = path.rstrip("/") + "/{filename}"
        name = getattr(route.handler, "__name__", "handler")
        methods = [m.upper() for m in METHODS_OF_ANY] if route.method == hdrs.METH_ANY else [route.method]
        out.extend((method, path, name) for method in methods)
    return out


def build(routes: Iterable[web.AbstractRoute], *, title: str = "Neotask gateway", version: str = "0.1.0") -> Schema:
    """The OpenAPI 3.1 document for these routes (``app.router.routes()``)."""
    components: Schema = {"schemas": dict(SCHEMAS), "securitySchemes": SECURITY_SCHEMES}
    paths: dict[str, dict[str, Any]] = {}
    seen_ids: set[str] = set()
    for method, path, name in sorted(route_list(routes), key=lambda r: (r[1], r[0] == "HEAD", r[0])):
        op = OPERATIONS.get(("GET" if method == "HEAD" else method, path))
        operation = _operation(method, path, op, components["schemas"])
        op_id = f"head_{name}" if method == "HEAD" else name
        while op_id in seen_ids:
            op_id += "_"
        seen_ids.add(op_id)
        operation["operationId"] = op_id
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": INFO},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": components,
    }


def _operation(method: str, path: str, op: Op | None, schemas: dict[str, Schema]) -> Schema:
    names = re.findall(r"{(\w+)(?::[^}]*)?}", path)
    described = op is not None
    if op is None:
        op = Op(
            f"{method} {path}",
            path.strip("/").split("/")[1 if path.startswith("/v1/") else 0] or "other",
            "Registered but not described yet: add it to OPERATIONS in gateway/openapi.py.",
            body={"type": "object"} if method in ("POST", "PUT", "PATCH") else None,
            body_required=False,
        )
    head = method == "HEAD"
    operation: Schema = {
        "summary": f"Headers of: {op.summary}" if head else op.summary,
        "tags": [op.tag],
    }
    if op.description:
        operation["description"] = op.description
    if not described:
        operation["x-undescribed"] = True
    params = [PATH_PARAMS.get(n, Param(n, n, STR, "path", True)) for n in names]
    params += list(op.params)
    if params:
        operation["parameters"] = [_param(p) for p in params]
    body = op.body if not head else None
    if body is not None:
        operation["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": _body(body, schemas)}},
        }
    errors = set(op.errors) | {"method_not_allowed", "internal_error", "host_not_allowed"}
    errors.update(c for n in names for c in PATH_ERRORS.get(n, ()))
    if body is not None:
        errors.update(BODY_ERRORS)
    if needs_token(path):
        errors.add("unauthorized")
        operation["security"] = (
            [{"bearerAuth": []}, {"accessToken": []}] if path == "/v1/events" else [{"bearerAuth": []}]
        )
    else:
        operation["security"] = []
    operation["responses"] = _responses(op, errors, head)
    return operation


def _param(p: Param) -> Schema:
    return {"name": p.name, "in": p.where, "required": p.required, "description": p.description, "schema": p.schema}


def _body(body: type[BaseModel] | str | Schema, schemas: dict[str, Schema]) -> Schema:
    if isinstance(body, dict):
        return body
    if isinstance(body, str):
        module, _, name = body.partition(":")
        body = getattr(importlib.import_module(module), name)
        assert isinstance(body, type) and issubclass(body, BaseModel), f"{module}:{name} is not a pydantic model"
    schema = copy.deepcopy(_model_schema(body))
    schemas.update(schema.pop("$defs", {}))
    schemas[body.__name__] = schema
    return {"$ref": f"#/components/schemas/{body.__name__}"}


@functools.cache
def _model_schema(model: type[BaseModel]) -> Schema:
    """Pydantic's schema generation is most of the build time, and a model never changes."""
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _responses(op: Op, errors: set[str], head: bool) -> Schema:
    ok: Schema = {"description": "success"}
    if op.answer is not None:
        ok["content"] = {"application/json": {"schema": _ref(op.answer)}}
    elif op.media != "application/json":
        ok["content"] = {op.media: {"schema": STR}}
    if op.streams:
        ok["description"] = "the answer; with `stream: true` server-sent events instead (see `StreamEvent`)"
        ok.setdefault("content", {})["text/event-stream"] = {"schema": _ref("StreamEvent")}
    responses: Schema = {str(op.status): ok}
    for status, name, description in op.extra_answers:
        responses[str(status)] = {"description": description, "content": {"application/json": {"schema": _ref(name)}}}
    by_status: dict[int, list[str]] = {}
    for code in sorted(errors):
        by_status.setdefault(ERROR_CODES[code][0], []).append(code)
    for status, codes in sorted(by_status.items()):
        if str(status) in responses:
            continue
        text = "; ".join(f"`{c}`: {ERROR_CODES[c][1]}" for c in codes)
        schema: Schema = {
            "allOf": [_ref("Error"), {"properties": {"error": {"properties": {"code": {"enum": codes}}}}}]
        }
        responses[str(status)] = {
            "description": text,
            "x-error-codes": codes,
            "content": {"application/json": {"schema": schema}},
        }
    if head:
        responses = {k: {"description": v["description"]} for k, v in responses.items()}
    return responses


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def error_codes(document: Mapping[str, Any]) -> set[str]:
    """Every error code the document mentions (for tests and clients)."""
    return {
        code
        for item in document["paths"].values()
        for operation in item.values()
        for response in operation["responses"].values()
        for code in response.get("x-error-codes", ())
    }


_OBJ: Schema = {"type": "object"}
_NULLABLE_STR: Schema = {"type": ["string", "null"]}
_USAGE: Schema = {
    "type": "object",
    "properties": {
        k: {"type": "integer"} for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    },
}
_MESSAGE_ANSWER: Schema = {
    "type": "object",
    "required": ["session_key", "run_id", "message_seq", "reply", "events", "usage"],
    "properties": {
        "session_key": STR,
        "run_id": _NULLABLE_STR,
        "message_seq": {"type": ["integer", "null"], "description": "messages.jsonl seq of the posted message"},
        "reply": {
            "description": "the model's answer, or a command's; with queue mode `collect` or `steer` several calls "
            "answer the same reply (same `seq`), each with its own `message_seq`",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["content", "seq"],
                    "properties": {"content": STR, "seq": {"type": "integer"}},
                },
                {"type": "null"},
            ],
        },
        "events": {"type": "array", "items": _OBJ},
        "usage": _USAGE,
    },
}
SCHEMAS: dict[str, Schema] = {
    "Object": _OBJ,
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "request_id"],
                "properties": {
                    "code": {"type": "string", "enum": sorted(ERROR_CODES)},
                    "message": {"type": "string", "description": "what was wrong and how to fix it"},
                    "request_id": STR,
                    "field": {"type": "string", "description": "invalid_field: the field"},
                    "rule": {"type": "string", "description": "invalid_key: the rule broken"},
                    "message_seq": {
                        "type": "integer",
                        "description": "provider_error, turn_failed, shutting_down: seq of the stored message",
                    },
                    "stored": {
                        "const": True,
                        "description": "provider_error, turn_failed, shutting_down: the message is stored",
                    },
                    "kind": {"type": "string", "description": "provider_error: the kind of failure"},
                    "retry_after_s": {"type": "number", "description": "session_busy: when to retry"},
                },
            }
        },
    },
    "MessageAnswer": _MESSAGE_ANSWER,
    "StreamEvent": {
        "type": "string",
        "description": '`event: delta` with `data: {"content": "..."}` per text delta, then one `event: final` whose '
        "data is a `MessageAnswer`; a failure after the stream started is an `event: error` with an `Error`.",
        "x-events": {
            "delta": {"type": "object", "properties": {"content": STR}},
            "final": _ref("MessageAnswer"),
            "error": _ref("Error"),
        },
    },
    "Health": {"type": "object", "properties": {"status": {"const": "ok"}}},
    "ChatCompletion": {
        "type": "object",
        "description": "OpenAI's `chat.completion`",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": STR,
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": STR,
            "choices": {"type": "array", "items": _OBJ},
            "usage": _OBJ,
        },
    },
    "OpenAIResponse": {
        "type": "object",
        "description": "OpenAI's Responses `response` object",
        "required": ["id", "object", "created_at", "status", "model", "output"],
        "properties": {
            "id": STR,
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": STR,
            "model": STR,
            "output": {"type": "array", "items": _OBJ},
            "previous_response_id": _NULLABLE_STR,
            "usage": {"oneOf": [_OBJ, {"type": "null"}]},
        },
    },
    "Model": {
        "type": "object",
        "properties": {"id": STR, "object": {"const": "model"}, "created": {"type": "integer"}, "owned_by": STR},
    },
    "ModelList": {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}},
    },
    "Readiness": {
        "type": "object",
        "properties": {
            "ready": {"type": "boolean"},
            "checks": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "problems": {
                "type": "object",
                "description": "why a check failed, e.g. `store_writable` on a full or read-only disk",
                "additionalProperties": {"type": "string"},
            },
        },
    },
    "Session": {
        "type": "object",
        "properties": {
            "key": STR,
            "agent_id": _NULLABLE_STR,
            "chat_type": STR,
            "status": STR,
            "run_id": _NULLABLE_STR,
            "pinned": {"type": "boolean"},
            "label": _NULLABLE_STR,
            "settings": _OBJ,
            "tokens": _OBJ,
            "threshold": {"type": "integer"},
            "compactions": {"type": "integer"},
            "next_reset": _NULLABLE_STR,
            "model": _NULLABLE_STR,
        },
    },
    "SessionList": {
        "type": "object",
        "properties": {"sessions": {"type": "array", "items": _ref("Session")}, "next_cursor": _NULLABLE_STR},
    },
    "Context": {
        "type": "object",
        "properties": {
            "session_key": STR,
            "run_id": _NULLABLE_STR,
            "messages": {"type": "array", "items": _OBJ},
            "tokens": {"type": "integer"},
            "threshold": {"type": "integer"},
        },
    },
    "Deleted": {
        "type": "object",
        "properties": {
            "session_key": STR,
            "deleted": {"const": True},
            "completed_run_id": _NULLABLE_STR,
            "purged": {"type": "boolean", "description": "present with `purge=true`"},
            "tombstone": {
                "type": "object",
                "properties": {
                    "session_key": STR,
                    "deleted_at": STR,
                    "runs": {"type": "integer"},
                    "messages": {"type": "integer"},
                },
            },
        },
    },
    "HistorySearch": {
        "type": "object",
        "properties": {
            "query": STR,
            "next_cursor": _NULLABLE_STR,
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "session_key": STR,
                        "run_id": STR,
                        "seq": {"type": "integer"},
                        "role": STR,
                        "timestamp": _NULLABLE_STR,
                        "snippet": {"type": "string", "description": "HTML-escaped, matches in <mark>"},
                        "score": {"type": "number", "description": "BM25, higher is better"},
                        "agent_id": _NULLABLE_STR,
                        "tool_result": {"type": "boolean"},
                        "link": {"type": "string", "description": "the console page of the message"},
                    },
                },
            },
        },
    },
    "Lifecycle": {"type": "object", "properties": {"session_key": STR, "run_id": STR, "status": STR}},
    "Stopped": {"type": "object", "properties": {"session_key": STR, "stopped": {"type": "boolean"}}},
    "Run": {
        "type": "object",
        "properties": {"uuid": STR, "status": STR, "pinned": {"type": "boolean"}, "archived": {"type": "boolean"}},
    },
    "RunList": {
        "type": "object",
        "properties": {"runs": {"type": "array", "items": _ref("Run")}, "next_cursor": _NULLABLE_STR},
    },
    "RunMessages": {
        "type": "object",
        "properties": {
            "run_id": STR,
            "messages": {"type": "array", "items": _OBJ},
            "next_after_seq": {"type": ["integer", "null"]},
        },
    },
    "RunRecords": {
        "type": "object",
        "properties": {"run_id": STR},
        "additionalProperties": {"type": "array", "items": _OBJ},
    },
    "FinalSummary": {"type": "object", "properties": {"run_id": STR, "status": STR, "final_summary": STR}},
    "HookAnswer": {
        "type": "object",
        "properties": {
            "status": {"enum": ["accepted", "duplicate"]},
            "session_key": STR,
            "run_id": _NULLABLE_STR,
            "message_seq": {"type": ["integer", "null"]},
            "delivery_id": STR,
        },
    },
    "MemorySearch": {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "path": STR,
                        "start_line": {"type": "integer"},
                        "end_line": {"type": "integer"},
                        "heading": _NULLABLE_STR,
                        "score": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1,
                            "description": "memory's one score, which orders the results (best first); with"
                            " memory.search.fusion `score` (default) absolute relevance, comparable across"
                            " queries: the weighted mean of `vector_score` and `text_score`, after recency"
                            " decay, so a weak match scores low even when it is the only result",
                        },
                        "vector_score": {"type": "number", "description": "cosine similarity clamped to [0, 1]"},
                        "text_score": {
                            "type": "number",
                            "description": "full-text strength BM25 / (BM25 + memory.search.text_saturation)",
                        },
                        "snippet": STR,
                        "citation": STR,
                    },
                },
            }
        },
    },
}
SECURITY_SCHEMES: Schema = {
    "bearerAuth": {"type": "http", "scheme": "bearer", "description": "one of `gateway.tokens`"},
    "accessToken": {"type": "apiKey", "in": "query", "name": "access_token", "description": "GET /v1/events only"},
}
INFO = (
    "The Neotask gateway API (SPEC section 8). Every error answers "
    '`{"error": {"code", "message", "request_id"}}`; each operation lists the codes it can return. '
    "When `gateway.tokens` is set, `/v1/*` and `/metrics` need `Authorization: Bearer <token>`; "
    "`/hooks/*`, `/healthz`, `/readyz`, `/openapi.json` and `/ui` do not. Any unknown path answers 404 "
    "`not_found`. A session key travels as one percent-encoded path segment (`/` as %2F)."
)
