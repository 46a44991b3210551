"""The records beside the runs: the inheritance flag, the reset boundary, idempotency records,
deliveries found in the transcript, webhook delivery ids, the OpenAI-compatible records."""

from __future__ import annotations

from config.clock import iso
from sessions.protocol import StoreProtocol
from sessions.records import CompatConversation, NewMessage, ResponseRef
from tests.conftest import FakeClock
from tests.sessions.conformance.support import KEY, Harness, start, user


async def test_inherit_next_is_set_only_on_change_and_survives_a_restart(harness: Harness) -> None:
    store = await harness.open()
    assert await store.set_inherit_next(KEY, False) is False  # no entry
    await start(store)
    assert store.require_entry(KEY).inherit_next is True
    assert await store.set_inherit_next(KEY, False) is True
    assert await store.set_inherit_next(KEY, False) is False
    await store.complete(KEY)  # idle: the next run starts clean
    store = await harness.reopen()
    assert store.require_entry(KEY).inherit_next is False
    assert await store.set_inherit_next(KEY, True) is True


async def test_the_reset_boundary_survives_a_restart(harness: Harness) -> None:
    store = await harness.open()
    await store.set_reset_boundary(KEY, "2026-11-30T04:00:00Z")  # no entry: nothing to set
    assert store.entry(KEY) is None
    await start(store)
    await store.set_reset_boundary(KEY, "2026-11-30T04:00:00Z")
    store = await harness.reopen()
    assert store.require_entry(KEY).last_reset_boundary == "2026-11-30T04:00:00Z"


async def test_idempotency_records_within_their_window(store: StoreProtocol, clock: FakeClock) -> None:
    since = iso(clock())
    assert await store.find_idempotency(KEY, "c-1", since=since) is None
    await store.remember_delivery(KEY, "c-1", run_id="r-1", seq=4)
    found = await store.find_idempotency(KEY, "c-1", since=since)
    assert found is not None and (found.run_id, found.message_seq, found.response) == ("r-1", 4, None)
    await store.remember_reply(KEY, "c-1", run_id="r-1", seq=4, response='{"reply": "hi"}')
    found = await store.find_idempotency(KEY, "c-1", since=since)
    assert found is not None and found.response == '{"reply": "hi"}'
    assert await store.find_idempotency("agent:main:other", "c-1", since=since) is None  # per key
    clock.advance(days=2)
    assert await store.find_idempotency(KEY, "c-1", since=iso(clock.now)) is None  # expired
    await store.remember_delivery(KEY, "c-1", run_id="r-2", seq=1)  # a new delivery replaces it whole
    found = await store.find_idempotency(KEY, "c-1", since=iso(clock.now))
    assert found is not None and (found.run_id, found.message_seq, found.response) == ("r-2", 1, None)


async def test_a_delivery_is_found_in_the_transcript_with_its_reply(harness: Harness, clock: FakeClock) -> None:
    store = await harness.open()
    since = iso(clock())
    run = await start(store)
    await store.append(run, user("question", client_message_id="c-9"))
    assert await store.find_delivery(KEY, "c-9", since=since) is not None
    await store.append(run, NewMessage(role="assistant", content="answer", reply_to=1))
    store = await harness.reopen()  # read back from what is stored, not from memory
    found = await store.find_delivery(KEY, "c-9", since=since)
    assert found is not None and (found.run_id, found.seq) == (run.run_id, 1)
    assert found.reply is not None and found.reply["content"] == "answer"
    assert await store.find_delivery(KEY, "c-other", since=since) is None
    clock.advance(days=2)
    assert await store.find_delivery(KEY, "c-9", since=iso(clock.now)) is None


async def test_webhook_delivery_ids_first_record_wins(store: StoreProtocol) -> None:
    assert await store.hook_delivery("d-1") is None
    await store.record_hook_delivery("d-1", "github", session_key="hook:github:1", message_seq=3)
    await store.record_hook_delivery("d-1", "github", session_key="hook:github:2", message_seq=9)
    found = await store.hook_delivery("d-1")
    assert found is not None and (found.session_key, found.message_seq) == ("hook:github:1", 3)


async def test_openai_compatible_records_read_back_as_written(harness: Harness) -> None:
    store = await harness.open()
    assert await store.compat_conversation(KEY) is None
    first = CompatConversation(1, 0, 2, "d2", 2, "a2")
    await store.save_compat_conversation(KEY, first)
    assert await store.compat_conversation(KEY) == first
    second = CompatConversation(1, 0, 4, "d4", 4, "a4", answer='{"id": "x"}')
    await store.save_compat_conversation(KEY, second)
    assert await store.latest_compat_response(KEY) is None
    await store.save_compat_response(ResponseRef("resp-1", KEY, "r-1", 2))
    await store.save_compat_response(ResponseRef("resp-2", KEY, "r-1", 4))
    store = await harness.reopen()
    assert await store.compat_conversation(KEY) == second
    assert await store.compat_response("resp-1") == ResponseRef("resp-1", KEY, "r-1", 2)
    assert await store.compat_response("resp-3") is None
    assert await store.latest_compat_response(KEY) == "resp-2"
