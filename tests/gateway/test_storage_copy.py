"""``neotask storage copy --to``: a files home (an active run, a completed one, a compacted one,
tool calls, a plan, delivery and OpenAI-compatible records, token usage per day and key, the
tombstone of a purged key) copied into PostgreSQL and from there into a new files home compares
equal, read through the stores themselves; a non-empty target is
refused and left as it was; a bad target, or a daemon on the source, is one clear line."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from config.clock import system_clock
from home.layout import Home
from home.lock import HomeLock
from sessions.compaction import archive_name, summary_line
from sessions.files import bulk as files_bulk
from sessions.files.archive import write_archive
from sessions.files.store import SessionStore
from sessions.postgres.store import PgStore
from sessions.protocol import StoreProtocol
from sessions.records import (
    CompatConversation,
    NewMessage,
    ResponseRef,
    RunFinish,
    RunQuery,
    RunStart,
    TaskKey,
    ToolUse,
)
from sessions.rewrites import Compaction
from sessions.usage import UsageQuery
from tests.gateway.daemons import child_env, run_cli
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]

KEYS = ("agent:main:dm:done", "agent:main:dm:live", "agent:main:dm:compacted")  # valid for the CLI too
PURGED = "agent:main:dm:purged"


async def _seed(root: Path) -> None:
    store = await SessionStore.open(root, settings_with(), clock=system_clock)
    try:
        for key in KEYS:
            run = await store.start_run(
                RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
            )
            for text in ("明日の会議は十時から" * 20, f"hello {key} " + "lorem " * 80, "and more"):
                await store.append(run, NewMessage("user", text))
            await store.append(run, NewMessage("assistant", "noted"))
        live = store.require_entry(KEYS[1])
        assert live.run_id is not None
        run = store.run_state(live.run_id)
        assert run is not None
        await store.record_tool(
            run, ToolUse(tool_name="search", arguments={"q": "会議"}, result=["a"], duration_ms=3.0)
        )
        await store.record_plan(run, plan_type="steps", plan_content="1. read\n2. write")
        await store.remember_reply(KEYS[1], "cm-1", run_id=run.run_id, seq=1, response='{"ok":true}')
        await store.record_hook_delivery("d-1", "github", session_key=KEYS[1], message_seq=2)
        await store.save_compat_conversation(KEYS[1], CompatConversation(1, 0, 2, "r", 1, "a", '{"x":1}'))
        await store.save_compat_response(ResponseRef("resp_1", KEYS[1], run.run_id, 4))
        await store.add_usage(run, {"input_tokens": 120, "output_tokens": 30, "cache_read_tokens": 7})
        await store.add_usage(run, {"input_tokens": 80, "output_tokens": 20})
        gone = await store.start_run(
            RunStart(PURGED, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", PURGED))
        )
        await store.append(gone, NewMessage("user", "forget me"))
        await store.add_usage(gone, {"input_tokens": 5, "output_tokens": 1})
        assert (await store.purge(PURGED, history=None))["runs"] == 1
        compacted = store.active_run(KEYS[2])
        assert compacted is not None
        head = summary_line(1, "they met at ten", covers_from=1, end_seq=2)
        record = {"type": "compaction", "id": 1, "summary": "they met at ten", "compressed_message_count": 2,
                  "created_at": "2026-12-01T00:00:00Z", "start_seq": 1, "end_seq": 2, "covers_from": 1,
                  "trigger": "manual", "compaction_count": 1, "archive": archive_name(1)}  # fmt: skip
        assert await store.rewrite_context(compacted, Compaction(1, 1, head, 2, record)) is not None
        await store.complete(KEYS[0], RunFinish(summarize=False))
        done = store.require_entry(KEYS[0]).last_run_id
    finally:
        await store.close()
    assert done is not None
    home = Home(root)  # archived as cleanup does it: a tar.gz, archived_at, no folder
    assert write_archive(home.run_dir(done, "completed"), home.archive_file(done))
    shutil.rmtree(home.run_dir(done, "completed"))
    with sqlite3.connect(home.tasks_db) as conn:
        conn.execute("UPDATE tasks SET archived_at = '2026-12-01T00:00:00Z' WHERE uuid = ?", (done,))
    conn.close()


async def _view(store: StoreProtocol) -> dict[str, Any]:
    """What a store shows of every run, entry and record, through the Protocol's reads."""
    runs = {}
    for row in await store.list_runs(RunQuery(limit=100)):
        run_id = row["uuid"]
        state = store.run_state(run_id)
        runs[run_id] = {
            "status": row["status"],
            "key": row.get("session_key"),
            "messages": await store.read_messages(run_id, after_seq=0, limit=1000),
            "summaries": await store.read_records(run_id, "summaries"),
            "tools": await store.read_records(run_id, "tools"),
            "plans": await store.read_records(run_id, "planning"),
            "context": await store.read_context(state) if state is not None else None,
        }
    entries = {e.key: (e.status, e.run_id, e.last_run_id, e.message_count, e.compaction_count) for e in store.entries()}
    usage = await store.daily_usage(UsageQuery(by="key"))
    records = (
        await store.find_idempotency(KEYS[1], "cm-1", since="2000-01-01T00:00:00Z"),
        await store.hook_delivery("d-1"),
        await store.compat_conversation(KEYS[1]),
        await store.compat_response("resp_1"),
    )
    return {"runs": runs, "entries": entries, "records": repr(records), "usage": usage}


async def _files_view(root: Path) -> dict[str, Any]:
    store = await SessionStore.open(root, settings_with(), clock=system_clock)
    try:
        return await _view(store)
    finally:
        await store.close()


async def test_files_to_postgres_and_back(postgres_server: PgServer, tmp_path: Path) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    source = tmp_path / "source"
    await _seed(source)
    before = await _files_view(source)
    assert len(before["runs"]) == 3 and before["runs"] and before["records"].count("None") == 0
    assert [(u["key"], u["input_tokens"], u["cache_read_tokens"], u["calls"]) for u in before["usage"]] == [
        (KEYS[1], 200, 7, 2)  # the purged key's usage went with it
    ]

    there = await run_cli("storage", "copy", "--to", dsn, "--home", str(source), env=child_env())
    assert there.returncode == 0, there.stderr
    lines = there.stdout.splitlines()
    assert len([line for line in lines if " running: " in line or " completed: " in line]) == 3, there.stdout
    assert "copied 3 runs, 3 sessions" in there.stdout and "verified" in there.stdout
    assert "1 usage rows" in there.stdout and "1 tombstones" in there.stdout, there.stdout
    store = await PgStore.open(settings_with(), dsn=dsn, clock=system_clock, pool_size=2)
    try:
        assert await _view(store) == before  # the database's store shows what the files showed
        live = store.active_run(KEYS[1])
        assert live is not None
        appended = await store.append(live, NewMessage("user", "after the move"))
        assert appended["seq"] == 5  # the active run carries on where it was
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    try:  # undo that append, so the way back compares with the source
        stones = await conn.fetch("SELECT session_key, run_id, runs, messages FROM purge_tombstones")
        assert [tuple(r) for r in stones] == [(PURGED, None, 1, 1)]
        assert await conn.fetchval("SELECT sum(calls) FROM usage_daily WHERE session_key = $1", KEYS[1]) == 2
        await conn.execute("DELETE FROM messages WHERE seq = 5")
        await conn.execute("DELETE FROM context_lines WHERE line->>'seq' = '5'")
        await conn.execute("UPDATE runs SET next_seq = 5 WHERE next_seq = 6")
    finally:
        await conn.close()

    config = tmp_path / "pg.yaml"
    config.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))
    found = await run_cli("history", "search", "会議", "--home", str(tmp_path / "pghome"), "--config", str(config),
                          "--json", env=child_env())  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert sorted(h["session_key"] for h in json.loads(found.stdout)["results"]) == sorted(KEYS)  # indexed on open
    back = tmp_path / "back"
    returned = await run_cli(
        "storage", "copy", "--to", str(back), "--home", str(tmp_path / "pghome"), "--config", str(config), "--json",
        env=child_env(),
    )  # fmt: skip
    assert returned.returncode == 0, returned.stderr
    report = json.loads(returned.stdout)
    assert len(report["runs"]) == 3 and report["skipped"] == []
    original = await asyncio.to_thread(files_bulk.dump, source)
    assert {r["run_id"]: r["sha256"] for r in report["runs"]} == {r.run_id: r.checksum() for r in original.runs}
    assert report["usage"] == {"rows": 1, "sha256": original.usage_checksum()}
    assert report["tombstones"] == {"count": 1, "sha256": original.tombstones_checksum()}
    assert await _files_view(back) == before
    returned_home = await asyncio.to_thread(files_bulk.dump, back)
    assert returned_home.usage == original.usage and returned_home.tombstones == original.tombstones
    assert [(t["session_key"], t["runs"], t["messages"]) for t in original.tombstones] == [(PURGED, 1, 1)]
    archived = [r for r in original.runs if r.row.get("archived_at")]
    assert len(archived) == 1 and archived[0].messages  # read from its tar.gz, and back into one
    assert Home(back).archive_file(archived[0].run_id).is_file()
    assert not Home(back).run_dir(archived[0].run_id, "completed").exists()


async def test_non_empty_target_and_bad_targets(postgres_server: PgServer, tmp_path: Path) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    source = tmp_path / "source"
    await _seed(source)
    first = await run_cli("storage", "copy", "--to", dsn, "--home", str(source), env=child_env())
    assert first.returncode == 0, first.stderr
    conn = await asyncpg.connect(dsn)
    try:
        counts = [await conn.fetchval(f"SELECT count(*) FROM {t}") for t in ("runs", "messages", "entries")]
        again = await run_cli("storage", "copy", "--to", dsn, "--home", str(source), env=child_env())
        assert again.returncode == 1 and "already holds 3 runs" in again.stderr, again.stderr
        assert [await conn.fetchval(f"SELECT count(*) FROM {t}") for t in ("runs", "messages", "entries")] == counts
    finally:
        await conn.close()

    occupied = tmp_path / "occupied"
    await _seed(occupied)
    before = await asyncio.to_thread(files_bulk.dump, occupied)
    refused = await run_cli("storage", "copy", "--to", str(occupied), "--home", str(source), env=child_env())
    assert refused.returncode == 1 and "already holds" in refused.stderr, refused.stderr
    after = await asyncio.to_thread(files_bulk.dump, occupied)
    assert after.report() == before.report()

    torn = next((source / "contexts" / "running").iterdir()) / "messages.jsonl"
    kept = torn.read_bytes()
    torn.write_bytes(kept + b'{"seq": 9, "ro')  # a crash's torn line: the doctor's work, not the copy's
    unreadable = await run_cli(
        "storage", "copy", "--to", str(tmp_path / "torn"), "--home", str(source), env=child_env()
    )
    assert unreadable.returncode == 1 and "is not JSON" in unreadable.stderr and "doctor" in unreadable.stderr
    assert not (tmp_path / "torn" / "contexts").exists()
    torn.write_bytes(kept)

    bad = await run_cli("storage", "copy", "--to", "mysql://x/y", "--home", str(source), env=child_env())
    assert bad.returncode == 2 and "not a postgres:// DSN nor a directory" in bad.stderr, bad.stderr
    closed = f"postgresql://neotask@127.0.0.1:{postgres_server.port + 1}/nothing"
    down = await run_cli("storage", "copy", "--to", closed, "--home", str(source), env=child_env())
    assert down.returncode == 1 and "cannot connect to postgres" in down.stderr, down.stderr

    with HomeLock(Home(source).lock_file):  # as a running daemon holds it
        busy = await run_cli("storage", "copy", "--to", str(tmp_path / "new"), "--home", str(source), env=child_env())
    assert busy.returncode == 1 and len(busy.stderr.strip().splitlines()) == 1, busy.stderr
    assert "gateway_running" in busy.stderr
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())


async def test_usage_and_a_purge_made_on_postgres_reach_a_files_home(postgres_server: PgServer, tmp_path: Path) -> None:
    """The other way round: a purge of a key with two runs writes a tombstone row per run id on
    PostgreSQL; the files home gets one tombstone with the purge's totals, and the usage rows."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    store = await PgStore.open(settings_with(), dsn=dsn, clock=system_clock, pool_size=2)
    try:
        for key in (PURGED, KEYS[1]):
            for text in ("first run", "second run"):
                run = await store.start_run(
                    RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
                )
                await store.append(run, NewMessage("user", text))
                await store.add_usage(run, {"input_tokens": 10, "output_tokens": 2})
                await store.complete(key, RunFinish(summarize=False))
        assert (await store.purge(PURGED, history=None))["runs"] == 2
        usage = await store.daily_usage()
    finally:
        await store.close()
    back = tmp_path / "back"
    done = await run_cli("storage", "copy", "--to", str(back), "--home", str(tmp_path / "pghome"), "--config",
                         str(_pg_config(tmp_path, dsn)), "--json", env=child_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tombstones"]["count"] == 1 and report["usage"]["rows"] == 1
    copied = await asyncio.to_thread(files_bulk.dump, back)
    assert [(t["session_key"], t["runs"], t["messages"]) for t in copied.tombstones] == [(PURGED, 2, 2)]
    files = await SessionStore.open(back, settings_with(), clock=system_clock)
    try:
        assert await files.daily_usage() == usage and usage[0]["calls"] == 2 and usage[0]["key"] == KEYS[1]
    finally:
        await files.close()


def _pg_config(tmp_path: Path, dsn: str) -> Path:
    config = tmp_path / "pg.yaml"
    config.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))
    return config
