"""The in-memory store's ``Maintenance``: the doctor's checks of the data (seqs without gaps, one
active run per key, entries naming an active run), cleanup on ``sessions.cleanup_plan`` (as on
PostgreSQL: an archive marks the run archived, its records stay readable; an expired archive
drops the run), export (each run's records read back as the export writer wants them) and purge
(every run and record of a key, its index rows, a tombstone without content)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Protocol

from config.clock import Clock, iso
from config.errors import RunNotFound, SessionNotFound
from sessions.cleanup_plan import CleanupRequest, carry_out, describe, facts_in_place, plan_cleanup, records_cutoffs
from sessions.entries import SessionEntry
from sessions.exports import RunExport
from sessions.findings import finding
from sessions.history_index import HistoryIndexProtocol
from sessions.inmemory.data import MemoryData, StoredRun
from sessions.records import ACTIVE_STATUSES, PLAIN_FINISH, PURGE_FINISH, RUN_COLUMNS, RunFinish, RunState, StoredRecord

log = logging.getLogger(__name__)


class _Store(Protocol):
    """What the maintenance needs of the store it is part of."""

    data: MemoryData
    clock: Clock
    _entries: dict[str, SessionEntry]

    def entry(self, key: str) -> SessionEntry | None: ...
    def active_run(self, key: str) -> RunState | None: ...
    def _save_entries(self) -> None: ...
    async def complete(self, key: str, end: RunFinish = PLAIN_FINISH) -> RunState: ...


class MemoryRunReader:
    """``ExportReader`` over a stored run (copies: the run may go on meanwhile)."""

    def __init__(self, stored: StoredRun) -> None:
        self._messages = list(stored.messages)
        self._summaries = [dict(s) for s in stored.summaries]
        self._final = stored.final_summary

    def messages(self) -> Iterator[dict[str, Any]]:
        return iter(self._messages)

    def summaries(self) -> list[dict[str, Any]]:
        return list(self._summaries)

    def final_summary(self) -> str | None:
        return self._final


class MemoryMaintenance:
    """A part of ``MemoryStore``: the doctor, cleanup, export and purge, given the store."""

    def __init__(self, store: _Store) -> None:
        self.store = store

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        """The data's consistency (nothing on this backend tears: what a bug would leave)."""
        findings: list[StoredRecord] = []
        active: dict[str, list[str]] = {}
        for run_id, stored in self.store.data.runs.items():
            key = str(stored.row.get("session_key") or "")
            seqs = [int(r.get("seq") or 0) for r in stored.messages]
            if seqs != list(range(1, len(seqs) + 1)):
                detail = f"run {run_id} has {len(seqs)} message(s) but seqs up to {max(seqs)}: seqs are missing"
                findings.append(finding("seq_gaps", "error", detail, None, run_id=run_id, key=key))
            if stored.row["status"] in ACTIVE_STATUSES:
                active.setdefault(key, []).append(run_id)
        for key, runs in active.items():
            if len(runs) > 1:
                detail = f"key {key} has {len(runs)} active runs"
                findings.append(finding("active_runs", "error", detail, None, key=key))
        for entry in list(self.store._entries.values()):
            if entry.run_id is not None and self.store.active_run(entry.key) is None:
                detail = f"the entry of {entry.key} names run {entry.run_id}, which is not active"
                if fix:
                    entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
                    self.store._save_entries()
                findings.append(finding("entries", "warning", detail, "set the entry idle", key=entry.key, fixed=fix))
        return findings

    async def cleanup(self, request: CleanupRequest) -> list[StoredRecord]:
        data = self.store.data
        rows = ((run_id, stored.row) for run_id, stored in data.runs.items())
        actions = plan_cleanup(*facts_in_place(rows, self.store.entry), request.settings, request.now)
        if request.dry_run:
            return [{**describe(a), "done": False} for a in actions]

        async def archive(run_id: str) -> None:
            data.runs[run_id].row["archived_at"] = iso(self.store.clock())

        async def delete(run_id: str) -> None:
            data.runs.pop(run_id, None)
            if data.history is not None:
                for place in [p for p in data.history if p[0] == run_id]:
                    del data.history[place]

        report = await carry_out(actions, request, active=self.store.active_run, archive=archive, delete=delete)
        _forget_expired(self.store.data, request.now)
        return report

    async def export_runs(self, *, key: str | None = None, run_id: str | None = None) -> list[RunExport]:
        """Every run of ``key`` oldest first (archived ones too), or the run ``run_id``."""
        if run_id is not None:
            stored = self.store.data.runs.get(run_id)
            if stored is None:
                raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
            chosen = [stored]
        else:
            chosen = [s for s in self.store.data.runs.values() if s.row.get("session_key") == key]
            chosen.sort(key=lambda s: str(s.row["created_at"]))  # stable: creation order within a time
            if not chosen:
                raise SessionNotFound(f"no session or run with key {key!r}")
        return [RunExport({c: s.row.get(c) for c in RUN_COLUMNS}, MemoryRunReader(s)) for s in chosen]

    async def purge(self, key: str, *, history: HistoryIndexProtocol | None) -> StoredRecord:
        """Erase ``key`` for good (``SessionNotFound`` when neither an entry nor a run of it
        exists); the tombstone ``{session_key, deleted_at, runs, messages}``."""
        mine = [run_id for run_id, s in self.store.data.runs.items() if s.row.get("session_key") == key]
        if self.store.entry(key) is None and not mine:
            raise SessionNotFound(f"no session or run with key {key!r}")
        if self.store.active_run(key) is not None:
            await self.store.complete(key, PURGE_FINISH)
        messages = sum(len(self.store.data.runs.pop(run_id).messages) for run_id in mine)
        _forget_key(self.store.data, key)
        if history is not None:
            await history.delete_key(key)
        elif self.store.data.history is not None:
            for place in [p for p, row in self.store.data.history.items() if row[2] == key]:
                del self.store.data.history[place]
        self.store._entries.pop(key, None)
        self.store._save_entries()
        tombstone: StoredRecord = {"session_key": key, "deleted_at": iso(self.store.clock()), "runs": len(mine),
                                   "messages": messages}  # fmt: skip
        self.store.data.tombstones.append(dict(tombstone))
        log.info("purged session %s: %d run(s), %d message(s)", key, len(mine), messages)
        return tombstone


def _forget_key(data: MemoryData, key: str) -> None:
    """Every record of ``key`` beside its runs."""
    data.idempotency = {k: v for k, v in data.idempotency.items() if k[0] != key}
    data.hook_deliveries = {k: v for k, v in data.hook_deliveries.items() if v[2] != key}
    data.compat_conversations.pop(key, None)
    data.compat_responses = [(ref, at) for ref, at in data.compat_responses if ref.session_key != key]
    data.usage_daily = {k: v for k, v in data.usage_daily.items() if k.session_key != key}


def _forget_expired(data: MemoryData, now: datetime) -> None:
    """Idempotency and webhook delivery records past their window."""
    keys, hooks = records_cutoffs(now)
    data.idempotency = {k: v for k, v in data.idempotency.items() if v.created_at >= keys}
    data.hook_deliveries = {k: v for k, v in data.hook_deliveries.items() if v[1] >= hooks}
