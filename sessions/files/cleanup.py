"""Carrying out a cleanup (SPEC section 7): gather the facts, plan (``sessions.cleanup_plan``),
then complete stale active runs, archive old completed ones, delete expired archives, VACUUM.

Archiving is ordered so that ``kill -9`` at any step loses nothing: write the
archive (never over an existing one), record ``archived_at`` in tasks.db, then remove the folder.
A cleanup first finishes what a crash interrupted: folders of recorded archives are removed, and a
folder whose archive exists is not packed again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from config.clock import iso, parse_iso
from sessions.cleanup_plan import (
    ArchiveFacts,
    CleanupAction,
    CleanupRequest,
    RunFacts,
    describe,
    is_pinned,
    plan_cleanup,
    records_cutoffs,
    run_facts,
)
from sessions.files import archive as archives
from sessions.files.archive import Step
from sessions.files.store_state import StoreState

log = logging.getLogger(__name__)
CompleteFn = Callable[[str], Awaitable[None]]


async def gather(store: StoreState) -> tuple[list[RunFacts], list[ArchiveFacts]]:
    rows = await store.ledger.execute(lambda c: [dict(r) for r in c.execute("SELECT * FROM tasks")])
    runs, archives = [], []
    for row in rows:
        key = row.get("session_key") or ""
        entry = store.entry(key)
        if row.get("archived_at"):
            if await asyncio.to_thread(store.home.archive_file(row["uuid"]).exists):
                archives.append(ArchiveFacts(row["uuid"], parse_iso(row["archived_at"]), key, is_pinned(row, entry)))
            continue
        runs.append(run_facts(row["uuid"], row, entry))
    return runs, archives


async def run_cleanup(store: StoreState, request: CleanupRequest) -> list[dict[str, Any]]:
    """The request's ``step`` is called at each step of archiving (``archive.STEPS``): a test hook."""
    unfinished = await _unfinished(store)
    runs, archive_facts = await gather(store)
    actions = plan_cleanup(runs, archive_facts, request.settings, request.now)
    if request.dry_run:
        return [*unfinished, *({**describe(a), "done": False} for a in actions)]
    report = []
    for item in unfinished:
        try:
            await _finish(store, item["run_id"])
            report.append({**item, "done": True})
        except OSError as exc:
            log.error("cleanup: finishing the archive of run %s failed: %s", item["run_id"], exc)
            report.append({**item, "error": str(exc)})
    for action in actions:
        try:
            await _apply(store, action, request.complete, request.step or _no_step)
            report.append({**describe(action), "done": True})
        except OSError as exc:
            log.error("cleanup %s of run %s failed: %s", action.kind, action.run_id, exc)
            report.append({**describe(action), "done": False, "error": str(exc)})
    trimmed = await store.ledger.execute(lambda c: _trim_deliveries(c, request.now))
    if trimmed:
        log.info("cleanup: forgot %d idempotency and webhook delivery record(s) past their window", trimmed)
    if actions or trimmed or unfinished:
        await store.ledger.execute(lambda c: c.execute("VACUUM"))
        log.info("cleanup: %d action(s) done", sum(1 for r in report if r["done"]))
    return report


def _trim_deliveries(conn: Any, now: datetime) -> int:
    """Forget redelivery records past their window (only rows nothing can match any more)."""
    keys_before, hooks_before = records_cutoffs(now)
    keys = conn.execute("DELETE FROM idempotency WHERE created_at < ?", (keys_before,))
    hooks = conn.execute("DELETE FROM hook_deliveries WHERE created_at < ?", (hooks_before,))
    return int(keys.rowcount) + int(hooks.rowcount)


def _no_step(name: str) -> None:
    return None


async def _unfinished(store: StoreState) -> list[dict[str, Any]]:
    """Archives a crash left half done: recorded but the folder still there, or a folder moved
    aside and not yet removed."""
    rows = await store.ledger.execute(
        lambda c: [dict(r) for r in c.execute("SELECT uuid, session_key FROM tasks WHERE archived_at IS NOT NULL")]
    )

    def scan() -> list[dict[str, Any]]:
        found = []
        for row in rows:
            folder = store.home.run_dir(row["uuid"], "completed")
            aside = store.home.archive / f"{archives.REMOVING_PREFIX}{row['uuid']}"
            if folder.is_dir() or aside.is_dir():
                found.append({"action": "finish_archive", "run_id": row["uuid"], "session_key": row["session_key"],
                              "reason": "archived, but a crash interrupted the removal of its folder",
                              "done": False})  # fmt: skip
        return found

    return await asyncio.to_thread(scan)


async def _finish(store: StoreState, run_id: str) -> None:
    archive = store.home.archive_file(run_id)
    folder = store.home.run_dir(run_id, "completed")

    def finish() -> None:
        if folder.is_dir() and not archives.archive_ok(archive, run_id):
            raise archives.ArchiveDamaged(2, f"run {run_id} is recorded as archived but {archive} is missing")
        archives.remove_folder(folder, archive.parent)
        archives.finish_removals(archive.parent)

    await asyncio.to_thread(finish)


async def _apply(store: StoreState, action: CleanupAction, complete: CompleteFn, step: Step) -> None:
    if action.kind == "complete":
        if action.session_key and store.active_run(action.session_key) is not None:
            await complete(action.session_key)
        return
    archive = store.home.archive_file(action.run_id)
    if action.kind == "archive":
        folder = store.home.run_dir(action.run_id, "completed")

        def write() -> bool:
            if archives.archive_ok(archive, action.run_id):
                archives.temp_of(archive).unlink(missing_ok=True)  # a kill between link and unlink left it
                if folder.is_dir():
                    log.warning("run %s: its archive exists already; finishing, not packing again", action.run_id)
                return True
            if folder.is_dir():
                return archives.write_archive(folder, archive, step=step) or True
            return False

        if not await asyncio.to_thread(write):
            log.error("cleanup: run %s has neither a folder nor an archive; marking it archived", action.run_id)
        await store.ledger.update_run(action.run_id, archived_at=iso(store.clock()))
        step("recorded")
        await asyncio.to_thread(archives.remove_folder, folder, archive.parent, step=step)
        return
    await asyncio.to_thread(archive.unlink, True)
