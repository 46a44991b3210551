"""The application factory: middlewares, routes, and one cleanup context that opens the object
graph of the composition root (``gateway/services.py``) and closes it in reverse order. Nothing is
done at import."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial

from aiohttp import web
from aiohttp.typedefs import Middleware

from config.clock import Clock, system_clock
from config.loader import LoadedConfig
from gateway import keys as K
from gateway import log_json, reload
from gateway.api import admin, channels, docs, history, hooks, memory, runs, scheduler, sessions, system, ui, usage
from gateway.api import backup as backup_routes
from gateway.api import config_reload as reload_routes
from gateway.api import logs as log_routes
from gateway.connections import GUARD, ConnectionGuard, GuardedProtocol
from gateway.hosts import allowed_hosts, host_check
from gateway.http import BODY_TIMEOUT, REQUEST_ID, Handler, error_answer, new_request_id
from gateway.openai_compat import routes as openai_routes
from gateway.openai_compat.errors import is_compat, openai_errors_middleware
from gateway.reload import LiveAuth
from gateway.services import open_services


def create_app(
    config: LoadedConfig,
    *,
    clock: Clock = system_clock,
    env: Mapping[str, str] | None = None,
) -> web.Application:
    """Build the gateway. ``env`` is the process environment read once at start (API keys)."""
    settings = config.settings
    guard = ConnectionGuard(
        max_connections=settings.gateway.max_connections,
        header_timeout_s=settings.gateway.header_timeout_s,
        max_body_reads_per_peer=settings.gateway.max_body_reads_per_peer,
    )
    auth = LiveAuth(settings.gateway.tokens)  # gateway.tokens may change on a config reload
    app = web.Application(
        middlewares=[front_middleware(guard, host_check(allowed_hosts(settings.gateway)), auth)],
        client_max_size=settings.gateway.max_body_bytes,
    )
    app[K.CONFIG] = config
    app[GUARD] = guard
    app[BODY_TIMEOUT] = settings.gateway.body_timeout_s
    app[K.CLOCK] = clock
    app[K.ENV] = dict(env or {})
    app[K.READY] = {"store": False}
    app[K.REINDEX] = {}
    app[K.PARSED_KEYS] = {}
    reload.install(app, config, env or {}, clock, auth)
    app.cleanup_ctx.append(_services_context)
    app.on_response_prepare.append(_request_id_header)
    app.on_shutdown.append(_stop_turns)
    app.on_shutdown.append(_close_streams)
    for table in (
        system.routes,
        sessions.routes,
        runs.routes,
        docs.routes,
        hooks.routes,
        admin.routes,
        scheduler.routes,
        memory.routes,
        history.routes,
        ui.routes,
        openai_routes.routes,
        channels.routes,
        usage.routes,
        log_routes.routes,
        backup_routes.routes,
        reload_routes.routes,
    ):
        app.router.add_routes(table)
    return app


Check = Callable[[web.Request], None]


def front_middleware(guard: ConnectionGuard, check_host: Check | None, check_auth: Check | None) -> Middleware:
    """What every request goes through, in this order, as one coroutine (five stacked middlewares
    cost a coroutine frame and an await each, per request): the connection guard marks the
    connection busy; the request id; errors become the gateway's error body (on the OpenAI routes,
    ``openai_errors_middleware`` gives them OpenAI's shape first); the ``Host`` allow-list; bearer
    auth; the peer's count of bodies still arriving; the handler."""
    checks = [check for check in (check_host, check_auth) if check is not None]

    def admit(request: web.Request, conn: GuardedProtocol | None) -> None:
        for check in checks:
            check(request)
        guard.body_read(conn, request)

    async def admitted(request: web.Request, handler: Handler, conn: GuardedProtocol | None) -> web.StreamResponse:
        admit(request, conn)
        return await handler(request)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = guard.enter(request)
        try:
            request_id = new_request_id(request)
            log_json.REQUEST_ID.set(request_id)
            try:
                if is_compat(request.path):
                    response = await openai_errors_middleware(request, partial(admitted, handler=handler, conn=conn))
                else:
                    admit(request, conn)
                    response = await handler(request)
            except Exception as exc:
                return error_answer(request, request_id, exc)
            response.headers.setdefault("X-Request-Id", request_id)
            return response
        finally:
            log_json.clear()  # the connection's next request runs in this same task
            if conn is not None:
                guard.leave(conn)

    return middleware


async def _request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer carries ``X-Request-Id``, streams and errors too (before their headers go)."""
    request_id = request.get(REQUEST_ID)
    if request_id is not None:
        response.headers.setdefault("X-Request-Id", request_id)


async def _services_context(app: web.Application) -> AsyncIterator[None]:
    """The object graph of ``gateway/services.py``, opened and closed in its order; the routes
    reach its parts through the app keys set here."""
    async with open_services(app[K.CONFIG], env=app[K.ENV], clock=app[K.CLOCK]) as services:
        app[K.SERVICES] = services
        app[K.STORE] = services.store
        app[K.HUB] = services.hub
        app[K.METRICS] = services.metrics
        app[K.CONVERSATIONS] = services.conversations
        app[K.COMMANDS] = services.commands
        app[K.WEBHOOKS] = services.webhooks
        app[K.COMPAT] = services.compat
        app[K.CHANNELS] = services.channels
        app[K.SCHEDULING] = services.scheduling
        app[K.SCHEDULER] = services.scheduler
        if services.memory is not None:
            app[K.MEMORY] = services.memory
        if services.history is not None:
            app[K.HISTORY] = services.history
        app[K.READY]["store"] = True
        app[K.READY]["scheduler"] = True
        try:
            yield
        finally:
            app[K.READY]["store"] = False
            app[K.READY]["scheduler"] = False


async def _stop_turns(app: web.Application) -> None:
    """Runs once the sites stopped accepting, before the runner waits for in-flight requests:
    running turns are stopped and their callers answered, so nothing waits for a model."""
    if K.SERVICES in app:
        await app[K.SERVICES].conversations.shutdown()


async def _close_streams(app: web.Application) -> None:
    if K.SERVICES in app:
        app[K.SERVICES].hub.close()
