"""What the CLI does when no daemon runs: take the home lock and work on the files through the
session store, answering with the same JSON shapes as the HTTP API where the API has them.

Each function is one short-lived session: open the store (recovery runs), do one thing, close it
(sessions.json flushed). Nothing else from the daemon is started (no scheduler, no memory index).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from config.clock import iso, system_clock
from config.errors import BadRequest
from config.loader import LoadedConfig
from gateway.views import session_view
from sessions import doctor
from sessions.keys import parse_key
from sessions.layout import Home
from sessions.lock import HomeLock
from sessions.records import CHAT_TYPES as CHAT_TYPES
from sessions.records import ENTRY_STATUSES
from sessions.registry import SessionEntry
from sessions.store import SessionStore
from sessions.thresholds import compaction_threshold
from sessions.tokens import estimate_text

if TYPE_CHECKING:
    from gateway.commands import Commands

T = TypeVar("T")
STATUSES = ENTRY_STATUSES


def locked(config: LoadedConfig, work: Callable[[], T]) -> T:
    """Run ``work`` holding the home lock (``HomeLocked`` when a daemon or another CLI has it)."""
    with HomeLock(Home(config.home).lock_file):
        return work()


def with_store(config: LoadedConfig, work: Callable[[SessionStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = await SessionStore.open(config.home, config.settings, clock=system_clock)
        try:
            return await work(store)
        finally:
            await store.close()

    return locked(config, lambda: asyncio.run(run()))


def describe_entry(config: LoadedConfig, store: SessionStore, entry: SessionEntry) -> dict[str, Any]:
    """The entry as ``GET /v1/sessions/{key}`` shows it, as far as the files tell (no next reset:
    that is the scheduler's; the overhead counts the system prompt, not the tool schemas)."""
    settings = config.settings
    agent = settings.agents.get(entry.agent_id or "main") or settings.agents["main"]
    return session_view(
        entry,
        store.active_run(entry.key),
        threshold=compaction_threshold(settings.compaction, agent.model),
        overhead=estimate_text(agent.system_prompt),
        next_reset=None,
        model=str(entry.settings.get("model") or agent.model.name) if agent.model.base_url else None,
    )


def list_sessions(
    config: LoadedConfig, *, agent: str | None, chat_type: str | None, status: str | None, limit: int
) -> dict[str, Any]:
    if status is not None and status not in STATUSES:
        raise BadRequest(f"'status' must be {', '.join(STATUSES)}", field="status")
    if chat_type is not None and chat_type not in CHAT_TYPES:
        raise BadRequest(f"'type' must be {', '.join(CHAT_TYPES)}", field="type")

    async def work(store: SessionStore) -> dict[str, Any]:
        entries = [
            e
            for e in store.entries()
            if (agent is None or e.agent_id == agent)
            and (chat_type is None or e.chat_type == chat_type)
            and (status is None or e.status == status)
        ]
        entries.sort(key=lambda e: (e.last_interaction_at or e.created_at, e.key), reverse=True)
        return {"sessions": [describe_entry(config, store, e) for e in entries[:limit]], "next_cursor": None}

    return with_store(config, work)


def show_session(config: LoadedConfig, key: str) -> dict[str, Any]:
    raw = _check_key(config, key)

    async def work(store: SessionStore) -> dict[str, Any]:
        return describe_entry(config, store, store.require_entry(raw))

    return with_store(config, work)


def reset_session(config: LoadedConfig, key: str) -> dict[str, Any]:
    """Complete the active run (final summary as the store makes it); the next message starts a
    new run that inherits from it."""
    raw = _check_key(config, key)

    async def work(store: SessionStore) -> dict[str, Any]:
        store.require_entry(raw)
        completed = None
        if store.active_run(raw) is not None:
            completed = (await store.complete(raw, reason="reset")).run_id
        await store.set_inherit_next(raw, True)
        return {"session_key": raw, "completed_run_id": completed, "status": "idle"}

    return with_store(config, work)


def delete_session(config: LoadedConfig, key: str) -> dict[str, Any]:
    raw = _check_key(config, key)

    async def work(store: SessionStore) -> dict[str, Any]:
        completed = await store.delete(raw)
        return {"session_key": raw, "deleted": True, "completed_run_id": completed}

    return with_store(config, work)


def run_command(config: LoadedConfig, key: str, command: str, env: Mapping[str, str]) -> dict[str, Any]:
    """A chat command through the same ``Commands`` the daemon builds (its answer, its body)."""
    from gateway.commands import dispatch
    from gateway.turns import Post

    parsed = parse_key(key, agents=config.settings.agents)

    async def work(store: SessionStore) -> dict[str, Any]:
        store.require_entry(parsed.raw)
        async with commands_for(config, store, env) as commands:
            outcome = await dispatch(commands, Post(key=parsed, role="user", content=command))
        return outcome.body()

    return with_store(config, work)


@asynccontextmanager
async def commands_for(config: LoadedConfig, store: SessionStore, env: Mapping[str, str]) -> AsyncIterator[Commands]:
    # Imported here: the model client (openai) takes seconds to import, and only commands need it.
    from gateway.commands import Commands
    from gateway.events import EventHub
    from gateway.metrics import Metrics
    from gateway.provider import ChatProvider
    from gateway.turns import Conversations

    settings = config.settings
    providers = {
        agent_id: ChatProvider(agent.model, api_key=env.get(agent.model.api_key_env))
        for agent_id, agent in settings.agents.items()
        if agent.model.base_url
    }
    conversations = Conversations(
        store, settings, providers=providers, hub=EventHub(), metrics=Metrics(), clock=system_clock
    )
    try:
        yield Commands(conversations)
    finally:
        for provider in providers.values():
            await provider.close()


def run_doctor(config: LoadedConfig, *, fix: bool) -> dict[str, Any]:
    """The doctor over the files; with ``fix``, an empty directory in place of gateway.lock (which
    stops the lock from being taken at all) is removed first."""
    cleared = doctor.clear_lock_dir(Home(config.home)) if fix else None

    def work() -> dict[str, Any]:
        findings = doctor.check_home(config.home, fix=fix, now=iso(system_clock()), settings=config.settings)
        return {"actions": [f.as_dict() for f in ([cleared] if cleared else []) + findings]}

    return locked(config, work)


def _check_key(config: LoadedConfig, key: str) -> str:
    return parse_key(key, agents=config.settings.agents).raw
