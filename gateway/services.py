"""The composition root: the one place that builds the gateway's objects and connects their hooks.

``open_services(config, env=..., clock=...)`` builds, from the settings, the process environment
and a clock, in this order (closed in the reverse order):

    event hub, metrics, model providers
    history index (contexts/history.db)            when history.enabled
    session store (recovery)                       hooks: final summary, event listeners, durable appends
    tool box, Conversations, Commands              hooks: resets on arrival, auto-recall, archive reader
    memory service, recall bridge, memory tools    when Parts.memory
    transcript source                              when memory.sources has ``sessions``
    session tools                                  when an agent enables them
    deliverer (HTTP client), webhooks, OpenAI-compatible service
    chat connectors and their outbox (channels/, <home>/channels.db)   started when Parts.channels
    Scheduling (resets, cleanup, cron), SchedulerService (APScheduler: started only with Parts.timers)
    LeaderWork (gateway/leading.py): with timers, the jobs and memory indexing run on the leader only

The daemon (``gateway/app.py``) opens it in one cleanup context; the offline CLI
(``gateway/offline.py``) opens the same graph under the home lock with ``Parts(timers=False)``, so
a reset, a compaction or a cron job run without a daemon goes through the same objects (final
summary, memory flush, memory tools, delivery). Hooks are declared in ``conversations/hooks.py``; they
are connected here and nowhere else. A hook that names an object built later (Conversations'
``before_post`` is ``Scheduling.check_on_arrival``) is a closure over this function's locals, called only once
everything is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp

from channels.delivery import Deliverer, Delivery
from channels.hooks import Webhooks
from channels.intake import ChannelIntake
from channels.registry import load_sdks
from channels.store import ChannelStore
from config.clock import Clock, host_zone, system_clock
from config.loader import LoadedConfig
from config.redaction import SECRETS
from conversations.budgets import Budgets
from conversations.commands import Commands
from conversations.events import EventHub
from conversations.fallbacks import ModelChain, load_provider_sdk
from conversations.hooks import CommandHooks, ConversationHooks, Event, SchedulingHooks
from conversations.housekeeping import Scheduling
from conversations.memory_scope import scope_of_raw
from conversations.metrics import Metrics
from conversations.posts import ReplyBody
from conversations.recall import MemoryBridge
from conversations.session_tools import SessionTools
from conversations.tools import ToolBox
from conversations.transcript_memory import TranscriptSource
from conversations.turns import Conversations, Post
from gateway.backups import Backups
from gateway.crashpoints import CRASH_ENV, crash_step, openai_crash_step
from gateway.disk_budget import DiskBudget
from gateway.leading import LeaderWork
from gateway.openai_compat.service import OpenAICompat
from gateway.places import memory_uri, workspaces
from gateway.validation import check_config
from memory import MemoryService
from scheduler.jobs import DailyJob
from scheduler.service import SchedulerService
from sessions.backends import open_leadership, open_store
from sessions.events import StoreEvent
from sessions.history_index import HistoryIndexProtocol
from sessions.protocol import SharedEvents, StoreProtocol
from sessions.records import MessageRecord, RunRow, RunState
from sessions.resets import daily_boundaries
from sessions.store_hooks import StoreHooks

log = logging.getLogger(__name__)
DELIVERY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Parts:
    """What to build besides the core. ``memory``: the memory index, auto-recall and the memory
    tools; ``timers``: APScheduler's jobs, the start-up reset sweep and the history index rebuilt
    in the background (without timers, the offline CLI, the index is brought level before use)."""

    memory: bool = True
    timers: bool = True
    channels: bool | None = None  # run the chat connectors; None: with the timers (the daemon)


def memory_service(
    config: LoadedConfig, env: Mapping[str, str], clock: Clock, *, background: bool = True
) -> MemoryService:
    """The memory index as the daemon builds it (the offline ``memory`` commands open only this);
    ``background`` false: no indexing in the background, the model loaded only for a search."""
    return MemoryService(
        config.settings.memory, workspaces(config), memory_uri(config), clock=clock, env=env, background=background
    )


@dataclass
class Services:
    """Everything the daemon and the CLI work with, built by :func:`open_services`."""

    config: LoadedConfig
    env: dict[str, str]
    clock: Clock
    host_zone: ZoneInfo
    hub: EventHub
    metrics: Metrics
    providers: dict[str, ModelChain]
    store: StoreProtocol
    history: HistoryIndexProtocol | None
    conversations: Conversations
    commands: Commands
    memory: MemoryService | None
    transcripts: TranscriptSource | None
    deliverer: Deliverer
    webhooks: Webhooks
    compat: OpenAICompat
    channels: ChannelIntake
    scheduling: Scheduling
    scheduler: SchedulerService
    disk_budget: DiskBudget
    backups: Backups
    leader: LeaderWork | None = None  # None without timers (the offline CLI)

    @property
    def memory_ready(self) -> bool | None:
        return None if self.memory is None else self.memory.ready

    async def forget_transcripts(self, runs: Sequence[RunRow]) -> None:
        """The memory notes of purged runs (rows of tasks.db) go with them."""
        if self.transcripts is None:
            return
        for agent_id in {r.get("agent_id") for r in runs}:
            await self.transcripts.forget(agent_id, [r["uuid"] for r in runs if r.get("agent_id") == agent_id])


def providers_for(config: LoadedConfig, env: Mapping[str, str], clock: Clock = system_clock) -> dict[str, ModelChain]:
    """Each agent's model and its fallbacks (``conversations/fallbacks.py``)."""
    return {
        agent_id: ModelChain(agent.model, env=env, clock=clock)
        for agent_id, agent in config.settings.agents.items()
        if agent.model.base_url
    }


@contextlib.asynccontextmanager
async def open_services(
    config: LoadedConfig,
    *,
    env: Mapping[str, str] | None = None,
    clock: Clock = system_clock,
    parts: Parts | None = None,
) -> AsyncIterator[Services]:
    """Build and start the object graph; close it in the reverse order on the way out. The caller
    holds the home lock (the daemon's, or the CLI's own)."""
    parts = parts or Parts()
    env = dict(env or {})
    settings = config.settings
    for warning in check_config(config, env):
        log.warning("%s", warning)
    zone = host_zone(env)
    async with contextlib.AsyncExitStack() as stack:
        hub = EventHub()
        metrics = Metrics()
        SECRETS.add([*settings.gateway.tokens, *(env.get(a.model.api_key_env) for a in settings.agents.values())])
        if any(agent.model.base_url for agent in settings.agents.values()):
            await load_provider_sdk()  # in a thread: the loop runs on (0.4 s of CPU, more on a busy machine)
        providers = providers_for(config, env, clock)
        stack.push_async_callback(_close_providers, providers)

        # Hooks naming objects built further down: called only once open_services has yielded.
        history: HistoryIndexProtocol | None = None
        transcripts: TranscriptSource | None = None
        bridge: MemoryBridge | None = None
        scheduling: Scheduling | None = None
        conversations: Conversations | None = None
        leader: LeaderWork | None = None

        def on_event(event: StoreEvent) -> None:  # not the store's recovery at open: from the graph on
            if conversations is None:
                return
            hub.publish(event)
            if transcripts is not None:
                transcripts.on_event(event)

        def feed(run: RunState, record: MessageRecord) -> None:
            if history is not None and conversations is not None:
                history.feed(run.run_id, run.key, run.agent_id, record)

        async def resets_due(post: Post) -> list[Event]:
            return [] if scheduling is None else await scheduling.check_on_arrival(post)

        async def recall(run: RunState, post: Post, new_run: bool) -> list[Event]:
            return [] if bridge is None else await bridge.recall(run, post, new_run)

        async def budget_check(post: Post) -> list[Event]:  # before anything is stored
            if conversations is not None and conversations.needs_turn(post):
                await budgets.check(post.key.agent_id or "main", post.key.raw)
            return []

        def next_reset(key: str) -> Any:
            return None if scheduling is None else scheduling.next_reset(key)

        store = await open_store(
            config.home,
            settings,
            clock=clock,
            environ=env,
            hooks=StoreHooks(
                listeners=(on_event,),
                durable_listeners=(feed,) if settings.history.enabled else (),
            ),
        )
        stack.push_async_callback(store.close)
        if settings.history.enabled:
            history = store.open_history(max_batch=settings.history.max_batch)
            created = await history.open()

            async def close_history() -> None:  # the store's appends stop feeding it first
                nonlocal history
                index, history = history, None
                if index is not None:
                    await index.close()

            stack.push_async_callback(close_history)

        async def cleanup_early() -> None:  # below storage.min_free: archive and delete now
            if scheduling is not None and leader is not None and leader.leading:
                report = await scheduling.cleanup()
                done = sum(1 for action in report if action["done"])
                log.info("early cleanup for low disk space: %d action(s) done", done)

        disk_budget = DiskBudget(config.home, settings.storage, metrics, on_low=cleanup_early)
        stack.push_async_callback(disk_budget.close)
        budgets = Budgets(store, lambda: settings if conversations is None else conversations.settings, clock)
        tools = ToolBox(store)
        conversations = Conversations(
            store,
            settings,
            providers=providers,
            hub=hub,
            metrics=metrics,
            clock=clock,
            tools=tools,
            hooks=ConversationHooks(
                before_post=(disk_budget.before_post, budget_check, resets_due),
                before_append=(recall,) if parts.memory else (),
            ),
        )
        commands = Commands(conversations, hooks=CommandHooks(next_reset=next_reset))
        if isinstance(store, SharedEvents):  # other gateway processes' events reach this one's subscribers
            store.follow_events(hub.publish)
        if history is not None:
            stack.push_async_callback(_settle_index, await _prepare_index(history, store, created, parts.timers))

        memory: MemoryService | None = None
        if parts.memory:
            memory = memory_service(config, env, clock, background=parts.timers)
            if parts.timers and settings.storage.backend == "postgres":
                memory.set_writer(False)  # until this process leads (LeaderWork below)
            await memory.start()
            stack.push_async_callback(memory.close)
            bridge = MemoryBridge(memory, conversations, settings, host_zone=zone)
            for tool in bridge.tools():
                tools.register(tool)
        if "sessions" in settings.memory.sources:
            transcripts = TranscriptSource(
                store, workspaces(config), lambda key: scope_of_raw(key, settings.memory.scope, settings.agents)
            )
            stack.push_async_callback(transcripts.close)
        if any(agent.tools.sessions.enabled for agent in settings.agents.values()):
            for tool in SessionTools(conversations, history).tools():
                tools.register(tool)

        client = await stack.enter_async_context(aiohttp.ClientSession(headers={"User-Agent": "neotask-gateway"}))
        deliverer = Deliverer(client)
        webhooks = Webhooks(conversations, settings, env, deliverer, clock=clock)
        stack.push_async_callback(webhooks.close)
        compat = OpenAICompat(commands, clock=clock, crash_step=openai_crash_step(env))
        stack.push_async_callback(compat.close)
        await load_sdks(settings.channels, env)  # in a thread: the connectors are built here, on the loop
        channels = ChannelIntake(
            conversations, commands, settings, ChannelStore.for_home(config.home), env, clock=clock,
            crash_at=env.get(CRASH_ENV),
        )  # fmt: skip
        stack.push_async_callback(channels.close)

        async def deliver(url: str, payload: ReplyBody) -> Delivery:
            return await deliverer.report(url, payload, timeout=DELIVERY_TIMEOUT_S)

        scheduling = Scheduling(
            conversations,
            commands,
            settings,
            clock=clock,
            host_zone=zone,
            storage=store,
            hooks=SchedulingHooks(
                deliver=deliver,
                forget_runs=history.delete_runs if history is not None else None,
                archive_step=crash_step(env),
            ),
        )
        backups = Backups(config, store, memory, clock)
        scheduler = scheduler_service(config, scheduling, zone, clock, backups=backups)
        if parts.timers:
            leader = LeaderWork(open_leadership(settings, environ=env), scheduler, scheduling, memory, clock=clock)
            stack.push_async_callback(leader.close)  # after the scheduler stopped: the lead goes last
            await scheduler.start()
            leader.start()  # the files backend leads at once (the start-up sweep); postgres when it may
            stack.push_async_callback(scheduler.stop)
            stack.push_async_callback(scheduling.close, settings.gateway.shutdown_timeout_s / 4)
        if parts.timers if parts.channels is None else parts.channels:
            await channels.start()
        if not providers:
            log.info("no model configured: running in store-only mode")
        yield Services(
            config=config,
            env=env,
            clock=clock,
            host_zone=zone,
            hub=hub,
            metrics=metrics,
            providers=providers,
            store=store,
            history=history,
            conversations=conversations,
            commands=commands,
            memory=memory,
            transcripts=transcripts,
            deliverer=deliverer,
            webhooks=webhooks,
            compat=compat,
            channels=channels,
            scheduling=scheduling,
            scheduler=scheduler,
            disk_budget=disk_budget,
            backups=backups,
            leader=leader,
        )


def scheduler_service(
    config: LoadedConfig, scheduling: Scheduling, zone: ZoneInfo, clock: Clock, *, backups: Backups | None = None
) -> SchedulerService:
    """The APScheduler jobs: the daily reset boundary and the sweep, cleanup, cron jobs, backups."""
    settings = config.settings
    backup = None
    if backups is not None and settings.backup.schedule:
        backup = (settings.backup.schedule, backups.scheduled)
    reset_zone = ZoneInfo(settings.session.reset.timezone) if settings.session.reset.timezone else zone
    return SchedulerService(
        timezone=reset_zone,
        daily_reset=DailyJob(
            settings.session.reset.at_hour, scheduling.sweep_job, daily_boundaries(settings.session, host_zone=zone)
        ),
        sweep_seconds=settings.scheduler.sweep_seconds,
        sweep=scheduling.sweep_job,
        cleanup_at_hour=settings.cleanup.at_hour,
        cleanup=scheduling.cleanup_job,
        cron_jobs=settings.cron.jobs,
        run_cron=scheduling.run_cron,
        clock=clock,
        backup=backup,
    )


async def _close_providers(providers: dict[str, ModelChain]) -> None:
    for provider in providers.values():
        await provider.close()


async def _prepare_index(
    history: HistoryIndexProtocol, store: StoreProtocol, created: bool, background: bool
) -> asyncio.Task[None] | None:
    """Rebuild the index when it was missing, else catch up the active runs a crash left behind:
    in the background (the daemon), or now (the CLI, which closes again soon)."""
    if background:
        return asyncio.create_task(_level_index(history, store, rebuild=created), name="history-rebuild")
    await _level_index(history, store, rebuild=created)
    return None


async def _settle_index(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _level_index(history: HistoryIndexProtocol, store: StoreProtocol, *, rebuild: bool) -> None:
    try:
        if rebuild:
            log.info("history index missing: rebuilding it from the run folders and archives")
            await store.rebuild_history(history)
        else:
            await store.catch_up_history(history)
    except Exception:  # the index is derived: a failed rebuild is logged; doctor --fix retries
        log.exception("history index rebuild failed")
