"""A message PostgreSQL refuses to index (its tsvector over 1 MB) is logged and left out, and the
rest of its batch indexed: retried as "the database away", it held the index, and with it every
later post (``history.max_backlog``), for good."""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import AsyncIterator

import pytest

from sessions.postgres.history import PgHistoryIndex
from sessions.postgres.store import PgStore
from sessions.records import NewMessage, RunStart, TaskKey
from sessions.store_hooks import StoreHooks
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.sessions.postgres.test_history import Fed
from tests.support.postgres import DATABASE, PgServer, empty_database


@pytest.fixture
async def pg(postgres_server: PgServer, clock: FakeClock) -> AsyncIterator[tuple[PgStore, PgHistoryIndex]]:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    fed = Fed()
    store = await PgStore.open(
        settings_with(), dsn=dsn, clock=clock, pool_size=2, hooks=StoreHooks(durable_listeners=(fed,))
    )
    index = store.open_history(max_backlog=3)
    await index.open()
    fed.index = index
    yield store, index
    await index.close()
    await store.close()


async def test_one_unindexable_message_does_not_hold_every_later_post(pg: tuple[PgStore, PgHistoryIndex]) -> None:
    store, index = pg
    rng = random.Random(1)
    # 900 KB of distinct words (a post under gateway.max_body_bytes): 1,247,154 bytes of tsvector
    big = " ".join("".join(rng.choices(string.ascii_lowercase, k=9)) for _ in range(90_000))
    key = "agent:main:a"
    run = await store.start_run(
        RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
    )
    await store.append(run, NewMessage("tool", big, tool_name="fetch", tool_call_id="c1"))
    for n in range(5):
        await store.append(run, NewMessage("user", f"lamp {n}"))
    await asyncio.wait_for(index.flush(), 30)  # before: retried every RETRY_S, never idle
    index.backlog.wait_s = 0.05
    assert index.backlog.rows < index.backlog.limit, (index.backlog.rows, index.stats.batches)
    assert await index.backlog.room() is False
    assert index.stats.refused == 1
    assert await index.seqs(run.run_id) == {2, 3, 4, 5, 6}  # the tool result (seq 1) alone is left out
