"""Maintenance on PostgreSQL: cleanup carries out sessions.cleanup_plan's decisions (a stale active
run completed then archived, an old archive deleted with its rows, a pinned key untouched, expired
delivery records forgotten; a dry run changes nothing); the doctor reports a clean database as
clean and finds seq gaps and an entry naming no active run; an export of an unknown key is not found."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from config.clock import iso
from config.errors import SessionNotFound
from config.settings import CleanupSettings
from sessions.cleanup_plan import CleanupRequest
from sessions.records import EntryChange, NewMessage, RunStart, TaskKey
from tests.conftest import FakeClock
from tests.sessions.postgres.conftest import Opener

OLD, PINNED, FRESH = "agent:main:old", "agent:main:pinned", "agent:main:fresh"
SETTINGS = CleanupSettings(retention_days=30, archive_retention_days=60)


async def test_cleanup_follows_the_plan(open_store: Opener, clock: FakeClock, pg_dsn: str) -> None:
    store = await open_store()
    runs = {}
    for key in (OLD, PINNED, FRESH):
        runs[key] = await store.start_run(RunStart(key, agent_id="main", chat_type="direct", channel=None,
                                                   task_key=TaskKey("agent", key)))  # fmt: skip
        await store.append(runs[key], NewMessage("user", f"hello from {key}"))
    await store.update_entry(PINNED, EntryChange(pinned=True))
    clock.advance(days=31)
    await store.append(runs[FRESH], NewMessage("user", "still here"))
    completed: list[str] = []

    async def complete(key: str) -> None:
        completed.append(key)
        await store.complete(key)

    planned = await store.cleanup(CleanupRequest(SETTINGS, clock(), True, complete))
    assert [(a["action"], a["session_key"], a["done"]) for a in planned] == [
        ("complete", OLD, False),
        ("archive", OLD, False),
    ]
    assert completed == [] and store.active_run(OLD) is not None

    done = await store.cleanup(CleanupRequest(SETTINGS, clock(), False, complete))
    assert [(a["action"], a["done"]) for a in done] == [("complete", True), ("archive", True)]
    assert completed == [OLD]
    row = await store.require_run(runs[OLD].run_id)
    assert row["archived_at"] == iso(clock()) and row["status"] == "completed"
    assert [m["content"] for m in await store.read_messages(runs[OLD].run_id, after_seq=0, limit=10)] == [
        f"hello from {OLD}"
    ]  # an archived run stays readable
    assert await store.cleanup(CleanupRequest(SETTINGS, clock(), False, complete)) == []

    clock.advance(days=61)
    await store.append(runs[FRESH], NewMessage("user", "and still"))
    gone = await store.cleanup(CleanupRequest(SETTINGS, clock(), False, complete))
    assert [(a["action"], a["run_id"]) for a in gone] == [("delete_archive", runs[OLD].run_id)]
    assert await store.get_run(runs[OLD].run_id) is None
    assert store.active_run(PINNED) is not None  # pinned: never touched


async def test_cleanup_forgets_expired_delivery_records(open_store: Opener, clock: FakeClock, pg_dsn: str) -> None:
    store = await open_store()
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            "INSERT INTO idempotency (session_key, client_message_id, created_at)"
            " VALUES ('k', 'old', $1), ('k', 'new', $2)",
            iso(clock() - timedelta(days=2)),
            iso(clock()),
        )

        async def complete(key: str) -> None:
            raise AssertionError(key)

        assert await store.cleanup(CleanupRequest(SETTINGS, clock(), False, complete)) == []
        assert [r[0] for r in await conn.fetch("SELECT client_message_id FROM idempotency")] == ["new"]
    finally:
        await conn.close()


async def test_doctor_clean_then_findings(open_store: Opener, pg_dsn: str) -> None:
    store = await open_store()
    run = await store.start_run(
        RunStart(OLD, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", OLD))
    )
    for text in ("one", "two", "three"):
        await store.append(run, NewMessage("user", text))
    assert await store.check(fix=False) == []

    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("DELETE FROM messages WHERE run_id = $1 AND seq = 2", run.run_id)
    finally:
        await conn.close()
    findings = await store.check(fix=False)
    assert [(f["check"], f["severity"], f["run_id"], f["fixable"]) for f in findings] == [
        ("seq_gaps", "error", run.run_id, False)
    ]
    assert "seqs up to 3" in findings[0]["detail"]

    await store.complete(OLD)
    entry = store.require_entry(OLD)
    entry.run_id, entry.status = run.run_id, "running"  # an entry left naming an ended run
    checks = {f["check"]: f for f in await store.check(fix=True)}
    assert checks["entries"]["fixed"] is True and store.require_entry(OLD).run_id is None
    assert "entries" not in {f["check"] for f in await store.check(fix=False)}


async def test_export_of_a_key_without_runs_is_not_found(open_store: Opener) -> None:
    """Exports themselves: tests/gateway/test_postgres_export.py (the files backend's bytes)."""
    store = await open_store()
    with pytest.raises(SessionNotFound, match=OLD):
        await store.export_runs(key=OLD)
