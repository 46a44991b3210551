"""High-water marks of the history index: per run, the seq through which every
message of its messages.jsonl is indexed (``marks`` in history.db, written in the transaction of
the rows that move it).

The index thread feeds ``Marks`` every durable message, indexable or not, with its seq. A run's
mark moves up while the next seq has been committed; a batch that fails (the disk full, history.db
locked past its busy timeout) or a seq that never arrives (a caller cancelled before the listener
ran, a crash with the batch still queued) leaves a gap. A run with a gap older than ``grace_s``,
or in a failed batch, is *behind*: the thread reads its messages.jsonl from the mark on, indexes
what is there and sets the mark to the last seq read, retrying with a growing pause (up to
``max_backoff_s``) while that fails. At start the caller compares each run's last seq on disk with
its mark (``marks_of``) and catches up the runs behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions.codec import decode
from sessions.files.jsonl import iter_records

log = logging.getLogger(__name__)

MARKS_TABLE = "CREATE TABLE marks (run_id TEXT PRIMARY KEY, session_key TEXT NOT NULL, through_seq INTEGER NOT NULL)"
UPSERT = (
    "INSERT INTO marks (run_id, session_key, through_seq) VALUES (?, ?, ?)"
    " ON CONFLICT(run_id) DO UPDATE SET through_seq = max(through_seq, excluded.through_seq)"
)
GRACE_S = 1.0  # a gap this old is not a late arrival any more: read the run's file
MAX_BACKOFF_S = 30.0
TAIL_BYTES = 65536

Rows = Callable[[str, str, "str | None", dict[str, Any]], "tuple[Any, ...] | None"]
Insert = Callable[[sqlite3.Connection, Sequence[Sequence[Any]]], int]


@dataclass(frozen=True, slots=True)
class Fed:
    """One durable message handed to the index: its ``messages`` row, or None when not indexed."""

    run_id: str
    key: str
    agent_id: str | None
    seq: int
    values: tuple[Any, ...] | None


@dataclass
class Progress:
    key: str
    agent_id: str | None
    mark: int | None = None  # None: not read from history.db yet
    seen: set[int] = field(default_factory=set)  # committed seqs above the mark
    behind_since: float | None = None


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One transaction on an autocommit connection (``isolation_level=None``, where ``with conn``
    opens none): a batch's rows, their FTS entries and the marks land together or not at all."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def advance(mark: int, seen: set[int]) -> int:
    """The mark after ``seen`` (committed seqs above it; those it passes are removed)."""
    while mark + 1 in seen:
        mark += 1
        seen.discard(mark)
    return mark


def upgrade(conn: sqlite3.Connection) -> None:
    """Schema 1 to 2: add ``marks``, taking each indexed run as complete through its highest seq
    (a hole older than the upgrade is doctor's to find)."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(MARKS_TABLE)
    conn.execute("INSERT INTO marks SELECT run_id, min(session_key), max(seq) FROM messages GROUP BY run_id")
    conn.execute("PRAGMA user_version = 2")
    conn.execute("COMMIT")


def marks_of(conn: sqlite3.Connection) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in conn.execute("SELECT run_id, through_seq FROM marks")}


def last_seq(path: Path) -> int:
    """The seq of the last complete line of a messages.jsonl, 0 when none (blocking; reads the
    tail only, unless its last line is longer than the tail)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read()
    except FileNotFoundError:
        return 0
    lines = tail.split(b"\n")[:-1]  # the piece after the last newline is not a complete line
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first piece may be cut
    for raw in reversed(lines):
        with contextlib.suppress(ValueError):
            record = decode(raw + b"\n")
            if isinstance(record, dict) and isinstance(record.get("seq"), int):
                return int(record["seq"])
    if size > TAIL_BYTES:
        return max((int(r.get("seq") or 0) for r in iter_records(path)), default=0)
    return 0


def locate_in(contexts: Path, folders: Iterable[str]) -> Callable[[str], Path | None]:
    """A run's folder under ``contexts`` (running, paused or completed), None when it has none."""
    names = tuple(folders)

    def locate(run_id: str) -> Path | None:
        for name in names:
            folder = contexts / name / run_id
            if folder.is_dir():
                return folder
        return None

    return locate


class Marks:
    """The index thread's view of every run's mark (used on that thread only)."""

    def __init__(
        self,
        locate: Callable[[str], Path | None],
        read: Callable[[Path], Iterator[dict[str, Any]]],
        *,
        grace_s: float = GRACE_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.locate = locate
        self.read = read
        self.grace_s = grace_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.runs: dict[str, Progress] = {}
        self.retry_at: float | None = None
        self.backoff = grace_s
        self.failures = 0
        self.caught_up = 0

    def _progress(self, conn: sqlite3.Connection, run_id: str, key: str, agent_id: str | None) -> Progress:
        progress = self.runs.get(run_id)
        if progress is None:
            progress = self.runs[run_id] = Progress(key, agent_id)
        if progress.mark is None:
            row = conn.execute("SELECT through_seq FROM marks WHERE run_id = ?", (run_id,)).fetchone()
            progress.mark = int(row[0]) if row else 0
        return progress

    def commit(self, conn: sqlite3.Connection, items: Sequence[Fed], insert: Insert) -> int:
        """Index a batch and move the marks it completes, in one transaction. On a SQLite error
        its runs are behind (caught up from their files later) and the error is raised."""
        rows = [item.values for item in items if item.values is not None]
        by_run: dict[str, list[Fed]] = {}
        for item in items:
            by_run.setdefault(item.run_id, []).append(item)
        try:
            with transaction(conn):
                added = insert(conn, rows) if rows else 0
                moved: dict[str, tuple[int, set[int]]] = {}
                for run_id, fed in by_run.items():
                    progress = self._progress(conn, run_id, fed[0].key, fed[0].agent_id)
                    assert progress.mark is not None
                    seen = progress.seen | {f.seq for f in fed if f.seq > progress.mark}
                    moved[run_id] = (advance(progress.mark, seen), seen)
                conn.executemany(UPSERT, [(r, by_run[r][0].key, m) for r, (m, _) in moved.items()])
        except sqlite3.Error:
            now = self.clock()
            for run_id, fed in by_run.items():
                progress = self.runs.setdefault(run_id, Progress(fed[0].key, fed[0].agent_id))
                progress.behind_since = progress.behind_since if progress.behind_since is not None else now
            self._failed()
            raise
        now = self.clock()
        for run_id, (mark, seen) in moved.items():
            progress = self.runs[run_id]
            progress.mark, progress.seen = mark, seen
            if seen and progress.behind_since is None:
                progress.behind_since = now
                self._due(now + self.grace_s)
        return added

    def _due(self, when: float) -> None:
        self.retry_at = when if self.retry_at is None else min(self.retry_at, when)

    def _failed(self) -> None:
        self.failures += 1
        self.retry_at = self.clock() + self.backoff
        self.backoff = min(self.max_backoff_s, self.backoff * 2)

    def wait_s(self) -> float | None:
        """How long the thread may wait for the queue before a catch-up is due (None: forever)."""
        return None if self.retry_at is None else max(0.0, self.retry_at - self.clock())

    def catch_up(self, conn: sqlite3.Connection, rows: Rows, insert: Insert, max_batch: int) -> int:
        """Read every run behind for longer than the grace from its file and index what the
        index lacks; the messages indexed. A SQLite or file error schedules the next try and is
        raised."""
        now = self.clock()
        if self.retry_at is None or now < self.retry_at:
            return 0
        self.retry_at = None
        count = 0
        try:
            for run_id, progress in list(self.runs.items()):
                since = progress.behind_since
                if since is None:
                    continue
                if now - since < self.grace_s:
                    self._due(since + self.grace_s)
                    continue
                count += self._read_run(conn, run_id, progress, rows, insert, max_batch)
        except (sqlite3.Error, OSError):  # history.db refused, or a run file unreadable: try again later
            self._failed()
            raise
        self.backoff = self.grace_s
        return count

    def _read_run(
        self, conn: sqlite3.Connection, run_id: str, progress: Progress, rows: Rows, insert: Insert, max_batch: int
    ) -> int:
        folder = self.locate(run_id)
        if folder is None:  # purged, or archived meanwhile (doctor reads archives)
            del self.runs[run_id]
            return 0
        mark = self._progress(conn, run_id, progress.key, progress.agent_id).mark
        assert mark is not None
        last, count, pending = mark, 0, []
        for record in self.read(folder):
            seq = int(record.get("seq") or 0)
            if seq <= mark:
                continue
            last = max(last, seq)
            values = rows(run_id, progress.key, progress.agent_id, record)
            if values is not None:
                pending.append(values)
            if len(pending) >= max_batch:
                with transaction(conn):
                    count += insert(conn, pending)
                pending = []
        with transaction(conn):
            count += insert(conn, pending) if pending else 0
            conn.execute(UPSERT, (run_id, progress.key, last))
        progress.mark = advance(last, {s for s in progress.seen if s > last})
        progress.seen = {s for s in progress.seen if s > progress.mark}
        progress.behind_since = self.clock() if progress.seen else None
        if progress.seen:
            self._due(self.clock() + self.grace_s)
        self.caught_up += 1
        log.info("history index: run %s caught up through seq %d (%d message(s) indexed)", run_id, last, count)
        return count

    def settle(self, conn: sqlite3.Connection, run_id: str, key: str, last: int) -> None:
        """A run read whole through ``last`` (a rebuild): its mark is at least ``last``."""
        conn.execute(UPSERT, (run_id, key, last))
        progress = self.runs.get(run_id)
        if progress is not None and progress.mark is not None:
            progress.mark = advance(max(progress.mark, last), progress.seen)
            progress.seen = {s for s in progress.seen if s > progress.mark}
            if not progress.seen:
                progress.behind_since = None

    def forget(self, conn: sqlite3.Connection, run_ids: Iterable[str] = (), key: str | None = None) -> None:
        """Drop the marks of deleted runs, or of every run of a purged key."""
        ids = set(run_ids)
        if key is not None:
            ids |= {r[0] for r in conn.execute("SELECT run_id FROM marks WHERE session_key = ?", (key,))}
            ids |= {run_id for run_id, p in self.runs.items() if p.key == key}
        conn.executemany("DELETE FROM marks WHERE run_id = ?", [(r,) for r in ids])
        for run_id in ids:
            self.runs.pop(run_id, None)

    def clear(self, conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM marks")
        self.runs.clear()


def runs_on_disk(
    locate: Callable[[str], Path | None], rows: Iterable[tuple[str, str, str | None]]
) -> list[tuple[str, str, str | None, Path, int]]:
    """(run, key, agent, folder, last seq on disk) of the ledger rows ``(uuid, key, agent)`` whose
    run has a folder (blocking: reads the tail of each messages.jsonl)."""
    out = []
    for run_id, key, agent_id in rows:
        folder = locate(run_id)
        if folder is not None:
            out.append((run_id, key, agent_id, folder, last_seq(folder / "messages.jsonl")))
    return out
