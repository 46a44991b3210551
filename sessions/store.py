"""The session engine: keys → entries → runs → durable JSONL stores, plus the run lifecycle.

``SessionStore`` is the only way the rest of the program changes session state. It owns the append
writer (file I/O thread), the ledger (SQLite thread) and the registry (sessions.json). Everything
that can block runs on one of those; the methods here only assign ids, update counters and wait.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from config.clock import Clock, iso
from config.errors import Conflict, NotFound, SessionPaused
from config.settings import Settings
from sessions import layout
from sessions.jsonl import encode, fsync_dir, iter_records, read_records, write_atomic, write_json_atomic
from sessions.layout import Home
from sessions.ledger import Ledger, RunStats
from sessions.records import USAGE_KEYS, NewMessage, RunState, TaskKey
from sessions.recovery import Checkpoint, RecoveredRun, context_line, in_context, recover_all
from sessions.registry import SessionEntry, SessionRegistry
from sessions.tokens import estimate_message
from sessions.writer import AppendWriter

log = logging.getLogger(__name__)

METADATA_FORMAT_VERSION = 1
Listener = Callable[[dict[str, Any]], object]
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
        self._runs: dict[str, RunState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._files: dict[str, tuple[Path, Path, Path]] = {}  # run id -> (dir, messages, current)
        self.recovered: list[RecoveredRun] = []

    # -- opening and closing --------------------------------------------------------------------

    @classmethod
    async def open(cls, root: Path, settings: Settings, *, clock: Clock) -> SessionStore:
        """Recover every active run, then load (or rebuild) sessions.json. The caller holds the
        home lock."""
        home = Home(root)
        await asyncio.to_thread(home.ensure)
        ledger = Ledger(home.tasks_db)
        await ledger.open()
        writer = AppendWriter(settings.storage.fsync)
        writer.start()
        registry = SessionRegistry(home.sessions_json, flush_ms=settings.storage.sessions_flush_ms)
        store = cls(home, settings, clock=clock, ledger=ledger, writer=writer, registry=registry)
        await store._recover()
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
            raise NotFound(f"no session with key {key!r}; post a message to create it", code="session_not_found")
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
    ) -> RunState:
        entry = self.entry(key)
        if entry is not None and entry.run_id is not None:
            raise Conflict(f"session {key!r} already has an active run {entry.run_id}", code="run_active")
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
        await self.writer.call(lambda: _create_run_folder(run.dir, metadata))
        await self.ledger.insert_run(self._ledger_row(run))
        self._runs[run_id] = run
        if entry is None:
            entry = self._new_entry(key, agent_id, chat_type, channel)
            self.registry.entries[key] = entry
        entry.run_id, entry.status, entry.started_at = run_id, "running", now
        self.sync_counters(entry, run)  # every checkpoint field: none may describe the previous run
        entry.updated_at = now
        self.registry.touch(key)
        await self.registry.flush()
        self._emit("lifecycle", run, action="start", parent_uuid=parent_uuid)
        return run

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

    async def complete(self, key: str, *, error: str | None = None, reason: str = "complete") -> RunState:
        """Complete (or, with ``error``, fail) the key's active run: completion hooks, the final
        summary, statistics, the move to completed/; the entry stays, idle, with ``run_id: null``."""
        run = self._require_active(key)
        run.closing = True
        status = "failed" if error is not None else "completed"
        for name, hook in list(self.completion_hooks.items()):
            await _run_hook("completion", name, hook, run)
        if self.final_summarizer is not None:
            try:
                text = await self.final_summarizer(run, reason)
            except Exception:  # the run must still complete; the summary is best effort
                log.exception("final summary of run %s failed", run.run_id)
                text = None
            if text is not None:
                path = run.dir / layout.FINAL_SUMMARY
                await self.writer.call(lambda: _write_text(path, text))
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
        return completed

    def _require_active(self, key: str) -> RunState:
        self.require_entry(key)
        run = self.active_run(key)
        if run is None:
            raise Conflict(f"session {key!r} has no active run", code="no_active_run")
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
            raise Conflict(f"run {run.run_id} is completing; retry on the next run", code="run_closing")
        if run.status == "paused" and not message.command:
            raise SessionPaused(
                f"session {run.key!r} is paused; send /resume or POST /v1/sessions/{{key}}/resume first"
            )

    async def append(self, run: RunState, message: NewMessage) -> dict[str, Any]:
        """Append a message; returns its messages.jsonl record once durable under the fsync
        policy. The seq is assigned here, on the loop, so arrival order is file order."""
        record, durable = self.queue_append(run, message)
        await durable
        self.emit_message(run, record)
        return record

    def queue_append(self, run: RunState, message: NewMessage) -> tuple[dict[str, Any], asyncio.Future[None]]:
        """The first half of ``append``: assign the seq and queue the line; the record and the
        future that resolves once it is durable. A caller that holds the key's lock can release
        it before awaiting, so the next message on the key joins the same group commit; it must
        then call ``emit_message`` once the future resolved."""
        self.check_writable(run, message)
        stamp = iso(self.clock())
        record = _message_record(run.next_seq, message, stamp)
        run.next_seq += 1
        data = encode(record)
        _, messages, current = self._run_files(run)
        durable = self.writer.append(messages, data, durable=True)
        run.messages_bytes += len(data)
        if in_context(record):
            line = encode(context_line(record))
            self.writer.append_nowait(current, line)
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

    def emit_message(self, run: RunState, record: dict[str, Any]) -> None:
        self._emit("message", run, at=record["timestamp"], **_event_fields(record))

    def _run_files(self, run: RunState) -> tuple[Path, Path, Path]:
        """The run's folder and its two message stores, joined once per folder (not per append)."""
        files = self._files.get(run.run_id)
        if files is None or files[0] is not run.dir:
            files = self._files[run.run_id] = (run.dir, run.dir / layout.MESSAGES, run.dir / layout.CURRENT)
        return files

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
        await self.ledger.add_usage(run.run_id, clean, iso(self.clock()))

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
        entry.updated_at = iso(self.clock())
        self.registry.touch(key)
        await self.registry.flush()
        return entry

    # -- reading stores -------------------------------------------------------------------------

    async def locate_run(self, run_id: str) -> tuple[dict[str, Any], Path | None]:
        """The ledger row and the folder (None when archived or missing)."""
        row = await self.ledger.get_run(run_id)
        if row is None:
            raise NotFound(f"no run {run_id!r}; list runs with GET /v1/runs", code="run_not_found")
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

    def _ledger_row(self, run: RunState) -> dict[str, Any]:
        return {
            "uuid": run.run_id,
            "status": run.status,
            **run.task_key.as_dict(),
            "created_at": run.started_at,
            "updated_at": run.started_at,
            "metadata": json.dumps(self._metadata(run), ensure_ascii=False),
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
    record["tokens"] = estimate_message(record)
    return record


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


def _create_run_folder(folder: Path, metadata: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=False)
    write_json_atomic(folder / layout.METADATA, metadata)
    (folder / layout.MESSAGES).touch()
    fsync_dir(folder)
    fsync_dir(folder.parent)


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))


async def _run_hook(kind: str, name: str, hook: RunHook, run: RunState) -> None:
    try:
        await hook(run)
    except Exception:  # a broken hook must not stop the lifecycle change; it is logged
        log.exception("%s hook %r failed for run %s", kind, name, run.run_id)
