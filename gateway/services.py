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
``before_post`` is ``Scheduling.check_on_arrival``) is a method of ``_Late``, which holds those objects
once they are built; ``open_services`` builds the graph part by part (``_storage``, ``_memory``,
``_edges``, ``_scheduling``, ``_lead``).
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
from config.settings import Settings
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


@dataclass
class _Late:
    """The objects a hook names that are built after the hook is handed out (Conversations'
    ``before_post`` is ``Scheduling.check_on_arrival``, built later): the hooks are its methods,
    and do nothing until their object exists (the store's recovery at open publishes nothing)."""

    settings: Settings
    hub: EventHub
    history: HistoryIndexProtocol | None = None
    transcripts: TranscriptSource | None = None
    bridge: MemoryBridge | None = None
    scheduling: Scheduling | None = None
    conversations: Conversations | None = None
    leader: LeaderWork | None = None
    budgets: Budgets | None = None
    metrics: Metrics | None = None

    def on_event(self, event: StoreEvent) -> None:
        if self.conversations is None:
            return
        self.hub.publish(event)
        if self.transcripts is not None:
            self.transcripts.on_event(event)

    def feed(self, run: RunState, record: MessageRecord) -> None:
        if self.history is not None and self.conversations is not None:
            self.history.feed(run.run_id, run.key, run.agent_id, record)

    async def history_room(self, post: Post) -> list[Event]:  # before anything is stored
        """A post waits while the history index is ``history.max_backlog`` messages behind."""
        if self.history is not None and await self.history.backlog.room() and self.metrics is not None:
            self.metrics.history_waits.inc()
        return []

    async def resets_due(self, post: Post) -> list[Event]:
        return [] if self.scheduling is None else await self.scheduling.check_on_arrival(post)

    async def recall(self, run: RunState, post: Post, new_run: bool) -> list[Event]:
        return [] if self.bridge is None else await self.bridge.recall(run, post, new_run)

    async def budget_check(self, post: Post) -> list[Event]:  # before anything is stored
        if self.conversations is not None and self.budgets is not None and self.conversations.needs_turn(post):
            await self.budgets.check(post.key.agent_id or "main", post.key.raw)
        return []

    def next_reset(self, key: str) -> Any:
        return None if self.scheduling is None else self.scheduling.next_reset(key)

    def settings_now(self) -> Settings:
        return self.settings if self.conversations is None else self.conversations.settings

    async def cleanup_early(self) -> None:  # below storage.min_free: archive and delete now
        if self.scheduling is not None and self.leader is not None and self.leader.leading:
            report = await self.scheduling.cleanup()
            done = sum(1 for action in report if action["done"])
            log.info("early cleanup for low disk space: %d action(s) done", done)

    async def close_history(self) -> None:  # the store's appends stop feeding it first
        index, self.history = self.history, None
        if index is not None:
            await index.close()


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
        metrics = Metrics()
        late = _Late(settings, EventHub(), metrics=metrics)
        providers = await _providers(config, env, clock, stack)
        store, created = await _storage(config, env, clock, late, stack)
        disk_budget = DiskBudget(config.home, settings.storage, metrics, on_low=late.cleanup_early)
        stack.push_async_callback(disk_budget.close)
        late.budgets = Budgets(store, late.settings_now, clock)
        tools = ToolBox(store)
        conversations = late.conversations = Conversations(
            store, settings, providers=providers, hub=late.hub, metrics=metrics, clock=clock, tools=tools,
            hooks=ConversationHooks(
                before_post=(disk_budget.before_post, late.budget_check, late.history_room, late.resets_due),
                before_append=(late.recall,) if parts.memory else (),
            ),
        )  # fmt: skip
        commands = Commands(conversations, hooks=CommandHooks(next_reset=late.next_reset))
        if isinstance(store, SharedEvents):  # other gateway processes' events reach this one's subscribers
            store.follow_events(late.hub.publish)
        if late.history is not None:
            stack.push_async_callback(_settle_index, await _prepare_index(late.history, store, created, parts.timers))
        memory = await _memory(config, env, clock, parts, late, store, tools, zone, stack)
        edges = await _edges(config, env, clock, conversations, commands, stack)
        scheduling = late.scheduling = _scheduling(config, env, clock, late, store, commands, edges.deliverer, zone)
        backups = Backups(config, store, memory, clock)
        scheduler = scheduler_service(config, scheduling, zone, clock, backups=backups)
        if parts.timers:
            late.leader = await _lead(config, env, clock, scheduler, scheduling, memory, stack)
        if parts.timers if parts.channels is None else parts.channels:
            await edges.channels.start()
        if not providers:
            log.info("no model configured: running in store-only mode")
        yield Services(
            config=config, env=env, clock=clock, host_zone=zone, hub=late.hub, metrics=metrics, providers=providers,
            store=store, history=late.history, conversations=conversations, commands=commands, memory=memory,
            transcripts=late.transcripts, deliverer=edges.deliverer, webhooks=edges.webhooks, compat=edges.compat,
            channels=edges.channels, scheduling=scheduling, scheduler=scheduler, disk_budget=disk_budget,
            backups=backups, leader=late.leader,
        )  # fmt: skip


async def _providers(
    config: LoadedConfig, env: Mapping[str, str], clock: Clock, stack: contextlib.AsyncExitStack
) -> dict[str, ModelChain]:
    """Each agent's model chain (the SDK loaded beside the loop first), the secrets hidden in logs."""
    settings = config.settings
    SECRETS.add([*settings.gateway.tokens, *(env.get(a.model.api_key_env) for a in settings.agents.values())])
    if any(agent.model.base_url for agent in settings.agents.values()):
        await load_provider_sdk()  # in a thread: the loop runs on (0.4 s of CPU, more on a busy machine)
    providers = providers_for(config, env, clock)
    stack.push_async_callback(_close_providers, providers)
    return providers


async def _storage(
    config: LoadedConfig, env: Mapping[str, str], clock: Clock, late: _Late, stack: contextlib.AsyncExitStack
) -> tuple[StoreProtocol, bool]:
    """The session store (recovered) and, when history is on, its index (``late.history``);
    whether the index was created empty over stored messages."""
    settings = config.settings
    hooks = StoreHooks(listeners=(late.on_event,), durable_listeners=(late.feed,) if settings.history.enabled else ())
    store = await open_store(config.home, settings, clock=clock, environ=env, hooks=hooks)
    stack.push_async_callback(store.close)
    created = False
    if settings.history.enabled:
        late.history = store.open_history(
            max_batch=settings.history.max_batch, max_backlog=settings.history.max_backlog
        )
        created = await late.history.open()
        stack.push_async_callback(late.close_history)
    return store, created


async def _memory(
    config: LoadedConfig, env: Mapping[str, str], clock: Clock, parts: Parts, late: _Late, store: StoreProtocol,
    tools: ToolBox, zone: ZoneInfo, stack: contextlib.AsyncExitStack,
) -> MemoryService | None:  # fmt: skip
    """The memory service and its recall bridge and tools (``Parts.memory``), the transcript
    source, the session tools."""
    settings = config.settings
    assert late.conversations is not None
    memory: MemoryService | None = None
    if parts.memory:
        memory = memory_service(config, env, clock, background=parts.timers)
        if parts.timers and settings.storage.backend == "postgres":
            memory.set_writer(False)  # until this process leads (LeaderWork)
        await memory.start()
        stack.push_async_callback(memory.close)
        late.bridge = MemoryBridge(memory, late.conversations, settings, host_zone=zone)
        for tool in late.bridge.tools():
            tools.register(tool)
    if "sessions" in settings.memory.sources:
        late.transcripts = TranscriptSource(
            store, workspaces(config), lambda key: scope_of_raw(key, settings.memory.scope, settings.agents)
        )
        stack.push_async_callback(late.transcripts.close)
    if any(agent.tools.sessions.enabled for agent in settings.agents.values()):
        for tool in SessionTools(late.conversations, late.history).tools():
            tools.register(tool)
    return memory


@dataclass(frozen=True)
class _Edges:
    """What talks to the world outside: the HTTP client for deliveries, webhooks, the
    OpenAI-compatible service, the chat connectors."""

    deliverer: Deliverer
    webhooks: Webhooks
    compat: OpenAICompat
    channels: ChannelIntake


async def _edges(
    config: LoadedConfig, env: dict[str, str], clock: Clock, conversations: Conversations, commands: Commands,
    stack: contextlib.AsyncExitStack,
) -> _Edges:  # fmt: skip
    settings = config.settings
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
    return _Edges(deliverer, webhooks, compat, channels)


def _scheduling(
    config: LoadedConfig, env: Mapping[str, str], clock: Clock, late: _Late, store: StoreProtocol,
    commands: Commands, deliverer: Deliverer, zone: ZoneInfo,
) -> Scheduling:  # fmt: skip
    """Resets, cleanup and cron jobs (what the scheduler's jobs call)."""
    assert late.conversations is not None

    async def deliver(url: str, payload: ReplyBody) -> Delivery:
        return await deliverer.report(url, payload, timeout=DELIVERY_TIMEOUT_S)

    history = late.history
    return Scheduling(
        late.conversations, commands, config.settings, clock=clock, host_zone=zone, storage=store,
        hooks=SchedulingHooks(
            deliver=deliver,
            forget_runs=history.delete_runs if history is not None else None,
            archive_step=crash_step(env),
        ),
    )  # fmt: skip


async def _lead(
    config: LoadedConfig, env: Mapping[str, str], clock: Clock, scheduler: SchedulerService, scheduling: Scheduling,
    memory: MemoryService | None, stack: contextlib.AsyncExitStack,
) -> LeaderWork:  # fmt: skip
    """The scheduler started and the leader's work with it (``Parts.timers``)."""
    settings = config.settings
    leader = LeaderWork(open_leadership(settings, environ=env), scheduler, scheduling, memory, clock=clock)
    stack.push_async_callback(leader.close)  # after the scheduler stopped: the lead goes last
    await scheduler.start()
    leader.start()  # the files backend leads at once (the start-up sweep); postgres when it may
    stack.push_async_callback(scheduler.stop)
    stack.push_async_callback(scheduling.close, settings.gateway.shutdown_timeout_s / 4)
    return leader


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
