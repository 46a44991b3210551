"""The PostgreSQL store's reads by run id (base capability): run rows and listings, the keys runs
were on, the runs a new one inherits from, a run's messages and records, its final summary."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, cast

from config.clock import iso
from config.errors import RunNotFound
from sessions.postgres.faults import unavailable
from sessions.postgres.state import PgState
from sessions.protocol import RecordKind
from sessions.records import NEWEST_RUNS, KnownKey, RunQuery, RunRow, StoredRecord, TaskKey

RUN_COLUMNS = (
    "run_id AS uuid",
    "status",
    "task_type",
    "task_identifier",
    "repository",
    '"user"',
    "created_at",
    "updated_at",
    "completed_at",
    "metadata",
    "total_messages",
    "total_summaries",
    "total_tool_calls",
    "final_token_count",
    "final_message_count",
    "error_message",
    "session_key",
    "agent_id",
    "channel",
    "chat_type",
    "parent_uuid",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "compaction_count",
    "pinned",
    "archived_at",
)  # fmt: skip; the tasks.db columns, the same names (RunRow)
SELECT_RUN = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"

# A run's records by kind -> (table, order)
_RECORDS: dict[RecordKind, tuple[str, str]] = {
    "summaries": ("summaries", "id"),
    "tools": ("tool_calls", "seq"),
    "planning": ("plans", "id"),
}


class PgReads:
    def __init__(self, state: PgState) -> None:
        self.state = state

    async def get_run(self, run_id: str) -> RunRow | None:
        with unavailable("nothing was read"):
            row = await self.state.pool.fetchrow(f"{SELECT_RUN} WHERE run_id = $1", run_id)
        return cast(RunRow, dict(row)) if row is not None else None

    async def list_runs(self, query: RunQuery = NEWEST_RUNS) -> list[RunRow]:
        """The runs ``query`` names, newest first by (created_at, run_id)."""
        clauses: list[str] = []
        values: list[Any] = []
        if query.session_key is not None:
            values.append(query.session_key)
            clauses.append(f"session_key = ${len(values)}")
        if query.statuses:
            values.append(list(query.statuses))
            clauses.append(f"status = ANY(${len(values)}::text[])")
        if query.before is not None:
            values.extend(query.before)
            clauses.append(f"(created_at, run_id) < (${len(values) - 1}, ${len(values)})")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        values.append(query.limit)
        sql = f"{SELECT_RUN} {where} ORDER BY created_at DESC, run_id DESC LIMIT ${len(values)}"
        with unavailable("nothing was read"):
            rows = await self.state.pool.fetch(sql, *values)
        return [cast(RunRow, dict(row)) for row in rows]

    async def known_keys(self) -> list[KnownKey]:
        sql = "SELECT session_key, max(agent_id), max(chat_type) FROM runs WHERE session_key IS NOT NULL GROUP BY 1"
        with unavailable("nothing was read"):
            rows = await self.state.pool.fetch(sql)
        return [KnownKey(r[0], r[1], r[2]) for r in rows]

    async def require_run(self, run_id: str) -> RunRow:
        row = await self.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
        return row

    async def previous_runs(self, *, key: str, task_key: TaskKey | None, within_days: float) -> list[RunRow]:
        """A deleted session's runs have ``inherit`` false."""
        since = iso(self.state.clock() - timedelta(days=within_days))
        values: list[object] = [since, key]
        match = "session_key = $2"
        if task_key is not None:
            values += [task_key.task_type, task_key.task_identifier, task_key.repository, task_key.user]
            match += (
                " OR (task_type = $3 AND task_identifier IS NOT DISTINCT FROM $4"
                ' AND repository IS NOT DISTINCT FROM $5 AND "user" IS NOT DISTINCT FROM $6)'
            )
        sql = (
            f"{SELECT_RUN} WHERE status IN ('completed', 'failed') AND completed_at >= $1 AND inherit AND ({match})"
            " ORDER BY completed_at DESC, created_at DESC"
        )
        with unavailable("nothing was read"):
            rows = await self.state.pool.fetch(sql, *values)
        return [cast(RunRow, dict(row)) for row in rows]

    async def read_messages(self, run_id: str, *, after_seq: int, limit: int) -> list[StoredRecord]:
        await self.require_run(run_id)
        with unavailable("nothing was read"):
            rows = await self.state.pool.fetch(
                "SELECT record::text FROM messages WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                run_id,
                after_seq,
                limit,
            )
        return [json.loads(row[0]) for row in rows]

    async def read_records(self, run_id: str, kind: RecordKind) -> list[StoredRecord]:
        await self.require_run(run_id)
        table, order = _RECORDS[kind]
        with unavailable("nothing was read"):
            sql = f"SELECT record::text FROM {table} WHERE run_id = $1 ORDER BY {order}"
            rows = await self.state.pool.fetch(sql, run_id)
        return [json.loads(row[0]) for row in rows]

    async def read_final_summary(self, run_id: str) -> str | None:
        await self.require_run(run_id)
        with unavailable("nothing was read"):
            text = await self.state.pool.fetchval("SELECT final_summary FROM runs WHERE run_id = $1", run_id)
        return str(text) if text is not None else None
