"""Memory routes (SPEC section 8): search, files, reindex, status; and the memory cleanup context."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from config.clock import host_zone
from config.errors import BadRequest
from gateway import keys as K
from gateway.http import json_response, parse_body, query_int
from gateway.recall import MemoryBridge
from gateway.relevance import present
from gateway.transcript_memory import TranscriptSource
from memory import MemoryService

routes = web.RouteTableDef()
MEMORY = web.AppKey("memory", MemoryService)


class ReindexBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str | None = None
    force: bool = False


def workspaces(config: Any) -> dict[str, Path]:
    home: Path = config.home
    return {
        agent_id: Path(agent.workspace).expanduser() if agent.workspace else home / "workspaces" / agent_id
        for agent_id, agent in config.settings.agents.items()
    }


def memory_uri(config: Any) -> Path:
    uri = config.settings.memory.uri
    return Path(uri).expanduser() if uri else config.home / "memory.lance"


def _agent(request: web.Request) -> str:
    agent = request.query.get("agent") or "main"
    if agent not in request.app[K.CONFIG].settings.agents:
        raise BadRequest(f"agent {agent!r} is not configured", field="agent")
    return agent


@routes.get("/v1/memory/search")
async def search(request: web.Request) -> web.Response:
    settings = request.app[K.CONFIG].settings
    query = request.query.get("q", "")
    if not query.strip():
        raise BadRequest("query parameter 'q' is required: the text to search for", field="q")
    k = query_int(request, "k", settings.memory.search.top_k, low=1, high=settings.memory.search.candidates)
    hits = await request.app[MEMORY].search(_agent(request), query, k=k)
    return json_response({"query": query, "results": [present(hit) for hit in hits]})


@routes.get("/v1/memory/files")
async def files(request: web.Request) -> web.Response:
    agent = _agent(request)
    found = await asyncio.to_thread(request.app[MEMORY].list_files, agent)  # walks the workspace
    return json_response({"agent": agent, "files": [f.as_dict() for f in found]})


@routes.get("/v1/memory/files/{path:.+}")
async def read_file(request: web.Request) -> web.Response:
    agent = _agent(request)
    path = request.match_info["path"]
    text = await asyncio.to_thread(request.app[MEMORY].read_file, agent, path)
    return json_response({"agent": agent, "path": path, "text": text})


@routes.post("/v1/memory/reindex")
async def reindex(request: web.Request) -> web.Response:
    limit = request.app[K.CONFIG].settings.gateway.max_body_bytes
    body = await parse_body(request, ReindexBody, limit, optional=True)
    if body.agent is not None and body.agent not in request.app[K.CONFIG].settings.agents:
        raise BadRequest(f"agent {body.agent!r} is not configured", field="agent")
    hub = request.app[K.HUB]
    state: dict[str, Any] = {"running": True, "agent": body.agent, "force": body.force, "done": 0, "total": None}
    request.app[K.EXTRAS]["reindex"] = state  # GET /v1/memory/status shows it while this runs

    def progress(done: int, total: int) -> None:
        state.update(done=done, total=total)
        hub.publish({"type": "memory", "key": None, "run_id": None, "action": "progress", "done": done,
                     "total": total})  # fmt: skip

    try:
        report = await request.app[MEMORY].reindex(body.agent, force=body.force, progress=progress)
    finally:
        state["running"] = False
    return json_response({"report": report.as_dict(), "status": request.app[MEMORY].status()})


@routes.get("/v1/memory/status")
async def status(request: web.Request) -> web.Response:
    reindex = request.app[K.EXTRAS].get("reindex")
    return json_response({**request.app[MEMORY].status(), "reindex": dict(reindex) if reindex else None})


async def memory_context(app: web.Application) -> AsyncIterator[None]:
    config = app[K.CONFIG]
    env: dict[str, str] = app[K.ENV]
    service = MemoryService(
        config.settings.memory, workspaces(config), memory_uri(config), clock=app[K.CLOCK], env=env
    )
    await service.start()
    app[MEMORY] = service
    MemoryBridge(service, app[K.CONVERSATIONS], config.settings, host_zone=host_zone(env))
    app[K.EXTRAS]["memory_ready"] = lambda: service.ready
    transcripts = None
    if "sessions" in config.settings.memory.sources:
        transcripts = TranscriptSource(app[K.STORE], workspaces(config))
        app[K.EXTRAS]["transcripts"] = transcripts
    try:
        yield
    finally:
        if transcripts is not None:
            await transcripts.close()
        await service.close()
