"""The session engine: keys → entries → runs → durable JSONL stores, plus the run lifecycle.

``SessionStore`` is the only way the rest of the program changes session state. It owns the append
writer (file I/O thread), the ledger (SQLite thread) and the registry (sessions.json). Everything
that can block runs on one of those; the methods here only assign ids, update counters and wait.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import sqlite3
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from config.clock import Clock, iso
from config.errors import (
    NeotaskError,
    NoActiveRun,
    RunActive,
    RunClosing,
    RunNotFound,
    SessionNotFound,
    SessionPaused,
    StorageUnavailable,
)
from config.settings import Settings
from sessions import layout, leftovers
from sessions.damage import ledger_error, storage_damage
from sessions.deliveries import Delivery, RunDeliveries
from sessions.deliveries import scan as scan_deliveries
from sessions.faults import probe_writable, storage_error
from sessions.jsonl import encode, fsync_dir, iter_records, read_records, write_atomic, write_json_atomic
from sessions.layout import Home
from sessions.ledger import Ledger, RunStats, run_metadata
from sessions.records import USAGE_KEYS, NewMessage, RunState, TaskKey
from sessions.recovery import Checkpoint, RecoveredRun, context_line, in_context, recover_all
from sessions.registry import SessionEntry, SessionRegistry
from sessions.tokens import estimate_message
from sessions.writer import AppendWriter

log = logging.getLogger(__name__)

METADATA_FORMAT_VERSION = 1
Listener = Callable[[dict[str, Any]], object]
DurableListener = Callable[["RunState", dict[str, Any]], object]
RunHook = Callable[[RunState], Awaitable[None]]
FinalSummarizer = Callable[[RunState, str], Awaitable[str | None]]


class SessionStore:
    def __init__(
        self,
        home: Home,
        settings: Settings,
        *,
        clock: Clock,
        ledger: Ledger,
        writer: AppendWriter,
        registry: SessionRegistry,
    ) -> None:
        self.home = home
        self.settings = settings
        self.clock = clock
        self.ledger = ledger
        self.writer = writer
        self.registry = registry
        self.completion_hooks: dict[str, RunHook] = {}
        self.stop_hooks: dict[str, RunHook] = {}
        self.final_summarizer: FinalSummarizer | None = None
        self.listeners: list[Listener] = []
        self.durable_listeners: list[DurableListener] = []  # (run, record) once the append is durable
        self._runs: dict[str, RunState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._files: dict[str, tuple[Path, Path, Path]] = {}  # run id -> (dir, messages, current)
        self.recovered: list[RecoveredRun] = []
        self._probed: tuple[float, str | None] = (float("-inf"), None)  # (monotonic time, problem)

    # -- opening and closing --------------------------------------------------------------------

    @classmethod
    async def open(cls, root: Path, settings: Settings, *, clock: Clock) -> SessionStore:
        """Recover every active run, then load (or rebuild) sessions.json. The caller holds the
        home lock."""
        home = Home(root)
        try:
            await asyncio.to_thread(home.ensure)
        except OSError as exc:
            raise storage_damage(home.contexts, exc, doing="create the folders of the home") from None
        ledger = Ledger(home.tasks_db)
        try:
            await ledger.open()
        except BaseException:
            await ledger.close()  # its thread
            raise
        writer = AppendWriter(settings.storage.fsync)
        writer.start()
        registry = SessionRegistry(home.sessions_json, flush_ms=settings.storage.sessions_flush_ms)
        store = cls(home, settings, clock=clock, ledger=ledger, writer=writer, registry=registry)
        try:
            await store._recover()
        except sqlite3.DatabaseError as exc:  # pages the open did not read (the header was fine)
            await store.close()
            raise ledger_error(home.tasks_db, exc) from None
        except BaseException:  # e.g. DamagedState from a newer sessions.json: nothing is written
            await store.close()
            raise
        return store

    async def close(self) -> None:
        await self.registry.close()
        await self.writer.close()
        await self.ledger.close()

    async def _recover(self) -> None:
        rows, problem = await asyncio.gather(self.ledger.execute(_active_rows), asyncio.to_thread(self.registry.load))
        active_rows = {row["uuid"]: row for row in rows}
        checkpoints = {e.run_id: _checkpoint(e) for e in self.registry.entries.values() if e.run_id}
        recovered = await asyncio.to_thread(recover_all, self.home.contexts, active_rows, checkpoints)
        recovered = await self._drop_half_created(recovered, active_rows)
        self.recovered = recovered
        for rec in recovered:
            row = active_rows.get(rec.run_id) or await self.ledger.get_run(rec.run_id)
            run = self._state_from_recovery(rec, row)
            if row is None:
                log.warning("run %s had a folder but no tasks.db row: inserting it", rec.run_id)
                await self.ledger.insert_run(self._ledger_row(run))
            elif row["status"] != run.status:
                await self.ledger.update_run(run.run_id, status=run.status, updated_at=iso(self.clock()))
            self._runs[run.run_id] = run
        found = {rec.run_id for rec in recovered}
        for row in active_rows.values():
            if row["uuid"] not in found:
                await self._settle_lost_run(row)
        if problem is not None:
            all_rows = await self.ledger.execute(_all_rows)
            if all_rows or recovered:
                log.warning(
                    "sessions.json is %s: rebuilding it from tasks.db (%d runs) and %d active run folder(s)",
                    problem,
                    len(all_rows),
                    len(recovered),
                )
                self._rebuild_entries(all_rows)
        self._reconcile_entries()
        if problem is not None or self.registry.pending:
            await self.registry.flush(force=problem is not None)
        for rec in recovered:
            if rec.damage is not None:
                await self._fail_damaged(rec.run_id, rec.damage)

    async def _fail_damaged(self, run_id: str, damage: str) -> None:
        """A run whose files recovery found damaged (bad lines cut, messages lost) is failed with the
        reason, so the key goes on in a new run and the rest of the home starts normally."""
        run = self._runs.get(run_id)
        if run is None or self.active_run(run.key) is not run:
            log.error("run %s is damaged (%s) but is not its key's active run: left for the doctor", run_id, damage)
            return
        try:
            await self.complete(run.key, error=f"damaged at start-up: {damage}", reason="damaged")
        except OSError as exc:  # not even movable: leave the folder to the doctor, free the key
            log.error("run %s of %r is damaged (%s) and cannot be failed (%s)", run_id, run.key, damage, exc)
            self._runs.pop(run_id, None)
            self._reconcile_entries()
            return
        log.error("run %s of %r marked failed: %s", run_id, run.key, damage)

    async def _drop_half_created(
        self, recovered: list[RecoveredRun], active_rows: dict[str, dict[str, Any]]
    ) -> list[RecoveredRun]:
        """Remove the runs a failed or interrupted start left without any message (folder and
        row): nothing in them was acknowledged, and the message that would have opened them is
        sent again by its client."""
        empty = [
            rec
            for rec in recovered
            if rec.next_seq == 1 and leftovers.opening(rec.dir) and leftovers.holds_no_message(rec.dir)
        ]
        known = {rec.run_id for rec in recovered}
        folders = [rec.dir for rec in empty]
        folders += await asyncio.to_thread(leftovers.half_created, self.home.contexts, known)
        removed = set()
        for folder in folders:
            if await asyncio.to_thread(leftovers.remove, folder):
                removed.add(folder.name)
        if removed:
            await self.ledger.execute(
                lambda c: c.executemany("DELETE FROM tasks WHERE uuid = ?", [(run_id,) for run_id in removed])
            )
            for run_id in removed:
                active_rows.pop(run_id, None)
        return [rec for rec in recovered if rec.run_id not in removed]

    def _state_from_recovery(self, rec: RecoveredRun, row: dict[str, Any] | None) -> RunState:
        meta = rec.metadata
        run = RunState(
            run_id=rec.run_id,
            key=str(meta.get("session_key") or (row or {}).get("session_key") or ""),
            agent_id=meta.get("agent_id"),
            chat_type=str(meta.get("chat_type") or "direct"),
            channel=meta.get("channel"),
            status=rec.status,
            dir=rec.dir,
            started_at=str(meta.get("created_at")),
            task_key=TaskKey(
                task_type=str(meta.get("task_type") or "agent"),
                task_identifier=meta.get("task_identifier"),
                repository=meta.get("repository"),
                user=meta.get("user"),
            ),
            parent_uuid=meta.get("parent_uuid"),
            next_seq=rec.next_seq,
            context_tokens=rec.context_tokens,
            context_lines=rec.context_lines,
            context_bytes=rec.context_bytes,
            messages_bytes=rec.messages_bytes,
            last_context_seq=rec.last_context_seq,
            next_summary_id=rec.next_summary_id,
            compaction_count=rec.compaction_count,
            next_tool_seq=rec.next_tool_seq,
            next_plan_id=rec.next_plan_id,
        )
        if row:
            run.usage = {k: int(row.get(k) or 0) for k in USAGE_KEYS}
        return run

    async def _settle_lost_run(self, row: dict[str, Any]) -> None:
        """A ledger row says active but no active folder exists: finish what a crash interrupted."""
        done = self.home.run_dir(row["uuid"], "completed")
        now = iso(self.clock())
        if await asyncio.to_thread(done.is_dir):
            log.warning("run %s was moved to completed/ before a crash: finishing its ledger row", row["uuid"])
            await self.ledger.update_run(row["uuid"], status="completed", completed_at=now, updated_at=now)
        else:
            log.error("run %s has no folder: marking it failed", row["uuid"])
            await self.ledger.update_run(
                row["uuid"], status="failed", completed_at=now, updated_at=now, error_message="run folder missing"
            )

    def _rebuild_entries(self, rows: list[dict[str, Any]]) -> None:
        by_key: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            if row.get("session_key"):
                by_key.setdefault(row["session_key"], []).append(row)
        for key, key_rows in by_key.items():
            key_rows.sort(key=lambda r: r["created_at"])
            latest = key_rows[-1]
            entry = SessionEntry(
                key=key,
                agent_id=latest.get("agent_id"),
                chat_type=latest.get("chat_type") or "direct",
                channel=latest.get("channel"),
                created_at=key_rows[0]["created_at"],
                updated_at=latest.get("updated_at") or latest["created_at"],
                pinned=any(r.get("pinned") for r in key_rows),
            )
            meta = run_metadata(latest.get("metadata"))
            if isinstance(meta.get("label"), str):
                entry.label = meta["label"]
            if isinstance(meta.get("settings"), dict):
                entry.settings = dict(meta["settings"])
            for usage_key in USAGE_KEYS:
                setattr(entry, usage_key, sum(int(r.get(usage_key) or 0) for r in key_rows))
            completed = [r for r in key_rows if r["status"] in ("completed", "failed")]
            if completed:
                entry.last_run_id = completed[-1]["uuid"]
                entry.last_interaction_at = completed[-1].get("completed_at")
            self.registry.put(entry)

    def _reconcile_entries(self) -> None:
        """Make entries agree with the recovered runs (the files are the truth); only entries
        that change are marked for rewriting."""
        recovered = {rec.run_id: rec for rec in self.recovered}
        for run in self._runs.values():
            entry = self.registry.entries.get(run.key)
            if entry is None:
                entry = self._new_entry(run.key, run.agent_id, run.chat_type, run.channel)
                self.registry.entries[run.key] = entry
            before = _reconciled_fields(entry)
            if entry.run_id != run.run_id:  # started after the last rewrite: /new's flag was spent on it
                entry.inherit_next = True
            entry.run_id, entry.status, entry.started_at = run.run_id, run.status, run.started_at
            rec = recovered.get(run.run_id)
            if rec and rec.last_message_at and (entry.last_interaction_at or "") < rec.last_message_at:
                entry.last_interaction_at = rec.last_message_at
            self.sync_counters(entry, run)
            if _reconciled_fields(entry) != before:
                self.registry.touch(run.key)
        for entry in self.registry.entries.values():
            if entry.run_id is not None and entry.run_id not in self._runs:
                entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
                self.registry.touch(entry.key)

    # -- queries --------------------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self.registry.entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        entry = self.entry(key)
        if entry is None:
            raise SessionNotFound(f"no session with key {key!r}; post a message to create it")
        return entry

    def entries(self) -> Iterable[SessionEntry]:
        return self.registry.entries.values()

    def active_run(self, key: str) -> RunState | None:
        entry = self.entry(key)
        if entry is None or entry.run_id is None:
            return None
        return self._runs.get(entry.run_id)

    def run_state(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def active_runs(self) -> Iterable[RunState]:
        return self._runs.values()

    def lock_for(self, key: str) -> asyncio.Lock:
        """The per-key lock that serializes turns and lifecycle changes on one key."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # -- lifecycle ------------------------------------------------------------------------------

    async def start_run(
        self,
        key: str,
        *,
        agent_id: str | None,
        chat_type: str,
        channel: str | None,
        task_key: TaskKey,
        parent_uuid: str | None = None,
        opening: bool = False,
    ) -> RunState:
        """A new active run for ``key``. With ``opening`` the run exists for the message about to
        be appended: until that message is durable the folder carries a marker, and start-up
        removes a marked folder that holds no message (a crash or a storage error came between)."""
        entry = self.entry(key)
        if entry is not None and entry.run_id is not None:
            raise RunActive(f"session {key!r} already has an active run {entry.run_id}")
        now = iso(self.clock())
        run_id = str(uuidlib.uuid4())
        run = RunState(
            run_id=run_id,
            key=key,
            agent_id=agent_id,
            chat_type=chat_type,
            channel=channel,
            status="running",
            dir=self.home.run_dir(run_id, "running"),
            started_at=now,
            task_key=task_key,
            parent_uuid=parent_uuid,
        )
        metadata = self._metadata(run)
        created = False
        try:
            await self.writer.call(lambda: _create_run_folder(run.dir, metadata, opening=opening))
            created = True
            await self.ledger.insert_run(self._ledger_row(run))
        except (OSError, sqlite3.Error) as exc:
            # a run that cannot be created leaves nothing behind: no folder, no row, no entry
            if created:
                await self._remove_run_files(run)
            else:
                try:
                    await self.writer.call(lambda: _remove_folder(run.dir))
                except OSError as cleanup:  # a folder with no message: start-up recovery removes it
                    log.error("could not remove the half-created folder of run %s (%s)", run.run_id, cleanup)
            raise _start_error(exc) from exc
        run.opening = opening
        self._runs[run_id] = run
        if entry is None:
            entry = self._new_entry(key, agent_id, chat_type, channel)
            self.registry.entries[key] = entry
        entry.run_id, entry.status, entry.started_at = run_id, "running", now
        self.sync_counters(entry, run)  # every checkpoint field: none may describe the previous run
        entry.updated_at = now
        # Coalesced like appends, not rewritten at once: the run folder and its tasks.db row are the
        # durable truth, and recovery rebuilds the entry from them (a rewrite per new run made
        # creating a session O(keys): issue 10 item 12).
        self.registry.touch(key)
        self._emit("lifecycle", run, action="start", parent_uuid=parent_uuid)
        return run

    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None:
        """Undo ``start_run`` for a run whose first posted message could not be stored: its folder
        and tasks.db row go, and the key's entry is removed (``remove_entry``: this run created it)
        or set idle. What cannot be removed now (a read-only disk) start-up recovery removes."""
        self._runs.pop(run.run_id, None)
        entry = self.entry(run.key)
        if entry is not None and entry.run_id == run.run_id:
            if remove_entry:
                self.registry.remove(run.key)
            else:
                entry.run_id, entry.status = None, "idle"
                entry.context_tokens = entry.message_count = 0
                self.registry.touch(run.key)
        await self._remove_run_files(run)
        await self._flush_registry()
        self._emit("lifecycle", run, action="discard")

    async def _remove_run_files(self, run: RunState) -> None:
        def _do() -> None:
            self.writer.close_handles_under(run.dir)
            _remove_folder(run.dir)

        try:
            await self.writer.call(_do)
        except OSError as exc:
            log.error("could not remove the folder of discarded run %s (%s): start-up recovery will", run.run_id, exc)
        try:
            await self.ledger.execute(lambda c: c.execute("DELETE FROM tasks WHERE uuid = ?", (run.run_id,)))
        except sqlite3.Error as exc:
            log.error("could not delete the tasks.db row of discarded run %s (%s): recovery will", run.run_id, exc)

    async def _flush_registry(self) -> None:
        """Write sessions.json now; a failure is logged (it is rewritten on the next change and
        rebuilt at start from tasks.db and the run folders, which are the truth)."""
        try:
            await self.registry.flush()
        except OSError as exc:
            log.error("sessions.json could not be written (%s); it is written again on the next change", exc)

    async def pause(self, key: str) -> RunState:
        run = self._require_active(key)
        if run.status == "paused":
            return run
        for name, hook in list(self.stop_hooks.items()):
            await _run_hook("stop", name, hook, run)
        await self._move(run, "paused")
        await self.ledger.update_run(run.run_id, status="paused", updated_at=iso(self.clock()), **_stats(run))
        await self._entry_status(run, "paused")
        self._emit("lifecycle", run, action="pause")
        return run

    async def resume(self, key: str) -> RunState:
        run = self._require_active(key)
        if run.status == "running":
            return run
        await self._move(run, "running")
        await self.ledger.update_run(run.run_id, status="running", updated_at=iso(self.clock()))
        await self._entry_status(run, "running")
        self._emit("lifecycle", run, action="resume")
        return run

    async def complete(
        self, key: str, *, error: str | None = None, reason: str = "complete", summarize: bool = True
    ) -> RunState:
        """Complete (or, with ``error``, fail) the key's active run: completion hooks, the final
        summary, statistics, the move to completed/; the entry stays, idle, with ``run_id: null``.
        ``summarize=False`` (a purge) runs no hook and writes no final summary."""
        run = self._require_active(key)
        run.closing = True
        status = "failed" if error is not None else "completed"
        for name, hook in list(self.completion_hooks.items()) if summarize else ():
            await _run_hook("completion", name, hook, run)
        if self.final_summarizer is not None and summarize:
            try:
                text = await self.final_summarizer(run, reason)
            except Exception:  # the run must still complete; the summary is best effort
                log.exception("final summary of run %s failed", run.run_id)
                text = None
            if text is not None:
                path = run.dir / layout.FINAL_SUMMARY
                await self.writer.call(lambda: _write_text(path, text))
        await self._record_deliveries(run)
        await self._move(run, "completed")
        now = iso(self.clock())
        await self.ledger.update_run(
            run.run_id,
            status=status,
            completed_at=now,
            updated_at=now,
            error_message=error,
            compaction_count=run.compaction_count,
            **_stats(run),
        )
        del self._runs[run.run_id]
        self._files.pop(run.run_id, None)
        entry = self.entry(key)
        if entry is not None:
            entry.last_run_id, entry.run_id, entry.status = run.run_id, None, "idle"
            entry.context_tokens = entry.message_count = 0
            entry.updated_at = now
            self.registry.touch(key)
            await self.registry.flush()
        run.status = status
        self._emit("lifecycle", run, action=status, reason=reason, error=error)
        return run

    async def delete(self, key: str) -> str | None:
        """Complete the active run (if any) and remove the entry; runs stay in tasks.db."""
        self.require_entry(key)
        completed = None
        if self.active_run(key) is not None:
            completed = (await self.complete(key, reason="delete")).run_id
        self.registry.remove(key)  # the key's lock stays: callers may be queued on it
        await self.registry.flush()
        await self.ledger.set_key_metadata(key, {"inherit": False})  # a new session on the key starts clean
        return completed

    def _require_active(self, key: str) -> RunState:
        self.require_entry(key)
        run = self.active_run(key)
        if run is None:
            raise NoActiveRun(f"session {key!r} has no active run")
        return run

    async def _move(self, run: RunState, status: str) -> None:
        old, new = run.dir, self.home.run_dir(run.run_id, status)
        run.dir = new
        run.status = status

        def _do() -> None:
            self.writer.close_handles_under(old)
            new.parent.mkdir(parents=True, exist_ok=True)
            os.rename(old, new)
            fsync_dir(new.parent)
            fsync_dir(old.parent)

        await self.writer.call(_do)

    async def _entry_status(self, run: RunState, status: str) -> None:
        entry = self.entry(run.key)
        if entry is not None:
            entry.status = status
            entry.updated_at = iso(self.clock())
            self.registry.touch(run.key)
            await self.registry.flush()

    # -- appends --------------------------------------------------------------------------------

    def check_writable(self, run: RunState, message: NewMessage) -> None:
        if run.closing:
            raise RunClosing(f"run {run.run_id} is completing; retry on the next run")
        if run.status == "paused" and not message.command:
            raise SessionPaused(
                f"session {run.key!r} is paused; send /resume or POST /v1/sessions/{{key}}/resume first"
            )

    async def append(self, run: RunState, message: NewMessage) -> dict[str, Any]:
        """Append a message; returns its messages.jsonl record once durable under the fsync
        policy. The seq is assigned here, on the loop, so arrival order is file order.

        A failed append (full disk, read-only file system) raises ``InsufficientStorage`` or
        ``StorageUnavailable``; the writer cut the files back, and once every append that was
        pending meanwhile has settled, the seq and the counters go back to where they were:
        a failed message consumes no seq and is not counted."""
        record, durable = self.queue_append(run, message)
        return await self.finish_append(run, message, record, durable)

    def queue_append(self, run: RunState, message: NewMessage) -> tuple[dict[str, Any], asyncio.Future[None]]:
        """The first half of ``append``: assign the seq and queue the line; the record and the
        future that resolves once it is durable. A caller that holds the key's lock can release
        it before awaiting, so the next message on the key joins the same group commit; it must
        then await ``finish_append``."""
        self.check_writable(run, message)
        stamp = iso(self.clock())
        record = _message_record(run.next_seq, message, stamp)
        run.next_seq += 1
        data = encode(record)
        _, messages, current = self._run_files(run)
        line = encode(context_line(record)) if in_context(record) else b""
        undo = _Undo(record["seq"], len(data), len(line), record["tokens"] if line else 0, run.last_context_seq)
        durable = self.writer.append(
            messages,
            data,
            durable=True,
            also=(current, line) if line else None,
            guarded=True,
        )
        run.appends_pending += 1
        durable.add_done_callback(lambda future: self._settle_append(run, undo, future))
        run.messages_bytes += len(data)
        if line:
            run.context_bytes += len(line)
            run.context_tokens += record["tokens"]
            run.context_lines += 1
            run.last_context_seq = record["seq"]
        entry = self.entry(run.key)
        if entry is not None:
            if message.role != "system":
                entry.last_interaction_at = stamp
            if message.counts_as_activity:
                entry.last_user_activity_at = stamp
            entry.updated_at = stamp
            self.sync_counters(entry, run)
            self.registry.touch(run.key)
        return record, durable

    async def finish_append(
        self, run: RunState, message: NewMessage, record: dict[str, Any], durable: asyncio.Future[None]
    ) -> dict[str, Any]:
        """The second half of ``append``: wait until the line is durable (a failed write raises the
        typed storage error), then tell the listeners and the event hub."""
        try:
            await asyncio.shield(durable)
        except OSError as exc:
            raise storage_error(exc) from exc
        if message.client_message_id is not None or message.reply_to is not None:
            _deliveries(run).add(record)
        if run.opening:
            run.opening = False
            marker = run.dir / leftovers.OPENING
            self.writer.call(lambda: marker.unlink(missing_ok=True)).add_done_callback(_log_failure)
        for durable_listener in self.durable_listeners:
            durable_listener(run, record)
        self._emit("message", run, at=record["timestamp"], **_event_fields(record))
        return record

    def _run_files(self, run: RunState) -> tuple[Path, Path, Path]:
        """The run's folder and its two message stores, joined once per folder (not per append)."""
        files = self._files.get(run.run_id)
        if files is None or files[0] is not run.dir:
            files = self._files[run.run_id] = (run.dir, run.dir / layout.MESSAGES, run.dir / layout.CURRENT)
        return files

    async def _record_deliveries(self, run: RunState) -> None:
        """Before a run leaves the active set, make sure every client_message_id it stored has
        its idempotency record (one may be missing after a crash or a tasks.db error): a
        redelivery after the run ended is then still recognised."""
        deliveries = _deliveries(run)
        if not deliveries.scanned and run.messages_bytes:
            path = run.dir / layout.MESSAGES
            deliveries.merge(await self.writer.call(lambda: scan_deliveries(path)))
        rows = [(run.key, cmid, stamp, run.run_id, seq) for cmid, (seq, stamp) in deliveries.by_id.items()]
        if not rows:
            return
        sql = (
            "INSERT OR IGNORE INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        try:
            await self.ledger.execute(lambda c: c.executemany(sql, rows))
        except sqlite3.Error as exc:
            log.warning("idempotency records of run %s not written at completion (%s)", run.run_id, exc)

    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None:
        """The message of the key's active run that carried ``client_message_id`` (stored at or
        after ``since``), read from messages.jsonl itself the first time a run is asked."""
        run = self.active_run(key)
        if run is None:
            return None
        deliveries = _deliveries(run)
        if not deliveries.scanned:
            path = run.dir / layout.MESSAGES
            deliveries.merge(await self.writer.call(lambda: scan_deliveries(path)))
        return deliveries.find(run.run_id, client_message_id, since)

    def _settle_append(self, run: RunState, undo: _Undo, future: asyncio.Future[None]) -> None:
        """On the loop, once an append is durable or failed: take a failed one out of the
        counters; when nothing is pending any more, give its seq back and reopen the file."""
        run.appends_pending -= 1
        failed = future.cancelled() or future.exception() is not None
        if failed:
            run.messages_bytes -= undo.messages_bytes
            if undo.context_bytes:
                run.context_bytes -= undo.context_bytes
                run.context_tokens = max(0, run.context_tokens - undo.tokens)
                run.context_lines -= 1
            if run.failed_seq is None or undo.seq < run.failed_seq:
                run.failed_seq, run.failed_context_seq = undo.seq, undo.last_context_seq
        if run.appends_pending == 0 and run.failed_seq is not None:
            run.next_seq, run.last_context_seq = run.failed_seq, run.failed_context_seq
            run.failed_seq = None
            self.writer.reopen(run.dir / layout.MESSAGES)
            entry = self.entry(run.key)
            if entry is not None and entry.run_id == run.run_id:
                self.sync_counters(entry, run)
                self.registry.touch(run.key)

    async def writable(self) -> str | None:
        """None when the store can write now; else why not (for ``/readyz``). Probed on the
        writer thread: no thread is started per call (starting one waits for the GIL, which a
        loading model can hold for seconds), and the probe sees the disk as the appends do."""
        contexts = self.home.contexts
        problem = await self.writer.call(lambda: probe_writable(contexts))
        self._probed = (time.monotonic(), problem)
        return problem

    def recently_writable(self, max_age_s: float) -> bool:
        """True when a probe within ``max_age_s`` found the store writable and no append has
        failed since the last that succeeded (``/readyz`` then answers without a new probe)."""
        at, problem = self._probed
        return problem is None and self.writer.last_error is None and time.monotonic() - at < max_age_s

    async def record_tool(
        self,
        run: RunState,
        *,
        tool_name: str,
        arguments: Any,
        result: Any = None,
        error: str | None = None,
        duration_ms: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "seq": run.next_tool_seq,
            "tool_name": tool_name,
            "arguments": arguments,
            "result": result,
            "error": error,
            "timestamp": iso(self.clock()),
        }
        if duration_ms is not None:
            record["duration_ms"] = round(duration_ms, 3)
        record.update(extra or {})
        run.next_tool_seq += 1
        await self.writer.append(run.dir / layout.TOOLS, encode(record), durable=True)
        return record

    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> dict[str, Any]:
        record = {
            "id": run.next_plan_id,
            "plan_type": plan_type,
            "plan_content": plan_content,
            "created_at": iso(self.clock()),
        }
        run.next_plan_id += 1
        await self.writer.append(run.dir / layout.PLANNING, encode(record), durable=True)
        return record

    async def add_usage(self, run: RunState, usage: dict[str, int]) -> None:
        """Cumulative usage per run (tasks.db) and per key (sessions.json)."""
        clean = {k: int(usage.get(k) or 0) for k in USAGE_KEYS}
        for k, v in clean.items():
            run.usage[k] += v
        entry = self.entry(run.key)
        if entry is not None:
            for k, v in clean.items():
                setattr(entry, k, getattr(entry, k) + v)
            self.registry.touch(run.key)
        try:
            await self.ledger.add_usage(run.run_id, clean, iso(self.clock()))
        except sqlite3.Error as exc:  # the turn goes on: its message and reply are stored already
            log.warning("usage of run %s not added to tasks.db (%s); sessions.json keeps it", run.run_id, exc)

    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None:
        """Replace the estimate with the provider's count of the context just sent, plus the
        ``appended_since`` tokens of what was appended after that context was read."""
        run.context_tokens = max(0, prompt_tokens - overhead_tokens) + max(0, appended_since)
        entry = self.entry(run.key)
        if entry is not None:
            self.sync_counters(entry, run)
            self.registry.touch(run.key)

    # -- settings on the entry ------------------------------------------------------------------

    async def update_entry(
        self,
        key: str,
        *,
        pinned: bool | None = None,
        label: str | None = None,
        clear_label: bool = False,
        settings: dict[str, Any] | None = None,
    ) -> SessionEntry:
        entry = self.require_entry(key)
        if pinned is not None and pinned != entry.pinned:
            entry.pinned = pinned
            await self.ledger.set_pinned(key, pinned)
        if label is not None or clear_label:
            entry.label = label
        if settings is not None:
            merged = {**entry.settings, **settings}
            entry.settings = {k: v for k, v in merged.items() if v is not None}
        if label is not None or clear_label or settings is not None:  # durable beyond sessions.json
            await self.ledger.set_key_metadata(key, {"label": entry.label, "settings": entry.settings})
        entry.updated_at = iso(self.clock())
        self.registry.touch(key)
        await self.registry.flush()
        return entry

    # -- reading stores -------------------------------------------------------------------------

    async def locate_run(self, run_id: str) -> tuple[dict[str, Any], Path | None]:
        """The ledger row and the folder (None when archived or missing)."""
        row = await self.ledger.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
        active = self._runs.get(run_id)
        if active is not None:
            return row, active.dir
        folder = self.home.run_dir(run_id, row["status"])
        return row, folder if await asyncio.to_thread(folder.is_dir) else None

    async def read_store(self, folder: Path, name: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(read_records, folder / name)

    async def read_messages(self, folder: Path, *, after_seq: int, limit: int) -> list[dict[str, Any]]:
        def _read() -> list[dict[str, Any]]:
            out = []
            for record in iter_records(folder / layout.MESSAGES):
                if int(record.get("seq", 0)) > after_seq:
                    out.append(record)
                    if len(out) >= limit:
                        break
            return out

        return await asyncio.to_thread(_read)

    async def read_context(self, run: RunState) -> list[dict[str, Any]]:
        """current.jsonl as the model will see it; read through the writer so queued appends
        are on disk first."""
        path = run.dir / layout.CURRENT
        return await self.writer.call(lambda: read_records(path))

    # -- helpers --------------------------------------------------------------------------------

    def _new_entry(self, key: str, agent_id: str | None, chat_type: str, channel: str | None) -> SessionEntry:
        now = iso(self.clock())
        return SessionEntry(
            key=key, agent_id=agent_id, chat_type=chat_type, channel=channel, created_at=now, updated_at=now
        )

    @staticmethod
    def sync_counters(entry: SessionEntry, run: RunState) -> None:
        entry.context_tokens = run.context_tokens
        entry.message_count = run.message_count
        entry.compaction_count = run.compaction_count
        entry.context_bytes = run.context_bytes
        entry.context_lines = run.context_lines
        entry.last_context_seq = run.last_context_seq
        entry.last_summary_id = run.next_summary_id - 1
        entry.messages_bytes = run.messages_bytes

    def _metadata(self, run: RunState) -> dict[str, Any]:
        return {
            "format_version": METADATA_FORMAT_VERSION,
            "uuid": run.run_id,
            "created_at": run.started_at,
            **run.task_key.as_dict(),
            "session_key": run.key,
            "agent_id": run.agent_id,
            "chat_type": run.chat_type,
            "channel": run.channel,
            "parent_uuid": run.parent_uuid,
        }

    def _entry_metadata(self, key: str) -> dict[str, Any]:
        entry = self.entry(key)
        if entry is None or (entry.label is None and not entry.settings):
            return {}
        return {"label": entry.label, "settings": entry.settings}

    def _ledger_row(self, run: RunState) -> dict[str, Any]:
        return {
            "uuid": run.run_id,
            "status": run.status,
            **run.task_key.as_dict(),
            "created_at": run.started_at,
            "updated_at": run.started_at,
            "metadata": json.dumps({**self._metadata(run), **self._entry_metadata(run.key)}, ensure_ascii=False),
            "session_key": run.key,
            "agent_id": run.agent_id,
            "channel": run.channel,
            "chat_type": run.chat_type,
            "parent_uuid": run.parent_uuid,
            "pinned": int(bool((self.entry(run.key) or _NO_ENTRY).pinned)),
        }

    def _emit(self, event_type: str, run: RunState, *, at: str | None = None, **fields: Any) -> None:
        event = {"type": event_type, "key": run.key, "run_id": run.run_id, "at": at or iso(self.clock()), **fields}
        for listener in list(self.listeners):
            listener(event)

    def emit(self, event_type: str, run: RunState, **fields: Any) -> None:
        """Publish a domain event (compaction, inheritance, reset, reply) to listeners."""
        self._emit(event_type, run, **fields)

    def expiry_cutoff(self, days: float) -> str:
        return iso(self.clock() - timedelta(days=days))


@dataclass(frozen=True)
class _Undo:
    """What one append added to a run's counters (taken back if it fails)."""

    seq: int
    messages_bytes: int
    context_bytes: int
    tokens: int
    last_context_seq: int


class _NoEntry:
    pinned = False


_NO_ENTRY = _NoEntry()


def _all_rows(conn: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM tasks")]


_RECOVERY_COLUMNS = (
    "uuid", "status", "session_key", "agent_id", "chat_type", "channel", "task_type", "task_identifier",
    "repository", "user", "parent_uuid", "created_at", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens",
)  # fmt: skip


def _active_rows(conn: Any) -> list[dict[str, Any]]:
    """What recovery needs of the active runs (not every column: 10,000 rows are read at start)."""
    sql = f"SELECT {', '.join(_RECOVERY_COLUMNS)} FROM tasks WHERE status IN ('running', 'paused')"
    cursor = conn.execute(sql)
    cursor.row_factory = None
    return [dict(zip(_RECOVERY_COLUMNS, row, strict=True)) for row in cursor]


def _reconciled_fields(entry: SessionEntry) -> tuple[Any, ...]:
    """What ``_reconcile_entries`` may change in an entry (to rewrite only the entries it did)."""
    return (
        entry.run_id, entry.status, entry.started_at, entry.last_interaction_at, entry.context_tokens,
        entry.message_count, entry.compaction_count, entry.context_bytes, entry.context_lines,
        entry.last_context_seq, entry.last_summary_id, entry.messages_bytes,
    )  # fmt: skip


def _checkpoint(entry: SessionEntry) -> Checkpoint:
    return Checkpoint(
        context_bytes=entry.context_bytes,
        context_tokens=entry.context_tokens,
        context_lines=entry.context_lines,
        last_context_seq=entry.last_context_seq,
        compaction_count=entry.compaction_count,
        last_summary_id=entry.last_summary_id,
        messages_bytes=entry.messages_bytes,
        message_count=entry.message_count,
    )


def _message_record(seq: int, message: NewMessage, timestamp: str) -> dict[str, Any]:
    record: dict[str, Any] = {
        "seq": seq,
        "role": message.role,
        "content": message.content,
        "timestamp": timestamp,
        "tokens": 0,
        "tool_name": message.tool_name,
    }
    # Optional fields only when set, in this order (one test per field: this runs per message).
    if message.name is not None:
        record["name"] = message.name
    if message.sender_id is not None:
        record["sender_id"] = message.sender_id
    if message.tool_call_id is not None:
        record["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        record["tool_calls"] = list(message.tool_calls)
    if message.command:
        record["command"] = True
    if message.usage is not None:
        record["usage"] = message.usage
    if message.kind is not None:
        record["kind"] = message.kind
    if message.client_message_id is not None:
        record["client_message_id"] = message.client_message_id
    if message.reply_to is not None:
        record["reply_to"] = message.reply_to
    record["tokens"] = estimate_message(record)
    return record


def _deliveries(run: RunState) -> RunDeliveries:
    if run.deliveries is None:
        run.deliveries = RunDeliveries()
    deliveries: RunDeliveries = run.deliveries
    return deliveries


def _event_fields(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in ("seq", "role", "content", "name", "kind", "command") if k in record}


def _stats(run: RunState) -> dict[str, Any]:
    """The seed's statistics columns."""
    return asdict(
        RunStats(
            total_messages=run.message_count,
            total_summaries=run.next_summary_id - 1,
            total_tool_calls=run.next_tool_seq - 1,
            final_token_count=run.context_tokens,
            final_message_count=run.context_lines,
        )
    )


def _create_run_folder(folder: Path, metadata: dict[str, Any], *, opening: bool) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=False)
    if opening:
        (folder / leftovers.OPENING).touch(mode=0o600)
    write_json_atomic(folder / layout.METADATA, metadata)
    for name in (layout.MESSAGES, layout.CURRENT, layout.SUMMARIES, layout.TOOLS, layout.PLANNING):
        (folder / name).touch(mode=0o600)  # the seed's layout, whole from the start
    fsync_dir(folder)
    fsync_dir(folder.parent)


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("could not remove a run's opening marker: %s", future.exception())


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


async def _run_hook(kind: str, name: str, hook: RunHook, run: RunState) -> None:
    try:
        await hook(run)
    except Exception:  # a broken hook must not stop the lifecycle change; it is logged
        log.exception("%s hook %r failed for run %s", kind, name, run.run_id)
