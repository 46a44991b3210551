"""The history index a backend keeps beside its runs (the ``HistorySource`` capability): a rebuild
indexes every stored message and only those, a catch-up what the index lacks, the search finds a
message by its words with the files index's filters, and the index's check finds what is missing
or stale and fixes it, on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest

from sessions.history_index import HistoryIndexProtocol, HistoryQuery
from sessions.protocol import ConversationStore, HistorySource
from sessions.records import NewMessage
from tests.sessions.conformance.support import KEY, start, user

pytestmark = pytest.mark.capability("HistorySource")
BOB = "agent:main:dm:bob"


@pytest.fixture
async def index(store: ConversationStore) -> AsyncIterator[HistoryIndexProtocol]:
    opened = cast(HistorySource, store).open_history()
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def source(store: ConversationStore) -> HistorySource:
    return cast(HistorySource, store)


async def test_a_rebuild_indexes_every_stored_message_and_the_search_finds_them(
    store: ConversationStore, index: HistoryIndexProtocol
) -> None:
    run = await start(store)
    await store.append(run, user("the quick brown fox jumps"))
    await store.append(run, NewMessage(role="assistant", content="a lazy dog sleeps"))
    other = await start(store, BOB)
    await store.append(other, user("foxes hunt at night"))

    await source(store).rebuild_history(index)

    assert await index.seqs(run.run_id) == {1, 2}
    assert await index.run_ids() == {run.run_id, other.run_id}
    hits = await index.search(HistoryQuery("fox"))
    assert {(h.session_key, h.run_id, h.seq) for h in hits} == {(KEY, run.run_id, 1), (BOB, other.run_id, 1)}
    assert all("<mark>" in h.snippet for h in hits)
    assert [h.seq for h in await index.search(HistoryQuery("lazy dog"))] == [2]
    assert await index.search(HistoryQuery("fox dog")) == []  # every term must match
    assert await source(store).check_history(index, fix=False) == []


async def test_the_search_filters_by_key_role_and_visible_keys(
    store: ConversationStore, index: HistoryIndexProtocol
) -> None:
    run = await start(store)
    await store.append(run, user("budget meeting on friday"))
    await store.append(run, NewMessage(role="assistant", content="the budget meeting is booked"))
    other = await start(store, BOB)
    await store.append(other, user("my budget is tight"))
    await source(store).rebuild_history(index)

    assert {h.session_key for h in await index.search(HistoryQuery("budget", key=BOB))} == {BOB}
    assert [h.role for h in await index.search(HistoryQuery("budget", key=KEY, role="assistant"))] == ["assistant"]
    assert {h.session_key for h in await index.search(HistoryQuery("budget", keys=frozenset({KEY})))} == {KEY}
    assert await index.search(HistoryQuery("budget", keys=frozenset())) == []
    assert len(await index.search(HistoryQuery("budget", limit=2))) == 2
    assert len(await index.search(HistoryQuery("budget", limit=2, offset=2))) == 1


async def test_a_catch_up_indexes_what_the_index_lacks(store: ConversationStore, index: HistoryIndexProtocol) -> None:
    run = await start(store)
    await store.append(run, user("first words"))
    await source(store).rebuild_history(index)
    await store.append(run, user("second words"))  # stored, never fed: a crash before the batch
    await store.complete(KEY)

    await source(store).catch_up_history(index)

    assert await index.seqs(run.run_id) == {1, 2}
    assert [h.seq for h in await index.search(HistoryQuery("second"))] == [2]


async def test_the_check_finds_messages_the_index_lacks_and_fixes_them(
    store: ConversationStore, index: HistoryIndexProtocol
) -> None:
    run = await start(store)
    await store.append(run, user("an unindexed message"))
    await store.append(run, user("and another one"))

    found = await source(store).check_history(index, fix=False)
    assert found and all(f["severity"] == "warning" and not f["fixed"] for f in found)
    assert await index.seqs(run.run_id) == set()

    fixed = await source(store).check_history(index, fix=True)
    assert fixed and all(f["fixed"] for f in fixed)
    assert await index.seqs(run.run_id) == {1, 2}
    assert await source(store).check_history(index, fix=False) == []


async def test_deleting_a_key_takes_its_rows_only(store: ConversationStore, index: HistoryIndexProtocol) -> None:
    run = await start(store)
    await store.append(run, user("kept apart"))
    other = await start(store, BOB)
    await store.append(other, user("kept apart too"))
    await source(store).rebuild_history(index)

    await index.delete_key(BOB)

    assert await index.run_ids() == {run.run_id}
    assert [h.session_key for h in await index.search(HistoryQuery("apart"))] == [KEY]


async def test_a_post_waits_while_the_index_is_max_backlog_behind_until_its_writer_catches_up(
    store: ConversationStore,
) -> None:
    index = source(store).open_history(max_backlog=20)
    await index.open()
    try:
        run = await start(store)
        records = [await store.append(run, user(f"backlog words {n}")) for n in range(60)]
        for record in records:  # fed with no await between: faster than any writer takes them
            index.feed(run.run_id, KEY, "main", record)
        behind = index.backlog.rows
        waited = await index.backlog.room()
        assert index.backlog.rows < 20
        assert waited == (behind >= 20)  # an index that writes as it is fed is never behind
        assert index.backlog.late == 0  # the writer brought it below the limit, not the timeout
        await index.flush()
        assert index.backlog.rows == 0
        assert await index.seqs(run.run_id) == set(range(1, 61))
    finally:
        await index.close()
