"""tasks.db: the SQLite ledger of every run (seed 000 schema plus SPEC section 2 columns).

One connection on one thread: every statement goes through ``Ledger._run``, so SQLite work never
touches the event loop and there is exactly one writer. The calls made during one pass of the
event loop are handed to that thread together (one wake-up, one callback back to the loop), each
still in its own transaction and in call order: under concurrent calls (the OpenAI-compatible
routes' usage and conversation records, idempotency records) this saves a thread round trip per
call. Schema changes are numbered migrations tracked in ``PRAGMA user_version``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from home.damage import FIX_LEDGER, DamagedState, ledger_error, storage_damage
from sessions import usage as usage_days
from sessions.records import RUN_COLUMNS, RunQuery

T = TypeVar("T")

MIGRATIONS: tuple[str, ...] = (
    # 1: the seed's table and indexes, as written in seed 000.
    """
    CREATE TABLE tasks (
        uuid TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        task_type TEXT NOT NULL,
        task_identifier TEXT,
        repository TEXT,
        user TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT,
        completed_at TEXT,
        metadata TEXT,
        total_messages INTEGER DEFAULT 0,
        total_summaries INTEGER DEFAULT 0,
        total_tool_calls INTEGER DEFAULT 0,
        final_token_count INTEGER,
        final_message_count INTEGER,
        error_message TEXT
    );
    CREATE INDEX idx_tasks_status ON tasks(status);
    CREATE INDEX idx_tasks_task_type ON tasks(task_type);
    CREATE INDEX idx_tasks_repository ON tasks(repository);
    CREATE INDEX idx_tasks_user ON tasks(user);
    CREATE INDEX idx_tasks_completed_at ON tasks(completed_at);
    """,
    # 2: the gateway's columns (SPEC section 2).
    """
    ALTER TABLE tasks ADD COLUMN session_key TEXT;
    ALTER TABLE tasks ADD COLUMN agent_id TEXT;
    ALTER TABLE tasks ADD COLUMN channel TEXT;
    ALTER TABLE tasks ADD COLUMN chat_type TEXT;
    ALTER TABLE tasks ADD COLUMN parent_uuid TEXT;
    ALTER TABLE tasks ADD COLUMN input_tokens INTEGER DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN output_tokens INTEGER DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN cache_read_tokens INTEGER DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN cache_write_tokens INTEGER DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN compaction_count INTEGER DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN pinned INTEGER DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN archived_at TEXT;
    CREATE INDEX idx_tasks_session_key ON tasks(session_key);
    """,
    # 3: idempotent redelivery and webhook delivery ids.
    """
    CREATE TABLE idempotency (
        session_key TEXT NOT NULL,
        client_message_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        run_id TEXT,
        message_seq INTEGER,
        response TEXT,
        PRIMARY KEY (session_key, client_message_id)
    );
    CREATE TABLE hook_deliveries (
        delivery_id TEXT PRIMARY KEY,
        hook TEXT NOT NULL,
        created_at TEXT NOT NULL,
        session_key TEXT,
        message_seq INTEGER
    );
    """,
    # 4: tombstones of purged sessions (key, when, how much; never content).
    """
    CREATE TABLE tombstones (
        id INTEGER PRIMARY KEY,
        session_key TEXT NOT NULL,
        deleted_at TEXT NOT NULL,
        runs INTEGER NOT NULL,
        messages INTEGER NOT NULL
    );
    CREATE INDEX idx_tombstones_key ON tombstones(session_key);
    """,
    # 5: the OpenAI-compatible routes: the conversation each key's client holds (what a resent
    # history is matched against) and response ids (previous_response_id -> key and seq).
    """
    CREATE TABLE openai_conversations (
        session_key TEXT PRIMARY KEY,
        epoch INTEGER NOT NULL,
        base_count INTEGER NOT NULL,
        request_count INTEGER NOT NULL,
        request_digest TEXT NOT NULL,
        answered_count INTEGER NOT NULL,
        answered_digest TEXT NOT NULL,
        answer TEXT,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE openai_responses (
        response_id TEXT PRIMARY KEY,
        session_key TEXT NOT NULL,
        run_id TEXT,
        seq INTEGER,
        created_at TEXT NOT NULL
    );
    CREATE INDEX idx_openai_responses_key ON openai_responses(session_key);
    """,
    # 6: token usage per UTC day, agent and key (GET /v1/usage, agents.<id>.limits).
    usage_days.MIGRATION,
)


def run_metadata(text: str | None) -> dict[str, Any]:
    """The ``metadata`` column as a dict (empty when missing or not a JSON object)."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neotask-ledger")
        self._conn: sqlite3.Connection | None = None
        self._outbox: list[_Job] = []  # calls of this loop pass, handed over together
        self._outbox_loop: asyncio.AbstractEventLoop | None = None

    # -- plumbing -------------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._outbox and self._outbox_loop is not loop:  # left by a loop that ended: run them now
            self._hand_over()
        if not self._outbox:
            self._outbox_loop = loop
            loop.call_soon(self._hand_over)
        self._outbox.append(_Job(fn, future))
        return await future

    def _hand_over(self) -> None:
        jobs, self._outbox = self._outbox, []
        if jobs and self._outbox_loop is not None:
            self._executor.submit(self._run_jobs, self._outbox_loop, jobs)

    def _run_jobs(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        """On the ledger thread: each call in its own transaction, in order; the results go back
        to the loop in one callback."""
        for job in jobs:
            if job.future.cancelled():
                continue
            try:
                job.result = self._call(job.fn)
            except BaseException as exc:  # handed to the awaiting coroutine, which decides
                job.error = exc
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed under us during shutdown
                loop.call_soon_threadsafe(_settle, jobs)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError("the ledger is closed")
        with self._conn:
            return fn(self._conn)

    def open_sync(self) -> None:
        """Open and migrate on the calling thread (start-up, CLI)."""
        self._executor.submit(self._open).result()

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._open)

    def _open(self) -> None:
        """Open, migrate and validate; ``DamagedState`` (naming tasks.db and what to do) when the
        file is not a SQLite database, has another schema, comes from a newer neotask, or cannot
        be written."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_damage(self.path.parent, exc, doing="create the folder of tasks.db") from None
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise ledger_error(self.path, exc) from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=5000")
            check_version(conn, self.path)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            migrate(conn)
            check_schema(conn, self.path)
            _make_private(self.path)
        except sqlite3.Error as exc:
            conn.close()
            raise ledger_error(self.path, exc) from None
        except DamagedState:
            conn.close()
            raise
        conn.isolation_level = "DEFERRED"
        self._conn = conn

    async def close(self) -> None:
        self._hand_over()  # the calls queued before it run first

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)

    def close_sync(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        self._executor.submit(_close).result()
        self._executor.shutdown(wait=True)

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Blocking call on the ledger thread, for code already off the loop."""
        return self._executor.submit(self._call, fn).result()

    # -- runs -----------------------------------------------------------------------------------

    async def insert_run(self, row: dict[str, Any]) -> None:
        columns = [c for c in RUN_COLUMNS if c in row]
        sql = f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
        await self._run(lambda c: c.execute(sql, [row[k] for k in columns]))

    async def update_run(self, uuid: str, **fields: Any) -> None:
        if not fields:
            return
        unknown = set(fields) - set(RUN_COLUMNS)
        if unknown:
            raise ValueError(f"unknown tasks columns: {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        values = [*fields.values(), uuid]
        await self._run(lambda c: c.execute(f"UPDATE tasks SET {assignments} WHERE uuid = ?", values))

    async def add_usage(
        self, uuid: str, usage: dict[str, int], updated_at: str, daily: usage_days.DailyKey | None = None
    ) -> None:
        """A model call's usage on its run's row and, with ``daily``, on its day (one transaction)."""
        sql = (
            "UPDATE tasks SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
            " cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?,"
            " updated_at = ? WHERE uuid = ?"
        )
        values = [
            usage.get("input_tokens", 0), usage.get("output_tokens", 0),
            usage.get("cache_read_tokens", 0), usage.get("cache_write_tokens", 0), updated_at, uuid,
        ]  # fmt: skip

        def _add(c: sqlite3.Connection) -> None:
            c.execute(sql, values)
            if daily is not None:
                usage_days.add(c, daily, usage)

        await self._run(_add)

    async def set_key_metadata(self, session_key: str, fields: dict[str, Any]) -> None:
        """Merge ``fields`` into the ``metadata`` JSON of every run of the key: the durable home of
        the entry fields sessions.json alone would hold (label, settings) and of ``inherit: false``
        on the runs of a deleted key."""

        def _set(c: sqlite3.Connection) -> None:
            rows = c.execute("SELECT uuid, metadata FROM tasks WHERE session_key = ?", (session_key,)).fetchall()
            for row in rows:
                meta = json.dumps({**run_metadata(row["metadata"]), **fields}, ensure_ascii=False)
                c.execute("UPDATE tasks SET metadata = ? WHERE uuid = ?", (meta, row["uuid"]))

        await self._run(_set)

    async def set_pinned(self, session_key: str, pinned: bool) -> None:
        await self._run(
            lambda c: c.execute("UPDATE tasks SET pinned = ? WHERE session_key = ?", (int(pinned), session_key))
        )

    async def get_run(self, uuid: str) -> dict[str, Any] | None:
        def _get(c: sqlite3.Connection) -> dict[str, Any] | None:
            row = c.execute("SELECT * FROM tasks WHERE uuid = ?", (uuid,)).fetchone()
            return dict(row) if row else None

        return await self._run(_get)

    async def list_runs(self, query: RunQuery) -> list[dict[str, Any]]:
        """The runs ``query`` names, newest first by (created_at, uuid)."""
        clauses: list[str] = []
        values: list[Any] = []
        if query.session_key is not None:
            clauses.append("session_key = ?")
            values.append(query.session_key)
        if query.statuses:
            clauses.append(f"status IN ({', '.join('?' for _ in query.statuses)})")
            values.extend(query.statuses)
        if query.before is not None:
            clauses.append("(created_at, uuid) < (?, ?)")
            values.extend(query.before)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM tasks {where} ORDER BY created_at DESC, uuid DESC LIMIT ?"
        values.append(query.limit)
        return await self._run(lambda c: [dict(r) for r in c.execute(sql, values)])

    async def previous_runs(
        self,
        *,
        session_key: str | None,
        task_key: dict[str, str | None] | None,
        since: str,
    ) -> list[dict[str, Any]]:
        """Completed or failed runs of a key (or of the seed's task key), newest first."""
        matchers: list[str] = []
        values: list[Any] = []
        if session_key is not None:
            matchers.append("session_key = ?")
            values.append(session_key)
        if task_key:
            parts = []
            for column in ("task_type", "task_identifier", "repository", "user"):
                value = task_key.get(column)
                parts.append(f"{column} IS ?")
                values.append(value)
            matchers.append("(" + " AND ".join(parts) + ")")
        if not matchers:
            return []
        sql = (
            f"SELECT * FROM tasks WHERE ({' OR '.join(matchers)}) AND status IN ('completed', 'failed')"
            " AND completed_at >= ? ORDER BY completed_at DESC, created_at DESC, rowid DESC"
        )
        values.append(since)
        return await self._run(lambda c: [dict(r) for r in c.execute(sql, values)])

    async def execute(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run custom SQL on the ledger thread (idempotency records, cleanup, doctor)."""
        return await self._run(fn)


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None


def _settle(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.future.done():  # its caller was cancelled meanwhile
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations the database has not seen; returns the resulting version."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    for number, script in enumerate(MIGRATIONS, start=1):
        if number <= version:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in (s.strip() for s in script.split(";")):
                if statement:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            raise
    return len(MIGRATIONS)


def check_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version; ``DamagedState`` when it is newer than this program knows (a newer
    neotask wrote it: reading it with the old schema would misread it)."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise DamagedState(
            path,
            f"schema version {version} is newer than this neotask knows ({len(MIGRATIONS)})",
            "upgrade neotask, or restore a tasks.db written by this version",
        )
    return version


def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """``DamagedState`` when the migrated database lacks the tables and columns this program uses
    (a foreign database, or one whose version number lies)."""
    expected = {"tasks": set(RUN_COLUMNS), "idempotency": {"session_key", "client_message_id"}}
    for table, columns in expected.items():
        have = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
        missing = sorted(columns - have)
        if missing:
            what = f"no {table} table" if not have else f"the {table} table lacks {', '.join(missing[:5])}"
            raise DamagedState(path, f"not a neotask ledger ({what})", FIX_LEDGER)


def _make_private(path: Path) -> None:
    """tasks.db and its -wal/-shm readable by the owner only (SQLite creates them by the umask)."""
    for name in (path.name, f"{path.name}-wal", f"{path.name}-shm"):
        target = path.with_name(name)
        try:
            mode = target.stat().st_mode & 0o777
            if mode & 0o077:
                target.chmod(mode & 0o700)
        except FileNotFoundError:
            continue
