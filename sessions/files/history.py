"""The history index: full-text search over every message of every run (``contexts/history.db``).

SQLite FTS5 in its own database file, so tasks.db stays small. ``messages`` holds one row per
indexed message (run, seq, key, agent, role, time, text); ``fts`` is a contentless FTS5 table
(``unicode61`` with Porter stemming, CJK runs as bigrams: ``sessions.history_text``) whose rowid
is the message row's id.

Writes come from one thread with its own connection: ``feed`` (called on the event loop once the
append writer has made a message durable) only puts the record on a queue; the thread takes
everything queued and commits it in one transaction, so ingest never waits for the index.
Deletes, rebuilds and maintenance go through the same queue, in order. Searches run on a second
thread with a read connection (WAL: readers never wait for the writer). A batch that fails is not
lost: per-run high-water marks (``sessions.files.history_marks``) let the thread read what it lacks from
the run's messages.jsonl, retried until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from home import layout
from home.layout import Home
from sessions.files.history_marks import MARKS_TABLE, Fed, Marks, locate_in, marks_of, transaction, upgrade
from sessions.files.history_search import search
from sessions.files.history_sources import RunSource as RunSource
from sessions.files.history_sources import iter_run_messages as iter_run_messages
from sessions.files.history_sources import sources_from_rows as sources_from_rows
from sessions.files.jsonl import iter_records
from sessions.files.ledger import Ledger
from sessions.history_index import MAX_BACKLOG, MAX_BATCH, Backlog, HistoryHit, HistoryQuery, HistoryStats, row_values
from sessions.history_text import CJK_RUN, index_text
from sessions.history_words import TOKENIZER

log = logging.getLogger(__name__)
T = TypeVar("T")

HISTORY_DB = "history.db"
SCHEMA_VERSION = 2
SCHEMA = (
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        session_key TEXT NOT NULL,
        agent_id TEXT,
        role TEXT NOT NULL,
        timestamp TEXT,
        tool INTEGER NOT NULL DEFAULT 0,
        content TEXT NOT NULL,
        UNIQUE (run_id, seq)
    )""",
    "CREATE INDEX idx_messages_key ON messages(session_key)",
    "CREATE INDEX idx_messages_time ON messages(timestamp)",
    f"CREATE VIRTUAL TABLE fts USING fts5(body, content='', tokenize='{TOKENIZER}')",
    MARKS_TABLE,
)
BATCH_WAIT_S = 0.05  # the index lags ingest by this much at most (plus the commit)


@dataclass
class _Op:
    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any] | None
    result: Any = None
    error: BaseException | None = None


_STOP = object()


_ROW = "(?, ?, ?, ?, ?, ?, ?, ?)"


def _insert_many(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> int:
    """Insert a batch in a few statements (many rows per INSERT, then the FTS rows through the
    ``index_text`` SQL function, or straight from ``content`` when no row has CJK text, where
    ``index_text`` changes nothing); rows already indexed are skipped. Each statement is one step
    with the GIL released, instead of one hand-back per row (which the event loop paid for).
    Only the index thread writes, so the new ids are those above the highest id before the batch."""
    before = int(conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])
    per_statement = max(1, min(500, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(_ROW.split(","))))
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        conn.execute(
            "INSERT OR IGNORE INTO messages (run_id, seq, session_key, agent_id, role, timestamp, tool, content)"
            " VALUES " + ", ".join([_ROW] * len(chunk)),
            [value for row in chunk for value in row],
        )
    body = "index_text(content)" if any(CJK_RUN.search(row[7]) for row in rows) else "content"
    cursor = conn.execute(f"INSERT INTO fts (rowid, body) SELECT id, {body} FROM messages WHERE id > ?", (before,))
    return int(cursor.rowcount)


def _delete_where(conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> int:
    rows = conn.execute(f"SELECT id, content FROM messages WHERE {where}", params).fetchall()
    conn.executemany(
        "INSERT INTO fts (fts, rowid, body) VALUES ('delete', ?, ?)", [(r[0], index_text(r[1])) for r in rows]
    )
    conn.execute(f"DELETE FROM messages WHERE {where}", params)
    return len(rows)


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA secure_delete=ON")  # a purged message leaves no bytes behind in freed pages
    return conn


def schema_ok(conn: sqlite3.Connection) -> bool:
    """Whether the schema is this one, upgrading version 1 (no marks) in place."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == 1:
        upgrade(conn)
        return True
    return version == SCHEMA_VERSION


def create_schema(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")


def _read_folder(folder: Path) -> Iterator[dict[str, Any]]:
    return iter_records(folder / layout.MESSAGES)


class HistoryIndex:
    def __init__(
        self,
        path: Path,
        *,
        max_batch: int = MAX_BATCH,
        locate: Callable[[str], Path | None] | None = None,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        self.path = path
        self.max_batch = max_batch
        self.marks = Marks(locate or locate_in(path.parent, layout.FOLDERS), _read_folder)
        self.stats = HistoryStats()
        self.backlog = Backlog(max_backlog)  # fed on the loop, written by the thread (``_commit``)
        self.created = False
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neotask-history-read")

    # -- opening and closing --------------------------------------------------------------------

    def _open(self) -> bool:
        """Open (creating when missing or of another schema); whether it was created empty."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        try:
            conn = connect(self.path)
        except sqlite3.DatabaseError as exc:
            log.warning("history index %s is unreadable (%s): rebuilding it", self.path, exc)
            remove_files(self.path)
            conn = connect(self.path)
            created = True
        try:
            if created:
                create_schema(conn)
            elif not schema_ok(conn):
                log.warning("history index %s has another schema: rebuilding it", self.path)
                conn.close()
                remove_files(self.path)
                conn = connect(self.path)
                create_schema(conn)
                created = True
        except sqlite3.DatabaseError as exc:
            log.warning("history index %s is unreadable (%s): rebuilding it", self.path, exc)
            conn.close()
            remove_files(self.path)
            conn = connect(self.path)
            create_schema(conn)
            created = True
        self._conn = conn
        self._reader = connect(self.path)
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)
        return created

    async def open(self) -> bool:
        """Open the index and start its writer thread; True when it was created (so the caller
        rebuilds it from the run folders and archives)."""
        self._loop = asyncio.get_running_loop()
        self.created = await asyncio.to_thread(self._open)
        self._thread = threading.Thread(target=self._run, name="neotask-history", daemon=True)
        self._thread.start()
        return self.created

    async def close(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._thread.join)
            self._thread = None

        def _close() -> None:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

        await asyncio.get_running_loop().run_in_executor(self._read_pool, _close)
        self._read_pool.shutdown(wait=True)

    # -- feeding (event loop, never blocks) -----------------------------------------------------

    def feed(self, run_id: str, key: str, agent_id: str | None, record: Mapping[str, Any]) -> None:
        """Queue one durable message for indexing (commands and empty messages are not indexed,
        but their seq moves the run's mark)."""
        if self._thread is not None:
            values = row_values(run_id, key, agent_id, record)
            self._queue.put(Fed(run_id, key, agent_id, int(record.get("seq") or 0), values))
            self.backlog.added()

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn`` on the index thread after everything queued before it is committed."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("the history index is not open")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put(_Op(fn, future))
        return future

    async def flush(self) -> None:
        await self.call(lambda conn: None)

    async def delete_runs(self, run_ids: Iterable[str]) -> int:
        ids = list(run_ids)

        def _do(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                self.marks.forget(conn, ids)
                return sum(_delete_where(conn, "run_id = ?", (r,)) for r in ids)

        deleted = await self.call(_do)
        self.stats.deleted += deleted
        return deleted

    async def delete_key(self, key: str) -> int:
        def _do(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                self.marks.forget(conn, key=key)
                return _delete_where(conn, "session_key = ?", (key,))

        deleted = await self.call(_do)
        self.stats.deleted += deleted
        return deleted

    async def scrub(self) -> None:
        """Merge the FTS segments (dropping deleted entries), VACUUM, and truncate the WAL: after
        a purge, no byte of a deleted message stays in history.db or its WAL."""

        def _do(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO fts (fts) VALUES ('optimize')")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        await self.call(_do)

    async def rebuild(self, sources: Iterable[RunSource], *, replace: bool = True) -> int:
        """Index every message of ``sources`` (blocking reads on the index thread); with
        ``replace`` the index is emptied first. Messages already indexed are skipped, so live
        feeding may go on meanwhile. Returns the number of messages indexed."""
        runs = list(sources)

        def _do(conn: sqlite3.Connection) -> int:
            if replace:
                with transaction(conn):
                    conn.execute("DELETE FROM messages")
                    conn.execute("INSERT INTO fts (fts) VALUES ('delete-all')")
                    self.marks.clear(conn)
            count = 0
            for source in runs:
                pending: list[tuple[Any, ...]] = []
                last = 0
                for record in iter_run_messages(source):
                    last = max(last, int(record.get("seq") or 0))
                    values = row_values(source.run_id, source.session_key, source.agent_id, record)
                    if values is not None:
                        pending.append(values)
                    if len(pending) >= self.max_batch:
                        with transaction(conn):
                            count += _insert_many(conn, pending)
                        pending = []
                with transaction(conn):
                    count += _insert_many(conn, pending) if pending else 0
                    self.marks.settle(conn, source.run_id, source.session_key, last)
                self.stats.rebuilt_runs += 1
            conn.execute("INSERT INTO fts (fts) VALUES ('optimize')")
            return count

        count = await self.call(_do)
        self.stats.indexed += count
        log.info("history index rebuilt: %d message(s) of %d run(s)", count, len(runs))
        return count

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        conn = self._conn
        assert conn is not None
        conn.create_function("index_text", 1, index_text, deterministic=True)
        conn.execute("PRAGMA wal_autocheckpoint=20000")  # checkpoints (and their fsyncs) every ~80 MB
        with contextlib.suppress(OSError, AttributeError):  # the index may lag; ingest must not
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        stopping = False
        while not stopping:
            try:
                batch = [self._queue.get(timeout=self.marks.wait_s())]
            except queue.Empty:  # nothing fed, but a run behind is due to catch up
                self._catch_up(conn)
                continue
            time.sleep(BATCH_WAIT_S)  # let a batch gather: fewer, larger transactions
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            fed: list[Fed] = []
            for item in batch:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, Fed):
                    fed.append(item)
                else:
                    self._commit(conn, fed)
                    fed = []
                    self._invoke(conn, item)
            self._commit(conn, fed)
            self._catch_up(conn)
        conn.close()
        self._conn = None

    def _commit(self, conn: sqlite3.Connection, fed: list[Fed]) -> None:
        if not fed:
            return
        try:
            self._commit_batch(conn, fed)
        finally:  # written, or behind and read from the run files later: no post waits for them
            self._on_loop(self.backlog.written, len(fed))

    def _commit_batch(self, conn: sqlite3.Connection, fed: list[Fed]) -> None:
        try:
            added = self.marks.commit(conn, fed, _insert_many)
            self.stats.indexed += added
            self.stats.batches += 1
        except sqlite3.Error as exc:  # the runs are behind: read from their files once it works again
            log.warning("history index: a batch of %d message(s) failed (%s); it is read again from the"
                        " run files once history.db takes writes", len(fed), exc)  # fmt: skip

    def _catch_up(self, conn: sqlite3.Connection) -> None:
        self.backlog.paused = True  # reading runs behind from their files: no post waits for it
        try:
            self.stats.indexed += self.marks.catch_up(conn, row_values, _insert_many, self.max_batch)
        except (sqlite3.Error, OSError) as exc:
            log.warning("history index: catching up failed (%s); retrying in %.1f s", exc, self.marks.wait_s() or 0.0)
        finally:
            self.backlog.paused = False

    def _invoke(self, conn: sqlite3.Connection, op: _Op) -> None:
        self.backlog.paused = True  # a rebuild takes minutes on a large home: no post waits for it
        try:
            op.result = op.fn(conn)
        except Exception as exc:  # handed to the awaiting coroutine
            op.error = exc
        finally:
            self.backlog.paused = False
        if op.future is not None:
            self._on_loop(_settle, op)

    def _on_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the event loop, unless it has closed (the daemon stopping)."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fn, *args)

    # -- reading --------------------------------------------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def _call() -> T:
            if self._reader is None:
                raise RuntimeError("the history index is closed")
            return fn(self._reader)

        return await asyncio.get_running_loop().run_in_executor(self._read_pool, _call)

    async def search(self, query: HistoryQuery) -> list[HistoryHit]:
        return await self._read(lambda conn: search(conn, query))

    async def count(self) -> int:
        return await self._read(lambda conn: int(conn.execute("SELECT count(*) FROM messages").fetchone()[0]))

    async def seqs(self, run_id: str) -> set[int]:
        """The seqs of one run the index holds."""
        sql = "SELECT seq FROM messages WHERE run_id = ?"
        return await self._read(lambda conn: {int(r[0]) for r in conn.execute(sql, (run_id,))})

    async def run_ids(self) -> set[str]:
        return await self._read(lambda conn: {r[0] for r in conn.execute("SELECT DISTINCT run_id FROM messages")})


def _settle(op: _Op) -> None:
    future = op.future
    if future is None or future.done():
        return
    if op.error is not None:
        future.set_exception(op.error)
    else:
        future.set_result(op.result)


def history_path(contexts: Path) -> Path:
    """``contexts/history.db``."""
    return contexts / HISTORY_DB


def remove_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


def _all_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    sql = "SELECT uuid, session_key, agent_id, status, created_at FROM tasks"
    return [dict(zip(("uuid", "session_key", "agent_id", "status", "created_at"), r, strict=True))
            for r in conn.execute(sql)]  # fmt: skip


async def rebuild_all(history: HistoryIndex, ledger: Ledger, home: Home) -> int:
    """Rebuild the whole index from every run in tasks.db (folders and archives)."""
    rows = await ledger.execute(_all_rows)
    sources = await asyncio.to_thread(sources_from_rows, rows, home)
    return await history.rebuild(sources)


async def catch_up(history: HistoryIndex, runs: Iterable[tuple[str, str, str | None, Path, int]]) -> int:
    """Index what a crash or a failed batch left unindexed: (run, key, agent, folder, last seq on
    disk) whose last seq is above the run's mark. Returns the number of runs re-read."""
    wanted = list(runs)
    if not wanted:
        return 0
    marks = await history._read(marks_of)
    behind = [RunSource(run_id, key, agent, folder=folder) for run_id, key, agent, folder, last in wanted
              if last > marks.get(run_id, 0)]  # fmt: skip
    if behind:
        await history.rebuild(behind, replace=False)
    return len(behind)
