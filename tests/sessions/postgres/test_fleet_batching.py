"""N gateway processes on one database batch as one process does: the fleet's append statements
under way are shared out (``in_flight_per_process``) and each process's history index gathers its
rows N times as long (``pacing``), one insert per wait at most however busy the gateway, so
the fleet sends about the statements one process would, each with as many messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from sessions.postgres.batching import MAX_IN_FLIGHT, in_flight_per_process
from sessions.postgres.history import BATCH_WAIT_S, BUSY_WAIT_S, Pacing, PgHistoryIndex, pacing
from sessions.postgres.store import PgStore
from sessions.records import MessageRecord, NewMessage, RunStart, RunState, TaskKey
from sessions.store_hooks import StoreHooks
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database


@pytest.mark.parametrize(("workers", "in_flight"), [(1, MAX_IN_FLIGHT), (2, 1), (3, 1), (8, 1)])
def test_each_process_takes_its_share_of_the_fleets_batching(workers: int, in_flight: int) -> None:
    assert in_flight_per_process(workers) == in_flight
    pace = pacing(workers)
    assert pace.quiet_s == pytest.approx(BATCH_WAIT_S * workers)
    assert pace.busy_s == pytest.approx(BUSY_WAIT_S * workers)


@pytest.mark.parametrize(
    ("workers", "gateway", "appenders"),
    [
        (1, {}, 1),
        (2, {}, 2),  # each worker stores the keys it owns by hash
        (2, {"key_owner": "first"}, 1),  # worker 1 stores every post: one group commit, batched as one process
        (4, {"key_owner": "first"}, 1),
        (2, {"key_owner": "first", "key_handoff": False}, 2),  # no hand-off: every worker stores
    ],
)
def test_the_fleets_batching_is_shared_by_the_workers_that_store(
    workers: int, gateway: dict[str, Any], appenders: int
) -> None:
    settings = settings_with({"gateway": {"workers": workers, **gateway}})
    assert settings.gateway.appenders == appenders
    assert in_flight_per_process(settings.gateway.appenders) == (MAX_IN_FLIGHT if appenders == 1 else 1)


class CountedIndex(PgHistoryIndex):
    """The index, counting its insert statements."""

    def __init__(self, pool: asyncpg.Pool, *, pace: Pacing) -> None:
        super().__init__(pool, pace=pace)
        self.inserts = 0

    async def insert(self, rows: list[Any]) -> int:
        self.inserts += 1
        return await super().insert(rows)


class Fed:
    def __init__(self) -> None:
        self.index: PgHistoryIndex | None = None

    def __call__(self, run: RunState, record: MessageRecord) -> None:
        if self.index is not None:
            self.index.feed(run.run_id, run.key, run.agent_id, record)


@pytest.fixture
async def fleet_store(postgres_server: PgServer, clock: FakeClock) -> AsyncIterator[tuple[PgStore, Fed]]:
    """A store configured as one worker of two (``gateway.workers: 2``), its index fed."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    fed = Fed()
    settings = settings_with({"gateway": {"workers": 2}})
    store = await PgStore.open(settings, dsn=dsn, clock=clock, pool_size=4, hooks=StoreHooks(durable_listeners=(fed,)))
    yield store, fed
    await store.close()


async def _start(store: PgStore, key: str) -> RunState:
    return await store.start_run(
        RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
    )


async def test_a_busy_index_sends_one_insert_per_wait(fleet_store: tuple[PgStore, Fed]) -> None:
    """Messages stored without a pause for 0.8 s: one insert per ``busy_s`` (and the first), not
    one per round trip as when each insert followed the last at once."""
    store, fed = fleet_store
    wait_s = 0.2
    index = fed.index = CountedIndex(store.state.pool, pace=Pacing(0.05, wait_s))
    await index.open()
    try:
        run = await _start(store, "agent:main:busy")
        loop = asyncio.get_running_loop()
        began, stored = loop.time(), 0
        while loop.time() - began < 0.8:
            await store.append(run, NewMessage("user", f"message {stored} about the budget"))
            stored += 1
        elapsed = loop.time() - began
        await index.flush()
        assert await index.count() == stored
        assert index.inserts <= elapsed / wait_s + 2, (index.inserts, stored)
        assert stored > 4 * index.inserts  # each insert carried many messages
    finally:
        await index.close()


async def test_the_index_of_a_fleets_worker_waits_its_share(fleet_store: tuple[PgStore, Fed]) -> None:
    store, _ = fleet_store
    index = store.open_history()
    assert index.pace == pacing(2)


async def test_one_statement_under_way_stores_every_run(fleet_store: tuple[PgStore, Fed]) -> None:
    """A worker of two sends one append statement at a time; messages of many runs at once are
    all stored, each run's in order."""
    store, _ = fleet_store
    assert store.queue.max_in_flight == 1
    runs = [await _start(store, f"agent:main:k{i}") for i in range(8)]
    await asyncio.gather(*(store.append(run, NewMessage("user", f"m{n}")) for n in range(5) for run in runs))
    for run in runs:
        records = await store.read_messages(run.run_id, after_seq=0, limit=100)
        assert [r["content"] for r in records] == [f"m{n}" for n in range(5)]
        assert [r["seq"] for r in records] == list(range(1, 6))
