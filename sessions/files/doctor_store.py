"""The doctor over an open store (``check_store``: inside the daemon, whose in-memory state is
the truth for active runs and entries); ``sessions/files/doctor.py`` is the doctor over the files
and re-exports it. Below the store's maintenance layer, which calls it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Mapping
from typing import Any

from config.clock import iso
from home.layout import Home
from sessions.files.doctor_checks import DAMAGED, ONLINE_MIN_AGE_S, Finding, RunFolder, Snapshot, diagnose
from sessions.files.doctor_files import file_findings, fix_files, scan_archives, scan_folders, scan_tmp
from sessions.files.doctor_fixes import _mark, _plan, entry_fix, folder_fix, remove_tmp
from sessions.files.run_folder import folder_of
from sessions.files.store_state import StoreState


def recorded_damage(rows: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The runs failed for damaged files (the reason is in their tasks.db row)."""
    return frozenset(
        rid
        for rid, row in rows.items()
        if row.get("status") == "failed" and str(row.get("error_message") or "").startswith(DAMAGED)
    )


async def check_store(store: StoreState, *, fix: bool, min_age_s: float = ONLINE_MIN_AGE_S) -> list[Finding]:
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
        if held_run is not None and finding.status in (held_run.status, folder_of(held_run).parent.name):
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
