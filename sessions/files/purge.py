"""Erasing a session key for good (``DELETE /v1/sessions/{key}?purge=true``, ``neotask sessions
purge``): every run folder and archive of the key, its rows in every table of tasks.db (runs,
idempotency and webhook delivery records, the OpenAI-compatible routes' conversation and response
ids: every table with a ``session_key`` column), its sessions.json entry and its history index
rows. A tombstone (key, time, counts, no content) stays in tasks.db so the deletion itself is
auditable.

The caller holds the key's locks (no turn runs, nothing is appended meanwhile).
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.clock import iso
from config.errors import SessionNotFound
from home import layout
from home.atomic import fsync_dir
from sessions.files.history import HistoryIndex
from sessions.files.store_state import StoreState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tombstone:
    session_key: str
    deleted_at: str
    runs: int
    messages: int

    def as_dict(self) -> dict[str, Any]:
        return {"session_key": self.session_key, "deleted_at": self.deleted_at, "runs": self.runs,
                "messages": self.messages}  # fmt: skip


def _key_rows(conn: sqlite3.Connection, key: str) -> list[dict[str, Any]]:
    sql = "SELECT uuid, status, archived_at, total_messages FROM tasks WHERE session_key = ?"
    return [dict(r) for r in conn.execute(sql, (key,))]


def keyed_tables(conn: sqlite3.Connection) -> list[str]:
    """Every table of tasks.db with a ``session_key`` column but the tombstones: the runs, the
    idempotency and webhook delivery records, the OpenAI-compatible routes' conversations and
    response ids, and whatever a later migration adds beside them."""
    tables = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return [
        name
        for name in tables
        if name != "tombstones" and any(col[1] == "session_key" for col in conn.execute(f'PRAGMA table_info("{name}")'))
    ]


def _erase_rows(conn: sqlite3.Connection, key: str, tombstone: Tombstone) -> None:
    conn.execute("PRAGMA secure_delete=ON")
    for table in keyed_tables(conn):
        conn.execute(f'DELETE FROM "{table}" WHERE session_key = ?', (key,))
    conn.execute(
        "INSERT INTO tombstones (session_key, deleted_at, runs, messages) VALUES (?, ?, ?, ?)",
        (tombstone.session_key, tombstone.deleted_at, tombstone.runs, tombstone.messages),
    )


def _scrub_ledger(conn: sqlite3.Connection) -> None:
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _remove_run_files(home: layout.Home, run_id: str) -> None:
    for name in layout.FOLDERS:
        folder = home.folder(name) / run_id
        if folder.is_dir():
            shutil.rmtree(folder)
            fsync_dir(folder.parent)
    archive: Path = home.archive_file(run_id)
    if archive.exists():
        archive.unlink()
        fsync_dir(archive.parent)


async def purge_key(
    store: StoreState, key: str, *, end_run: Callable[[str], Awaitable[object]], history: HistoryIndex | None
) -> Tombstone:
    """Erase ``key`` (NotFound when neither an entry nor a run of it exists); ``end_run`` completes
    its active run first (without hooks or a final summary)."""
    rows = await store.ledger.execute(lambda c: _key_rows(c, key))
    if store.entry(key) is None and not rows:
        raise SessionNotFound(f"no session or run with key {key!r}")
    if store.active_run(key) is not None:
        await end_run(key)
        rows = await store.ledger.execute(lambda c: _key_rows(c, key))
    writer = store.writer
    for row in rows:
        run_id = str(row["uuid"])

        def _remove(run_id: str = run_id) -> None:
            for name in layout.FOLDERS:
                writer.close_handles_under(store.home.folder(name) / run_id)
            _remove_run_files(store.home, run_id)

        await writer.call(_remove)
    tombstone = Tombstone(
        session_key=key,
        deleted_at=iso(store.clock()),
        runs=len(rows),
        messages=sum(int(r.get("total_messages") or 0) for r in rows),
    )
    await store.ledger.execute(lambda c: _erase_rows(c, key, tombstone))
    store.forget_recorded(key)
    if store.entry(key) is not None:
        store.registry.remove(key)
        await store.registry.flush(force=True)
    if history is not None:
        await history.delete_key(key)
        await history.scrub()
    await store.ledger.execute(_scrub_ledger)
    log.info("purged session %s: %d run(s), %d message(s)", key, tombstone.runs, tombstone.messages)
    return tombstone


async def tombstones(store: StoreState, key: str | None = None) -> list[dict[str, Any]]:
    def _read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        sql = "SELECT session_key, deleted_at, runs, messages FROM tombstones"
        params: tuple[Any, ...] = ()
        if key is not None:
            sql += " WHERE session_key = ?"
            params = (key,)
        return [dict(r) for r in conn.execute(sql + " ORDER BY id", params)]

    return await store.ledger.execute(_read)
