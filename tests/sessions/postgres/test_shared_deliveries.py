"""Retries of one ``client_message_id`` sent to two processes sharing the database (two shared
stores, as ``--workers 2``): the append statement checks the id, so it is stored once whichever
process gets which retry and whatever each process knew of the key before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sessions.deliveries import AlreadyDelivered
from sessions.postgres.store import PgStore
from sessions.records import MessageRecord, NewMessage, RunStart, TaskKey
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

KEY = "agent:main:retried"
Opener = Callable[[], Awaitable[PgStore]]


@pytest.fixture
async def shared_store(postgres_server: PgServer, clock: FakeClock) -> AsyncIterator[Opener]:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    opened: list[PgStore] = []

    async def opener() -> PgStore:
        store = await PgStore.open(settings_with(), dsn=dsn, clock=clock, pool_size=2, shared=True)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        await store.close()


async def post_once(store: PgStore, text: str, cmid: str) -> MessageRecord:
    """What a post does: under the key's lock, the active run (or a new one), its message marked once."""
    async with store.lock_for(KEY):
        run = store.active_run(KEY) or await store.start_run(
            RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", KEY))
        )
        message = NewMessage(role="user", content=text, client_message_id=cmid, once=True)
        return await store.append(run, message)


async def test_retries_of_one_id_across_two_processes_store_it_once(shared_store: Opener) -> None:
    first, second = await shared_store(), await shared_store()
    opening = await post_once(first, "opens the run", "c-0")
    assert opening["seq"] == 1
    settled = await asyncio.gather(
        *(post_once(store, "retried", "c-1") for store in (first, second, first, second)), return_exceptions=True
    )
    kept = [r for r in settled if not isinstance(r, BaseException)]
    refused = [r for r in settled if isinstance(r, AlreadyDelivered)]
    assert len(kept) == 1 and len(refused) == 3, settled
    assert {r.prior.seq for r in refused} == {kept[0]["seq"]} == {2}
    with pytest.raises(AlreadyDelivered):  # the other process, later: its view of the key is refreshed
        await post_once(second, "opens the run", "c-0")
    after = await post_once(second, "next", "c-2")
    assert after["seq"] == 3
    run = first.active_run(KEY)
    assert run is not None
    stored = await first.read_messages(run.run_id, after_seq=0, limit=10)
    assert [m["content"] for m in stored] == ["opens the run", "retried", "next"]


async def test_a_repeat_found_by_the_statement_gives_its_seq_to_what_was_queued_behind_it(
    postgres_server: PgServer, clock: FakeClock
) -> None:
    """The statement stores nothing of a run whose batch holds a repeat: the appends queued
    behind it while the statement ran take the seqs that follow, a reply to the repeat goes with
    it, and what is stored is gapless."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    store = await PgStore.open(settings_with(), dsn=dsn, clock=clock, pool_size=2)
    try:
        run = await store.start_run(
            RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", KEY))
        )
        first = await store.append(run, NewMessage(role="user", content="first", client_message_id="c-1", once=True))
        again = NewMessage(role="user", content="again", client_message_id="c-1", once=True)
        repeat, repeat_durable = store.queue_append(run, again)
        await asyncio.sleep(0)  # the flusher sends the repeat: the run is in a statement now
        assert run.run_id in store.queue.in_flight
        behind = NewMessage(role="user", content="behind")
        reply = NewMessage(role="assistant", content="to the repeat", reply_to=repeat["seq"])
        queued = [(m, *store.queue_append(run, m)) for m in (behind, reply)]
        with pytest.raises(AlreadyDelivered) as refused:
            await store.finish_append(run, again, repeat, repeat_durable)
        assert refused.value.prior.seq == first["seq"] == 1
        kept = await store.finish_append(run, *queued[0])
        assert kept["seq"] == 2 and kept["content"] == "behind"
        with pytest.raises(AlreadyDelivered):  # the reply to a repeat is not stored either
            await store.finish_append(run, *queued[1])
        assert (await store.append(run, NewMessage(role="user", content="next")))["seq"] == 3
        stored = await store.read_messages(run.run_id, after_seq=0, limit=10)
        assert [(m["seq"], m["content"]) for m in stored] == [(1, "first"), (2, "behind"), (3, "next")]
        assert [line["content"] for line in await store.read_context(run)] == ["first", "behind", "next"]
        assert run.message_count == 3 and store.require_entry(KEY).counters == run.counters
    finally:
        await store.close()
