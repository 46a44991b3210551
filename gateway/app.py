"""The application factory. Every resource opens and closes in a cleanup context, torn down in
reverse order: the session store (recovery at open), then the model providers and the
conversation engine. Nothing is done at import."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from config.clock import Clock, system_clock
from config.loader import LoadedConfig
from gateway import keys as K
from gateway.api import admin, docs, history, hooks, memory, runs, scheduler, sessions, system, ui
from gateway.commands import Commands
from gateway.connections import GUARD, ConnectionGuard
from gateway.events import EventHub
from gateway.hosts import allowed_hosts, host_middleware
from gateway.http import BODY_TIMEOUT, auth_middleware, errors_middleware
from gateway.metrics import Metrics
from gateway.openai_compat import routes as openai_routes
from gateway.openai_compat.errors import openai_errors_middleware
from gateway.provider import ChatProvider
from gateway.turns import Conversations
from sessions.store import SessionStore

log = logging.getLogger(__name__)


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
    app[K.HUB] = EventHub()
    app[K.METRICS] = Metrics()
    app[K.READY] = {"store": False}
    app[K.EXTRAS] = {}
    app.cleanup_ctx.append(_store_context)
    app.cleanup_ctx.append(_conversation_context)
    app.cleanup_ctx.append(history.history_context)
    app.cleanup_ctx.append(openai_routes.compat_context)
    app.cleanup_ctx.append(hooks.hooks_context)
    app.cleanup_ctx.append(memory.memory_context)
    app.cleanup_ctx.append(scheduler.scheduler_context)
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


async def _store_context(app: web.Application) -> AsyncIterator[None]:
    config = app[K.CONFIG]
    store = await SessionStore.open(config.home, config.settings, clock=app[K.CLOCK])
    app[K.STORE] = store
    store.listeners.append(app[K.HUB].publish)
    app[K.READY]["store"] = True
    try:
        yield
    finally:
        app[K.READY]["store"] = False
        await store.close()


async def _conversation_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[K.CONFIG].settings
    env = app[K.ENV]
    providers = {
        agent_id: ChatProvider(agent.model, api_key=env.get(agent.model.api_key_env))
        for agent_id, agent in settings.agents.items()
        if agent.model.base_url
    }
    conversations = Conversations(
        app[K.STORE], settings, providers=providers, hub=app[K.HUB], metrics=app[K.METRICS], clock=app[K.CLOCK]
    )
    app[K.CONVERSATIONS] = conversations
    app[K.COMMANDS] = Commands(conversations)
    if not providers:
        log.info("no model configured: running in store-only mode")
    try:
        yield
    finally:
        for provider in providers.values():
            await provider.close()


async def _stop_turns(app: web.Application) -> None:
    """Runs once the sites stopped accepting, before the runner waits for in-flight requests:
    running turns are stopped and their callers answered, so nothing waits for a model."""
    if K.CONVERSATIONS in app:
        await app[K.CONVERSATIONS].shutdown()


async def _close_streams(app: web.Application) -> None:
    app[K.HUB].close()
