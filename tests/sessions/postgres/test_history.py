"""The history index on PostgreSQL: the same messages appended to a files store and to a PgStore
give the same hits for the same queries (Japanese included), with the files index's filters; the
index catches up with what it missed and is rebuilt when empty; the doctor finds its holes; a
purge leaves no row of the key anywhere but a tombstone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from config.errors import SessionNotFound
from sessions.files.history import HistoryIndex
from sessions.history_index import HistoryHit, HistoryQuery
from sessions.postgres.history import PgHistoryIndex
from sessions.postgres.store import PgStore
from sessions.protocol import StoreProtocol
from sessions.records import MessageRecord, NewMessage, RunQuery, RunStart, RunState, TaskKey
from sessions.store_hooks import StoreHooks
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store as open_files_store
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

A, B, C = "agent:main:a", "agent:ops:b", "agent:main:c"
MESSAGES: list[tuple[str, str, NewMessage]] = [
    (A, "main", NewMessage("user", "明日の会議は何時からですか")),
    (A, "main", NewMessage("assistant", "The budget meeting starts at ten; 会議室は三階です。")),
    (A, "main", NewMessage("user", "/status", command=True)),  # a command: not indexed
    (A, "main", NewMessage("tool", "weather in Paris: rain", tool_name="weather", tool_call_id="c1")),
    (B, "ops", NewMessage("user", "Deploy the budget dashboard to staging")),
    (B, "ops", NewMessage("assistant", "予算の資料を送りました")),
    (B, "ops", NewMessage("user", "what does 'a OR b' mean in a query?")),
    # what PostgreSQL's own parser keeps whole (URLs, addresses, hosts, paths, versions) or leaves
    # unstemmed and unfolded; the files index's tokenizer splits, stems and folds them
    (C, "main", NewMessage("user", "The runbook is at https://wiki.example.com/ops/runbook-v2.html#restore")),
    (C, "main", NewMessage("assistant", "Mail alice.smith@example.org or page oncall-bot@ops.example.net")),
    (C, "main", NewMessage("user", "db-primary-03.eu-west.internal is down; failover to db-replica-07")),
    (C, "main", NewMessage("assistant", "Edit /etc/neotask/config.yaml and ~/notes/2026-12-01.md then restart")),
    (C, "main", NewMessage("user", "We upgraded from v1.9.12 to 2.0.0-rc.3 (python3.11, x86_64)")),
    (C, "main", NewMessage("assistant", "We decided to postpone; the deciding vote was running late, decisions later")),
    (C, "main", NewMessage("user", "Meet at the Café Müller in Zürich, crème brûlée after; naïve résumé")),
    (C, "main", NewMessage("assistant", "東京のオフィスは https://rooms.example.jp/tokyo で予約済みです")),
]
QUERIES = [
    HistoryQuery(q="会議"),
    HistoryQuery(q="会"),  # one character: a prefix match of the bigrams
    HistoryQuery(q="会議室"),
    HistoryQuery(q="予算"),
    HistoryQuery(q="議は"),
    HistoryQuery(q="budget"),
    HistoryQuery(q="BUDGET meeting"),
    HistoryQuery(q="budget", key=B),
    HistoryQuery(q="budget", agent="main"),
    HistoryQuery(q="budget", role="user"),
    HistoryQuery(q="budget", keys=frozenset({A})),
    HistoryQuery(q="budget", keys=frozenset()),
    HistoryQuery(q="rain"),
    HistoryQuery(q="status"),  # the command's text is not indexed
    HistoryQuery(q="a OR b"),  # operators are words
    HistoryQuery(q="\"'():*&|!"),  # no term at all
    HistoryQuery(q="nothing-like-this"),
    HistoryQuery(q="runbook"),  # a word inside a URL
    HistoryQuery(q="wiki"),
    HistoryQuery(q="example"),
    HistoryQuery(q="html"),
    HistoryQuery(q="restore"),
    HistoryQuery(q="https://wiki.example.com/ops/runbook-v2.html"),  # the URL itself
    HistoryQuery(q="alice"),  # a part of an e-mail address
    HistoryQuery(q="alice.smith@example.org"),
    HistoryQuery(q="oncall"),
    HistoryQuery(q="eu-west"),  # parts of a host name
    HistoryQuery(q="replica"),
    HistoryQuery(q="internal"),
    HistoryQuery(q="config.yaml"),  # a path and its parts
    HistoryQuery(q="etc neotask"),
    HistoryQuery(q="notes"),
    HistoryQuery(q="2026"),
    HistoryQuery(q="1.9.12"),  # versions
    HistoryQuery(q="rc"),
    HistoryQuery(q="x86_64"),
    HistoryQuery(q="python3"),
    HistoryQuery(q="decide"),  # stems
    HistoryQuery(q="decision"),
    HistoryQuery(q="run"),
    HistoryQuery(q="upgrade"),
    HistoryQuery(q="cafe"),  # accents folded, both ways
    HistoryQuery(q="café"),
    HistoryQuery(q="muller"),
    HistoryQuery(q="zurich"),
    HistoryQuery(q="creme brulee"),
    HistoryQuery(q="resume"),
    HistoryQuery(q="naive"),
    HistoryQuery(q="東京"),  # Japanese beside a URL
    HistoryQuery(q="予約"),
    HistoryQuery(q="オフィス"),
    HistoryQuery(q="rooms"),
    HistoryQuery(q="tokyo"),
]


async def _fill(store: StoreProtocol) -> list[RunState]:
    runs = {}
    for key, agent, message in MESSAGES:
        if key not in runs:
            runs[key] = await store.start_run(
                RunStart(key, agent_id=agent, chat_type="direct", channel=None, task_key=TaskKey("agent", key))
            )
        await store.append(runs[key], message)
    return list(runs.values())


def _answer(hits: list[HistoryHit]) -> set[tuple[str, int, str, bool, str | None]]:
    return {(h.session_key, h.seq, h.snippet, h.tool, h.agent_id) for h in hits}


class Fed:
    """A durable listener feeding an index opened after the store."""

    def __init__(self) -> None:
        self.index: Any = None

    def __call__(self, run: RunState, record: MessageRecord) -> None:
        if self.index is not None:
            self.index.feed(run.run_id, run.key, run.agent_id, record)


@pytest.fixture
async def pg(postgres_server: PgServer, clock: FakeClock) -> AsyncIterator[tuple[PgStore, PgHistoryIndex, str]]:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    fed = Fed()
    store = await PgStore.open(
        settings_with(), dsn=dsn, clock=clock, pool_size=2, hooks=StoreHooks(durable_listeners=(fed,))
    )
    index = store.open_history()
    await index.open()
    fed.index = index
    yield store, index, dsn
    await index.close()
    await store.close()


async def test_the_same_answers_as_the_files_index(
    pg: tuple[PgStore, PgHistoryIndex, str], tmp_path: Path, clock: FakeClock
) -> None:
    store, index, _ = pg
    fed = Fed()
    files = await open_files_store(tmp_path / "home", clock, hooks=StoreHooks(durable_listeners=(fed,)))
    files_index: HistoryIndex = files.open_history()
    await files_index.open()
    fed.index = files_index
    try:
        await _fill(files)
        await _fill(store)
        await files_index.flush()
        await index.flush()
        for query in QUERIES:
            want, got = _answer(await files_index.search(query)), _answer(await index.search(query))
            assert got == want, query
        assert len(await index.search(HistoryQuery(q="会議"))) == 2
        assert await index.count() == await files_index.count() == 14
        for q, found in (("runbook", 1), ("decide", 1), ("cafe", 1), ("alice", 1), ("replica", 1), ("tokyo", 1)):
            assert len(await index.search(HistoryQuery(q=q))) == found, q  # not a shared miss
    finally:
        await files_index.close()
        await files.close()


async def test_ranking_and_pages(pg: tuple[PgStore, PgHistoryIndex, str]) -> None:
    store, index, _ = pg
    run = await store.start_run(
        RunStart(A, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", A))
    )
    await store.append(run, NewMessage("user", "budget " * 5 + "review"))
    for n in range(4):
        await store.append(
            run, NewMessage("user", f"a long note number {n} that mentions the budget once among many words")
        )
    await index.flush()
    hits = await index.search(HistoryQuery(q="budget"))
    assert len(hits) == 5 and hits[0].seq == 1  # the densest first
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    page = await index.search(HistoryQuery(q="budget", limit=2, offset=1))
    assert [h.seq for h in page] == [h.seq for h in hits[1:3]]
    assert "<mark>budget</mark>" in hits[0].snippet


async def test_catch_up_rebuild_and_doctor(pg: tuple[PgStore, PgHistoryIndex, str]) -> None:
    store, index, dsn = pg
    await _fill(store)
    await index.flush()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM history WHERE session_key = $1", B)  # a crash before the batch
        await conn.execute(  # a row of no stored message
            "INSERT INTO history (run_id, seq, session_key, role, tool, content, body)"
            " SELECT run_id, 99, session_key, 'user', false, 'ghost', to_tsvector('simple', 'ghost')"
            " FROM runs WHERE session_key = $1",
            A,
        )
        findings = await store.check_history(index, fix=False)
        assert {f["check"] for f in findings} == {"history_stale", "history_holes"}
        assert not any(f["fixed"] for f in findings)
        assert await index.search(HistoryQuery(q="予算")) == []
        fixed = await store.check_history(index, fix=True)
        assert all(f["fixed"] for f in fixed)
        assert await store.check_history(index, fix=False) == []
        assert len(await index.search(HistoryQuery(q="予算"))) == 1
        assert await index.search(HistoryQuery(q="ghost")) == []

        await conn.execute("DELETE FROM history WHERE session_key = $1", B)
        await store.catch_up_history(index)
        assert await index.count() == 14
        await conn.execute("DELETE FROM history")
        assert await index.open() is True  # empty but messages stored: the daemon rebuilds it
        assert await store.rebuild_history(index) == 14
        assert await index.open() is False
    finally:
        await conn.close()


async def test_purge_leaves_no_trace_but_a_tombstone(pg: tuple[PgStore, PgHistoryIndex, str]) -> None:
    store, index, dsn = pg
    runs = await _fill(store)
    await index.flush()
    await store.complete(A)
    second = await store.start_run(
        RunStart(A, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", A))
    )
    await store.append(second, NewMessage("user", "another 会議 tomorrow", client_message_id="m1"))
    await store.add_usage(second, {"input_tokens": 12, "output_tokens": 3})  # usage_daily names the key
    await index.flush()
    assert len(await index.search(HistoryQuery(q="会議"))) == 3
    assert [u["key"] for u in await store.daily_usage()] == [A]

    tombstone = await store.purge(A, history=index)
    assert tombstone["runs"] == 2 and tombstone["messages"] == 5 and tombstone["session_key"] == A

    assert await index.search(HistoryQuery(q="会議")) == []
    assert await index.search(HistoryQuery(q="budget")) != []  # B's messages stay
    assert store.entry(A) is None and store.active_run(A) is None
    conn = await asyncpg.connect(dsn)
    try:
        tables = [r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for table in tables:  # no row anywhere holds the key, a run id of it or its text
            if table in ("purge_tombstones", "neotask_schema"):
                continue
            text = await conn.fetchval(f"SELECT coalesce(string_agg(t::text, ' '), '') FROM {table} t")
            for trace in (A, runs[0].run_id, second.run_id, "会議", "Paris"):
                assert trace not in text, (table, trace)
        stones = await conn.fetch("SELECT session_key, run_id, runs, messages FROM purge_tombstones ORDER BY id")
        assert {tuple(r) for r in stones} == {(A, runs[0].run_id, 2, 5), (A, second.run_id, 2, 5)}
    finally:
        await conn.close()
    with pytest.raises(SessionNotFound):
        await store.purge(A, history=index)
    reopened = await PgStore.open(settings_with(), dsn=dsn, clock=store.clock, pool_size=2)  # another process
    try:
        assert reopened.entry(A) is None
        assert await reopened.list_runs(RunQuery(session_key=A)) == []
    finally:
        await reopened.close()


async def test_the_doctor_waits_for_rows_in_flight(pg: tuple[PgStore, PgHistoryIndex, str]) -> None:
    """Rows fed but not yet written (the batch waits BATCH_WAIT_S) are not holes."""
    store, index, _ = pg
    await _fill(store)  # no flush: the last batch is in flight
    assert await store.check_history(index, fix=False) == []
    assert await index.count() == 14
