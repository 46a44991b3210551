"""The CLI without a daemon on ``storage.backend: postgres``: ``history search`` finds 会議 in the
database, ``doctor`` reports on the database (clean, then a seq gap), ``sessions purge`` erases the
key there."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest
import yaml

from config.clock import system_clock
from sessions.postgres.store import PgStore
from sessions.records import NewMessage, RunStart, TaskKey
from tests.gateway.daemons import child_env, run_cli
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]

KEY = "agent:main:main"


async def test_search_doctor_and_purge_offline(postgres_server: PgServer, tmp_path: Path) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    store = await PgStore.open(settings_with(), dsn=dsn, clock=system_clock, pool_size=2)
    try:
        run = await store.start_run(
            RunStart(KEY, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", KEY))
        )
        for text in ("明日の会議は十時から", "budget", "more"):
            await store.append(run, NewMessage("user", text))
    finally:
        await store.close()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))
    home = ("--home", str(tmp_path / "home"), "--config", str(config), "--json")

    found = await run_cli("history", "search", "会議", *home, env=child_env())
    assert found.returncode == 0, found.stderr
    assert [(h["session_key"], h["seq"]) for h in json.loads(found.stdout)["results"]] == [(KEY, 1)]

    clean = await run_cli("doctor", *home, env=child_env())
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["actions"] == []
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM messages WHERE run_id = $1 AND seq = 2", run.run_id)
        gap = await run_cli("doctor", *home, env=child_env())
        assert "seq_gaps" in {a["check"] for a in json.loads(gap.stdout)["actions"]}, gap.stdout + gap.stderr

        purged = await run_cli("sessions", "purge", KEY, *home, env=child_env())
        assert purged.returncode == 0, purged.stderr
        assert json.loads(purged.stdout)["tombstone"]["runs"] == 1
        assert await conn.fetchval("SELECT count(*) FROM runs") == 0
        assert await conn.fetchval("SELECT count(*) FROM history") == 0
    finally:
        await conn.close()
