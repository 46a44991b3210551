"""Health, readiness, metrics and the event stream."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from config.errors import BadRequest, InvalidKey
from conversations.metrics import CONTENT_TYPE
from gateway import keys as K
from gateway.contract import STR, Answer, Param, operation
from gateway.http import json_response
from gateway.reload import RELOADS
from sessions.keys import parse_key

routes = web.RouteTableDef()
HEARTBEAT_S = 15.0
PROBE_EVERY_S = 1.0
HEALTH = Answer("Health", {"type": "object", "properties": {"status": {"const": "ok"}}})
READINESS = Answer(
    "Readiness",
    {
        "type": "object",
        "properties": {
            "ready": {"type": "boolean"},
            "leader": {
                "type": "boolean",
                "description": "with `storage.backend: postgres` only: whether this process leads (runs the daily "
                "and idle resets, cleanup, cron jobs and backups, and writes the memory index); one process of "
                "those sharing the database does, another takes over within seconds when it dies",
            },
            "checks": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "workers": {
                "type": "array",
                "description": "under `--workers N`: each worker's last status (`worker`, `pid`, `ready`, `leader`,"
                " `since`, `reloads`; `answering` false for one that wrote none in 5 s)",
                "items": {"type": "object", "required": ["worker", "answering"], "additionalProperties": True},
            },
            "leader_worker": {"type": ["integer", "null"], "description": "under `--workers N`: the worker that leads"},
            "problems": {
                "type": "object",
                "description": "why a check failed, e.g. `store_writable` on a full or read-only disk",
                "additionalProperties": {"type": "string"},
            },
        },
    },
)
EVENT_KEY = Param("key", "only events of this session key", schema=dict(STR))
LAST_EVENT_ID = Param("last_event_id", "resume after this event id", schema={"type": "integer"})
LAST_EVENT_ID_HEADER = Param("Last-Event-ID", "resume after this event id", "header", schema={"type": "integer"})


@routes.get("/healthz")
@operation("Liveness (after recovery)", "system", answer=HEALTH)
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@routes.get("/readyz")
@operation(
    "Readiness: store (and that it can write now), scheduler and memory index",
    "system",
    "`checks.store_writable` is false while a small file cannot be written and synced in contexts/ (a full "
    "or read-only disk); it turns true by itself once the disk can write. `checks.disk_budget` is false while "
    "free space is below `storage.min_free` (`problems.disk_budget` says how much is free). With the postgres "
    "backend, `leader` says whether this process runs the scheduled work (a follower is ready too). `/healthz` "
    "stays liveness only.",
    answer=READINESS,
    extra_answers=((503, READINESS, "not ready; `checks` says what is missing"),),
)
async def readyz(request: web.Request) -> web.Response:
    """Liveness is ``/healthz``; readiness adds that the store can write right now (a small file
    is written and synced in contexts/), so a full or read-only disk makes the gateway unready
    while it lasts, and ready again by itself once it can write."""
    checks: dict[str, bool] = request.app[K.READY].copy()
    problems: dict[str, str] = {}
    if K.SERVICES in request.app and checks.get("store"):
        low = request.app[K.SERVICES].disk_budget.check(fresh=True)
        checks["disk_budget"] = low is None
        if low is not None:
            problems["disk_budget"] = low
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
    leader = services.leader if services is not None else None
    if leader is not None and leader.shared:
        body["leader"] = leader.leading
    if problems:
        body["problems"] = problems
    fleet = request.app[RELOADS].fleet if RELOADS in request.app else None
    if fleet is not None:  # --workers N: every worker, whichever answers (gateway/fleet.py)
        workers = await asyncio.to_thread(fleet.statuses)
        body["workers"] = workers
        body["leader_worker"] = next((w["worker"] for w in workers if w.get("answering") and w.get("leader")), None)
    return json_response(body, status=200 if ready else 503)


@routes.get("/metrics")
@operation("Prometheus metrics", "system", answer=None, media="text/plain")
async def metrics(request: web.Request) -> web.Response:
    registry = request.app[K.METRICS]
    store = request.app[K.STORE]
    registry.active_sessions.set(sum(1 for _ in store.active_runs()))
    return web.Response(body=registry.render(), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/v1/events")
@operation(
    "Server-sent events",
    "system",
    "Events `message`, `reply`, `compaction`, `inheritance`, `reset`, `lifecycle`, `memory`; each `data:` is a "
    "JSON object with `type`, `key`, `run_id`, `at` and the event's fields; `id:` for `Last-Event-ID`; a "
    "heartbeat comment every 15 s. Also takes the token as `?access_token=`. `reset` comes from idle and daily "
    "resets and from `/reset` and `/new` (`reason: command`, `command`); `inheritance` carries the new run as "
    "`run_id` and the run it inherits from as `from_run_id`.",
    params=(EVENT_KEY, LAST_EVENT_ID, LAST_EVENT_ID_HEADER),
    answer=None,
    media="text/event-stream",
    errors=(BadRequest, InvalidKey),
)
async def events(request: web.Request) -> web.StreamResponse:
    hub = request.app[K.HUB]
    key = EVENT_KEY.raw(request) or None
    if key is not None:
        parse_key(key, agents=request.app[K.CONFIG].settings.agents)  # 400 invalid_key naming the rule
    raw_last = LAST_EVENT_ID_HEADER.raw(request) or LAST_EVENT_ID.raw(request)
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
