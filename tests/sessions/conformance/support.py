"""The backends the suite runs against, a harness that opens, reopens and closes one, and helpers
that use the protocol only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sessions.files.store import SessionStore
from sessions.inmemory import MemoryData, MemoryStore
from sessions.postgres.store import PgStore
from sessions.protocol import ConversationStore
from sessions.records import NewMessage, RunStart, RunState, TaskKey
from sessions.store_hooks import StoreHooks
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

KEY = "agent:main:main"


class Factory(Protocol):
    """Opens a backend's storage at ``place`` (the same place again on a reopen)."""

    def __call__(self, place: Path, clock: FakeClock, hooks: StoreHooks) -> Awaitable[ConversationStore]: ...


async def _files(place: Path, clock: FakeClock, hooks: StoreHooks) -> ConversationStore:
    """The run-folder store: JSONL files, tasks.db and sessions.json in a real home."""
    return await SessionStore.open(place, settings_with(), clock=clock, hooks=hooks)


_MEMORY: dict[Path, MemoryData] = {}  # what a memory store keeps, per place: a reopen finds it again


async def _memory(place: Path, clock: FakeClock, hooks: StoreHooks) -> ConversationStore:
    """The in-memory store: a reopen in the same process sees what was acknowledged."""
    return await MemoryStore.open(_MEMORY.setdefault(place, MemoryData()), clock=clock, hooks=hooks)


@dataclass(frozen=True)
class Backend:
    factory: Factory
    capabilities: frozenset[str]  # the capability protocols of sessions.protocol it implements


BASE = "RunStore"
DELIVERY = "DeliveryRecords"
COMPAT = "CompatRecords"
USAGE = "UsageRecords"
HISTORY = "HistorySource"
MAINTENANCE = "Maintenance"
EVERY = frozenset({BASE, DELIVERY, COMPAT, USAGE, HISTORY, MAINTENANCE})
BACKENDS: dict[str, Backend] = {
    "files": Backend(_files, EVERY),
    "memory": Backend(_memory, EVERY),
}


def _postgres(server: PgServer) -> Factory:
    """The PostgreSQL store on a real server: one database for the suite, emptied when a test
    first opens it (a reopen in the same test finds everything again)."""
    fresh = True

    async def factory(place: Path, clock: FakeClock, hooks: StoreHooks) -> ConversationStore:
        nonlocal fresh
        dsn = await server.database(DATABASE)
        if fresh:
            await empty_database(dsn)
            fresh = False
        return await PgStore.open(settings_with(), dsn=dsn, clock=clock, hooks=hooks, pool_size=4)

    return factory


# Backends on a server: the fixture that gives the server, the factory on it, the capabilities.
SERVER_BACKENDS: dict[str, tuple[str, Callable[[PgServer], Factory], frozenset[str]]] = {
    "postgres": ("postgres_server", _postgres, EVERY),
}


class Harness:
    """One backend's storage: ``open`` it, ``reopen`` it as a restart would (everything
    acknowledged must be there again), and close it at the end of the test."""

    def __init__(self, name: str, backend: Backend, place: Path, clock: FakeClock) -> None:
        self.name, self.backend, self.place, self.clock = name, backend, place, clock
        self.store: ConversationStore | None = None
        self.hooks = StoreHooks()

    async def open(self, hooks: StoreHooks | None = None) -> ConversationStore:
        """Open the storage (with ``hooks``, kept for every reopen)."""
        assert self.store is None, "already open"
        self.hooks = hooks or self.hooks
        self.store = await self.backend.factory(self.place, self.clock, self.hooks)
        return self.store

    async def reopen(self) -> ConversationStore:
        await self.close()
        return await self.open()

    async def close(self) -> None:
        if self.store is not None:
            store, self.store = self.store, None
            await store.close()


async def start(store: ConversationStore, key: str = KEY, *, chat_type: str = "direct") -> RunState:
    return await store.start_run(
        RunStart(
            key,
            agent_id="main",
            chat_type=chat_type,
            channel=None,
            task_key=TaskKey(task_type="agent", task_identifier=key, user="u1"),
        ),
    )


def user(text: str, **extra: object) -> NewMessage:
    return NewMessage(role="user", content=text, **extra)  # type: ignore[arg-type]


def command(text: str) -> NewMessage:
    return NewMessage(role="user", content=text, command=True, user_activity=False)


def counters_agree(store: ConversationStore, key: str = KEY) -> None:
    """The entry's checkpoint is the active run's counters (every change keeps them in step)."""
    run, entry = store.active_run(key), store.entry(key)
    assert run is not None and entry is not None
    assert entry.counters == run.counters
