"""Usage per UTC day, agent and key in tasks.db (ledger migration 6, issue 29 item 5)."""

from __future__ import annotations

import sqlite3
from datetime import date, timedelta
from pathlib import Path

import pytest

from home.damage import DamagedState
from sessions.files.ledger import MIGRATIONS, Ledger, migrate
from sessions.usage import UsageQuery, usage_day
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store, start


def build_version(path: Path, version: int) -> None:
    """A tasks.db as a neotask that knew ``version`` migrations left it, with one run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:version], start=1):
        for statement in (s.strip() for s in script.split(";")):
            if statement:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {number}")
    conn.execute(
        "INSERT INTO tasks (uuid, status, task_type, created_at, input_tokens)"
        " VALUES ('r1', 'completed', 'agent', 'x', 7)"
    )
    conn.close()


async def test_a_version_5_ledger_gains_the_usage_table_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    build_version(path, 5)
    ledger = Ledger(path)
    await ledger.open()
    await ledger.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 6 == len(MIGRATIONS)
    assert conn.execute("SELECT input_tokens FROM tasks WHERE uuid = 'r1'").fetchone() == (7,)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(usage_daily)")}
    assert {"day", "agent_id", "session_key", "input_tokens", "output_tokens", "calls"} <= columns
    assert migrate(conn) == 6  # a second pass changes nothing


async def test_a_ledger_from_a_newer_neotask_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    build_version(path, 6)
    sqlite3.connect(path, isolation_level=None).execute("PRAGMA user_version = 7")
    with pytest.raises(DamagedState) as refused:
        await Ledger(path).open()
    assert "schema version 7 is newer than this neotask knows (6)" in refused.value.message


async def test_usage_is_added_per_utc_day_agent_and_key(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    try:
        main = await start(store)
        other = await start(store, "agent:main:dm:bob")
        await store.add_usage(main, {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 3})
        await store.add_usage(main, {"input_tokens": 1, "output_tokens": 1})
        await store.add_usage(other, {"input_tokens": 20, "output_tokens": 2})
        first_day = usage_day(clock())
        clock.advance(days=1)
        await store.add_usage(main, {"input_tokens": 100, "output_tokens": 0})
        second_day = usage_day(clock())

        rows = await store.daily_usage()
        assert [(r["day"], r["key"], r["total_tokens"], r["calls"]) for r in rows] == [
            (first_day, "agent:main:dm:bob", 22, 1),
            (first_day, "agent:main:main", 17, 2),
            (second_day, "agent:main:main", 100, 1),
        ]
        assert rows[1]["cache_read_tokens"] == 3 and rows[1]["agent"] == "main"
        days = await store.daily_usage(UsageQuery(by="day"))
        assert [(r["day"], r["agent"], r["key"], r["total_tokens"]) for r in days] == [
            (first_day, None, None, 39),
            (second_day, None, None, 100),
        ]
        since = date.fromisoformat(second_day)
        assert [r["total_tokens"] for r in await store.daily_usage(UsageQuery(by="agent", since=since))] == [100]
        before = UsageQuery(session_key="agent:main:dm:bob", until=since - timedelta(days=2))
        assert await store.daily_usage(before) == []
        assert await store.tokens_spent(first_day, "main", "agent:main:main") == (39, 17)
        assert await store.tokens_spent(second_day, "main", "agent:main:dm:bob") == (100, 0)
        assert await store.tokens_spent(second_day, "helper", "agent:main:main") == (0, 0)
    finally:
        await store.close()
