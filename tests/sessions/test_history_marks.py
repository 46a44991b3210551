"""The history index's high-water marks (issue 24 item 14): how a mark moves, the last seq of a
messages.jsonl read from its tail, and an index of schema 1 upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sessions.history import SCHEMA, HistoryIndex, connect
from sessions.history_marks import MARKS_TABLE, TAIL_BYTES, advance, last_seq, marks_of
from sessions.jsonl import encode


@pytest.mark.parametrize(
    ("mark", "seen", "moved", "left"),
    [
        (0, {1, 2, 3}, 3, set()),
        (0, {2, 3}, 0, {2, 3}),  # seq 1 missing: a gap holds the mark
        (4, {5, 7}, 5, {7}),
        (4, set(), 4, set()),
    ],
)
def test_a_mark_moves_through_committed_seqs_only(mark: int, seen: set[int], moved: int, left: set[int]) -> None:
    assert advance(mark, seen) == moved and seen == left


def test_last_seq_reads_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    assert last_seq(path) == 0
    lines = [encode({"seq": n, "role": "user", "content": "x" * (TAIL_BYTES if n == 3 else 10)}) for n in (1, 2, 3)]
    path.write_bytes(b"".join(lines[:2]))
    assert last_seq(path) == 2
    path.write_bytes(b"".join(lines) + b'{"seq": 4, "role": "us')  # a torn last line is not counted
    assert last_seq(path) == 3  # its last line is longer than the tail: read whole


async def test_an_index_of_schema_1_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    conn = connect(path)
    for statement in SCHEMA:
        if statement != MARKS_TABLE:
            conn.execute(statement)
    conn.execute("INSERT INTO messages (run_id, seq, session_key, role, content) VALUES ('r1', 7, 'k', 'user', 'x')")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    index = HistoryIndex(path)
    assert await index.open() is False  # kept, not rebuilt
    await index.close()
    check = sqlite3.connect(path)
    assert marks_of(check) == {"r1": 7} and check.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    check.close()
