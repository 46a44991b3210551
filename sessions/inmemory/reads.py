"""The in-memory backend's reads by run id: rows, listings, known keys, a run's records, the
context as the model sees it."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from config.clock import Clock, iso
from config.errors import RunNotFound
from sessions.context_lines import ContextLine, read_back
from sessions.inmemory.data import MemoryData, StoredRun
from sessions.protocol import RecordKind
from sessions.records import FINISHED_STATUSES, NEWEST_RUNS, KnownKey, RunQuery, RunRow, RunState, StoredRecord, TaskKey


class MemoryReads:
    """A part of ``MemoryStore``: its reads by run id, over its ``MemoryData``."""

    def __init__(self, data: MemoryData, clock: Clock) -> None:
        self.data = data
        self.clock = clock

    async def get_run(self, run_id: str) -> RunRow | None:
        stored = self.data.runs.get(run_id)
        return None if stored is None else cast(RunRow, dict(stored.row))

    async def require_run(self, run_id: str) -> RunRow:
        row = await self.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
        return row

    async def list_runs(self, query: RunQuery = NEWEST_RUNS) -> list[RunRow]:
        key, statuses, before = query.session_key, query.statuses, query.before
        rows = [
            cast(RunRow, dict(s.row))
            for s in self.data.runs.values()
            if (key is None or s.row.get("session_key") == key)
            and (not statuses or s.row["status"] in statuses)
            and (before is None or (s.row["created_at"], s.row["uuid"]) < before)
        ]
        rows.sort(key=lambda r: (r["created_at"], r["uuid"]), reverse=True)
        return rows[: query.limit]

    async def known_keys(self) -> list[KnownKey]:
        keys: dict[str, tuple[str | None, str | None]] = {}
        for stored in self.data.runs.values():
            key = stored.row.get("session_key")
            if key:
                agent, chat = keys.get(key, (None, None))
                keys[key] = (_max(agent, stored.row.get("agent_id")), _max(chat, stored.row.get("chat_type")))
        return [KnownKey(key, agent, chat) for key, (agent, chat) in sorted(keys.items())]

    async def previous_runs(self, *, key: str, task_key: TaskKey | None, within_days: float) -> list[RunRow]:
        since = iso(self.clock() - timedelta(days=within_days))
        wanted = task_key.as_dict() if task_key is not None else None
        rows = [
            s.row
            for s in self.data.runs.values()
            if s.row["status"] in FINISHED_STATUSES
            and str(s.row.get("completed_at") or "") >= since
            and s.metadata.get("inherit") is not False
            and (
                s.row.get("session_key") == key
                or (wanted is not None and all(s.row.get(k) == v for k, v in wanted.items()))
            )
        ]
        rows.sort(key=lambda r: (str(r.get("completed_at")), r["created_at"]), reverse=True)
        return [cast(RunRow, dict(r)) for r in rows]

    async def read_messages(self, run_id: str, *, after_seq: int, limit: int) -> list[StoredRecord]:
        stored = self._stored(run_id)
        return [dict(m) for m in stored.messages if int(m["seq"]) > after_seq][:limit]

    async def read_records(self, run_id: str, kind: RecordKind) -> list[StoredRecord]:
        stored = self._stored(run_id)
        records = {"summaries": stored.summaries, "tools": stored.tools, "planning": stored.planning}[kind]
        return [dict(r) for r in records]

    async def read_final_summary(self, run_id: str) -> str | None:
        return self._stored(run_id).final_summary

    async def read_context(self, run: RunState) -> list[ContextLine]:
        return read_back([dict(line) for line in self.data.runs[run.run_id].context])

    def _stored(self, run_id: str) -> StoredRun:
        stored = self.data.runs.get(run_id)
        if stored is None:
            raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
        return stored


def _max(a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else max(a, b)
