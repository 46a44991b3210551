"""Consistency checks over a home (``neotask doctor``, ``POST /v1/admin/doctor``).

Three steps: take a ``Snapshot`` (run folders, tasks.db rows, sessions.json entries, stray temp
files), ``diagnose`` it (pure: a list of ``Finding``), and, when asked, apply the safe fixes. The
snapshot and the fixes come in two flavours: over the files (``check_home``: no daemon, the caller
holds the home lock) and over an open ``SessionStore`` (``check_store``: inside the daemon, whose
in-memory state is the truth for active runs and entries). Fixes follow what start-up recovery
does: the folders are the truth, tasks.db and sessions.json follow them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from config.clock import iso, parse_iso, system_clock
from config.errors import NeotaskError
from config.settings import Settings
from sessions import layout, leftovers
from sessions.archive import read_member
from sessions.compaction import last_seq
from sessions.damage import FIX_LEDGER, DamagedState, ledger_error
from sessions.integrity import cut_lines, describe, scan_lines
from sessions.jsonl import fsync_dir, read_records, write_json_atomic
from sessions.layout import FOLDERS, Home, folder_for
from sessions.ledger import MIGRATIONS, Ledger, check_schema, check_version
from sessions.permissions import tighten, wide_modes
from sessions.records import ACTIVE_STATUSES
from sessions.registry import SessionEntry, SessionRegistry
from sessions.store import SessionStore

log = logging.getLogger(__name__)

Severity = Literal["error", "warning", "info"]
FixKind = Literal[
    "insert_row", "settle_row", "set_row_status", "idle_entry", "point_entry", "remove_tmp", "rebuild_ledger",
    "cut_lines", "tighten_modes", "remove_folder", "restore_metadata", "set_aside", "fail_run", "rebuild_sessions",
]  # fmt: skip
FOLDER_FIXES = ("remove_folder", "restore_metadata", "set_aside")
SET_ASIDE = "quarantine"  # contexts/quarantine/<state>-<uuid>: folders the doctor moved out of the way
ACTIVE = ACTIVE_STATUSES
LOST = "run folder missing"  # error_message of a run settled without its folder (as recovery writes it)
DAMAGED = "damaged"  # error_message prefix of a run failed for damaged files (start-up or the doctor)
RESTART = "restart the gateway (start-up recovery adopts the run), or stop it and run `neotask doctor --fix`"
ONLINE_MIN_AGE_S = 60.0  # inside the daemon, younger files may belong to a write in progress


@dataclass(frozen=True)
class RunFolder:
    run_id: str
    state: str  # running | paused | completed
    metadata: dict[str, Any] | None  # None when metadata.json is missing or unreadable
    young: bool = False  # changed within the last moments: may be a lifecycle change in progress
    empty: bool = False  # holds no message (only judged when metadata is None)


@dataclass(frozen=True)
class Snapshot:
    folders: tuple[RunFolder, ...]
    rows: Mapping[str, Mapping[str, Any]]  # uuid -> tasks.db row (status, session_key, ...)
    entries: Mapping[str, str | None]  # key -> run_id
    tmp_files: tuple[str, ...] = ()  # relative to the home
    archives: frozenset[str] = frozenset()  # run ids with an archive file
    live: frozenset[str] | None = None  # inside the daemon: the runs its store holds as active


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    detail: str
    fix: str | None  # what --fix does; None when it needs a person
    kind: FixKind | None = None
    run_id: str | None = None
    key: str | None = None
    path: str | None = None
    status: str | None = None  # the status a row or entry is set to
    fixed: bool = False
    lines: tuple[int, ...] = ()  # the bad lines of ``path`` (cut_lines)
    manual: bool = False  # ``fix`` is for a person (upgrade) or a restart: --fix does not carry it out

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"check": self.check, "severity": self.severity, "detail": self.detail, "fix": self.fix}
        for name in ("run_id", "key", "path"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        body["fixed"] = self.fixed
        body["fixable"] = not self.manual  # False: the fix needs a restart or a person
        return body


# -- the checks (pure) ------------------------------------------------------------------------------


def diagnose(snap: Snapshot) -> list[Finding]:
    findings: list[Finding] = []
    by_run: dict[str, list[RunFolder]] = {}
    for folder in snap.folders:
        by_run.setdefault(folder.run_id, []).append(folder)
    active_runs: dict[str, RunFolder] = {}
    ambiguous = set()
    for run_id, places in sorted(by_run.items()):
        if len(places) > 1:
            ambiguous.add(run_id)
            findings.extend(_duplicates(run_id, places, snap.rows.get(run_id), snap.live))
            continue
        folder = places[0]
        if folder.state in ACTIVE:
            active_runs[run_id] = folder
        if not folder.young:
            findings.extend(_check_folder(folder, snap.rows.get(run_id), snap.live))
    findings.extend(_check_rows(snap, by_run))
    if snap.live is not None:
        active_runs = {rid: f for rid, f in active_runs.items() if rid in snap.live}
    findings.extend(_check_entries(snap, active_runs, ambiguous))
    findings.extend(
        Finding(
            "stray_tmp",
            "info",
            f"{path} is a temp file left by an interrupted write",
            "delete it",
            kind="remove_tmp",
            path=path,
        )
        for path in snap.tmp_files
    )
    return findings


def _check_folder(folder: RunFolder, row: Mapping[str, Any] | None, live: frozenset[str] | None) -> list[Finding]:
    run_id = folder.run_id
    where = f"{folder.state}/{run_id}"
    if folder.metadata is None:
        detail = f"{where} has no readable metadata.json"
        kind: FixKind
        if folder.empty:
            fix, kind = "remove the folder (it holds no message: a run whose start was interrupted)", "remove_folder"
        elif row is not None and row.get("metadata"):
            fix, kind = "rewrite metadata.json from the run's tasks.db row", "restore_metadata"
        else:
            fix, kind = f"move the folder to contexts/{SET_ASIDE}/ for a person to look at", "set_aside"
        return [Finding("unreadable_metadata", "error", detail, fix, kind=kind, run_id=run_id, status=folder.state)]
    if live is not None and folder.state in ACTIVE and run_id not in live:
        return [
            Finding(
                "unrecovered_folder",
                "warning",
                f"run folder {where} is not held by the running gateway",
                RESTART,
                run_id=run_id,
                manual=True,
            )
        ]
    if row is None:
        return [
            Finding(
                "orphan_folder",
                "warning",
                f"run folder {where} has no tasks.db row",
                f"insert its tasks.db row from metadata.json with status {folder.state}",
                kind="insert_row",
                run_id=run_id,
                status=folder.state,
            )
        ]
    if folder_for(str(row["status"])) != folder.state:
        return [
            Finding(
                "wrong_state_folder",
                "warning",
                f"run {run_id} is {row['status']} in tasks.db but its folder is in {folder.state}/",
                f"set its tasks.db status to {folder.state} (the folder is the truth)",
                kind="set_row_status",
                run_id=run_id,
                status=folder.state,
            )
        ]
    return []


def _duplicates(
    run_id: str, places: list[RunFolder], row: Mapping[str, Any] | None, live: frozenset[str] | None
) -> list[Finding]:
    """A run with folders in several states: the one tasks.db names stays (else the furthest
    along: completed, paused, running); the others are moved aside, never deleted."""
    states = ", ".join(sorted(p.state for p in places))
    keep: str | None = folder_for(str(row["status"])) if row is not None else None
    if keep not in {p.state for p in places}:
        keep = max((p.state for p in places), key=lambda s: ("running", "paused", "completed").index(s))
    if live is not None and run_id in live:  # the daemon holds it: its own folder stays, the others go
        keep = next(p.state for p in places if p.young)  # check_store marks the held one young
    return [
        Finding(
            "duplicate_folder",
            "error",
            f"run {run_id} has folders in {states}",
            f"keep {keep}/{run_id}; move {place.state}/{run_id} to contexts/{SET_ASIDE}/",
            kind="set_aside",
            run_id=run_id,
            status=place.state,
        )
        for place in places
        if place.state != keep
    ]


def _check_rows(snap: Snapshot, by_run: Mapping[str, list[RunFolder]]) -> list[Finding]:
    findings = []
    for run_id, row in sorted(snap.rows.items()):
        if run_id in by_run:
            continue
        if row["status"] in ACTIVE:
            findings.append(
                Finding(
                    "missing_folder",
                    "error",
                    f"tasks.db says run {run_id} is {row['status']} but it has no run folder",
                    "mark the run failed in tasks.db ('run folder missing')",
                    kind="settle_row",
                    run_id=run_id,
                    status="failed",
                )
            )
        elif run_id not in snap.archives and row.get("error_message") != LOST:
            findings.append(
                Finding(
                    "missing_folder",
                    "warning",
                    f"run {run_id} is {row['status']} but neither its folder nor its archive exists",
                    "mark the run failed in tasks.db ('run folder missing'), so it is not reported again",
                    kind="settle_row",
                    run_id=run_id,
                    status="failed",
                )
            )
    return findings


def _check_entries(snap: Snapshot, active_runs: Mapping[str, RunFolder], ambiguous: set[str]) -> list[Finding]:
    findings = []
    pointed = {run_id for run_id in snap.entries.values() if run_id}
    for key, run_id in sorted(snap.entries.items()):
        if run_id is not None and run_id not in active_runs and run_id not in ambiguous:
            findings.append(
                Finding(
                    "stale_entry",
                    "warning",
                    f"sessions.json entry {key!r} points at run {run_id}, which is not active",
                    "set the entry idle (run_id null), keeping its settings",
                    kind="idle_entry",
                    key=key,
                    run_id=run_id,
                )
            )
    for run_id, folder in sorted(active_runs.items()):
        key = str((folder.metadata or {}).get("session_key") or "")
        if run_id in pointed or not key:
            continue
        findings.append(
            Finding(
                "missing_entry",
                "warning",
                f"active run {run_id} of {key!r} has no sessions.json entry pointing at it",
                f"point the entry of {key!r} at the run",
                kind="point_entry",
                key=key,
                run_id=run_id,
                status=folder.state,
            )
        )
    return findings


# -- the files themselves: every line, seqs, modes (blocking) ----------------------------------------


def file_findings(home: Home, folders: Iterable[RunFolder], recorded: frozenset[str] = frozenset()) -> list[Finding]:
    """Line-level checks of every run folder's stores, then the modes of the home. The damage of a
    completed run in ``recorded`` (failed with the reason in tasks.db) is known: not reported again."""
    findings: list[Finding] = []
    for folder in folders:
        if not folder.young:
            found = _line_findings(home, folder)
            if folder.state == "completed" and folder.run_id in recorded:
                found = [f for f in found if f.kind != "fail_run"]
            findings.extend(found)
    wide = wide_modes(home.root)
    if wide is not None:
        findings.append(
            Finding(
                "wide_modes",
                "warning",
                wide.describe(),
                "clear the group and other permission bits (files 0600, folders 0700)",
                kind="tighten_modes",
                path=".",
            )
        )
    return findings


def _line_findings(home: Home, folder: RunFolder) -> list[Finding]:
    base = home.folder(layout.folder_for(folder.state)) / folder.run_id
    where = f"{folder.state}/{folder.run_id}"
    findings = []
    held = 0
    for name in layout.STORE_FILES:
        report = scan_lines(base / name, with_seq=name == layout.MESSAGES)
        relative = f"contexts/{where}/{name}"
        if report.bad:
            findings.append(
                Finding(
                    "bad_line",
                    "error",
                    f"{where}/{describe(name, report.bad)}" + (": readers skip it" if report.bad[0].line else ""),
                    f"cut the line(s) into {name}.torn" if report.bad[0].line else _fail_text(folder),
                    kind="cut_lines" if report.bad[0].line else "fail_run",
                    run_id=folder.run_id,
                    status=None if report.bad[0].line else folder.state,
                    path=relative,
                    lines=tuple(b.line for b in report.bad),
                )
            )
        if report.gaps:
            torn = " (lines were cut into messages.jsonl.torn)" if (base / f"{name}.torn").exists() else ""
            detail = f"{where}/{describe(name, report.gaps)}{torn}"
            findings.append(
                Finding(
                    "seq_gap",
                    "warning",
                    detail,
                    _fail_text(folder),
                    kind="fail_run",
                    run_id=folder.run_id,
                    path=relative,
                    status=folder.state,
                )
            )
        if name == layout.MESSAGES:
            held = report.last_seq
        elif name == layout.CURRENT and report.lines and not findings:  # bad lines may have held them
            context_seq = last_seq(read_records(base / name))
            if context_seq > held:
                ends = f"ends at seq {held}" if held else "is missing or empty"
                kept = (base / f"{layout.MESSAGES}.torn").exists()  # cut there: known, and kept
                findings.append(
                    Finding(
                        "lost_messages",
                        "warning" if kept else "error",
                        f"{where}/messages.jsonl {ends} but current.jsonl holds seqs up to {context_seq}"
                        + (" (lines were cut into messages.jsonl.torn)" if kept else "")
                        + ("; the next start marks the run failed" if folder.state in ACTIVE else ""),
                        _fail_text(folder),
                        kind="fail_run",
                        run_id=folder.run_id,
                        path=f"contexts/{where}/messages.jsonl",
                        status=folder.state,
                    )
                )
    return findings


def _fail_text(folder: RunFolder) -> str:
    if folder.state in ACTIVE:
        return (
            "mark the run failed with this reason, as start-up recovery does (its folder goes to completed/,"
            " the key goes on in a new run, nothing is deleted; inside the daemon: " + RESTART + ")"
        )
    return "mark the run failed in tasks.db with this reason (nothing is deleted), so it is not reported again"


def fix_files(home: Home, finding: Finding) -> bool:
    """Cut bad lines into ``.torn`` or tighten modes; whether it was done."""
    if finding.kind == "cut_lines" and finding.path:
        cut_lines(home.root / finding.path, set(finding.lines))
        return True
    if finding.kind == "tighten_modes":
        tighten(home.root)
        return True
    return False


# -- reading a home -------------------------------------------------------------------------------


def scan_folders(home: Home, *, min_age_s: float = 0.0, now: float | None = None) -> tuple[RunFolder, ...]:
    """Every run folder (blocking). Active folders changed within ``min_age_s`` are marked young
    and judged only as present: a run being created has its folder before its tasks.db row. A
    resting folder (completed, failed) always had its row first, so a young one is judged too."""
    now = time.time() if now is None else now
    found = []
    for state in FOLDERS:
        base = home.folder(state)
        try:
            children = sorted(os.scandir(base), key=lambda e: e.name)
        except FileNotFoundError:
            continue
        for child in children:
            if not child.is_dir():
                continue
            stat = child.stat()
            young = state in ACTIVE and now - stat.st_mtime < min_age_s  # runs are created only there
            metadata = _read_metadata(Path(child.path))
            empty = metadata is None and leftovers.holds_no_message(Path(child.path))
            found.append(RunFolder(child.name, state, metadata, young, empty))
    return tuple(found)


def _read_metadata(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / layout.METADATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def scan_tmp(home: Home, *, min_age_s: float = 0.0, now: float | None = None) -> tuple[str, ...]:
    """Temp files of atomic rewrites (``.<name>.tmp``) under the home and contexts/ (blocking)."""
    now = time.time() if now is None else now
    found = []
    roots = [(home.root, False), (home.contexts, True)]
    for root, recursive in roots:
        walker = os.walk(root) if recursive else [(str(root), [], _files(root))]
        for folder, _, names in walker:
            for name in names:
                if not name.endswith(".tmp"):
                    continue
                path = Path(folder) / name
                try:
                    if now - path.stat().st_mtime < min_age_s:
                        continue
                except FileNotFoundError:
                    continue
                found.append(str(path.relative_to(home.root)))
    return tuple(sorted(found))


def _files(folder: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(folder) if e.is_file()]
    except FileNotFoundError:
        return []


def scan_archives(home: Home) -> frozenset[str]:
    try:
        return frozenset(n.removesuffix(".tar.gz") for n in os.listdir(home.archive) if n.endswith(".tar.gz"))
    except FileNotFoundError:
        return frozenset()


def read_rows(db: Path) -> dict[str, dict[str, Any]]:
    """tasks.db rows by uuid (blocking; no migration, nothing written). ``DamagedState`` when the
    file is not a SQLite database, not a neotask ledger, or from a newer neotask."""
    if not db.exists():
        return {}
    try:
        conn = sqlite3.connect(db)
    except sqlite3.Error as exc:
        raise ledger_error(db, exc) from None
    try:
        conn.row_factory = sqlite3.Row
        version = check_version(conn, db)
        if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            return {}  # nothing migrated yet: an empty ledger
        if version in (0, len(MIGRATIONS)):  # 0 with tables: not ours
            check_schema(conn, db)
        problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)")]  # every page (start-up only
        if problems != ["ok"]:  # reads the header and the schema: damage deeper down is found here)
            raise DamagedState(db, f"damaged pages ({'; '.join(problems)})", FIX_LEDGER)
        return {r["uuid"]: dict(r) for r in conn.execute("SELECT * FROM tasks")}
    except sqlite3.Error as exc:
        raise ledger_error(db, exc) from None
    finally:
        conn.close()


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


# -- over the files (no daemon) --------------------------------------------------------------------


def check_home(
    root: Path, *, fix: bool, now: str, min_age_s: float = 0.0, settings: Settings | None = None
) -> list[Finding]:
    """Check (and with ``fix`` repair) a home whose lock the caller holds (blocking). Fixes that
    need the start-up recovery (an unreadable sessions.json, an active run to fail) open a
    ``SessionStore`` over the home with ``settings`` (the defaults when None)."""
    home = Home(root)
    try:
        rows = read_rows(home.tasks_db)
    except DamagedState as exc:
        damaged = ledger_finding(exc)
        if not fix or damaged.kind is None:
            return [damaged]
        aside = set_ledger_aside(home)
        ledger = Ledger(home.tasks_db)
        ledger.open_sync()
        try:
            archived = rebuild_archived_rows(home, ledger, now)
        finally:
            ledger.close_sync()
        detail = f"{damaged.detail} (moved to {aside.name}; {archived} archived run(s) restored from their archives)"
        again = check_home(root, fix=True, now=now, min_age_s=min_age_s, settings=settings)
        return [replace(damaged, detail=detail, fixed=True), *again]
    registry = SessionRegistry(home.sessions_json, flush_ms=0)
    try:
        problem = registry.load()
    except DamagedState as exc:  # a newer format: judged as unreadable, never rewritten
        problem = f"unsupported ({exc.problem}: {exc.todo})"
    snap = Snapshot(
        folders=scan_folders(home, min_age_s=min_age_s),
        rows=rows,
        entries={k: e.run_id for k, e in registry.entries.items()},
        tmp_files=scan_tmp(home, min_age_s=min_age_s),
        archives=scan_archives(home),
    )
    findings = diagnose(snap) + file_findings(home, snap.folders, recorded_damage(rows))
    if problem not in (None, "missing"):
        newer = problem.startswith("unsupported")  # rebuilding it would throw a newer neotask's entries away
        findings.append(
            Finding(
                "unreadable_sessions_json",
                "error",
                f"sessions.json is {problem}",
                "upgrade neotask, or move the file aside to have it rebuilt from tasks.db and the run folders"
                if newer
                else "move it aside (sessions.json.damaged) and rebuild it from tasks.db and the run folders,"
                " as start-up recovery does",
                kind=None if newer else "rebuild_sessions",
                path="contexts/sessions.json",
                manual=newer,
            )
        )
    if not fix:
        return findings
    folders = {f.run_id: f for f in snap.folders}
    plan = _plan(findings, folders, now)
    fixed: set[int] = set()
    if plan.ledger:
        ledger = Ledger(home.tasks_db)
        ledger.open_sync()
        try:
            for index, sql in plan.ledger:
                ledger.submit(sql)
                fixed.add(index)
        finally:
            ledger.close_sync()
    if plan.entries and problem in (None, "missing"):
        changed = [i for i in plan.entries if entry_fix(findings[i], registry.entries, folders, now)]
        if changed:
            asyncio.run(_save_entries(registry, [findings[i].key or "" for i in changed]))
            fixed.update(changed)
    fixed.update(i for i in plan.tmp if remove_tmp(home, findings[i].path or ""))
    fixed.update(i for i in plan.folders if folder_fix(home, findings[i], snap.rows))
    fixed.update(i for i in plan.files if fix_files(home, findings[i]))
    rebuild = [i for i, f in enumerate(findings) if f.kind == "rebuild_sessions"]
    if plan.runs or rebuild:
        for _ in rebuild:
            set_aside_file(home.sessions_json)
        failed = asyncio.run(_recover(root, settings, now, {findings[i].run_id or "": findings[i] for i in plan.runs}))
        if failed is not None:
            fixed.update(rebuild)
            fixed.update(plan.entries if rebuild else ())  # the rebuilt entries follow the runs
            fixed.update(i for i in plan.runs if findings[i].run_id in failed)
    return _mark(findings, fixed)


def recorded_damage(rows: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The runs failed for damaged files (the reason is in their tasks.db row)."""
    return frozenset(
        rid
        for rid, row in rows.items()
        if row.get("status") == "failed" and str(row.get("error_message") or "").startswith(DAMAGED)
    )


def set_aside_file(path: Path) -> Path:
    """Rename ``path`` to ``<name>.damaged[-n]`` (kept for a person); the new name."""
    target, n = path.with_name(f"{path.name}.damaged"), 1
    while target.exists():
        target, n = path.with_name(f"{path.name}.damaged-{n}"), n + 1
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


async def _recover(root: Path, settings: Settings | None, now: str, damaged: Mapping[str, Finding]) -> set[str] | None:
    """Run the start-up recovery over the home (it rebuilds a missing sessions.json and fails the
    runs whose files it finds damaged), then fail the ``damaged`` runs it left active; the runs
    no longer active afterwards (None when the store could not be opened)."""
    from config.loader import build_settings, load_defaults  # only here: the daemon passes none

    at = parse_iso(now) if now[:1].isdigit() else system_clock()
    try:
        store = await SessionStore.open(root, settings or build_settings(load_defaults()), clock=lambda: at)
    except (NeotaskError, OSError, sqlite3.Error) as exc:
        log.error("doctor: the home could not be opened to finish the fixes: %s", exc)
        return None
    done = set()
    try:
        for run_id, finding in damaged.items():
            run = next((r for r in store.active_runs() if r.run_id == run_id), None)
            if run is not None and store.active_run(run.key) is run:
                try:
                    await store.complete(run.key, error=f"{DAMAGED} (doctor): {finding.detail}", reason="damaged")
                except (NeotaskError, OSError) as exc:
                    log.error("doctor: run %s could not be failed: %s", run_id, exc)
                    continue
            if all(r.run_id != run_id for r in store.active_runs()):
                done.add(run_id)
    finally:
        await store.close()
    return done


def _insert_row(row: dict[str, Any]) -> LedgerFix:
    sql = f"INSERT OR IGNORE INTO tasks ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"
    values = tuple(row.values())

    def run(conn: sqlite3.Connection) -> None:
        conn.execute(sql, values)

    return run


def clear_lock_dir(home: Home) -> Finding | None:
    """Remove a directory standing where gateway.lock belongs, when it is empty (blocking; before
    the lock is taken). A finding (fixed) when there was one; ``DamagedState`` when it holds files."""
    path = home.lock_file
    if not path.is_dir() or path.is_symlink():
        return None
    try:
        path.rmdir()
    except OSError as exc:
        problem = f"is a directory, not the lock file, and cannot be removed ({exc.strerror})"
        raise DamagedState(path, problem, "move it aside, then start again") from None
    detail = f"{path} was a directory, not the lock file"
    return Finding("lock_is_directory", "error", detail, "remove it", path="gateway.lock", fixed=True)


async def _save_entries(registry: SessionRegistry, keys: list[str]) -> None:
    for key in keys:
        registry.touch(key)
    await registry.close()


# -- over an open store (inside the daemon) --------------------------------------------------------


async def check_store(store: SessionStore, *, fix: bool, min_age_s: float = ONLINE_MIN_AGE_S) -> list[Finding]:
    """Check (and repair) while the daemon runs. The runs the store holds are active whatever the
    files say (their rows are left alone: a lifecycle change may be half way), entries are judged
    against them, and files changed within ``min_age_s`` may belong to a write in progress."""
    home = store.home
    folders, tmp_files, archives = await asyncio.to_thread(_scan_files, home, min_age_s)
    rows = {r["uuid"]: r for r in await store.ledger.execute(_all_rows)}
    live = {run.run_id: run for run in store.active_runs()}
    on_disk = {(f.run_id, f.state) for f in folders}
    strays = tuple(  # another folder of a held run, whose own folder is where the store has it
        f
        for f in folders
        if f.run_id in live
        and not f.young
        and f.state != live[f.run_id].status
        and (f.run_id, live[f.run_id].status) in on_disk
    )
    held = tuple(
        RunFolder(
            rid,
            run.status,
            {
                "session_key": run.key,
                "agent_id": run.agent_id,
                "chat_type": run.chat_type,
                "channel": run.channel,
                "created_at": run.started_at,
            },
            young=True,
        )
        for rid, run in live.items()
    )
    snap = Snapshot(
        folders=held + tuple(f for f in folders if f.run_id not in live) + strays,
        rows={rid: row for rid, row in rows.items() if rid not in live},
        entries={k: e.run_id for k, e in store.registry.entries.items()},
        tmp_files=tmp_files,
        archives=archives,
        live=frozenset(live),
    )
    resting = tuple(f for f in folders if f.run_id not in live)  # the daemon does not write these
    findings = diagnose(snap) + await asyncio.to_thread(file_findings, home, resting, recorded_damage(rows))
    if not fix:
        return findings
    now = iso(store.clock())
    by_id = {f.run_id: f for f in snap.folders}
    plan = _plan(findings, by_id, now)
    fixed: set[int] = set()
    for index, sql in plan.ledger:
        await store.ledger.execute(sql)
        fixed.add(index)
    for index in plan.entries:
        finding = findings[index]
        if finding.key is not None and entry_fix(finding, store.registry.entries, by_id, now):
            store.registry.touch(finding.key)
            fixed.add(index)
    if plan.entries:
        await store.registry.flush()
    for index in plan.tmp:
        if await asyncio.to_thread(remove_tmp, home, findings[index].path or ""):
            fixed.add(index)
    for index in plan.folders:  # never the folder the store holds (a held run's strays may go)
        finding = findings[index]
        held_run = live.get(finding.run_id or "")
        if held_run is not None and (held_run.status == finding.status or held_run.dir.parent.name == finding.status):
            continue
        if await asyncio.to_thread(folder_fix, home, finding, rows):
            fixed.add(index)
    for index in plan.files:
        if await asyncio.to_thread(fix_files, home, findings[index]):
            fixed.add(index)
    return _mark(findings, fixed)


def _scan_files(home: Home, min_age_s: float) -> tuple[tuple[RunFolder, ...], tuple[str, ...], frozenset[str]]:
    return scan_folders(home, min_age_s=min_age_s), scan_tmp(home, min_age_s=min_age_s), scan_archives(home)


def _all_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM tasks")]
