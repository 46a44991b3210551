"""The history index's high-water marks (issue 24 item 14): how a mark moves, the last seq of a
messages.jsonl read from its tail, and an index of schema 1 upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sessions.codec import encode
from sessions.files.history import SCHEMA, HistoryIndex, _insert_many, connect, create_schema
from sessions.files.history_marks import MARKS_TABLE, TAIL_BYTES, Fed, Marks, advance, last_seq, marks_of
from sessions.files.jsonl import iter_records
from sessions.history_index import row_values
from sessions.history_text import index_text


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


def test_a_failed_catch_up_is_retried_later_with_a_longer_pause(tmp_path: Path) -> None:
    """A run behind whose file cannot be read yet: the failure schedules the next try (1 s, then
    2 s, ...); once the file reads, the run is caught up and the pause starts over."""
    now = [100.0]
    folder = tmp_path / "run"
    marks = Marks(lambda run_id: folder, lambda f: iter_records(f / "messages.jsonl"), clock=lambda: now[0])
    conn = connect(tmp_path / "history.db")
    create_schema(conn)
    conn.create_function("index_text", 1, index_text, deterministic=True)
    marks.commit(conn, [Fed("r", "k", None, 2, row_values("r", "k", None, {"seq": 2, "role": "user", "content": "b"}))],
                 _insert_many)  # fmt: skip
    assert marks.runs["r"].mark == 0 and marks.wait_s() == 1.0  # seq 1 never came: a gap
    now[0] += 1.0
    (folder / "messages.jsonl").mkdir(parents=True)  # unreadable as a file
    with pytest.raises(OSError):
        marks.catch_up(conn, row_values, _insert_many, 100)
    assert marks.wait_s() == 1.0 and marks.backoff == 2.0
    (folder / "messages.jsonl").rmdir()
    (folder / "messages.jsonl").write_bytes(
        b"".join(encode({"seq": n, "role": "user", "content": w}) for n, w in ((1, "a"), (2, "b"), (3, "c")))
    )
    now[0] += 1.0
    assert marks.catch_up(conn, row_values, _insert_many, 100) == 2  # seqs 1 and 3; 2 was indexed
    assert marks.runs["r"].mark == 3 and marks.wait_s() is None and marks.backoff == 1.0
    assert marks_of(conn) == {"r": 3}
    conn.close()
