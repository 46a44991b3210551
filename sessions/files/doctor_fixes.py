"""The doctor's fixes: the SQL a finding runs on tasks.db, the entry and folder fixes, rebuilding
tasks.db, and the plan that orders them.

Part of ``sessions.files.doctor`` (which re-exports these names).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from home import layout
from home.atomic import fsync_dir, write_json_atomic
from home.damage import FIX_LEDGER, DamagedState
from home.layout import Home
from sessions.files import leftovers
from sessions.files.archive import read_member
from sessions.files.doctor_checks import ACTIVE, DAMAGED, FOLDER_FIXES, LOST, SET_ASIDE, Finding, RunFolder
from sessions.files.doctor_files import scan_archives
from sessions.files.ledger import Ledger
from sessions.files.registry import SessionEntry


def ledger_finding(exc: DamagedState) -> Finding:
    """The finding for a tasks.db that cannot be read; fixable when rebuilding it is the remedy."""
    fixable = exc.todo == FIX_LEDGER
    return Finding(
        "unreadable_ledger",
        "error",
        exc.message,
        "move tasks.db aside (tasks.db.damaged) and rebuild it from the run folders and archives"
        if fixable
        else exc.todo,
        kind="rebuild_ledger" if fixable else None,
        path="contexts/tasks.db",
        manual=not fixable,
    )


def set_ledger_aside(home: Home) -> Path:
    """Rename a damaged tasks.db (and its -wal/-shm) to ``tasks.db.damaged[-n]``; the new name."""
    db = home.tasks_db
    target = db.with_name(f"{db.name}.damaged")
    n = 1
    while target.exists():
        target, n = db.with_name(f"{db.name}.damaged-{n}"), n + 1
    for suffix in ("-wal", "-shm"):
        side = db.with_name(db.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    os.replace(db, target)
    return target


def rebuild_archived_rows(home: Home, ledger: Ledger, now: str) -> int:
    """Insert a completed row for every archived run that has none (from the archive's
    metadata.json); how many were inserted."""
    known = {r["uuid"] for r in ledger.submit(_all_rows)}
    inserted = 0
    for run_id in sorted(scan_archives(home) - known):
        text = read_member(home.archive_file(run_id), run_id, layout.METADATA)
        try:
            meta = json.loads(text) if text else None
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            continue
        row = {**_row_from_metadata(RunFolder(run_id, "completed", meta), now), "archived_at": now}
        ledger.submit(_insert_row(row))
        inserted += 1
    return inserted


# -- fixes -----------------------------------------------------------------------------------------

LedgerFix = Callable[[sqlite3.Connection], None]


def ledger_fix(finding: Finding, folders: Mapping[str, RunFolder], now: str) -> LedgerFix | None:
    """The SQL a finding's fix runs on tasks.db (None when it touches no row)."""
    run_id = finding.run_id
    if finding.kind == "insert_row" and run_id is not None:
        row = _row_from_metadata(folders[run_id], now)
        sql = f"INSERT OR IGNORE INTO tasks ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"
        values: tuple[Any, ...] = tuple(row.values())
    elif finding.kind == "settle_row":
        sql = "UPDATE tasks SET status = 'failed', completed_at = ?, updated_at = ?, error_message = ? WHERE uuid = ?"
        values = (now, now, LOST, run_id)
    elif finding.kind == "set_row_status":
        sql = (
            "UPDATE tasks SET status = ?, updated_at = ?,"
            " completed_at = CASE WHEN ? THEN COALESCE(completed_at, ?) ELSE NULL END WHERE uuid = ?"
        )
        values = (finding.status, now, finding.status not in ACTIVE, now, run_id)
    elif finding.kind == "fail_run" and finding.status == "completed":  # a settled run: its row only
        sql = "UPDATE tasks SET status = 'failed', updated_at = ?, error_message = ? WHERE uuid = ?"
        values = (now, f"{DAMAGED}: {finding.detail}", run_id)
    else:
        return None

    def run(conn: sqlite3.Connection) -> None:
        conn.execute(sql, values)

    return run


def _row_from_metadata(folder: RunFolder, now: str) -> dict[str, Any]:
    meta = folder.metadata or {}
    key = meta.get("session_key")
    return {
        "uuid": folder.run_id,
        "status": folder.state,
        "task_type": meta.get("task_type") or (str(key).split(":", 1)[0] if key else "agent"),
        "task_identifier": meta.get("task_identifier", key),
        "repository": meta.get("repository"),
        "user": meta.get("user"),
        "created_at": meta.get("created_at") or now,
        "updated_at": now,
        "completed_at": now if folder.state == "completed" else None,
        "metadata": json.dumps(meta, ensure_ascii=False),
        "session_key": key,
        "agent_id": meta.get("agent_id"),
        "channel": meta.get("channel"),
        "chat_type": meta.get("chat_type"),
        "parent_uuid": meta.get("parent_uuid"),
    }


def entry_fix(finding: Finding, entries: dict[str, SessionEntry], folders: Mapping[str, RunFolder], now: str) -> bool:
    """Apply an entry fix to an in-memory registry; whether it changed the entry."""
    key = finding.key
    if key is None:
        return False
    entry = entries.get(key)
    if finding.kind == "idle_entry" and entry is not None and entry.run_id == finding.run_id:
        entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
        entry.context_tokens = entry.message_count = 0
        entry.updated_at = now
        return True
    if finding.kind == "point_entry" and finding.run_id is not None:
        meta = folders[finding.run_id].metadata or {}
        if entry is None:
            entry = SessionEntry(
                key=key,
                agent_id=meta.get("agent_id"),
                chat_type=str(meta.get("chat_type") or "direct"),
                channel=meta.get("channel"),
                created_at=str(meta.get("created_at") or now),
                updated_at=now,
            )
            entries[key] = entry
        if entry.run_id is not None and entry.run_id != finding.run_id:
            entry.last_run_id = entry.run_id
        entry.run_id, entry.status = finding.run_id, finding.status or "running"
        entry.started_at = meta.get("created_at") or entry.started_at
        entry.updated_at = now
        return True
    return False


def folder_fix(home: Home, finding: Finding, rows: Mapping[str, Mapping[str, Any]]) -> bool:
    """Carry out a fix on a run folder that no daemon holds (blocking); whether it was done."""
    if finding.run_id is None or finding.status is None:
        return False
    folder = home.run_dir(finding.run_id, finding.status)
    if not folder.is_dir():
        return False
    if finding.kind == "remove_folder":
        return leftovers.remove(folder)
    if finding.kind == "restore_metadata":
        metadata = json.loads(str(rows[finding.run_id]["metadata"]))
        write_json_atomic(folder / layout.METADATA, metadata)
        return True
    if finding.kind == "set_aside":
        target = home.contexts / SET_ASIDE
        target.mkdir(exist_ok=True)
        os.rename(folder, target / f"{finding.status}-{finding.run_id}-{int(time.time())}")
        fsync_dir(target)
        fsync_dir(folder.parent)
        return True
    return False


def remove_tmp(home: Home, relative: str) -> bool:
    """Delete a stray temp file; True once it is gone (an atomic rewrite may have used it up)."""
    (home.root / relative).unlink(missing_ok=True)
    return True


def _mark(findings: Iterable[Finding], fixed: set[int]) -> list[Finding]:
    return [replace(f, fixed=True) if i in fixed else f for i, f in enumerate(findings)]


@dataclass
class _Plan:
    ledger: list[tuple[int, LedgerFix]] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)
    tmp: list[int] = field(default_factory=list)
    folders: list[int] = field(default_factory=list)
    files: list[int] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)  # active runs to fail (through a store)


def _plan(findings: list[Finding], folders: Mapping[str, RunFolder], now: str) -> _Plan:
    plan = _Plan()
    for index, finding in enumerate(findings):
        if finding.kind in ("idle_entry", "point_entry"):
            plan.entries.append(index)
        elif finding.kind == "remove_tmp":
            plan.tmp.append(index)
        elif finding.kind in FOLDER_FIXES:
            plan.folders.append(index)
        elif finding.kind in ("cut_lines", "tighten_modes"):
            plan.files.append(index)
        elif finding.kind == "fail_run" and finding.status in ACTIVE:
            plan.runs.append(index)
        elif finding.kind is not None and (sql := ledger_fix(finding, folders, now)) is not None:
            plan.ledger.append((index, sql))
    return plan


def _insert_row(row: dict[str, Any]) -> LedgerFix:
    sql = f"INSERT OR IGNORE INTO tasks ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"
    values = tuple(row.values())

    def run(conn: sqlite3.Connection) -> None:
        conn.execute(sql, values)

    return run


def _all_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM tasks")]
