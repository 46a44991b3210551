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
import logging
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from config.clock import parse_iso, system_clock
from config.errors import NeotaskError
from config.settings import Settings
from home.atomic import fsync_dir
from home.damage import DamagedState
from home.layout import Home
from sessions.files.doctor_checks import (
    ACTIVE,
    DAMAGED,
    FOLDER_FIXES,
    LOST,
    ONLINE_MIN_AGE_S,
    RESTART,
    SET_ASIDE,
    Finding,
    FixKind,
    RunFolder,
    Severity,
    Snapshot,
    diagnose,
)
from sessions.files.doctor_files import (
    file_findings,
    fix_files,
    read_rows,
    scan_archives,
    scan_folders,
    scan_tmp,
)
from sessions.files.doctor_fixes import (
    LedgerFix,
    _mark,
    _plan,
    entry_fix,
    folder_fix,
    ledger_finding,
    ledger_fix,
    rebuild_archived_rows,
    remove_tmp,
    set_ledger_aside,
)
from sessions.files.doctor_store import check_store, recorded_damage
from sessions.files.ledger import Ledger
from sessions.files.registry import SessionRegistry
from sessions.files.store import SessionStore
from sessions.records import RunFinish

__all__ = [
    "ACTIVE", "DAMAGED", "FOLDER_FIXES", "LOST", "ONLINE_MIN_AGE_S", "RESTART", "SET_ASIDE", "Finding", "FixKind",
    "LedgerFix", "RunFolder", "Severity", "Snapshot", "check_home", "check_store", "diagnose",
    "entry_fix", "file_findings", "fix_files", "folder_fix", "ledger_finding", "ledger_fix", "read_rows",
    "rebuild_archived_rows", "recorded_damage", "remove_tmp", "scan_archives", "scan_folders", "scan_tmp",
    "set_aside_file", "set_ledger_aside",
]  # fmt: skip

log = logging.getLogger(__name__)

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
        return _rebuild_ledger(home, damaged, now=now, min_age_s=min_age_s, settings=settings)
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
        findings.append(_sessions_json_finding(problem))
    if not fix:
        return findings
    return _fix_home(home, findings, snap, registry, problem, now=now, settings=settings)


def _rebuild_ledger(
    home: Home, damaged: Finding, *, now: str, min_age_s: float, settings: Settings | None
) -> list[Finding]:
    """An unreadable tasks.db set aside and a new one made (its archived runs restored from their
    archives), then the home checked and fixed again."""
    aside = set_ledger_aside(home)
    ledger = Ledger(home.tasks_db)
    ledger.open_sync()
    try:
        archived = rebuild_archived_rows(home, ledger, now)
    finally:
        ledger.close_sync()
    detail = f"{damaged.detail} (moved to {aside.name}; {archived} archived run(s) restored from their archives)"
    again = check_home(home.root, fix=True, now=now, min_age_s=min_age_s, settings=settings)
    return [replace(damaged, detail=detail, fixed=True), *again]


def _sessions_json_finding(problem: str) -> Finding:
    newer = problem.startswith("unsupported")  # rebuilding it would throw a newer neotask's entries away
    return Finding(
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


def _fix_home(
    home: Home,
    findings: list[Finding],
    snap: Snapshot,
    registry: SessionRegistry,
    problem: str | None,
    *,
    now: str,
    settings: Settings | None,
) -> list[Finding]:
    """The safe fixes of ``findings``: the findings, those fixed marked."""
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
        damaged = {findings[i].run_id or "": findings[i] for i in plan.runs}
        failed = asyncio.run(_recover(home.root, settings, now, damaged))
        if failed is not None:
            fixed.update(rebuild)
            fixed.update(plan.entries if rebuild else ())  # the rebuilt entries follow the runs
            fixed.update(i for i in plan.runs if findings[i].run_id in failed)
    return _mark(findings, fixed)


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
                    finish = RunFinish(error=f"{DAMAGED} (doctor): {finding.detail}", reason="damaged")
                    await store.complete(run.key, finish)
                except (NeotaskError, OSError) as exc:
                    log.error("doctor: run %s could not be failed: %s", run_id, exc)
                    continue
            if all(r.run_id != run_id for r in store.active_runs()):
                done.add(run_id)
    finally:
        await store.close()
    return done


async def _save_entries(registry: SessionRegistry, keys: list[str]) -> None:
    for key in keys:
        registry.touch(key)
    await registry.close()
