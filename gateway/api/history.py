"""Conversation history: search (``GET /v1/history/search``), export of sessions and runs
(JSON Lines or Markdown, streamed), purge. The index itself is built and fed by the composition
root (``gateway/services.py``)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterator

from aiohttp import web

from config.errors import BadRequest, HistoryDisabled, InvalidKey, RunNotFound, SessionNotFound
from gateway import keys as K
from gateway.contract import (
    AGENT,
    CURSOR,
    NULLABLE_STR,
    STR,
    Answer,
    ChoiceParam,
    FlagParam,
    IntParam,
    Param,
    operation,
)
from gateway.http import json_response
from gateway.keys import HISTORY
from sessions.export_lines import ExportFormat, export_lines
from sessions.exports import RunExport
from sessions.history_index import HistoryIndexProtocol, HistoryQuery, time_bound
from sessions.history_text import match_expression
from sessions.keys import parse_key
from sessions.records import ROLES, RunQuery

log = logging.getLogger(__name__)
routes = web.RouteTableDef()
EXPORT_CHUNK_LINES = 256
Q = Param("q", "the words to find", required=True)
SEARCH_KEY = Param("key", "only this session key")
ROLE = ChoiceParam("role", "only this role", choices=ROLES)
SINCE = Param("since", "only messages at or after this ISO 8601 time")
UNTIL = Param("until", "only messages before this ISO 8601 time")
SEARCH_LIMIT = IntParam("limit", "page size, 1 to history.max_limit", default=20, low=1, high=None)
FORMAT = ChoiceParam("format", "jsonl (default) or md", choices=("jsonl", "md"), default="jsonl")
PURGE = FlagParam("purge", "erase everything of the key")
HISTORY_SEARCH = Answer(
    "HistorySearch",
    {
        "type": "object",
        "properties": {
            "query": STR,
            "next_cursor": NULLABLE_STR,
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "session_key": STR,
                        "run_id": STR,
                        "seq": {"type": "integer"},
                        "role": STR,
                        "timestamp": NULLABLE_STR,
                        "snippet": {"type": "string", "description": "HTML-escaped, matches in <mark>"},
                        "score": {"type": "number", "description": "BM25, higher is better"},
                        "agent_id": NULLABLE_STR,
                        "tool_result": {"type": "boolean"},
                        "link": {"type": "string", "description": "the console page of the message"},
                    },
                },
            },
        },
    },
)
DELETED = Answer(
    "Deleted",
    {
        "type": "object",
        "properties": {
            "session_key": STR,
            "deleted": {"const": True},
            "completed_run_id": NULLABLE_STR,
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
)


def history_of(app: web.Application) -> HistoryIndexProtocol | None:
    return app.get(HISTORY)


def require_history(request: web.Request) -> HistoryIndexProtocol:
    history = history_of(request.app)
    if history is None:
        raise HistoryDisabled("the history index is off (history.enabled: false)")
    return history


def _when(request: web.Request, param: Param) -> str | None:
    return time_bound(param.name, param.raw(request))


def _cursor(raw: str | None) -> int:
    if not raw:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))["o"]
        if isinstance(offset, int) and offset >= 0:
            return offset
    except (ValueError, TypeError, KeyError):
        pass
    raise BadRequest("'cursor' is not one this API returned; start again without it", field="cursor")


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def parse_query(request: web.Request) -> HistoryQuery:
    """The search parameters of a request, validated (nothing is searched on a bad one)."""
    settings = request.app[K.CONFIG].settings
    q = Q.text(request) or ""
    if match_expression(q) is None:
        raise BadRequest("query parameter 'q' is required: words to search for", field="q")
    agent = AGENT.raw(request) or None
    if agent is not None and agent not in settings.agents:
        raise BadRequest(f"agent {agent!r} is not configured", field="agent")
    key = SEARCH_KEY.raw(request) or None
    if key is not None:
        key = parse_key(key, agents=settings.agents).raw
    role = ROLE.read(request)
    since, until = _when(request, SINCE), _when(request, UNTIL)
    limit = SEARCH_LIMIT.read(request, high=settings.history.max_limit)
    offset = _cursor(CURSOR.raw(request))
    return HistoryQuery(q=q, agent=agent, key=key, role=role, since=since, until=until, limit=limit, offset=offset)


@routes.get("/v1/history/search")
@operation(
    "Full-text search over every message of every run",
    "history",
    "SQLite FTS5 over active, completed and archived runs (`contexts/history.db`); Latin words are stemmed, "
    "Japanese/Chinese/Korean text matches by character bigrams. Every word must match. Commands are not "
    "indexed; tool results are, marked `tool_result: true`. Best first (BM25; a query matching over 1,000 "
    "messages ranks its newest 300 by term frequency); `snippet` is HTML-escaped text "
    "with each match in `<mark>`; `link` opens the message in the console.",
    params=(Q, AGENT, SEARCH_KEY, ROLE, SINCE, UNTIL, SEARCH_LIMIT, CURSOR),
    answer=HISTORY_SEARCH,
    errors=(BadRequest, InvalidKey, HistoryDisabled),
)
async def search(request: web.Request) -> web.Response:
    query = parse_query(request)
    history = require_history(request)
    hits = await history.search(HistoryQuery(**{**query.__dict__, "limit": query.limit + 1}))
    page = hits[: query.limit]
    next_cursor = encode_cursor(query.offset + query.limit) if len(hits) > query.limit else None
    return json_response({"query": query.q, "results": [h.as_dict() for h in page], "next_cursor": next_cursor})


# -- export ---------------------------------------------------------------------------------------


def export_format(request: web.Request) -> ExportFormat:
    return "md" if FORMAT.read(request) == "md" else "jsonl"


def _take(lines: Iterator[str], count: int) -> str:
    out = []
    for line in lines:
        out.append(line)
        if len(out) >= count:
            break
    return "".join(out)


async def stream_export(
    request: web.Request, runs: list[RunExport], fmt: ExportFormat, *, title: str, filename: str
) -> web.StreamResponse:
    """Lines are produced on a thread, a few hundred at a time, and written as they come."""
    media = "text/markdown" if fmt == "md" else "application/x-ndjson"
    response = web.StreamResponse(
        headers={
            "Content-Type": f"{media}; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{filename}.{fmt}"',
        }
    )
    await response.prepare(request)
    lines = export_lines(runs, fmt, title=title)
    while chunk := await asyncio.to_thread(_take, lines, EXPORT_CHUNK_LINES):
        await response.write(chunk.encode("utf-8"))
    await response.write_eof()
    return response


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:120]


@routes.get("/v1/sessions/{key}/export")
@operation(
    "Export every run of a key (streamed)",
    "history",
    "JSON Lines (`type`: `run`, `message`, `compaction`, `uncompact`, `final_summary`) or Markdown, oldest run "
    "first, archived runs included; commands, tool calls and results, summaries and compaction markers kept."
    " The same bytes on either storage backend for the same runs.",
    params=(FORMAT,),
    answer=None,
    media="application/x-ndjson",
    errors=(BadRequest, InvalidKey, SessionNotFound),
)
async def export_session(request: web.Request) -> web.StreamResponse:
    settings = request.app[K.CONFIG].settings
    key = parse_key(request.match_info["key"], agents=settings.agents).raw
    fmt = export_format(request)
    runs = await request.app[K.STORE].export_runs(key=key)
    return await stream_export(request, runs, fmt, title=f"Session {key}", filename=_safe_name(key))


@routes.get("/v1/runs/{uuid}/export")
@operation(
    "Export one run (streamed)",
    "history",
    "As `GET /v1/sessions/{key}/export`, for one run (archived runs too).",
    params=(FORMAT,),
    answer=None,
    media="application/x-ndjson",
    errors=(BadRequest, RunNotFound),
)
async def export_run(request: web.Request) -> web.StreamResponse:
    fmt = export_format(request)
    (run,) = await request.app[K.STORE].export_runs(run_id=request.match_info["uuid"])
    title = f"Run {run.row['uuid']} of {run.row.get('session_key')}"
    return await stream_export(request, [run], fmt, title=title, filename=run.row["uuid"])


# -- purge ----------------------------------------------------------------------------------------


async def purge(request: web.Request, key: str) -> web.Response:
    """``DELETE /v1/sessions/{key}?purge=true``: stop its turn, then erase it under its locks
    (the OpenAI-compatible routes' too, which then forget the key's conversation); the events
    hub's replay buffer forgets the key's events."""
    conv = request.app[K.CONVERSATIONS]
    store = request.app[K.STORE]
    conv.stop_turn(key)
    async with request.app[K.COMPAT].erasing(key):
        conv.stop_turn(key)  # a turn that started while an OpenAI call held the key
        async with conv.exclusive(key):
            runs = await store.list_runs(RunQuery(session_key=key, limit=1_000_000))
            tombstone = await store.purge(key, history=history_of(request.app))
            await request.app[K.SERVICES].forget_transcripts(runs)
            request.app[K.HUB].forget(key)
    return json_response({"session_key": key, "deleted": True, "purged": True, "tombstone": tombstone})
