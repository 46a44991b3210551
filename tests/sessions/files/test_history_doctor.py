"""Doctor checks of the history index: rows of runs gone from tasks.db (stale), runs with searchable
messages the index lacks (incomplete), a missing index; and their fixes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sessions.files.history import HistoryIndex, history_path
from sessions.files.history_doctor import HOLES, INCOMPLETE, MISSING, STALE, check_home_index, check_index
from sessions.history_index import HistoryQuery
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store, start


async def test_stale_and_incomplete_findings_and_fixes(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    history = HistoryIndex(history_path(store.home.contexts))
    await history.open()
    try:
        run = await start(store)
        await store.append(run, NewMessage(role="user", content="unindexed harbour notes"))
        commands_only = await start(store, "agent:main:dm:bob")
        await store.append(commands_only, NewMessage(role="user", content="/status", command=True))
        history.feed("gone-run", "agent:main:dm:ghost", "main", {"seq": 1, "role": "user", "content": "ghost"})
        await history.flush()
        findings = await check_index(history, store.ledger, store.home, fix=False)
        assert sorted((f.check, f.fixed) for f in findings) == [(INCOMPLETE, False), (STALE, False)]
        assert "1 run(s)" in next(f.detail for f in findings if f.check == INCOMPLETE)  # bob's has no text
        fixed = await check_index(history, store.ledger, store.home, fix=True)
        assert all(f.fixed for f in fixed) and len(fixed) == 2
        assert await check_index(history, store.ledger, store.home, fix=False) == []
        assert [h.run_id for h in await history.search(HistoryQuery(q="harbour"))] == [run.run_id]
        assert await history.search(HistoryQuery(q="ghost")) == []
    finally:
        await history.close()
        await store.close()


async def test_a_missing_index_is_reported_then_built(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    try:
        run = await start(store)
        await store.append(run, NewMessage(role="user", content="lighthouse"))
        home, contexts = store.home, store.home.contexts
        assert [f.check for f in await check_home_index(contexts, store.ledger, home, fix=False)] == [MISSING]
        assert not history_path(contexts).exists()  # no fix, no change
        built = await check_home_index(contexts, store.ledger, home, fix=True)
        assert [(f.check, f.fixed) for f in built] == [(MISSING, True)]
        assert await check_home_index(contexts, store.ledger, home, fix=False) == []
    finally:
        await store.close()


async def test_a_hole_in_an_indexed_run_is_reported_then_filled(tmp_path: Path, clock: FakeClock) -> None:
    """Issue 24 item 14: rows deleted from the index (as a lost batch leaves it) are a finding, and
    ``fix`` indexes them again from the run's file."""
    store = await open_store(tmp_path, clock)
    history = HistoryIndex(history_path(store.home.contexts))
    await history.open()
    try:
        run = await start(store)
        words = ["anchor", "buoy", "compass", "dinghy", "ensign"]
        for word in words:
            record = await store.append(run, NewMessage(role="user", content=f"the {word} log"))
            history.feed(run.run_id, run.key, run.agent_id, record)
        await history.flush()
        assert await check_index(history, store.ledger, store.home, fix=False) == []

        def punch(conn: sqlite3.Connection) -> None:  # seqs 2 and 4 out of the index, as a lost batch
            rows = conn.execute("SELECT id, content FROM messages WHERE seq IN (2, 4)").fetchall()
            conn.executemany("INSERT INTO fts (fts, rowid, body) VALUES ('delete', ?, ?)", rows)
            conn.execute("DELETE FROM messages WHERE seq IN (2, 4)")

        await history.call(punch)
        assert await history.search(HistoryQuery(q="buoy")) == []
        findings = await check_index(history, store.ledger, store.home, fix=False)
        assert [(f.check, f.fixed) for f in findings] == [(HOLES, False)]
        assert "2 message(s) of 1 run(s)" in findings[0].detail
        fixed = await check_index(history, store.ledger, store.home, fix=True)
        assert [(f.check, f.fixed) for f in fixed] == [(HOLES, True)]
        assert await check_index(history, store.ledger, store.home, fix=False) == []
        for word in words:
            assert [h.seq for h in await history.search(HistoryQuery(q=word))] == [words.index(word) + 1]
    finally:
        await history.close()
        await store.close()
