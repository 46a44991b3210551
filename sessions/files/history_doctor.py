"""Doctor checks of the history index (``neotask doctor [--fix]``, ``POST /v1/admin/doctor``): the
index is derived from the run folders and archives, so every fix rebuilds from them. Every run's
searchable seqs on disk are compared with the seqs the index holds, so a hole (a lost batch, rows
deleted by hand) is found as well as a run missing altogether."""

from __future__ import annotations

import asyncio
from pathlib import Path

from home.layout import Home
from sessions.files.doctor_checks import Finding
from sessions.files.history import HistoryIndex, history_path, iter_run_messages, rebuild_all, sources_from_rows
from sessions.files.history_sources import RunSource
from sessions.files.ledger import Ledger
from sessions.history_text import indexable

MISSING = "history_index_missing"
STALE = "history_index_stale"
INCOMPLETE = "history_index_incomplete"
HOLES = "history_index_holes"
PATH = "contexts/history.db"


def _indexable_seqs(source: RunSource) -> set[int]:
    return {int(record.get("seq") or 0) for record in iter_run_messages(source) if indexable(record)}


async def check_index(history: HistoryIndex, ledger: Ledger, home: Home, *, fix: bool) -> list[Finding]:
    """Rows of runs no longer in tasks.db (stale), runs with searchable messages that the index
    lacks altogether (incomplete), and runs the index holds with some of their messages missing
    (holes). ``fix`` deletes the first and indexes the others from their files."""
    sql = "SELECT uuid, session_key, agent_id, created_at FROM tasks"
    rows = await ledger.execute(lambda c: [dict(r) for r in c.execute(sql)])
    indexed = await history.run_ids()
    known = {r["uuid"] for r in rows}
    stale = sorted(indexed - known)
    lacking, holed, missing = [], [], 0
    for source in await asyncio.to_thread(sources_from_rows, rows, home):
        on_disk = await asyncio.to_thread(_indexable_seqs, source)
        if source.run_id not in indexed:
            if on_disk:
                lacking.append(source)
            continue
        held = await history.seqs(source.run_id)
        if gone := on_disk - held:
            holed.append(source)
            missing += len(gone)
    findings = []
    if stale:
        if fix:
            await history.delete_runs(stale)
        detail = f"the history index holds {len(stale)} run(s) no longer in tasks.db"
        findings.append(Finding(STALE, "warning", detail, "delete their index rows", path=PATH, fixed=fix))
    incomplete = f"{len(lacking)} run(s) have messages the history index lacks"
    holes = f"{missing} message(s) of {len(holed)} run(s) are missing from the history index"
    for code, runs, detail, remedy in (
        (INCOMPLETE, lacking, incomplete, "index them from their folders and archives"),
        (HOLES, holed, holes, "index them again from their folders and archives"),
    ):
        if runs:
            if fix:
                await history.rebuild(runs, replace=False)
            findings.append(Finding(code, "warning", detail, remedy, path=PATH, fixed=fix))
    return findings


async def check_home_index(contexts: Path, ledger: Ledger, home: Home, *, fix: bool) -> list[Finding]:
    """The offline check (the caller holds the home lock): a missing index is a finding, built
    with ``fix``; an existing one is checked as ``check_index`` does."""
    path = history_path(contexts)
    exists = await asyncio.to_thread(path.exists)
    if not exists:
        has_runs = await ledger.execute(lambda c: c.execute("SELECT 1 FROM tasks LIMIT 1").fetchone() is not None)
        if not has_runs:
            return []
        if fix:
            history = HistoryIndex(path)
            await history.open()
            try:
                await rebuild_all(history, ledger, home)
            finally:
                await history.close()
        detail = "there is no history index (contexts/history.db)"
        return [Finding(MISSING, "warning", detail, "build it from the run folders and archives", path=PATH, fixed=fix)]
    history = HistoryIndex(path)
    await history.open()
    try:
        return await check_index(history, ledger, home, fix=fix)
    finally:
        await history.close()
