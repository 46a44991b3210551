"""Runs and their lifecycle: one active run per key, pause/resume, complete/fail, delete, discard."""

from __future__ import annotations

from typing import Any

import pytest

from config.errors import Conflict, NotFound, SessionPaused
from sessions.events import StoreEvent
from sessions.protocol import StoreProtocol
from sessions.records import RunFinish, RunQuery, RunState
from sessions.store_hooks import StoreHooks
from tests.sessions.conformance.support import KEY, Harness, command, start, user


async def test_a_started_run_is_the_keys_active_run(store: StoreProtocol) -> None:
    assert store.entry(KEY) is None and store.active_run(KEY) is None
    run = await start(store)
    assert run.status == "running" and run.next_seq == 1
    assert store.active_run(KEY) is run and store.run_state(run.run_id) is run
    assert [r.run_id for r in store.active_runs()] == [run.run_id]
    entry = store.require_entry(KEY)
    assert (entry.run_id, entry.status, entry.chat_type, entry.inherit_next) == (run.run_id, "running", "direct", True)
    row = await store.get_run(run.run_id)
    assert row is not None and (row["status"], row["session_key"], row["task_type"]) == ("running", KEY, "agent")
    assert [r["uuid"] for r in await store.list_runs(RunQuery(session_key=KEY))] == [run.run_id]
    assert [(k.key, k.agent_id, k.chat_type) for k in await store.known_keys()] == [(KEY, "main", "direct")]


async def test_a_key_has_at_most_one_active_run(store: StoreProtocol) -> None:
    run = await start(store)
    with pytest.raises(Conflict):
        await start(store)
    assert store.active_run(KEY) is run
    other = await start(store, "agent:main:other")
    assert {r.run_id for r in store.active_runs()} == {run.run_id, other.run_id}


async def test_pause_refuses_messages_but_not_commands_until_resume(store: StoreProtocol) -> None:
    run = await start(store)
    assert (await store.pause(KEY)) is run and run.status == "paused"
    assert store.require_entry(KEY).status == "paused"
    assert (await store.get_run(run.run_id) or {}).get("status") == "paused"
    with pytest.raises(SessionPaused):
        await store.append(run, user("hello"))
    assert (await store.append(run, command("/status")))["seq"] == 1
    assert (await store.pause(KEY)) is run  # pausing twice is a no-op
    await store.resume(KEY)
    assert run.status == "running" and store.require_entry(KEY).status == "running"
    assert (await store.append(run, user("hello")))["seq"] == 2


async def test_complete_leaves_the_entry_idle_and_the_row_completed(store: StoreProtocol) -> None:
    run = await start(store)
    await store.append(run, user("one"))
    await store.append(run, user("two"))
    done = await store.complete(KEY)
    assert done.status == "completed" and store.active_run(KEY) is None and store.run_state(run.run_id) is None
    entry = store.require_entry(KEY)
    assert (entry.run_id, entry.last_run_id, entry.status) == (None, run.run_id, "idle")
    row = await store.get_run(run.run_id)
    assert row is not None and row["status"] == "completed" and row["completed_at"] is not None
    assert row["total_messages"] == 2
    with pytest.raises(Conflict):
        await store.complete(KEY)
    again = await start(store)
    assert again.run_id != run.run_id and (await store.append(again, user("three")))["seq"] == 1


async def test_complete_with_an_error_fails_the_run(store: StoreProtocol) -> None:
    run = await start(store)
    done = await store.complete(KEY, RunFinish(error="broken", reason="test"))
    assert done.status == "failed"
    row = await store.get_run(run.run_id)
    assert row is not None and (row["status"], row["error_message"]) == ("failed", "broken")
    assert [r["uuid"] for r in await store.list_runs(RunQuery(statuses=("failed",)))] == [run.run_id]
    assert await store.list_runs(RunQuery(statuses=("completed",))) == []


async def test_complete_runs_the_hooks_and_keeps_the_final_summary_it_is_given(harness: Harness) -> None:
    seen: list[tuple[str, Any]] = []

    async def hook(run: RunState) -> None:
        seen.append(("hook", run.run_id))

    store = await harness.open(StoreHooks(completion_hooks={"test": hook}))
    run = await start(store)
    await store.complete(KEY, RunFinish(reason="reset", final_summary="what happened"))
    assert seen == [("hook", run.run_id)]
    assert await store.read_final_summary(run.run_id) == "what happened"
    seen.clear()
    other = await start(store)
    await store.complete(KEY, RunFinish(reason="purge", summarize=False, final_summary="not kept"))
    assert seen == [] and await store.read_final_summary(other.run_id) is None
    third = await start(store)
    await store.complete(KEY)  # given none, the store writes none
    assert await store.read_final_summary(third.run_id) is None


async def test_delete_removes_the_entry_and_keeps_the_runs(store: StoreProtocol) -> None:
    run = await start(store)
    assert await store.delete(KEY) == run.run_id
    assert store.entry(KEY) is None and store.active_run(KEY) is None
    with pytest.raises(NotFound):
        store.require_entry(KEY)
    assert [r["uuid"] for r in await store.list_runs(RunQuery(session_key=KEY))] == [run.run_id]
    with pytest.raises(NotFound):
        await store.delete(KEY)


@pytest.mark.parametrize("remove_entry", [True, False])
async def test_discard_run_leaves_nothing_of_the_run(store: StoreProtocol, remove_entry: bool) -> None:
    if not remove_entry:  # the key had a run before: its entry stays, idle
        await start(store)
        await store.complete(KEY)
    run = await start(store)
    await store.discard_run(run, remove_entry=remove_entry)
    assert store.active_run(KEY) is None and store.run_state(run.run_id) is None
    assert await store.get_run(run.run_id) is None
    entry = store.entry(KEY)
    assert (entry is None) if remove_entry else (entry is not None and entry.status == "idle")


async def test_listeners_hear_lifecycle_and_message_events(harness: Harness) -> None:
    events: list[StoreEvent] = []
    durable: list[int] = []
    hooks = StoreHooks(
        listeners=(events.append,), durable_listeners=(lambda run, record: durable.append(record["seq"]),)
    )
    store = await harness.open(hooks)
    run = await start(store)
    await store.append(run, user("hello"))
    await store.pause(KEY)
    await store.resume(KEY)
    await store.complete(KEY)
    kinds = [(e["type"], e.get("action")) for e in events]
    assert kinds == [("lifecycle", "start"), ("message", None), ("lifecycle", "pause"), ("lifecycle", "resume"),
                     ("lifecycle", "completed")]  # fmt: skip
    assert all(e["key"] == KEY and e["run_id"] == run.run_id for e in events)
    assert events[1]["seq"] == 1 and events[1]["content"] == "hello"
    assert durable == [1]
