"""The session store's part for the run lifecycle: start (and undo a start), pause, resume,
complete (hooks, the final summary, statistics, the move to completed/) and delete, each keeping
the run folder, its tasks.db row and the key's sessions.json entry in step; and the entry's
settings outside a run's lifecycle."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import uuid as uuidlib
from pathlib import Path
from typing import Any

from config.clock import iso
from config.errors import NeotaskError, StorageUnavailable
from home import layout
from home.atomic import fsync_dir, write_atomic, write_json_atomic
from sessions import bookkeeping
from sessions.faults import storage_error
from sessions.files import leftovers
from sessions.files.registry import SessionEntry
from sessions.files.run_folder import FolderRun, folder_of, folder_run
from sessions.files.store_appends import Appends
from sessions.files.store_state import StoreState
from sessions.records import PLAIN_FINISH, EntryChange, RunFinish, RunStart, RunState, RunStatus, copy_counters

log = logging.getLogger(__name__)


class Lifecycle:
    """What changes a key's run or entry; a run that ends has its deliveries recorded by
    ``appends`` first."""

    def __init__(self, state: StoreState, appends: Appends) -> None:
        self.state = state
        self.appends = appends

    # -- the entry outside a run's lifecycle ------------------------------------------------------

    async def update_entry(self, key: str, change: EntryChange) -> SessionEntry:
        state = self.state
        entry = state.require_entry(key)
        pinned = change.pinned
        if pinned is not None and pinned != entry.pinned:
            entry.pinned = pinned
            await state.ledger.set_pinned(key, pinned)
        entry.relabel(change)
        if change.relabels:  # durable beyond sessions.json
            await state.ledger.set_key_metadata(key, {"label": entry.label, "settings": entry.settings})
        entry.updated_at = iso(state.clock())
        state.registry.touch(key)
        await state.registry.flush()
        return entry

    async def set_inherit_next(self, key: str, inherit: bool) -> bool:
        """Whether the key's next run inherits from its last (``/new`` and a diverged OpenAI-compatible
        conversation say no, a reset and a run start say yes again); False when nothing changed
        (no entry, or the flag was already so)."""
        changed = bookkeeping.inherit_next(self.state.entry(key), inherit)
        if changed:
            self.state.registry.touch(key)
        return changed

    async def set_reset_boundary(self, key: str, boundary: str) -> None:
        """Written at once: a restart must not reset the key again for the same boundary."""
        if bookkeeping.mark_reset_boundary(self.state.entry(key), boundary):
            self.state.registry.touch(key)
            await self.state.registry.flush()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start_run(self, start: RunStart) -> RunState:
        """A new active run for ``start.key``. With ``opening`` the run exists for the message about to
        be appended: until that message is durable the folder carries a marker, and start-up
        removes a marked folder that holds no message (a crash or a storage error came between)."""
        key = start.key
        entry = self.state.entry(key)
        bookkeeping.refuse_second_run(entry, key)
        now = iso(self.state.clock())
        run_id = str(uuidlib.uuid4())
        run = FolderRun(
            run_id=run_id,
            key=key,
            agent_id=start.agent_id,
            chat_type=start.chat_type,
            channel=start.channel,
            status="running",
            dir=self.state.home.run_dir(run_id, "running"),
            started_at=now,
            task_key=start.task_key,
            parent_uuid=start.parent_uuid,
        )
        metadata = self.state.metadata(run)
        created = False
        try:
            await self.state.writer.call(lambda: _create_run_folder(folder_of(run), metadata, opening=start.opening))
            created = True
            await self.state.ledger.insert_run(self.state.ledger_row(run))
        except (OSError, sqlite3.Error) as exc:
            # a run that cannot be created leaves nothing behind: no folder, no row, no entry
            if created:
                await self._remove_run_files(run)
            else:
                try:
                    await self.state.writer.call(lambda: _remove_folder(folder_of(run)))
                except OSError as cleanup:  # a folder with no message: start-up recovery removes it
                    log.error("could not remove the half-created folder of run %s (%s)", run.run_id, cleanup)
            raise _start_error(exc) from exc
        run.opening = start.opening
        self.state.runs[run_id] = run
        if entry is None:
            entry = self.state.new_entry(key, start.agent_id, start.chat_type, start.channel)
            self.state.registry.entries[key] = entry
        bookkeeping.start_entry(entry, run_id, now)
        copy_counters(run, entry)  # every checkpoint field: none may describe the previous run
        # Coalesced like appends, not rewritten at once: the run folder and its tasks.db row are the
        # durable truth, and recovery rebuilds the entry from them (a rewrite per new run made
        # creating a session O(keys)).
        self.state.registry.touch(key)
        self.state.emit_run("lifecycle", run, action="start", parent_uuid=start.parent_uuid)
        return run

    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None:
        """Undo ``start_run`` for a run whose first posted message could not be stored: its folder
        and tasks.db row go, and the key's entry is removed (``remove_entry``: this run created it)
        or set idle. What cannot be removed now (a read-only disk) start-up recovery removes."""
        self.state.runs.pop(run.run_id, None)
        entry = self.state.entry(run.key)
        if entry is not None and entry.run_id == run.run_id:
            if remove_entry:
                self.state.registry.remove(run.key)
            else:
                bookkeeping.idle_entry(entry)
                self.state.registry.touch(run.key)
        await self._remove_run_files(run)
        await self.state.flush_registry()
        self.state.emit_run("lifecycle", run, action="discard")

    async def _remove_run_files(self, run: RunState) -> None:
        def _do() -> None:
            self.state.writer.close_handles_under(folder_of(run))
            _remove_folder(folder_of(run))

        try:
            await self.state.writer.call(_do)
        except OSError as exc:
            log.error("could not remove the folder of discarded run %s (%s): start-up recovery will", run.run_id, exc)
        try:
            await self.state.ledger.execute(lambda c: c.execute("DELETE FROM tasks WHERE uuid = ?", (run.run_id,)))
        except sqlite3.Error as exc:
            log.error("could not delete the tasks.db row of discarded run %s (%s): recovery will", run.run_id, exc)

    async def pause(self, key: str) -> RunState:
        run, pausing = await bookkeeping.to_pause(self.state, key, self.state.hooks)
        if not pausing:
            return run
        await self._move(run, "paused")
        now = iso(self.state.clock())
        await self.state.ledger.update_run(run.run_id, status="paused", updated_at=now, **bookkeeping.run_stats(run))
        await self._entry_status(run, "paused")
        self.state.emit_run("lifecycle", run, action="pause")
        return run

    async def resume(self, key: str) -> RunState:
        run = bookkeeping.require_active(self.state, key)
        if run.status == "running":
            return run
        await self._move(run, "running")
        await self.state.ledger.update_run(run.run_id, status="running", updated_at=iso(self.state.clock()))
        await self._entry_status(run, "running")
        self.state.emit_run("lifecycle", run, action="resume")
        return run

    async def complete(self, key: str, end: RunFinish = PLAIN_FINISH) -> RunState:
        """Complete (or, with ``end.error``, fail) the key's active run: completion hooks, the final
        summary it is given (``final_summary.txt``), statistics, the move to completed/; the entry
        stays, idle, with ``run_id: null``. ``summarize=False`` (a purge, a one-off run nothing
        inherits) runs no hook and writes no final summary."""
        run, status = await bookkeeping.to_complete(self.state, key, self.state.hooks, end)
        if end.final_summary is not None and end.summarize:
            text, path = end.final_summary, folder_of(run) / layout.FINAL_SUMMARY
            await self.state.writer.call(lambda: _write_text(path, text))
        await self.appends.record_deliveries(run)
        await self._move(run, "completed")
        now = iso(self.state.clock())
        await self.state.ledger.update_run(
            run.run_id,
            status=status,
            completed_at=now,
            updated_at=now,
            error_message=end.error,
            compaction_count=run.compaction_count,
            **bookkeeping.run_stats(run),
        )
        del self.state.runs[run.run_id]
        self.state.files.pop(run.run_id, None)
        entry = self.state.entry(key)
        if entry is not None:
            bookkeeping.end_entry(entry, run.run_id, now)
            self.state.registry.touch(key)
            await self.state.registry.flush()
        run.status = status
        self.state.emit_run("lifecycle", run, action=status, reason=end.reason, error=end.error)
        return run

    async def delete(self, key: str) -> str | None:
        """Complete the active run (if any) and remove the entry; runs stay in tasks.db."""
        completed = await bookkeeping.end_to_delete(self.state, key, self.complete)
        self.state.registry.remove(key)  # the key's lock stays: callers may be queued on it
        await self.state.registry.flush()
        await self.state.ledger.set_key_metadata(key, {"inherit": False})  # a new session on the key starts clean
        return completed

    async def _move(self, run: RunState, status: RunStatus) -> None:
        old, new = folder_of(run), self.state.home.run_dir(run.run_id, status)
        folder_run(run).dir = new
        run.status = status

        def _do() -> None:
            self.state.writer.close_handles_under(old)
            new.parent.mkdir(parents=True, exist_ok=True)
            os.rename(old, new)
            fsync_dir(new.parent)
            fsync_dir(old.parent)

        await self.state.writer.call(_do)

    async def _entry_status(self, run: RunState, status: str) -> None:
        entry = self.state.entry(run.key)
        if entry is not None:
            entry.status = status
            entry.updated_at = iso(self.state.clock())
            self.state.registry.touch(run.key)
            await self.state.registry.flush()


def _create_run_folder(folder: Path, metadata: dict[str, Any], *, opening: bool) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=False)
    if opening:
        (folder / leftovers.OPENING).touch(mode=0o600)
    write_json_atomic(folder / layout.METADATA, metadata)
    for name in (layout.MESSAGES, layout.CURRENT, layout.SUMMARIES, layout.TOOLS, layout.PLANNING):
        (folder / name).touch(mode=0o600)  # the seed's layout, whole from the start
    fsync_dir(folder)
    fsync_dir(folder.parent)


def _remove_folder(folder: Path) -> None:
    """Remove a run folder that holds no acknowledged message (blocking; missing is fine)."""
    if folder.exists():
        shutil.rmtree(folder)
        fsync_dir(folder.parent)


def _start_error(exc: OSError | sqlite3.Error) -> NeotaskError:
    if isinstance(exc, OSError):
        return storage_error(exc)
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return storage_error(OSError(errno.ENOSPC, "tasks.db: database or disk is full"))
    return StorageUnavailable(
        f"tasks.db cannot record the new run ({exc}): the message was not stored; send it again shortly"
    )


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))
