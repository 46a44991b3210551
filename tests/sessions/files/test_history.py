"""The history index: text rules (table), feeding in batches, Japanese and English matching,
filters, deletes that leave no bytes behind, rebuilds from run folders and archives."""

from __future__ import annotations

import sqlite3
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sessions.codec import encode
from sessions.files.history import HistoryIndex, history_path
from sessions.files.history_sources import RunSource
from sessions.history_index import HistoryQuery
from sessions.history_text import index_text, indexable, match_expression, query_terms, snippet

KEY = "agent:main:main"


def message(seq: int, content: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "role": role, "content": content, "timestamp": f"2026-11-{seq % 28 + 1:02d}T10:00:00+00:00",
            **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (message(1, "hello"), True),
        (message(1, "/status", command=True), False),
        (message(2, "Status: running", role="assistant", command=True), False),
        (message(3, "<relevant-memories>x</relevant-memories>", role="system", kind="recall"), False),
        (message(4, "Summary of the previous run", role="system", kind="inheritance"), False),
        (message(5, "42 results", role="tool", tool_call_id="c1"), True),
        (message(6, "   "), False),
        (
            {
                "seq": 7,
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
            },
            True,
        ),
    ],
)
def test_what_is_indexed(record: dict[str, Any], expected: bool) -> None:
    assert indexable(record) is expected


@pytest.mark.parametrize(
    ("query", "words", "runs", "expression"),
    [
        ("budget decision", ["budget", "decision"], [], '"budget" AND "decision"'),
        ("予算", [], ["予算"], '"予算"'),
        ("会議室の予約", [], ["会議室の予約"], '"会議 議室 室の の予 予約"'),
        ("予", [], ["予"], '"予"*'),
        ("Tokyo 会議", ["tokyo"], ["会議"], '"tokyo" AND "会議"'),
        ('NEAR("x" OR y) AND', ["near", "x", "or", "y", "and"], [], '"near" AND "x" AND "or" AND "y" AND "and"'),
        ("  !!  ", [], [], None),
    ],
)
def test_query_terms(query: str, words: list[str], runs: list[str], expression: str | None) -> None:
    assert query_terms(query) == (words, runs)
    assert match_expression(query) == expression


def test_index_text_turns_cjk_runs_into_bigrams() -> None:
    assert index_text("plain English") == "plain English"
    assert index_text("予算は300万円") == " 予算 算は は " + "300" + " 万円 円 "


def test_snippet_marks_matches_and_escapes() -> None:
    text = "We <b>decided</b> the budget; then deciding again. 予算は決定"
    out = snippet(text, "decide 予算")
    assert "<mark>decided</mark>" in out and "<mark>deciding</mark>" in out and "<mark>予算</mark>" in out
    assert "&lt;b&gt;" in out and "<b>" not in out
    long = "x " * 200 + "needle here"
    assert snippet(long, "needle").startswith("…") and "<mark>needle</mark>" in snippet(long, "needle")


def test_trigram_tokenizer_cannot_match_two_character_words() -> None:
    """Why CJK text is indexed as bigrams: FTS5 trigram finds nothing for 会議 or 予算."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='trigram')")
    conn.execute("INSERT INTO t VALUES ('明日の会議で予算を決めます')")
    assert conn.execute("SELECT count(*) FROM t WHERE t MATCH '\"会議で\"'").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM t WHERE t MATCH '\"会議\"'").fetchone()[0] == 0


@pytest.fixture
async def index(tmp_path: Path) -> Any:
    history = HistoryIndex(history_path(tmp_path))
    assert await history.open() is True
    yield history
    await history.close()


async def test_feed_search_filters_and_deletes(index: HistoryIndex, tmp_path: Path) -> None:
    index.feed("r1", KEY, "main", message(1, "We decided the budget is 300 dollars"))
    index.feed("r1", KEY, "main", message(2, "明日の会議で予算を決めます"))
    index.feed("r1", KEY, "main", message(3, "/status budget", command=True))
    index.feed("r1", KEY, "main", message(4, "budget tool output", role="tool", tool_call_id="c"))
    index.feed("r2", "agent:main:telegram:group:g1", "main", message(5, "group budget talk"))
    index.feed("r3", "agent:other:main", "other", message(6, "other agent budget"))
    await index.flush()
    assert index.stats.indexed == 5 and index.stats.batches >= 1
    hits = await index.search(HistoryQuery(q="budget"))
    assert {(h.run_id, h.seq) for h in hits} == {("r1", 1), ("r1", 4), ("r2", 5), ("r3", 6)}
    assert [h.tool for h in hits if h.seq == 4] == [True]
    assert [h.seq for h in await index.search(HistoryQuery(q="予算"))] == [2]
    assert [h.seq for h in await index.search(HistoryQuery(q="会議 予算"))] == [2]
    assert [h.seq for h in await index.search(HistoryQuery(q="決め"))] == [2]
    assert await index.search(HistoryQuery(q="予定")) == []
    assert [h.seq for h in await index.search(HistoryQuery(q="decide"))] == [1]  # Porter: decided ~ decide
    assert {h.seq for h in await index.search(HistoryQuery(q="budget", agent="main"))} == {1, 4, 5}
    assert {h.seq for h in await index.search(HistoryQuery(q="budget", key=KEY))} == {1, 4}
    assert {h.seq for h in await index.search(HistoryQuery(q="budget", role="tool"))} == {4}
    since = HistoryQuery(q="budget", since="2026-11-05T00:00:00+00:00", until="2026-11-07T00:00:00+00:00")
    assert {h.seq for h in await index.search(since)} == {4, 5}
    assert {h.seq for h in await index.search(HistoryQuery(q="budget", keys=frozenset({KEY})))} == {1, 4}
    page1 = await index.search(HistoryQuery(q="budget", limit=2))
    page2 = await index.search(HistoryQuery(q="budget", limit=2, offset=2))
    assert len(page1) == 2 and len(page2) == 2 and not {h.seq for h in page1} & {h.seq for h in page2}
    # the same message fed twice (a rebuild racing the feed) is indexed once
    index.feed("r1", KEY, "main", message(1, "We decided the budget is 300 dollars"))
    await index.flush()
    assert await index.count() == 5
    assert await index.delete_runs(["r2"]) == 1
    assert await index.delete_key(KEY) == 3
    assert {h.seq for h in await index.search(HistoryQuery(q="budget"))} == {6}


async def test_deleted_text_leaves_no_bytes_after_scrub(index: HistoryIndex, tmp_path: Path) -> None:
    for seq in range(1, 300):
        index.feed("r1", KEY, "main", message(seq, f"filler message number {seq} zqxsecretword{seq % 3}"))
    index.feed("r2", "agent:main:dm:bob", "main", message(1, "keep this one"))
    await index.flush()
    await index.delete_key(KEY)
    await index.scrub()
    for path in tmp_path.iterdir():
        assert b"zqxsecretword" not in path.read_bytes(), path
    assert [h.run_id for h in await index.search(HistoryQuery(q="keep"))] == ["r2"]


def _write_run(folder: Path, records: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True)
    (folder / "messages.jsonl").write_bytes(b"".join(encode(r) for r in records))


async def test_rebuild_from_folders_and_archives(index: HistoryIndex, tmp_path: Path) -> None:
    live = tmp_path / "completed" / "run-a"
    _write_run(live, [message(1, "alpha in a folder"), message(2, "/new", command=True)])
    packed = tmp_path / "pack" / "run-b"
    _write_run(packed, [message(1, "alpha in an archive"), message(2, "ふたつめの会議")])
    archive = tmp_path / "run-b.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(packed, arcname="run-b")
    index.feed("stale", KEY, "main", message(1, "alpha stale row"))
    await index.flush()
    count = await index.rebuild(
        [RunSource("run-a", KEY, "main", folder=live), RunSource("run-b", KEY, "main", archive=archive)]
    )
    assert count == 3
    assert {h.run_id for h in await index.search(HistoryQuery(q="alpha"))} == {"run-a", "run-b"}
    assert [h.seq for h in await index.search(HistoryQuery(q="会議"))] == [2]


async def test_reopen_keeps_rows_and_a_damaged_file_is_recreated(tmp_path: Path) -> None:
    path = history_path(tmp_path)
    first = HistoryIndex(path)
    await first.open()
    first.feed("r1", KEY, "main", message(1, "persisted words"))
    await first.close()
    again = HistoryIndex(path)
    assert await again.open() is False
    assert len(await again.search(HistoryQuery(q="persisted"))) == 1
    await again.close()
    path.write_bytes(b"this is not a database" * 100)
    damaged = HistoryIndex(path)
    assert await damaged.open() is True
    assert await damaged.count() == 0
    await damaged.close()
