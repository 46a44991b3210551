"""The retry-safe append: a message marked ``once`` is its own delivery record, and a repeat of
its ``client_message_id`` on the key within the window is refused by the append itself
(``AlreadyDelivered``), taking no seq, whether it comes in the same group commit as other
messages, at the same time as the first, after a restart, or after the run ended."""

from __future__ import annotations

import asyncio

import pytest

from config.clock import iso
from sessions.deliveries import DELIVERY_WINDOW, AlreadyDelivered
from sessions.protocol import ConversationStore
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.sessions.conformance.support import KEY, Harness, counters_agree, start, user


def once(text: str, cmid: str) -> NewMessage:
    return user(text, client_message_id=cmid, once=True)


async def _since(store: ConversationStore, clock: FakeClock) -> str:
    return iso(clock() - DELIVERY_WINDOW)


async def _ready(store: ConversationStore, clock: FakeClock, cmid: str) -> None:
    """What a post does before an append it cannot leave the check to (``checks_deliveries``)."""
    if not store.checks_deliveries(KEY):
        assert await store.recall_delivery(KEY, cmid, since=await _since(store, clock)) is None


async def test_a_repeat_in_the_same_group_commit_is_refused_and_takes_no_seq(
    store: ConversationStore, clock: FakeClock
) -> None:
    run = await start(store)
    await _ready(store, clock, "c-1")
    first = await store.append(run, once("first", "c-1"))
    assert first["seq"] == 1 and first["client_message_id"] == "c-1"
    await _ready(store, clock, "c-2")
    # queued in one pass: one group commit on the backends that have one
    settled = await asyncio.gather(
        store.append(run, user("before")),
        store.append(run, once("again", "c-1")),
        store.append(run, once("new", "c-2")),
        store.append(run, NewMessage(role="assistant", content="after", reply_to=1)),
        return_exceptions=True,
    )
    repeat = settled[1]
    assert isinstance(repeat, AlreadyDelivered), settled
    assert (repeat.prior.run_id, repeat.prior.seq) == (run.run_id, 1)
    stored = [r for r in settled if not isinstance(r, BaseException)]
    assert [r["seq"] for r in stored] == [2, 3, 4]  # gapless: the repeat took none
    assert [r["content"] for r in stored] == ["before", "new", "after"]
    assert stored[2]["reply_to"] == 1
    messages = await store.read_messages(run.run_id, after_seq=0, limit=100)
    assert [(m["seq"], m["content"]) for m in messages] == [(1, "first"), (2, "before"), (3, "new"), (4, "after")]
    assert [line["content"] for line in await store.read_context(run)] == ["first", "before", "new", "after"]
    assert run.message_count == 4
    counters_agree(store)


async def test_concurrent_retries_of_one_id_store_it_once(store: ConversationStore, clock: FakeClock) -> None:
    run = await start(store)
    await store.append(run, user("opening"))
    await _ready(store, clock, "c-9")
    settled = await asyncio.gather(
        *(store.append(run, once("retried", "c-9")) for _ in range(5)), return_exceptions=True
    )
    kept = [r for r in settled if not isinstance(r, BaseException)]
    refused = [r for r in settled if isinstance(r, AlreadyDelivered)]
    assert len(kept) == 1 and len(refused) == 4, settled
    assert {r.prior.seq for r in refused} == {kept[0]["seq"]} == {2}
    messages = await store.read_messages(run.run_id, after_seq=0, limit=100)
    assert [m["content"] for m in messages] == ["opening", "retried"]
    await store.append(run, user("next"))  # the run goes on at the next seq
    assert run.message_count == 3
    counters_agree(store)


async def test_a_retry_after_a_restart_between_the_append_and_any_record(harness: Harness, clock: FakeClock) -> None:
    """The message is durable, nothing else was written (the process died before it answered):
    the retry after the restart is recognised from the message itself, in the run and after it."""
    store = await harness.open()
    run = await start(store)
    await _ready(store, clock, "c-5")
    await store.append(run, once("answered never", "c-5"))
    store = await harness.reopen()
    run_after = store.active_run(KEY)
    assert run_after is not None
    prior = await store.recall_delivery(KEY, "c-5", since=await _since(store, clock))
    assert prior is not None and (prior.run_id, prior.seq, prior.response) == (run.run_id, 1, None)
    with pytest.raises(AlreadyDelivered) as refused:
        await store.append(run_after, once("answered never", "c-5"))
    assert refused.value.prior.seq == 1
    await store.complete(KEY)
    store = await harness.reopen()
    run_next = await start(store)
    prior = await store.recall_delivery(KEY, "c-5", since=await _since(store, clock))
    assert prior is not None and (prior.run_id, prior.seq) == (run.run_id, 1)  # the ended run's record
    with pytest.raises(AlreadyDelivered):
        await store.append(run_next, once("answered never", "c-5"))
    assert run_next.message_count == 0
    assert await store.read_messages(run_next.run_id, after_seq=0, limit=10) == []


async def test_an_expired_delivery_is_stored_anew_and_the_new_one_counts(harness: Harness, clock: FakeClock) -> None:
    store = await harness.open()
    run = await start(store)
    await _ready(store, clock, "c-7")
    await store.append(run, once("first", "c-7"))
    clock.advance(days=2)  # the first delivery's window is over
    again = await store.append(run, once("second", "c-7"))
    assert again["seq"] == 2
    clock.advance(hours=1)
    with pytest.raises(AlreadyDelivered) as refused:
        await store.append(run, once("third", "c-7"))
    assert refused.value.prior.seq == 2
    await store.complete(KEY)  # the run's record of the id is its latest delivery
    store = await harness.reopen()
    run_next = await start(store)
    prior = await store.recall_delivery(KEY, "c-7", since=await _since(store, clock))
    assert prior is not None and (prior.run_id, prior.seq) == (run.run_id, 2)
    with pytest.raises(AlreadyDelivered):
        await store.append(run_next, once("fourth", "c-7"))


async def test_a_recorded_reply_body_comes_back_with_the_prior_delivery(
    store: ConversationStore, clock: FakeClock
) -> None:
    run = await start(store)
    await _ready(store, clock, "c-3")
    await store.append(run, once("question", "c-3"))
    await store.append(run, NewMessage(role="assistant", content="answer", reply_to=1))
    prior = await store.recall_delivery(KEY, "c-3", since=await _since(store, clock))
    assert prior is not None and prior.reply == {"content": "answer", "seq": 2} and prior.response is None
    await store.remember_reply(KEY, "c-3", run_id=run.run_id, seq=1, response='{"reply": "answer"}')
    prior = await store.recall_delivery(KEY, "c-3", since=await _since(store, clock))
    assert prior is not None and (prior.seq, prior.response) == (1, '{"reply": "answer"}')
    assert await store.recall_delivery("agent:main:other", "c-3", since=await _since(store, clock)) is None
