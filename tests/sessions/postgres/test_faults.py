"""A database that goes away: every write answers the typed 503 (nothing stored, retry after a
second) and counts nothing; once the server is back the same store goes on by itself."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg
import pytest

from config.errors import StorageUnavailable
from gateway.http import retry_headers
from sessions.postgres.faults import database_error
from sessions.postgres.store import PgStore
from sessions.records import NewMessage, RunStart, TaskKey
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

KEY = "agent:main:main"


def _task(key: str) -> TaskKey:
    return TaskKey("agent", key, user="u1")


async def test_a_lost_database_answers_503_and_the_store_recovers_by_itself(
    postgres_server: PgServer, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Stops the suite's server (tests of one worker run one at a time) and starts it again. The
    log says so in lines, not tracebacks (asyncpg's pool logged each failed reconnection with its
    traceback at WARNING)."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    store = await PgStore.open(settings_with(), dsn=dsn, clock=clock, pool_size=2)
    try:
        run = await store.start_run(
            RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=_task(KEY))
        )
        acked = [(await store.append(run, NewMessage(role="user", content=f"m{i}")))["seq"] for i in range(3)]
        counters = run.counters
        await asyncio.to_thread(postgres_server.stop, "fast")

        with pytest.raises(StorageUnavailable) as info:
            await store.append(run, NewMessage(role="user", content="while down"))
        error = info.value
        assert error.status == 503 and error.code == "storage_unavailable"
        assert error.extra == {"stored": False, "retry_after_s": 1} and retry_headers(error) == {"Retry-After": "1"}
        assert "was not stored" in error.message
        assert run.counters == counters and run.appends_pending == 0  # the failed append took no seq
        assert store.require_entry(KEY).counters == counters
        other = "agent:main:other"
        with pytest.raises(StorageUnavailable):
            await store.start_run(
                RunStart(other, agent_id="main", chat_type="direct", channel=None, task_key=_task(other))
            )
        assert store.entry(other) is None  # no half-made session
        assert await store.writable() is not None and not store.recently_writable(60)
        async with asyncio.timeout(10):  # the pool tries to restore its floor of one connection
            while not any(r.name == "asyncpg.pool" for r in caplog.records):
                await asyncio.sleep(0.05)
        tracebacks = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
        assert tracebacks == [], [(r.name, r.getMessage()) for r in tracebacks]
        assert all("Error: " in r.getMessage() for r in caplog.records if r.name == "asyncpg.pool")  # on the line

        await asyncio.to_thread(postgres_server.start)
        after = await store.append(run, NewMessage(role="user", content="after"))
        assert after["seq"] == 4
        assert await store.writable() is None and store.recently_writable(60)
        stored = await store.read_messages(run.run_id, after_seq=0, limit=10)
        assert [(m["seq"], m["content"]) for m in stored] == [(1, "m0"), (2, "m1"), (3, "m2"), (4, "after")]
        assert acked == [1, 2, 3]
    finally:
        if not await asyncio.to_thread(postgres_server.running):
            await asyncio.to_thread(postgres_server.start)  # for the next tests
        await store.close()


async def test_a_first_message_lost_with_the_database_leaves_the_key_usable_once_it_is_back(
    postgres_server: PgServer, clock: FakeClock
) -> None:
    """The run started for a key's first message could not be deleted when that message failed
    (the database went away): once the database is back the key takes a new run, without a restart
    (it answered 409 run_active "started by another gateway process" until one)."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    store = await PgStore.open(settings_with(), dsn=dsn, clock=clock, pool_size=2)
    try:
        run = await store.start_run(
            RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=_task(KEY), opening=True)
        )
        await asyncio.to_thread(postgres_server.stop, "fast")
        await store.discard_run(run, remove_entry=True)  # its DELETE fails: the row stays
        await asyncio.to_thread(postgres_server.start)
        again = await store.start_run(
            RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=_task(KEY))
        )
        assert (await store.append(again, NewMessage(role="user", content="first")))["seq"] == 1
        rows = await store.pool.fetch("SELECT run_id FROM runs WHERE session_key = $1", KEY)
        assert [r[0] for r in rows] == [again.run_id]
    finally:
        if not await asyncio.to_thread(postgres_server.running):
            await asyncio.to_thread(postgres_server.start)
        await store.close()


def test_a_connection_broken_under_another_call_is_a_503_not_a_500() -> None:
    """Two daemons under load, the database stopped: asyncpg reported a pooled connection the server
    shut down as this client error, and the message was answered 500."""
    exc = asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")
    typed = database_error(exc)
    assert isinstance(typed, StorageUnavailable)
    assert typed.extra["stored"] is False and typed.extra["retry_after_s"] == 1
