"""The backends the suite runs against, a harness that opens, reopens and closes one, and helpers
that use the protocol only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from sessions.files.store import SessionStore
from sessions.protocol import StoreProtocol
from sessions.records import NewMessage, RunState, TaskKey
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with

KEY = "agent:main:main"

# A factory opens the backend's storage at a place (the same place again on a reopen).
Factory = Callable[[Path, FakeClock], Awaitable[StoreProtocol]]


async def _files(place: Path, clock: FakeClock) -> StoreProtocol:
    """The run-folder store: JSONL files, tasks.db and sessions.json in a real home."""
    return await SessionStore.open(place, settings_with(), clock=clock)


BACKENDS: dict[str, Factory] = {"files": _files}


class Harness:
    """One backend's storage: ``open`` it, ``reopen`` it as a restart would (everything
    acknowledged must be there again), and close it at the end of the test."""

    def __init__(self, factory: Factory, place: Path, clock: FakeClock) -> None:
        self.factory, self.place, self.clock = factory, place, clock
        self.store: StoreProtocol | None = None

    async def open(self) -> StoreProtocol:
        assert self.store is None, "already open"
        self.store = await self.factory(self.place, self.clock)
        return self.store

    async def reopen(self) -> StoreProtocol:
        await self.close()
        return await self.open()

    async def close(self) -> None:
        if self.store is not None:
            store, self.store = self.store, None
            await store.close()


async def start(store: StoreProtocol, key: str = KEY, *, chat_type: str = "direct") -> RunState:
    return await store.start_run(
        key,
        agent_id="main",
        chat_type=chat_type,
        channel=None,
        task_key=TaskKey(task_type="agent", task_identifier=key, user="u1"),
    )


def user(text: str, **extra: object) -> NewMessage:
    return NewMessage(role="user", content=text, **extra)  # type: ignore[arg-type]


def command(text: str) -> NewMessage:
    return NewMessage(role="user", content=text, command=True, user_activity=False)


def counters_agree(store: StoreProtocol, key: str = KEY) -> None:
    """The entry's checkpoint is the active run's counters (every change keeps them in step)."""
    run, entry = store.active_run(key), store.entry(key)
    assert run is not None and entry is not None
    assert entry.counters == run.counters
