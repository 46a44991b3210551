"""Memory routes (SPEC section 8): search, files, reindex, status."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from config.errors import BadRequest, EmbeddingError, MemoryFileNotFound, MemoryNotReady
from conversations.relevance import present
from gateway import keys as K
from gateway.contract import AGENT, NULLABLE_STR, STR, Answer, IntParam, Param, operation
from gateway.http import Strict, json_response, parse_body
from gateway.keys import MEMORY
from sessions.events import MemoryProgress

routes = web.RouteTableDef()
QUERY = Param("q", "the query", required=True)
MEMORY_AGENT = Param("agent", "agent id (default main)")
TOP_K = IntParam("k", "how many results, 1 to memory.search.candidates", default=None, low=1, high=None)
MEMORY_SEARCH = Answer(
    "MemorySearch",
    {
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
                        "heading": NULLABLE_STR,
                        "score": {
                            "type": "number",
                            "description": "memory's one score, which orders the results (best first); with"
                            " memory.search.fusion `score` (default) absolute relevance in [0, 1], comparable"
                            " across queries: the weighted mean of `vector_score` and `text_score`, after recency"
                            " decay, so a weak match scores low even when it is the only result; with `rrf` the"
                            " reciprocal rank fusion's value (orders, not comparable across queries)",
                        },
                        "vector_score": {"type": "number", "description": "cosine similarity clamped to [0, 1]"},
                        "text_score": {
                            "type": "number",
                            "description": "full-text strength in [0, 1]: the mean of the cube of the query's term"
                            " share the chunk holds and BM25³ / (BM25³ + memory.search.text_saturation³)",
                        },
                        "snippet": STR,
                        "citation": STR,
                    },
                },
            },
            "partial": {
                "type": "boolean",
                "description": "true while the index may miss what the memory files hold: before the first"
                " indexing pass has finished, and while a pass has chunks left to embed (a rebuild after a change"
                " of embedder, or new and changed files); GET /v1/memory/status `progress` says how far it is",
            },
            "serving": {
                "type": ["object", "null"],
                "description": "the index that answered: its embedder (`provider`, `model`); `vectors`: whether the"
                " query got a vector for it (false: its text side answered alone, `note` says why); `replacing`: while"
                " a rebuild for another embedder runs, that embedder (the old index answers, with query vectors of"
                " its own model, until the new one is complete), else null; null before any index exists",
            },
        },
    },
)


class ReindexBody(Strict):
    agent: str | None = None
    force: bool = False


def _agent(request: web.Request, param: Param = AGENT) -> str:
    agent = param.raw(request) or "main"
    if agent not in request.app[K.CONFIG].settings.agents:
        raise BadRequest(f"agent {agent!r} is not configured", field="agent")
    return agent


@routes.get("/v1/memory/search")
@operation(
    "Hybrid memory search",
    "memory",
    answer=MEMORY_SEARCH,
    params=(QUERY, MEMORY_AGENT, TOP_K),
    errors=(BadRequest, MemoryNotReady, EmbeddingError),
)
async def search(request: web.Request) -> web.Response:
    settings = request.app[K.CONFIG].settings
    query = QUERY.text(request) or ""
    if not query.strip():
        raise BadRequest("query parameter 'q' is required: the text to search for", field="q")
    k = TOP_K.read(request, high=settings.memory.search.candidates, default=settings.memory.search.top_k)
    hits = await request.app[MEMORY].search(_agent(request, MEMORY_AGENT), query, k=k)
    memory = request.app[MEMORY]
    return json_response(
        {
            "query": query,
            "results": [present(hit) for hit in hits],
            "partial": memory.partial,
            "serving": memory.serving(),
        }
    )


@routes.get("/v1/memory/files")
@operation("Memory files", "memory", params=(AGENT,), errors=(BadRequest,))
async def files(request: web.Request) -> web.Response:
    agent = _agent(request)
    found = await asyncio.to_thread(request.app[MEMORY].list_files, agent)  # walks the workspace
    return json_response({"agent": agent, "files": [f.as_dict() for f in found]})


@routes.get("/v1/memory/files/{path:.+}")
@operation("A memory file's text", "memory", params=(AGENT,), errors=(BadRequest, MemoryFileNotFound))
async def read_file(request: web.Request) -> web.Response:
    agent = _agent(request)
    path = request.match_info["path"]
    text = await asyncio.to_thread(request.app[MEMORY].read_file, agent, path)
    return json_response({"agent": agent, "path": path, "text": text})


@routes.post("/v1/memory/reindex")
@operation("Reindex memory", "memory", body=ReindexBody, body_required=False, errors=(MemoryNotReady, EmbeddingError))
async def reindex(request: web.Request) -> web.Response:
    limit = request.app[K.CONFIG].settings.gateway.max_body_bytes
    body = await parse_body(request, ReindexBody, limit, optional=True)
    if body.agent is not None and body.agent not in request.app[K.CONFIG].settings.agents:
        raise BadRequest(f"agent {body.agent!r} is not configured", field="agent")
    hub = request.app[K.HUB]
    state: dict[str, Any] = {"running": True, "agent": body.agent, "force": body.force, "done": 0, "total": None}
    request.app[K.REINDEX].update(state=state)  # GET /v1/memory/status shows it while this runs

    def progress(done: int, total: int) -> None:
        state.update(done=done, total=total)
        event: MemoryProgress = {"type": "memory", "key": None, "run_id": None, "action": "progress", "done": done,
                                 "total": total}  # fmt: skip
        hub.publish(event)

    try:
        report = await request.app[MEMORY].reindex(body.agent, force=body.force, progress=progress)
    finally:
        state["running"] = False
    return json_response({"report": report.as_dict(), "status": request.app[MEMORY].status()})


@routes.get("/v1/memory/status")
@operation("Memory index state", "memory")
async def status(request: web.Request) -> web.Response:
    reindex = request.app[K.REINDEX].get("state")
    return json_response({**request.app[MEMORY].status(), "reindex": dict(reindex) if reindex else None})
