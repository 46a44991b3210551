"""Live reload of the configuration (SIGHUP, ``POST /v1/admin/config/reload``, ``neotask config
reload``): the file is read again with the environment the daemon started with and checked as at
start; an invalid file changes nothing and the answer says what is wrong.

What changes in place, without a restart or a dropped connection: agents and their models (a
changed model gets a new client; the old one is closed at shutdown, so a turn using it finishes),
bindings, ``gateway.tokens`` (not emptied), session and reset policies, compaction, inheritance,
cleanup, cron jobs and backup schedule (rescheduled; running firings finish), hooks, memory search
and recall, channels (only the connectors of changed accounts restarted; turns in progress go on).
Keys under ``RESTART`` keep their running value and are named in the answer's ``restart_required``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from config.clock import Clock, iso
from config.errors import BadRequest, ConfigError
from config.loader import LoadedConfig, load_config
from config.settings import Settings
from conversations.fallbacks import ModelChain, load_provider_sdk
from gateway import keys as K
from gateway.fleet import Fleet
from gateway.http import auth_check
from gateway.reload_swap import counterparts, swap

log = logging.getLogger(__name__)

# Keys whose new value needs a restart: the listening socket, storage, logging, the history index,
# the memory index's identity and watcher, values sized at start.
RESTART = (
    "gateway.",
    "storage.",
    "logging.",
    "history.",
    "memory.uri",
    "memory.embedding",
    "memory.watch",
    "memory.sources",
    "memory.scope",
    "memory.chunk_tokens",
    "memory.overlap_tokens",
    "memory.extra_paths",
    "channels.outbox",
    "scheduler.reset_concurrency",
)
LIVE_EXCEPTIONS = ("gateway.tokens",)


class ConfigRejected(BadRequest):
    code = "config_rejected"
    doc = "the reloaded configuration is invalid: nothing changed; fix the key the message names and reload again"


class LiveAuth:
    """Bearer auth whose tokens a reload may change (``gateway.tokens``)."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self.check: Callable[[web.Request], None] | None = None
        self.set(tokens)

    def set(self, tokens: tuple[str, ...]) -> None:
        self.check = auth_check(tokens)

    def __call__(self, request: web.Request) -> None:
        if self.check is not None:
            self.check(request)


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted path: value}`` of a settings dump, lists and empty mappings as leaves."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(leaves(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}


def needs_restart(path: str) -> bool:
    if any(path == live or path.startswith(live + ".") for live in LIVE_EXCEPTIONS):
        return False
    return any(path == key or path.startswith(key if key.endswith(".") else key + ".") for key in RESTART)


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


def in_force(old: Settings, new: Settings) -> tuple[Settings, list[str], list[str]]:
    """The settings to run with (``new`` but the keys that need a restart, kept as they run),
    the live paths that change, and the restart paths that would."""
    before, after = leaves(old.model_dump(mode="python")), leaves(new.model_dump(mode="python"))
    changed = sorted(p for p in set(before) | set(after) if before.get(p, ...) != after.get(p, ...))
    restart = [p for p in changed if needs_restart(p)]
    if old.gateway.tokens and not new.gateway.tokens:
        restart.append("gateway.tokens")  # emptied: the address and Host checks were chosen with tokens
    live = [p for p in changed if p not in restart]
    if not restart:
        return new, live, restart
    data = new.model_dump(mode="python")
    for path in restart:
        if path in before:
            _set(data, path, before[path])
    return Settings.model_validate(data), live, restart


@dataclass
class Reloads:
    """What is in force and since when; the daemon's one reloader (``RELOADS``)."""

    config: LoadedConfig
    env: dict[str, str]
    clock: Clock
    auth: LiveAuth
    since: datetime
    count: int = 0
    last: dict[str, Any] | None = None
    retired: list[ModelChain] = field(default_factory=list)
    fleet: Fleet | None = None  # a worker of ``--workers N``: a reload through the API reaches them all
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def read(self) -> LoadedConfig:
        """The file again, with the start's environment (blocking); ``ConfigRejected``."""
        from gateway.validation import check_config

        explicit = self.config.config_path
        default = self.config.home / "config.yaml"
        try:
            config = load_config(
                env=self.env, home=self.config.home, config_path=explicit if explicit not in (None, default) else None
            )
            check_config(config, self.env)
        except ConfigError as exc:
            raise ConfigRejected(f"the configuration was not reloaded, nothing changed: {exc.message}") from exc
        return config

    async def reload(self, app: web.Application, *, trigger: str) -> dict[str, Any]:
        async with self._lock:
            try:
                loaded = await asyncio.to_thread(self.read)
            except ConfigRejected as exc:
                log.error("config reload (%s) refused: %s", trigger, exc.message)
                raise
            config = self.config
            settings, live, restart = in_force(config.settings, loaded.settings)
            if live:
                await self._apply(app, config, settings, live)
            answer = {
                "reloaded": bool(live),
                "trigger": trigger,
                "changed": live,
                "restart_required": restart,
                "since": iso(self.since),
                "config_path": str(config.config_path) if config.config_path else None,
            }
            self.last = {**answer, "at": iso(self.clock())}
            log.info(
                "config reload (%s): %d change(s) in force%s%s",
                trigger,
                len(live),
                f" ({', '.join(live[:8])}{'...' if len(live) > 8 else ''})" if live else "",
                f"; needs a restart: {', '.join(restart)}" if restart else "",
            )
            return answer

    async def reload_all(self, app: web.Application) -> dict[str, Any]:
        """The API's reload: this process, then (a worker) every other worker of the fleet, whose
        outcomes the answer lists under ``workers``."""
        answer = await self.reload(app, trigger="api")
        if self.fleet is None:
            return answer
        own = {"worker": self.fleet.index, "pid": os.getpid(), **answer}
        return {**answer, "workers": [own, *await self.fleet.reload_others()]}

    async def _apply(self, app: web.Application, config: LoadedConfig, settings: Settings, live: list[str]) -> None:
        """Put ``settings`` in force. The app's state is frozen once it runs (aiohttp), so the
        objects the routes hold stay and change inside: ``LoadedConfig`` (one object everywhere)
        gets the new settings, every reference to the old settings is moved (``swap``), the
        channel intake is rebuilt in place."""
        services = app[K.SERVICES]
        old = config.settings
        fresh: dict[str, ModelChain] = {}
        if any(agent.model.base_url for agent in settings.agents.values()):
            await load_provider_sdk()  # the first model of a reload: its SDK loads beside the serving loop
        for agent_id, agent in settings.agents.items():  # built before anything changes: may fail
            before = old.agents.get(agent_id)
            same = before is not None and before.model == agent.model and agent_id in services.providers
            if agent.model.base_url and not same:
                fresh[agent_id] = ModelChain(agent.model, env=self.env, clock=self.clock)
        parts = counterparts(old, settings)
        # From here to the end of the swap nothing awaits: no request sees half the change.
        for agent_id in list(services.providers):
            if agent_id not in settings.agents or not settings.agents[agent_id].model.base_url or agent_id in fresh:
                self.retired.append(services.providers.pop(agent_id))
        services.providers.update(fresh)
        object.__setattr__(config, "settings", settings)  # frozen dataclass: the one shared instance
        swapped = swap([services], parts)
        services.conversations.refresh_compactors()  # new agents, and the summarizer of a changed model
        self.auth.set(settings.gateway.tokens)
        self.since = self.clock()
        self.count += 1
        log.debug("config reload: %d reference(s) moved to the new settings", swapped)
        from gateway.services import scheduler_service

        scheduler = services.scheduler
        rebuilt = scheduler_service(
            config, services.scheduling, services.host_zone, self.clock, backups=services.backups
        )
        rescheduled = scheduler.adopt(rebuilt)
        if rescheduled:
            log.info("config reload: jobs rescheduled: %s", ", ".join(rescheduled))
        if any(path.startswith("channels.") for path in live):  # bindings: read by the intake at each message
            restarted = await services.channels.reconfigure(old.channels)
            if restarted:
                log.info("config reload: channel accounts restarted: %s", ", ".join(restarted))

    async def close(self) -> None:
        retired, self.retired = self.retired, []
        for provider in retired:
            await provider.close()


RELOADS = web.AppKey("reloads", Reloads)


def install(app: web.Application, config: LoadedConfig, env: Mapping[str, str], clock: Clock, auth: LiveAuth) -> None:
    """The reloader of a gateway app, changing ``auth`` (the bearer check its middleware runs)."""
    reloads = Reloads(config=config, env=dict(env), clock=clock, auth=auth, since=clock())
    app[RELOADS] = reloads

    async def close(app: web.Application) -> None:
        await reloads.close()

    app.on_cleanup.append(close)


async def on_hangup(app: web.Application) -> None:
    """SIGHUP: reload, log the outcome (a bad file is logged, and nothing changes)."""
    reloads = app[RELOADS]
    outcome: dict[str, Any]
    if K.SERVICES not in app or not app[K.READY].get("store") or app[K.SERVICES].conversations.closing:
        log.warning("SIGHUP during start-up or shutdown: the configuration is not reloaded now")
        outcome = {"error": "starting up or shutting down: the configuration was not reloaded"}
    else:
        try:
            outcome = await reloads.reload(app, trigger="SIGHUP")
        except ConfigRejected as exc:  # logged by reload: nothing changed
            outcome = {"error": exc.message}
    if reloads.fleet is not None:  # the worker that asked for it waits for this
        await asyncio.to_thread(reloads.fleet.note, outcome)
