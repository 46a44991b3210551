"""Reads the conformance suite does not reach: the runs a new run inherits from (by key or by the
seed's task key, within a window, not those of a deleted session), and an unknown run id."""

from __future__ import annotations

import pytest

from config.errors import RunNotFound
from sessions.records import RunStart, TaskKey
from tests.conftest import FakeClock
from tests.sessions.postgres.conftest import Opener

KEY, OTHER = "agent:main:a", "agent:main:b"


async def test_previous_runs_by_key_and_task_key_within_the_window(open_store: Opener, clock: FakeClock) -> None:
    store = await open_store()
    task = TaskKey("agent", "shared-task", user="u1")

    async def run_on(key: str, task_key: TaskKey) -> str:
        run = await store.start_run(RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=task_key))
        await store.complete(key)
        return run.run_id

    old = await run_on(KEY, TaskKey("agent", KEY))
    clock.advance(days=10)
    recent = await run_on(KEY, TaskKey("agent", KEY))
    clock.advance(hours=1)
    same_task = await run_on(OTHER, task)
    running = await store.start_run(RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=task))

    assert [r["uuid"] for r in await store.previous_runs(key=KEY, task_key=None, within_days=30)] == [recent, old]
    assert [r["uuid"] for r in await store.previous_runs(key=KEY, task_key=None, within_days=5)] == [recent]
    by_task = await store.previous_runs(key=KEY, task_key=task, within_days=30)
    assert [r["uuid"] for r in by_task] == [same_task, recent, old]  # newest ended first; the running one not
    assert running.run_id not in {r["uuid"] for r in by_task}

    await store.delete(KEY)  # a new session on the key starts clean
    assert await store.previous_runs(key=KEY, task_key=None, within_days=30) == []
    assert [r["uuid"] for r in await store.previous_runs(key=OTHER, task_key=None, within_days=30)] == [same_task]


async def test_reads_of_an_unknown_run_say_so(open_store: Opener) -> None:
    store = await open_store()
    assert await store.get_run("nope") is None
    for read in (
        store.require_run("nope"),
        store.read_messages("nope", after_seq=0, limit=10),
        store.read_records("nope", "tools"),
        store.read_final_summary("nope"),
    ):
        with pytest.raises(RunNotFound, match="no run 'nope'"):
            await read
