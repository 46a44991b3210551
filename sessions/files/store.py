"""The session engine: keys → entries → runs → durable JSONL stores, plus the run lifecycle.

``SessionStore`` is the only way the rest of the program changes session state. It owns the append
writer (file I/O thread), the ledger (SQLite thread) and the registry (sessions.json). Everything
that can block runs on one of those; the methods here only assign ids, update counters and wait.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

from config.clock import Clock, iso
from config.settings import Settings
from home.damage import ledger_error, storage_damage
from home.layout import Home
from sessions.delegate import Delegate, PartField
from sessions.files import leftovers
from sessions.files.backup import FilesBackup
from sessions.files.ledger import Ledger, run_metadata
from sessions.files.recovery import RecoveredRun, recover_all
from sessions.files.registry import SessionEntry, SessionRegistry
from sessions.files.run_folder import FolderRun
from sessions.files.store_appends import Appends
from sessions.files.store_lifecycle import Lifecycle
from sessions.files.store_maintenance import FilesMaintenance
from sessions.files.store_records import Reads, Records
from sessions.files.store_state import StoreState
from sessions.files.writer import AppendWriter
from sessions.protocol import StoreProtocol
from sessions.records import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    USAGE_KEYS,
    RunFinish,
    RunState,
    TaskKey,
    copy_counters,
    counter_values,
    restore_counters,
)
from sessions.store_hooks import DurableListener, Listener, RunHook, StoreHooks
from sessions.usage import UsageBook

log = logging.getLogger(__name__)

__all__ = ["DurableListener", "Listener", "RunHook", "SessionStore", "StoreHooks"]

NO_HOOKS = StoreHooks()


class SessionStore:
    """The run-folder backend of every capability of ``sessions.protocol``: its parts (``reads``,
    ``records``, ``appends``, ``lifecycle``, ``maintenance``) over one ``StoreState``."""

    # the state's resources, read-only here (the backend's own tools, the backups and the tests read them)
    home: PartField[Home] = PartField("state")
    settings: PartField[Settings] = PartField("state")
    clock: PartField[Clock] = PartField("state")
    ledger: PartField[Ledger] = PartField("state")
    writer: PartField[AppendWriter] = PartField("state")
    registry: PartField[SessionRegistry] = PartField("state")
    recovered: PartField[list[RecoveredRun]] = PartField("state")
    # each method of the port is its part's (``sessions.delegate``)
    # the lookups, the events
    entry = Delegate("state", StoreState.entry)
    require_entry = Delegate("state", StoreState.require_entry)
    entries = Delegate("state", StoreState.entries)
    active_run = Delegate("state", StoreState.active_run)
    run_state = Delegate("state", StoreState.run_state)
    active_runs = Delegate("state", StoreState.active_runs)
    lock_for = Delegate("state", StoreState.lock_for)
    emit = Delegate("state", StoreState.emit)
    # the entry, the lifecycle
    update_entry = Delegate("lifecycle", Lifecycle.update_entry)
    set_inherit_next = Delegate("lifecycle", Lifecycle.set_inherit_next)
    set_reset_boundary = Delegate("lifecycle", Lifecycle.set_reset_boundary)
    start_run = Delegate("lifecycle", Lifecycle.start_run)
    discard_run = Delegate("lifecycle", Lifecycle.discard_run)
    pause = Delegate("lifecycle", Lifecycle.pause)
    resume = Delegate("lifecycle", Lifecycle.resume)
    complete = Delegate("lifecycle", Lifecycle.complete)
    delete = Delegate("lifecycle", Lifecycle.delete)
    # appends, and the deliveries an append checks
    check_writable = Delegate("appends", Appends.check_writable)
    append = Delegate("appends", Appends.append)
    queue_append = Delegate("appends", Appends.queue_append)
    finish_append = Delegate("appends", Appends.finish_append)
    record_tool = Delegate("appends", Appends.record_tool)
    record_plan = Delegate("appends", Appends.record_plan)
    add_usage = Delegate("appends", Appends.add_usage)
    calibrate_context = Delegate("appends", Appends.calibrate_context)
    rewrite_context = Delegate("appends", Appends.rewrite_context)
    writable = Delegate("appends", Appends.writable)
    recently_writable = Delegate("appends", Appends.recently_writable)
    checks_deliveries = Delegate("appends", Appends.checks_deliveries)
    recall_delivery = Delegate("appends", Appends.recall_delivery)
    find_delivery = Delegate("appends", Appends.find_delivery)
    # reads by run id, usage
    get_run = Delegate("reads", Reads.get_run)
    require_run = Delegate("reads", Reads.require_run)
    list_runs = Delegate("reads", Reads.list_runs)
    known_keys = Delegate("reads", Reads.known_keys)
    previous_runs = Delegate("reads", Reads.previous_runs)
    locate_run = Delegate("reads", Reads.locate_run)
    read_messages = Delegate("reads", Reads.read_messages)
    read_records = Delegate("reads", Reads.read_records)
    read_final_summary = Delegate("reads", Reads.read_final_summary)
    read_context = Delegate("reads", Reads.read_context)
    daily_usage = Delegate("usage", UsageBook.daily_usage)
    tokens_spent = Delegate("usage", UsageBook.tokens_spent)
    # the records beside the runs
    find_idempotency = Delegate("records", Records.find_idempotency)
    remember_delivery = Delegate("records", Records.remember_delivery)
    remember_reply = Delegate("records", Records.remember_reply)
    hook_delivery = Delegate("records", Records.hook_delivery)
    record_hook_delivery = Delegate("records", Records.record_hook_delivery)
    compat_conversation = Delegate("records", Records.compat_conversation)
    save_compat_conversation = Delegate("records", Records.save_compat_conversation)
    compat_response = Delegate("records", Records.compat_response)
    latest_compat_response = Delegate("records", Records.latest_compat_response)
    save_compat_response = Delegate("records", Records.save_compat_response)
    # HistorySource, Maintenance
    open_history = Delegate("maintenance", FilesMaintenance.open_history)
    rebuild_history = Delegate("maintenance", FilesMaintenance.rebuild_history)
    catch_up_history = Delegate("maintenance", FilesMaintenance.catch_up_history)
    check_history = Delegate("maintenance", FilesMaintenance.check_history)
    check = Delegate("maintenance", FilesMaintenance.check)
    cleanup = Delegate("maintenance", FilesMaintenance.cleanup)
    export_runs = Delegate("maintenance", FilesMaintenance.export_runs)
    purge = Delegate("maintenance", FilesMaintenance.purge)

    def __init__(
        self,
        home: Home,
        settings: Settings,
        *,
        clock: Clock,
        ledger: Ledger,
        writer: AppendWriter,
        registry: SessionRegistry,
        hooks: StoreHooks = NO_HOOKS,
    ) -> None:
        state = self.state = StoreState(home, settings, clock, ledger, writer, registry, hooks)
        self.reads = Reads(state)
        self.usage = UsageBook(self.reads.usage_rows, self.reads.tokens_spent)
        self.records = Records(state)
        self.appends = Appends(state, self.records)
        self.lifecycle = Lifecycle(state, self.appends)
        self.maintenance = FilesMaintenance(state, self.lifecycle)

    # -- opening and closing --------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        root: Path,
        settings: Settings,
        *,
        clock: Clock,
        hooks: StoreHooks = NO_HOOKS,
    ) -> SessionStore:
        """Recover every active run, then load (or rebuild) sessions.json. The caller holds the
        home lock. The hooks are the composition root's (``gateway/services.py``)."""
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
        store = cls(
            home,
            settings,
            clock=clock,
            ledger=ledger,
            writer=writer,
            registry=registry,
            hooks=hooks,
        )
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

    @property
    def backup(self) -> FilesBackup:
        return FilesBackup(self.home, self.registry, self.writer, self.active_runs, self.clock)

    async def _recover(self) -> None:
        rows, problem = await asyncio.gather(self.ledger.execute(_active_rows), asyncio.to_thread(self.registry.load))
        active_rows = {row["uuid"]: row for row in rows}
        checkpoints = {e.run_id: e.counters for e in self.registry.entries.values() if e.run_id}
        recovered = await asyncio.to_thread(recover_all, self.home.contexts, active_rows, checkpoints)
        recovered = await self._drop_half_created(recovered, active_rows)
        self.state.recovered = recovered
        for rec in recovered:
            row = active_rows.get(rec.run_id) or await self.ledger.get_run(rec.run_id)
            run = self._state_from_recovery(rec, row)
            if row is None:
                log.warning("run %s had a folder but no tasks.db row: inserting it", rec.run_id)
                await self.ledger.insert_run(self.state.ledger_row(run))
            elif row["status"] != run.status:
                await self.ledger.update_run(run.run_id, status=run.status, updated_at=iso(self.clock()))
            self.state.runs[run.run_id] = run
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
        run = self.state.runs.get(run_id)
        if run is None or self.active_run(run.key) is not run:
            log.error("run %s is damaged (%s) but is not its key's active run: left for the doctor", run_id, damage)
            return
        try:
            await self.complete(run.key, RunFinish(error=f"damaged at start-up: {damage}", reason="damaged"))
        except OSError as exc:  # not even movable: leave the folder to the doctor, free the key
            log.error("run %s of %r is damaged (%s) and cannot be failed (%s)", run_id, run.key, damage, exc)
            self.state.runs.pop(run_id, None)
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
        run = FolderRun(
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
            next_tool_seq=rec.next_tool_seq,
            next_plan_id=rec.next_plan_id,
        )
        restore_counters(run, rec.counters)  # as recovery counted them
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
            completed = [r for r in key_rows if r["status"] in FINISHED_STATUSES]
            if completed:
                entry.last_run_id = completed[-1]["uuid"]
                entry.last_interaction_at = completed[-1].get("completed_at")
            self.registry.put(entry)

    def _reconcile_entries(self) -> None:
        """Make entries agree with the recovered runs (the files are the truth); only entries
        that change are marked for rewriting."""
        recovered = {rec.run_id: rec for rec in self.state.recovered}
        for run in self.state.runs.values():
            entry = self.registry.entries.get(run.key)
            if entry is None:
                entry = self.state.new_entry(run.key, run.agent_id, run.chat_type, run.channel)
                self.registry.entries[run.key] = entry
            before = _reconciled_fields(entry)
            if entry.run_id != run.run_id:  # started after the last rewrite: /new's flag was spent on it
                entry.inherit_next = True
            entry.run_id, entry.status, entry.started_at = run.run_id, run.status, run.started_at
            rec = recovered.get(run.run_id)
            if rec and rec.last_message_at and (entry.last_interaction_at or "") < rec.last_message_at:
                entry.last_interaction_at = rec.last_message_at
            copy_counters(run, entry)
            if _reconciled_fields(entry) != before:
                self.registry.touch(run.key)
        for entry in self.registry.entries.values():
            if entry.run_id is not None and entry.run_id not in self.state.runs:
                entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
                self.registry.touch(entry.key)


def _all_rows(conn: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM tasks")]


_RECOVERY_COLUMNS = (
    "uuid", "status", "session_key", "agent_id", "chat_type", "channel", "task_type", "task_identifier",
    "repository", "user", "parent_uuid", "created_at", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens",
)  # fmt: skip


def _active_rows(conn: Any) -> list[dict[str, Any]]:
    """What recovery needs of the active runs (not every column: 10,000 rows are read at start)."""
    sql = f"SELECT {', '.join(_RECOVERY_COLUMNS)} FROM tasks WHERE status IN {ACTIVE_STATUSES}"
    cursor = conn.execute(sql)
    cursor.row_factory = None
    return [dict(zip(_RECOVERY_COLUMNS, row, strict=True)) for row in cursor]


def _reconciled_fields(entry: SessionEntry) -> tuple[Any, ...]:
    """What ``_reconcile_entries`` may change in an entry (to rewrite only the entries it did)."""
    return (entry.run_id, entry.status, entry.started_at, entry.last_interaction_at, counter_values(entry))


def _conforms(store: SessionStore) -> StoreProtocol:
    return store  # mypy checks here that SessionStore implements the protocol
