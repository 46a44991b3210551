"""The PostgreSQL store's reads (core capability): run rows, the keys runs were on, and a run's
stores. Today's protocol reads a run's stores through a folder (``locate_run`` gives one); here the
folder is only a handle whose name is the run id, and the store names map onto tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from config.errors import NotFound, RunNotFound
from sessions import layout
from sessions.jsonl import decode
from sessions.postgres.appends import PgAppends
from sessions.postgres.faults import unavailable
from sessions.records import KnownKey, RunRow

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

# A store's file name -> (table, the JSON column, the order)
_STORES = {
    layout.MESSAGES: ("messages", "record", "seq"),
    layout.CURRENT: ("context_lines", "line", "pos"),
    layout.SUMMARIES: ("summaries", "record", "id"),
    layout.TOOLS: ("tool_calls", "record", "seq"),
    layout.PLANNING: ("plans", "record", "id"),
}


class PgReads(PgAppends):
    async def get_run(self, run_id: str) -> RunRow | None:
        with unavailable("the read"):
            row = await self.pool.fetchrow(f"{SELECT_RUN} WHERE run_id = $1", run_id)
        return cast(RunRow, dict(row)) if row is not None else None

    async def list_runs(
        self,
        *,
        session_key: str | None = None,
        statuses: Sequence[str] = (),
        limit: int = 50,
        before: tuple[str, str] | None = None,
    ) -> list[RunRow]:
        """Newest first by (created_at, uuid); ``before`` is the cursor of the last row seen."""
        clauses: list[str] = []
        values: list[Any] = []
        if session_key is not None:
            values.append(session_key)
            clauses.append(f"session_key = ${len(values)}")
        if statuses:
            values.append(list(statuses))
            clauses.append(f"status = ANY(${len(values)}::text[])")
        if before is not None:
            values.extend(before)
            clauses.append(f"(created_at, run_id) < (${len(values) - 1}, ${len(values)})")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        values.append(limit)
        sql = f"{SELECT_RUN} {where} ORDER BY created_at DESC, run_id DESC LIMIT ${len(values)}"
        with unavailable("the read"):
            rows = await self.pool.fetch(sql, *values)
        return [cast(RunRow, dict(row)) for row in rows]

    async def known_keys(self) -> list[KnownKey]:
        sql = "SELECT session_key, max(agent_id), max(chat_type) FROM runs WHERE session_key IS NOT NULL GROUP BY 1"
        with unavailable("the read"):
            rows = await self.pool.fetch(sql)
        return [KnownKey(r[0], r[1], r[2]) for r in rows]

    async def locate_run(self, run_id: str) -> tuple[RunRow, Path | None]:
        """The row, and the handle its stores are read through (``read_store``, ``read_messages``)."""
        row = await self.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
        return row, self.staging_dir(run_id)

    async def read_store(self, folder: Path, name: str) -> list[dict[str, Any]]:
        run_id = folder.name
        with unavailable("the read"):
            if name.startswith(f"{layout.COMPACTIONS}/"):
                text = await self.pool.fetchval(
                    "SELECT lines::text FROM context_archives WHERE run_id = $1 AND name = $2", run_id, name
                )
                return list(decode(text.encode())) if text is not None else []
            if name not in _STORES:
                raise NotFound(f"a run has no store {name!r}; stores: {', '.join(sorted(_STORES))}")
            table, column, order = _STORES[name]
            rows = await self.pool.fetch(
                f"SELECT {column}::text FROM {table} WHERE run_id = $1 ORDER BY {order}", run_id
            )
        return [decode(row[0].encode()) for row in rows]

    async def read_messages(self, folder: Path, *, after_seq: int, limit: int) -> list[dict[str, Any]]:
        with unavailable("the read"):
            rows = await self.pool.fetch(
                "SELECT record::text FROM messages WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                folder.name,
                after_seq,
                limit,
            )
        return [decode(row[0].encode()) for row in rows]

    async def final_summary(self, run_id: str) -> str | None:
        with unavailable("the read"):
            text = await self.pool.fetchval("SELECT final_summary FROM runs WHERE run_id = $1", run_id)
        return str(text) if text is not None else None
