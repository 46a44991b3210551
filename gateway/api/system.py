"""Health, readiness, metrics and the event stream."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from config.errors import BadRequest
from gateway import keys as K
from gateway.http import json_response
from gateway.metrics import CONTENT_TYPE
from sessions.keys import parse_key

routes = web.RouteTableDef()
HEARTBEAT_S = 15.0
PROBE_EVERY_S = 1.0


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """Liveness is ``/healthz``; readiness adds that the store can write right now (a small file
    is written and synced in contexts/), so a full or read-only disk makes the gateway unready
    while it lasts, and ready again by itself once it can write."""
    checks: dict[str, bool] = request.app[K.READY].copy()
    problems: dict[str, str] = {}
    store = request.app.get(K.STORE) if checks.get("store") else None
    if store is not None:
        # a probe at most once a second while all is well (each one is a write and a sync);
        # at every call once an append has failed, so recovery shows at once
        problem = None if store.recently_writable(PROBE_EVERY_S) else await store.writable()
        checks["store_writable"] = problem is None
        if problem is not None:
            problems["store_writable"] = f"the store cannot write: {problem}"
    services = request.app.get(K.SERVICES)
    memory_ready = services.memory_ready if services is not None else None
    if memory_ready is not None:
        checks["memory"] = memory_ready
    ready = all(checks.values())
    body: dict[str, object] = {"ready": ready, "checks": checks}
    if problems:
        body["problems"] = problems
    return json_response(body, status=200 if ready else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    registry = request.app[K.METRICS]
    store = request.app[K.STORE]
    registry.active_sessions.set(sum(1 for _ in store.active_runs()))
    return web.Response(body=registry.render(), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/v1/events")
async def events(request: web.Request) -> web.StreamResponse:
    hub = request.app[K.HUB]
    key = request.query.get("key") or None
    if key is not None:
        parse_key(key, agents=request.app[K.CONFIG].settings.agents)  # 400 invalid_key naming the rule
    raw_last = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    last_id = None
    if raw_last:
        try:
            last_id = int(raw_last)
        except ValueError:
            raise BadRequest("Last-Event-ID must be an event id this stream sent", field="Last-Event-ID") from None
    heartbeat = HEARTBEAT_S
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    await response.write(b": connected\n\n")
    with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
        async for event in hub.subscribe(key=key, last_event_id=last_id, heartbeat_s=heartbeat):
            await response.write(b": heartbeat\n\n" if event is None else event.encode())
    return response
