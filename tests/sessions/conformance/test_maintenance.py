"""The doctor, cleanup, export and purge of a backend's storage (the ``Maintenance`` capability):
a sound store checks clean, cleanup plans (dry run) and archives what is past its retention and
the archived run stays readable, an export gives each run's row and its records in order, a purge
erases a key for good and says how much, on every backend."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from config.errors import RunNotFound, SessionNotFound
from config.settings import CleanupSettings
from sessions.cleanup_plan import CleanupRequest
from sessions.exports import RunExport
from sessions.protocol import ConversationStore, Maintenance
from sessions.records import NewMessage, RunFinish, RunQuery
from tests.conftest import FakeClock
from tests.sessions.conformance.support import KEY, start, user

pytestmark = pytest.mark.capability("Maintenance")
BOB = "agent:main:dm:bob"


def maintenance(store: ConversationStore) -> Maintenance:
    return cast(Maintenance, store)


async def _complete_no_hooks(key: str) -> None:
    raise AssertionError(f"cleanup completed {key}: no run of these tests is stale")


def _read(run: RunExport) -> tuple[list[int], list[dict[str, Any]], str | None]:
    """What the export writer reads of a run (blocking: off the loop, as the writer runs)."""
    return [int(m["seq"]) for m in run.reader.messages()], run.reader.summaries(), run.reader.final_summary()


async def test_a_sound_store_checks_clean(store: ConversationStore) -> None:
    run = await start(store)
    await store.append(run, user("hello"))
    await store.complete(KEY)
    other = await start(store, BOB)
    await store.append(other, user("still here"))

    assert await maintenance(store).check(fix=False) == []
    assert await maintenance(store).check(fix=True) == []


async def test_an_export_gives_each_run_row_and_records_in_order(store: ConversationStore, clock: FakeClock) -> None:
    first = await start(store)
    await store.append(first, user("one"))
    await store.append(first, NewMessage(role="assistant", content="two"))
    await store.complete(KEY, RunFinish(final_summary="the first run"))
    clock.advance(seconds=1)
    second = await start(store)
    await store.append(second, user("three"))

    runs = await maintenance(store).export_runs(key=KEY)

    assert [r.row["uuid"] for r in runs] == [first.run_id, second.run_id]
    assert [r.row["status"] for r in runs] == ["completed", "running"]
    assert all(r.row["session_key"] == KEY for r in runs)
    assert await asyncio.to_thread(_read, runs[0]) == ([1, 2], [], "the first run")
    assert await asyncio.to_thread(_read, runs[1]) == ([1], [], None)
    (one,) = await maintenance(store).export_runs(run_id=first.run_id)
    assert one.row["uuid"] == first.run_id
    with pytest.raises(SessionNotFound):
        await maintenance(store).export_runs(key=BOB)
    with pytest.raises(RunNotFound):
        await maintenance(store).export_runs(run_id="no-such-run")


async def test_cleanup_plans_then_archives_a_run_past_its_retention(store: ConversationStore, clock: FakeClock) -> None:
    old = await start(store)
    await store.append(old, user("long ago"))
    await store.complete(KEY)
    clock.advance(days=40)
    recent = await start(store, BOB)
    await store.append(recent, user("just now"))
    settings = CleanupSettings(retention_days=30)

    planned = await maintenance(store).cleanup(CleanupRequest(settings, clock(), True, _complete_no_hooks))
    assert [(a["action"], a["run_id"], a["done"]) for a in planned] == [("archive", old.run_id, False)]
    assert (await store.require_run(old.run_id))["archived_at"] is None

    done = await maintenance(store).cleanup(CleanupRequest(settings, clock(), False, _complete_no_hooks))
    assert [(a["action"], a["run_id"], a["done"]) for a in done] == [("archive", old.run_id, True)]
    assert (await store.require_run(old.run_id))["archived_at"] is not None
    assert [m["content"] for m in await store.read_messages(old.run_id, after_seq=0, limit=10)] == ["long ago"]
    assert await maintenance(store).cleanup(CleanupRequest(settings, clock(), True, _complete_no_hooks)) == []


async def test_an_expired_archive_is_deleted(store: ConversationStore, clock: FakeClock) -> None:
    run = await start(store)
    await store.append(run, user("gone soon"))
    await store.complete(KEY)
    clock.advance(days=2)
    settings = CleanupSettings(retention_days=1, archive_retention_days=5)
    await maintenance(store).cleanup(CleanupRequest(settings, clock(), False, _complete_no_hooks))
    clock.advance(days=6)

    done = await maintenance(store).cleanup(CleanupRequest(settings, clock(), False, _complete_no_hooks))

    assert [(a["action"], a["run_id"]) for a in done] == [("delete_archive", run.run_id)]
    assert await readable(store, run.run_id) == []  # its messages are gone (the files backend keeps its row)
    assert await maintenance(store).cleanup(CleanupRequest(settings, clock(), True, _complete_no_hooks)) == []


async def readable(store: ConversationStore, run_id: str) -> list[Any]:
    """A run's messages; none when the run is gone."""
    try:
        return await store.read_messages(run_id, after_seq=0, limit=10)
    except RunNotFound:
        return []


async def test_a_purge_erases_a_key_for_good(store: ConversationStore, clock: FakeClock) -> None:
    first = await start(store)
    await store.append(first, user("secret one"))
    await store.complete(KEY)
    second = await start(store)
    await store.append(second, user("secret two"))
    await store.append(second, user("secret three"))
    other = await start(store, BOB)
    await store.append(other, user("not mine"))
    clock.advance(seconds=5)

    tombstone = await maintenance(store).purge(KEY, history=None)

    assert (tombstone["session_key"], tombstone["runs"], tombstone["messages"]) == (KEY, 2, 3)
    assert store.entry(KEY) is None and store.active_run(KEY) is None
    assert await store.list_runs(RunQuery(session_key=KEY)) == []
    for run_id in (first.run_id, second.run_id):
        assert await store.get_run(run_id) is None
        assert await readable(store, run_id) == []
    assert [r["uuid"] for r in await store.list_runs(RunQuery(session_key=BOB))] == [other.run_id]
    with pytest.raises(SessionNotFound):
        await maintenance(store).purge(KEY, history=None)
