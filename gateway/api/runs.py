"""Runs in tasks.db and their stores (archived runs too)."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Mapping
from typing import Any, TypeVar, get_args

from aiohttp import web
from pydantic import BaseModel, Field

from config.errors import BadRequest, FinalSummaryNotFound, RunNotActive
from gateway import keys as K
from gateway.contract import (
    CURSOR,
    LIMIT,
    OBJ,
    STR,
    Answer,
    ChoiceParam,
    IntParam,
    Param,
    operation,
    page,
    typed,
)
from gateway.http import Strict, json_response, parse_body
from sessions.protocol import RecordKind
from sessions.records import RUN_STATUSES, RunQuery, RunRow, RunState, ToolUse

routes = web.RouteTableDef()
B = TypeVar("B", bound=BaseModel)
RUN_KEY = Param("key", "session key")
RUN_STATUS = ChoiceParam("status", "run statuses", choices=RUN_STATUSES, many=True)
AFTER_SEQ = IntParam("after_seq", "messages after this seq", default=0, low=0, high=2**62)
PAGE = IntParam("limit", "page size", default=100, low=1, high=1000)
RUN = typed(
    "Run",
    RunRow,
    replace={
        "pinned": {"type": "boolean"},
        "metadata": {"description": "the run's metadata (JSON text when it is not an object)"},
    },
    add={"archived": {"type": "boolean"}},
    required=("uuid", "status", "created_at"),
)
RUN_LIST = page("RunList", "runs", RUN)
RUN_MESSAGES = Answer(
    "RunMessages",
    {
        "type": "object",
        "properties": {
            "run_id": STR,
            "messages": {"type": "array", "items": OBJ},
            "next_after_seq": {"type": ["integer", "null"]},
        },
    },
)
RUN_RECORDS = Answer(
    "RunRecords",
    {"type": "object", "properties": {"run_id": STR}, "additionalProperties": {"type": "array", "items": OBJ}},
)
FINAL_SUMMARY = Answer(
    "FinalSummary", {"type": "object", "properties": {"run_id": STR, "status": STR, "final_summary": STR}}
)


class ToolBody(Strict):
    tool_name: str = Field(min_length=1, max_length=200)
    arguments: Any = None
    result: Any = None
    error: str | None = None


class PlanBody(Strict):
    plan_type: str = Field(min_length=1, max_length=64)
    plan_content: str = Field(min_length=1)


def run_body(row: Mapping[str, Any]) -> dict[str, Any]:
    body = dict(row)
    body["pinned"] = bool(body.get("pinned"))
    if isinstance(body.get("metadata"), str):
        with contextlib.suppress(ValueError):
            body["metadata"] = json.loads(body["metadata"])
    body["archived"] = body.get("archived_at") is not None
    return body


@routes.get("/v1/runs")
@operation(
    "List runs (archived ones too)",
    "runs",
    answer=RUN_LIST,
    errors=(BadRequest,),
    params=(RUN_KEY, RUN_STATUS, LIMIT, CURSOR),
)
async def list_runs(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    limit = LIMIT.read(request)
    statuses = RUN_STATUS.read_many(request)
    before = None
    if cursor := CURSOR.raw(request):
        try:
            at, uuid = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            before = (str(at), str(uuid))
        except (ValueError, TypeError):
            raise BadRequest("'cursor' is not one this API returned", field="cursor") from None
    rows = await store.list_runs(RunQuery(RUN_KEY.raw(request) or None, tuple(statuses), limit + 1, before))
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = base64.urlsafe_b64encode(json.dumps([last["created_at"], last["uuid"]]).encode())
    return json_response(
        {"runs": [run_body(r) for r in page], "next_cursor": next_cursor.decode().rstrip("=") if next_cursor else None}
    )


@routes.get("/v1/runs/{uuid}")
@operation("A run's ledger row", "runs", answer=RUN)
async def get_run(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    row = await store.require_run(request.match_info["uuid"])
    return json_response(run_body(row))


@routes.get("/v1/runs/{uuid}/messages")
@operation("A run's messages, by seq", "runs", answer=RUN_MESSAGES, errors=(BadRequest,), params=(AFTER_SEQ, PAGE))
async def run_messages(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    after = AFTER_SEQ.read(request)
    limit = PAGE.read(request)
    run_id = request.match_info["uuid"]
    records = await store.read_messages(run_id, after_seq=after, limit=limit + 1)
    page = records[:limit]
    return json_response(
        {
            "run_id": run_id,
            "messages": page,
            "next_after_seq": page[-1]["seq"] if len(records) > limit else None,
        }
    )


def _store_route(path: RecordKind) -> None:
    async def handler(request: web.Request) -> web.Response:
        records = await request.app[K.STORE].read_records(request.match_info["uuid"], path)
        return json_response({"run_id": request.match_info["uuid"], path: records})

    handler.__name__ = f"run_{path}"
    describe = operation(f"A run's {path} records", "runs", answer=RUN_RECORDS)
    routes.get(f"/v1/runs/{{uuid}}/{path}")(describe(handler))


for _path in get_args(RecordKind):
    _store_route(_path)


@routes.get("/v1/runs/{uuid}/final-summary")
@operation("A completed run's final summary", "runs", answer=FINAL_SUMMARY, errors=(FinalSummaryNotFound,))
async def run_final_summary(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    row = await store.require_run(request.match_info["uuid"])
    text = await store.read_final_summary(row["uuid"])
    if text is None:
        raise FinalSummaryNotFound(
            f"run {row['uuid']} has no final summary (status {row['status']}); runs get one when they complete",
        )
    return json_response({"run_id": row["uuid"], "status": row["status"], "final_summary": text})


async def _on_active_run(request: web.Request, model: type[B]) -> tuple[RunState, B]:
    """A record's body and the active run it goes to: a run that does not exist is 404, a body
    that does not fit 400, a run that is no longer active 409 ``run_not_active``."""
    store = request.app[K.STORE]
    run_id = request.match_info["uuid"]
    await store.require_run(run_id)
    body = await parse_body(request, model, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    run = store.run_state(run_id)
    if run is None:
        raise RunNotActive(f"run {run_id} is not active; tool calls and plans are recorded on active runs")
    return run, body


@routes.post("/v1/runs/{uuid}/tools")
@operation("Record a tool call", "runs", body=ToolBody, status=201, errors=(RunNotActive,))
async def record_tool(request: web.Request) -> web.Response:
    run, body = await _on_active_run(request, ToolBody)
    record = await request.app[K.STORE].record_tool(
        run, ToolUse(tool_name=body.tool_name, arguments=body.arguments, result=body.result, error=body.error)
    )
    return json_response(record, status=201)


@routes.post("/v1/runs/{uuid}/planning")
@operation("Record a plan", "runs", body=PlanBody, status=201, errors=(RunNotActive,))
async def record_plan(request: web.Request) -> web.Response:
    run, body = await _on_active_run(request, PlanBody)
    record = await request.app[K.STORE].record_plan(run, plan_type=body.plan_type, plan_content=body.plan_content)
    return json_response(record, status=201)
