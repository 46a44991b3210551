"""Keys leased across processes (``sessions/postgres/keylocks.py``), two shared stores on one
database standing for two gateway processes: a lease lingers after its message (the next message
on the key takes no lock), goes back at once when the other process asks for the key, when its
linger ends, when its connection is needed for another key, and at close (its entry written); one
connection holds the leases of any number of keys, and losing it drops them."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from config.errors import StorageUnavailable
from sessions.postgres.keylocks import LOCK_CONNECTIONS, KeyLeases
from sessions.postgres.store import PgStore
from sessions.records import NewMessage, RunStart, TaskKey
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

KEY = "agent:main:leased"
Shared = Callable[..., Awaitable[PgStore]]


@pytest.fixture
async def shared_store(postgres_server: PgServer, clock: FakeClock) -> AsyncIterator[Shared]:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    opened: list[PgStore] = []

    async def opener(**leases: float) -> PgStore:
        store = await PgStore.open(settings_with(), dsn=dsn, clock=clock, pool_size=2, shared=True)
        opened.append(store)
        for name, value in leases.items():
            setattr(store.sharing.leases, name, value)
        return store

    yield opener
    for store in opened:
        await store.close()


def leases_of(store: PgStore) -> KeyLeases:
    assert store.sharing.leases is not None
    return store.sharing.leases


async def post(store: PgStore, key: str, text: str) -> int:
    """What a post does: under the key's lock, the active run (or a new one), one message."""
    async with store.lock_for(key):
        run = store.active_run(key) or await store.start_run(
            RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
        )
        record = await store.append(run, NewMessage(role="user", content=text))
    return int(record["seq"])


async def test_the_next_message_on_a_held_key_takes_no_lock(shared_store: Shared) -> None:
    store = await shared_store()
    seqs = [await post(store, KEY, f"m{i}") for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert leases_of(store).takes == 1 and leases_of(store).held(KEY)


async def test_a_key_asked_for_by_another_process_goes_back_long_before_the_linger(shared_store: Shared) -> None:
    first = await shared_store(linger_s=60.0)
    second = await shared_store(linger_s=60.0)
    assert await post(first, KEY, "one") == 1
    started = time.monotonic()
    assert await post(second, KEY, "two") == 2  # the view of the key was read again: seq follows
    assert time.monotonic() - started < 30  # not the 60 s linger: the first process was asked
    assert leases_of(second).waits == 1 and not leases_of(first).held(KEY)
    assert await post(first, KEY, "three") == 3  # and back: asked again, the seq follows again
    run = first.active_run(KEY)
    assert run is not None
    assert [m["seq"] for m in await first.read_messages(run.run_id, after_seq=0, limit=10)] == [1, 2, 3]


async def test_an_unheard_ask_waits_for_the_linger_only(shared_store: Shared) -> None:
    first = await shared_store(linger_s=1.0)
    second = await shared_store()
    assert first.state.relay is not None
    first.state.relay.asked = None  # the first process does not hear the ask (its listener was away)
    await post(first, KEY, "one")
    assert await post(second, KEY, "two") == 2  # the lease went back when its linger ended
    assert leases_of(second).waits == 1


async def test_a_lease_goes_back_when_its_linger_ends(shared_store: Shared) -> None:
    store = await shared_store(linger_s=0.2)
    await post(store, KEY, "one")
    assert leases_of(store).held(KEY)
    deadline = time.monotonic() + 10
    while leases_of(store).held(KEY) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not leases_of(store).held(KEY)
    assert await post(store, KEY, "two") == 2 and leases_of(store).takes == 2


async def test_one_connection_holds_the_leases_of_many_keys(shared_store: Shared) -> None:
    store = await shared_store()
    keys = [f"agent:main:k{i}" for i in range(3 * LOCK_CONNECTIONS)]
    await asyncio.gather(*(post(store, key, "hello") for key in keys))
    await asyncio.gather(*(post(store, key, "again") for key in keys))
    assert all(leases_of(store).held(key) for key in keys)
    assert leases_of(store).takes == len(keys)  # each key taken once, none given up for room


async def test_waiting_leases_make_room_longest_idle_first(shared_store: Shared) -> None:
    first = await shared_store(linger_s=60.0)
    second = await shared_store(linger_s=60.0, capacity=2)  # the holder and one waiting lease
    a, b = "agent:main:a", "agent:main:b"
    await post(first, a, "one")
    await post(first, b, "one")
    await post(second, a, "two")  # waits for the first (which is asked), on its own connection
    await post(second, b, "two")  # the same: the idle lease of a goes to make room
    deadline = time.monotonic() + 10
    while leases_of(second).held(a) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not leases_of(second).held(a) and leases_of(second).held(b)
    assert leases_of(second).waits == 2


async def test_a_lost_holder_connection_drops_its_leases(shared_store: Shared, pg_dsn: str) -> None:
    first = await shared_store(linger_s=60.0)
    second = await shared_store(linger_s=60.0)
    await post(first, KEY, "one")
    holder = leases_of(first)._holder
    assert holder is not None
    admin = await asyncpg.connect(pg_dsn)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", holder.get_server_pid())
    finally:
        await admin.close()
    deadline = time.monotonic() + 10
    while leases_of(first).held(KEY) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not leases_of(first).held(KEY)  # the lock went with the connection, and so did the lease
    assert await post(second, KEY, "two") == 2 and leases_of(second).waits == 0  # free at once
    assert await post(first, KEY, "three") == 3  # taken again (asked for), its view read again


async def test_a_lingering_lease_is_settled_at_close(shared_store: Shared) -> None:
    first = await shared_store(linger_s=60.0)
    for i in range(3):
        await post(first, KEY, f"m{i}")
    await first.close()
    second = await shared_store()
    entry, run = second.entry(KEY), first.active_run(KEY)
    assert entry is not None and run is not None and entry.run_id == run.run_id and entry.message_count == 3
    assert await post(second, KEY, "after") == 4 and leases_of(second).waits == 0


async def test_the_view_of_a_key_another_process_works_on_follows_its_events(shared_store: Shared) -> None:
    first = await shared_store(linger_s=60.0)
    second = await shared_store()
    for i in range(3):
        await post(first, KEY, f"m{i}")
    await first.flush_entries()  # what the first's flush timer does within storage.sessions_flush_ms

    async def seen(count: int) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            entry = second.entry(KEY)
            if entry is not None and entry.message_count == count:
                return True
            await asyncio.sleep(0.05)
        return False

    assert await seen(3)  # the second never worked on the key, and sees it
    await post(first, KEY, "m3")
    assert await seen(4)  # the runs row is read: no entry flush needed for the counters
    assert not leases_of(second).known(KEY)  # seen without taking the key from the first
    await first.delete(KEY)
    await first.flush_entries()
    deadline = time.monotonic() + 10
    while second.entry(KEY) is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert second.entry(KEY) is None  # a session deleted elsewhere leaves the listing here


# Under libfaketime the server's lock_timeout never fires (measured with psql on a shifted server:
# `SET lock_timeout = 1000` waited 4.6 s, until the holder let go), and it is what asks again.
@pytest.mark.skipif("FAKETIME" in os.environ, reason="PostgreSQL's lock_timeout does not fire under libfaketime")
async def test_a_lost_ask_is_asked_again_while_the_holder_stays_busy(shared_store: Shared) -> None:
    """The holder never lets its lease linger out (a message on the key every 0.3 s) and misses
    the first ask: the waiting process asks again and gets the key."""
    first = await shared_store(linger_s=60.0)
    second = await shared_store()
    assert first.state.relay is not None
    heard = first.state.relay.asked
    missed: list[int] = []

    def deaf_once(lock: int) -> None:
        if not missed:
            missed.append(lock)
            return
        assert heard is not None
        heard(lock)

    first.state.relay.asked = deaf_once
    await post(first, KEY, "one")
    stop = asyncio.Event()

    async def busy() -> None:
        while not stop.is_set():
            await post(first, KEY, "busy")
            await asyncio.sleep(0.3)

    keeper = asyncio.create_task(busy())
    try:
        await asyncio.wait_for(post(second, KEY, "two"), 30)
    finally:
        stop.set()
        await keeper
    assert missed  # the first ask was lost, a later one was heard


async def test_closing_while_a_take_waits_does_not_hang(shared_store: Shared) -> None:
    first = await shared_store(linger_s=60.0)
    second = await shared_store()
    assert first.state.relay is not None
    first.state.relay.asked = None  # the first never gives the key back
    await post(first, KEY, "one")
    waiting = asyncio.create_task(post(second, KEY, "two"))
    deadline = time.monotonic() + 10
    while leases_of(second).waits == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.wait_for(second.close(), 30)
    with pytest.raises(StorageUnavailable, match="shutting down"):
        await waiting
    assert await post(first, KEY, "three") == 2  # the first holds the key still, and stores on


async def test_a_view_read_that_a_lease_overtook_is_not_applied(shared_store: Shared) -> None:
    first = await shared_store()
    second = await shared_store(linger_s=0.0)  # gives each lease back at once
    await post(first, KEY, "one")
    await asyncio.sleep(0)
    real = second.sharing._read_keys
    views = 0

    async def overtaken(keys: list[str], conn: Any, **how: Any) -> Any:
        nonlocal views
        snapshot = await real(keys, conn, **how)
        views += 1
        if views == 1:  # the view's read: meanwhile this process takes the key, stores, gives it back
            assert await post(second, KEY, "two") == 2
            while leases_of(second).known(KEY):
                await asyncio.sleep(0.01)
        return snapshot

    second.sharing._read_keys = overtaken  # type: ignore[method-assign]
    second.sharing._from_others({"type": "message", "key": KEY, "run_id": "r", "at": "now"})  # type: ignore[typeddict-item]
    assert second.sharing._viewing is not None
    await second.sharing._viewing
    run = second.active_run(KEY)
    assert run is not None and run.next_seq == 3  # not the older read's 2


async def test_a_dead_holders_append_committing_after_the_lease_was_read_is_followed_not_refused(
    shared_store: Shared, pg_dsn: str
) -> None:
    """The killed holder's append was sent on another connection than its lease lock: it may not
    hold the run's row yet when the next holder reads the run, and commit after. The next holder's
    append then finds its seq taken: it is sent once more after the committed counters, not
    refused with a 409 (CI and a local loop of the kill -9 test saw that refusal)."""
    store = await shared_store(linger_s=60.0)
    assert await post(store, KEY, "one") == 1
    assert leases_of(store).held(KEY)  # this process holds the key and has read its run
    run = store.active_run(KEY)
    assert run is not None
    dead = await asyncpg.connect(pg_dsn)  # the dead holder's append, committing only now
    try:
        await dead.execute("UPDATE runs SET next_seq = next_seq + 1 WHERE run_id = $1", run.run_id)
    finally:
        await dead.close()
    assert await post(store, KEY, "two") == 3
    assert await post(store, KEY, "three") == 4


async def test_a_posts_append_whose_seq_a_dead_holder_took_is_sent_again_with_the_committed_seq(
    shared_store: Shared, pg_dsn: str
) -> None:
    """The same race on the way a post stores (``Conversations``): the seq is given under the key's
    lock by ``queue_append`` and the commit awaited after it with ``finish_append``. The retry used
    to sit in ``append`` alone, so a post got the 409 (CI, the kill -9 test, after the first fix).
    The caller's record takes the seq the message was stored with."""
    store = await shared_store(linger_s=60.0)
    assert await post(store, KEY, "one") == 1
    run = store.active_run(KEY)
    assert run is not None
    dead = await asyncpg.connect(pg_dsn)  # the dead holder's append, committing only now
    try:
        await dead.execute("UPDATE runs SET next_seq = next_seq + 1 WHERE run_id = $1", run.run_id)
        message = NewMessage(role="user", content="two")
        async with store.lock_for(KEY):
            record, durable = store.queue_append(run, message)
        assert record["seq"] == 2  # what this process counted
        stored = await store.finish_append(run, message, record, durable)
        assert stored["seq"] == record["seq"] == 3
        rows = await dead.fetch("SELECT seq, record->>'content' AS content FROM messages WHERE run_id = $1", run.run_id)
        assert sorted((r["seq"], r["content"]) for r in rows) == [(1, "one"), (3, "two")]  # stored once, at 3
    finally:
        await dead.close()
    assert await post(store, KEY, "three") == 4


async def test_a_lease_taken_while_a_dead_holders_append_commits_reads_after_it(
    shared_store: Shared, pg_dsn: str
) -> None:
    """A process killed while it held a key frees the lock at once, but the append it had sent may
    still commit. The next holder reads the key's run once that transaction has ended, so it
    appends after that seq instead of failing with a conflict (CI saw a 409 after a kill -9)."""
    store = await shared_store(linger_s=0.05)
    assert await post(store, KEY, "one") == 1
    run = store.active_run(KEY)
    assert run is not None
    deadline = time.monotonic() + 10
    while leases_of(store).held(KEY):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    dead = await asyncpg.connect(pg_dsn)  # the killed holder's append, still committing
    try:
        writing = dead.transaction()
        await writing.start()
        await dead.execute("UPDATE runs SET next_seq = next_seq + 1 WHERE run_id = $1", run.run_id)
        taking = asyncio.create_task(post(store, KEY, "two"))
        await asyncio.sleep(0.3)
        assert not taking.done()  # the read waits for the transaction
        await writing.commit()
        assert await asyncio.wait_for(taking, 10) == 3
    finally:
        await dead.close()
