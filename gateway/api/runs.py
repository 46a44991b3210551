"""Runs in tasks.db and their stores (archived runs too)."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from config.errors import BadRequest, Conflict, NotFound
from gateway import keys as K
from gateway.http import json_response, parse_body, query_int
from sessions import layout
from sessions.records import RUN_STATUSES

routes = web.RouteTableDef()
STATUSES = RUN_STATUSES
STORES = {"summaries": layout.SUMMARIES, "tools": layout.TOOLS, "planning": layout.PLANNING}


class ToolBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_name: str = Field(min_length=1, max_length=200)
    arguments: Any = None
    result: Any = None
    error: str | None = None


class PlanBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
async def list_runs(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    limit = query_int(request, "limit", 50, low=1, high=500)
    statuses = [s for s in request.query.get("status", "").split(",") if s]
    bad = [s for s in statuses if s not in STATUSES]
    if bad:
        raise BadRequest(f"'status' must be among {', '.join(STATUSES)}", field="status")
    before = None
    if cursor := request.query.get("cursor"):
        try:
            at, uuid = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            before = (str(at), str(uuid))
        except (ValueError, TypeError):
            raise BadRequest("'cursor' is not one this API returned", field="cursor") from None
    rows = await store.list_runs(
        session_key=request.query.get("key") or None, statuses=statuses, limit=limit + 1, before=before
    )
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = base64.urlsafe_b64encode(json.dumps([last["created_at"], last["uuid"]]).encode())
    return json_response(
        {"runs": [run_body(r) for r in page], "next_cursor": next_cursor.decode().rstrip("=") if next_cursor else None}
    )


@routes.get("/v1/runs/{uuid}")
async def get_run(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    row, _ = await store.locate_run(request.match_info["uuid"])
    return json_response(run_body(row))


async def _run_records(request: web.Request, name: str) -> list[dict[str, Any]]:
    store = request.app[K.STORE]
    reader = request.app[K.SERVICES].archives.records
    row, folder = await store.locate_run(request.match_info["uuid"])
    if folder is not None:
        return await store.read_store(folder, name)
    if row.get("archived_at"):
        records: list[dict[str, Any]] = await reader(row["uuid"], name)
        return records
    raise NotFound(f"run {row['uuid']} has no readable folder", code="run_not_found")


@routes.get("/v1/runs/{uuid}/messages")
async def run_messages(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    after = query_int(request, "after_seq", 0, low=0, high=2**62)
    limit = query_int(request, "limit", 100, low=1, high=1000)
    row, folder = await store.locate_run(request.match_info["uuid"])
    if folder is not None:
        records = await store.read_messages(folder, after_seq=after, limit=limit + 1)
    else:
        records = [r for r in await _run_records(request, layout.MESSAGES) if int(r.get("seq", 0)) > after]
        records = records[: limit + 1]
    page = records[:limit]
    return json_response(
        {
            "run_id": row["uuid"],
            "messages": page,
            "next_after_seq": page[-1]["seq"] if len(records) > limit else None,
        }
    )


def _store_route(path: str, name: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        records = await _run_records(request, name)
        return json_response({"run_id": request.match_info["uuid"], path: records})

    handler.__name__ = f"run_{path}"
    routes.get(f"/v1/runs/{{uuid}}/{path}")(handler)


for _path, _name in STORES.items():
    _store_route(_path, _name)


@routes.get("/v1/runs/{uuid}/final-summary")
async def run_final_summary(request: web.Request) -> web.Response:
    store = request.app[K.STORE]
    row, folder = await store.locate_run(request.match_info["uuid"])
    text: str | None = None
    if folder is not None:
        path = folder / layout.FINAL_SUMMARY
        text = await _read_text(path)
    else:
        if row.get("archived_at"):
            text = await request.app[K.SERVICES].archives.text(row["uuid"], layout.FINAL_SUMMARY)
    if text is None:
        raise NotFound(
            f"run {row['uuid']} has no final summary (status {row['status']}); runs get one when they complete",
            code="final_summary_not_found",
        )
    return json_response({"run_id": row["uuid"], "status": row["status"], "final_summary": text})


async def _read_text(path: Any) -> str | None:
    import asyncio

    def _read() -> str | None:
        try:
            return str(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    return await asyncio.to_thread(_read)


def _active_run(request: web.Request) -> Any:
    store = request.app[K.STORE]
    run = store.run_state(request.match_info["uuid"])
    if run is None:
        raise Conflict(
            f"run {request.match_info['uuid']} is not active; tool calls and plans are recorded on active runs",
            code="run_not_active",
        )
    return run


@routes.post("/v1/runs/{uuid}/tools")
async def record_tool(request: web.Request) -> web.Response:
    config = request.app[K.CONFIG]
    store = request.app[K.STORE]
    await store.locate_run(request.match_info["uuid"])
    body = await parse_body(request, ToolBody, config.settings.gateway.max_body_bytes)
    run = _active_run(request)
    record = await store.record_tool(
        run, tool_name=body.tool_name, arguments=body.arguments, result=body.result, error=body.error
    )
    return json_response(record, status=201)


@routes.post("/v1/runs/{uuid}/planning")
async def record_plan(request: web.Request) -> web.Response:
    config = request.app[K.CONFIG]
    store = request.app[K.STORE]
    await store.locate_run(request.match_info["uuid"])
    body = await parse_body(request, PlanBody, config.settings.gateway.max_body_bytes)
    run = _active_run(request)
    record = await store.record_plan(run, plan_type=body.plan_type, plan_content=body.plan_content)
    return json_response(record, status=201)
