"""The application factory: middlewares, routes, and one cleanup context that opens the object
graph of the composition root (``gateway/services.py``) and closes it in reverse order. Nothing is
done at import."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from config.clock import Clock, system_clock
from config.loader import LoadedConfig
from gateway import keys as K
from gateway.api import admin, docs, history, hooks, memory, runs, scheduler, sessions, system, ui
from gateway.connections import GUARD, ConnectionGuard
from gateway.hosts import allowed_hosts, host_middleware
from gateway.http import BODY_TIMEOUT, auth_middleware, errors_middleware
from gateway.openai_compat import routes as openai_routes
from gateway.openai_compat.errors import openai_errors_middleware
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
        max_connections=settings.gateway.max_connections, header_timeout_s=settings.gateway.header_timeout_s
    )
    app = web.Application(
        middlewares=[
            guard.middleware(),
            errors_middleware,
            openai_errors_middleware,
            host_middleware(allowed_hosts(settings.gateway)),
            auth_middleware(settings.gateway.tokens),
        ],
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
    app.cleanup_ctx.append(_services_context)
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
    ):
        app.router.add_routes(table)
    return app


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
