"""The schema: migrations applied at open (once), a newer database refused, and the constraints
that hold whatever the processes do (one active run per key, a seq taken once)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from config.errors import Conflict, RunActive, StorageUnavailable
from home.damage import DamagedState
from sessions.postgres.schema import SCHEMA_VERSION
from sessions.records import NewMessage, RunStart, TaskKey
from tests.sessions.postgres.conftest import Opener

KEY = "agent:main:main"


async def _start(store, key: str = KEY):  # type: ignore[no-untyped-def]
    return await store.start_run(
        RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key, user="u1"))
    )


async def test_migrations_are_applied_once_and_recorded(open_store: Opener, pg_dsn: str) -> None:
    await open_store()
    await open_store()  # a second gateway on the same database applies nothing again
    conn = await asyncpg.connect(pg_dsn)
    try:
        versions = [r[0] for r in await conn.fetch("SELECT version FROM neotask_schema ORDER BY version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1))
        tables = {r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {
            "runs", "entries", "messages", "context_lines", "summaries", "context_archives", "tool_calls", "plans",
            "idempotency", "hook_deliveries", "openai_conversations", "openai_responses", "purge_tombstones",
        } <= tables  # fmt: skip
    finally:
        await conn.close()


async def test_a_database_newer_than_the_code_is_refused_and_left_alone(open_store: Opener, pg_dsn: str) -> None:
    await open_store()
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("INSERT INTO neotask_schema (version) VALUES ($1)", SCHEMA_VERSION + 1)
        with pytest.raises(DamagedState, match=f"schema version {SCHEMA_VERSION + 1} is newer"):
            await open_store()
        assert await conn.fetchval("SELECT max(version) FROM neotask_schema") == SCHEMA_VERSION + 1
    finally:
        await conn.execute("DELETE FROM neotask_schema WHERE version > $1", SCHEMA_VERSION)  # for the next tests
        await conn.close()


async def test_one_active_run_per_key_is_a_constraint(open_store: Opener, pg_dsn: str) -> None:
    """Two processes whose memory both says the key is free: the database lets one start a run."""
    first, second = await open_store(), await open_store()
    run = await _start(first)
    with pytest.raises(RunActive, match="another gateway process"):
        await _start(second)
    assert second.active_run(KEY) is None and second.entry(KEY) is None  # nothing half-made
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(asyncpg.UniqueViolationError, match="runs_one_active_per_key"):
            await conn.execute(
                "INSERT INTO runs (run_id, session_key, status, task_type, created_at)"
                " VALUES ('x', $1, 'paused', 'a', 't')",
                KEY,
            )
        assert await conn.fetchval("SELECT count(*) FROM runs WHERE session_key = $1", KEY) == 1
    finally:
        await conn.close()
    await first.complete(KEY)
    await _start(second)  # the key is free again for any process
    assert run.status == "completed"


async def test_a_seq_is_claimed_in_the_transaction_that_stores_it(open_store: Opener, pg_dsn: str) -> None:
    """A process whose idea of the next seq is stale stores nothing and gets its seq back."""
    first = await open_store()
    run = await _start(first)
    await first.append(run, NewMessage(role="user", content="one"))
    second = await open_store()  # sees the run at seq 2
    stale = second.active_run(KEY)
    assert stale is not None and stale.next_seq == 2
    await first.append(run, NewMessage(role="user", content="two"))
    counters = stale.counters
    with pytest.raises(Conflict, match="no longer takes seq 2"):
        await second.append(stale, NewMessage(role="user", content="stale two"))
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch("SELECT seq, record->>'content' FROM messages ORDER BY seq")
        assert [tuple(r) for r in rows] == [(1, "one"), (2, "two")]
    finally:
        await conn.close()
    # the stale process took the run's counters from its row: its next message goes on at seq 3
    assert stale.counters == run.counters and stale.counters != counters and stale.appends_pending == 0
    assert (await second.append(stale, NewMessage(role="user", content="three")))["seq"] == 3


async def test_after_an_unknown_outcome_the_run_is_checked_before_its_next_statement(open_store: Opener) -> None:
    """A statement whose answer was lost with the connection may have committed. The run is then
    marked unsure (set here by hand: the loss cannot be timed from outside) and checked before
    its next statement: where the row moved on, what was queued since fails with a 503 and the
    counters come from the row, so the message after that goes on."""
    first = await open_store()
    run = await _start(first)
    second = await open_store()
    stale = second.active_run(KEY)
    assert stale is not None
    await first.append(run, NewMessage(role="user", content="committed, answer lost"))
    second.queue.unsure.add(stale.run_id)
    with pytest.raises(StorageUnavailable, match="did not count") as info:
        await second.append(stale, NewMessage(role="user", content="queued after the loss"))
    assert info.value.extra == {"stored": False, "retry_after_s": 1}
    assert stale.next_seq == 2 and stale.counters == run.counters
    assert (await second.append(stale, NewMessage(role="user", content="next")))["seq"] == 2
    second.queue.unsure.add(stale.run_id)  # unsure, but the row is where it was counted: sent as is
    assert (await second.append(stale, NewMessage(role="user", content="after")))["seq"] == 3


async def test_one_statement_stores_several_runs_and_a_stale_claim_fails_only_its_run(
    open_store: Opener, pg_dsn: str
) -> None:
    """The group commit sends the queued appends of every run together; each run's lines go in
    only if that run's claim holds, so another process's write fails this run, not its neighbours."""
    first = await open_store()
    a, b = await _start(first, "agent:main:a"), await _start(first, "agent:main:b")
    second = await open_store()
    await first.append(b, NewMessage(role="user", content="b by first"))  # second's b is stale now
    a2, b2 = second.active_run("agent:main:a"), second.active_run("agent:main:b")
    assert a2 is not None and b2 is not None
    messages = [NewMessage(role="user", content=f"{name} by second {i}") for name in "ab" for i in range(2)]
    queued = [second.queue_append(run, m) for run, m in zip((a2, a2, b2, b2), messages, strict=True)]
    outcomes = await asyncio.gather(*(durable for _, durable in queued), return_exceptions=True)
    assert outcomes[:2] == [None, None]
    assert all(isinstance(o, Conflict) for o in outcomes[2:])
    assert (a2.next_seq, b2.next_seq, b2.appends_pending) == (3, 2, 0)  # b took its counters from its row
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT r.session_key, m.seq, m.record->>'content' FROM messages m JOIN runs r USING (run_id) ORDER BY 1, 2"
        )
        assert [tuple(r) for r in rows] == [
            ("agent:main:a", 1, "a by second 0"), ("agent:main:a", 2, "a by second 1"),
            ("agent:main:b", 1, "b by first"),
        ]  # fmt: skip
    finally:
        await conn.close()
    assert a.run_id == a2.run_id
