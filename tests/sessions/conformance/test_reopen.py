"""Reopen and recovery: what was acknowledged is there after a restart, counters included."""

from __future__ import annotations

from sessions.compactor import Compactor, extractive
from sessions.records import EntryChange, ToolUse
from tests.sessions.conformance.support import KEY, Harness, command, counters_agree, start, user
from tests.sessions.helpers import settings_with


async def test_an_active_run_goes_on_after_a_restart(harness: Harness) -> None:
    store = await harness.open()
    run = await start(store)
    for i in range(5):
        await store.append(run, user(f"message {i}"))
    await store.append(run, command("/status"))
    await store.record_tool(run, ToolUse(tool_name="t", arguments={}))
    counters = run.counters
    store = await harness.reopen()
    back = store.active_run(KEY)
    assert back is not None and back.run_id == run.run_id and back.status == "running"
    assert back.counters == counters and back.next_tool_seq == 2
    counters_agree(store)
    assert (await store.append(back, user("after")))["seq"] == 7
    assert [m["seq"] for m in await store.read_messages(run.run_id, after_seq=0, limit=100)] == list(range(1, 8))


async def test_counters_after_a_compaction_survive_a_restart(harness: Harness) -> None:
    store = await harness.open()
    run = await start(store)
    for i in range(12):
        await store.append(run, user(f"message {i} " + "word " * 40))
    compactor = Compactor(store, extractive, settings_with().compaction)
    assert await compactor.compact(run, trigger="manual", threshold=2000, keep_recent=2, min_to_compress=1)
    await store.append(run, user("after"))
    counters = run.counters
    store = await harness.reopen()
    back = store.active_run(KEY)
    assert back is not None and back.counters == counters
    counters_agree(store)


async def test_a_paused_run_stays_paused(harness: Harness) -> None:
    store = await harness.open()
    run = await start(store)
    await store.pause(KEY)
    store = await harness.reopen()
    back = store.active_run(KEY)
    assert back is not None and back.run_id == run.run_id and back.status == "paused"
    assert store.require_entry(KEY).status == "paused"


async def test_completed_runs_and_entry_settings_survive(harness: Harness) -> None:
    store = await harness.open()
    run = await start(store)
    await store.append(run, user("hello"))
    await store.add_usage(run, {"input_tokens": 7})
    await store.update_entry(KEY, EntryChange(pinned=True, label="work", settings={"model": "m"}))
    await store.complete(KEY)
    store = await harness.reopen()
    assert store.active_run(KEY) is None and list(store.active_runs()) == []
    entry = store.require_entry(KEY)
    assert (entry.status, entry.run_id, entry.last_run_id) == ("idle", None, run.run_id)
    assert (entry.pinned, entry.label, entry.settings, entry.input_tokens) == (True, "work", {"model": "m"}, 7)
    row = await store.get_run(run.run_id)
    assert row is not None and row["status"] == "completed" and row["pinned"]
    assert [m["content"] for m in await store.read_messages(run.run_id, after_seq=0, limit=10)] == ["hello"]


async def test_a_discarded_run_is_gone_after_a_restart(harness: Harness) -> None:
    store = await harness.open()
    run = await start(store)
    await store.discard_run(run, remove_entry=True)
    store = await harness.reopen()
    assert store.entry(KEY) is None and await store.get_run(run.run_id) is None
    assert list(store.active_runs()) == []
