"""Token usage per UTC day, agent and key in PostgreSQL (the ``UsageRecords`` capability): the
``usage_daily`` table of migration 2, added to by ``add_usage`` in the transaction that adds the
run's totals, read by ``GET /v1/usage`` and the daily budgets."""

from __future__ import annotations

import asyncpg

from sessions.postgres.faults import unavailable
from sessions.postgres.state import PgState
from sessions.records import USAGE_KEYS
from sessions.usage import ALL_USAGE, USAGE_COLUMNS, DailyKey, DailyUsage, UsageQuery, daily_row

MIGRATION = """
CREATE TABLE usage_daily (
    day text NOT NULL,
    agent_id text NOT NULL,
    session_key text NOT NULL,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    cache_write_tokens bigint NOT NULL DEFAULT 0,
    calls bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (day, agent_id, session_key)
);
CREATE INDEX usage_daily_key ON usage_daily (session_key, day);
"""

_ADD = (
    "INSERT INTO usage_daily AS u (day, agent_id, session_key, input_tokens, output_tokens, cache_read_tokens,"
    " cache_write_tokens, calls) VALUES ($1, $2, $3, $4, $5, $6, $7, 1)"
    " ON CONFLICT (day, agent_id, session_key) DO UPDATE SET"
    " input_tokens = u.input_tokens + excluded.input_tokens, output_tokens = u.output_tokens + excluded.output_tokens,"
    " cache_read_tokens = u.cache_read_tokens + excluded.cache_read_tokens,"
    " cache_write_tokens = u.cache_write_tokens + excluded.cache_write_tokens, calls = u.calls + 1"
)


async def add_daily(conn: asyncpg.Connection, where: DailyKey, usage: dict[str, int]) -> None:
    """One model call's usage added to its day, agent and key (in the caller's transaction)."""
    await conn.execute(_ADD, where.day, where.agent_id, where.session_key, *(usage.get(k, 0) for k in USAGE_KEYS))


class PgUsage:
    def __init__(self, state: PgState) -> None:
        self.state = state

    async def daily_usage(self, query: UsageQuery = ALL_USAGE) -> list[DailyUsage]:
        since, until = query.since, query.until
        clauses: list[str] = []
        values: list[str] = []
        for column, value in (
            ("agent_id =", query.agent_id),
            ("session_key =", query.session_key),
            ("day >=", since.isoformat() if since else None),
            ("day <=", until.isoformat() if until else None),
        ):
            if value is not None:
                values.append(value)
                clauses.append(f"{column} ${len(values)}")
        group = {"key": ["day", "agent_id", "session_key"], "agent": ["day", "agent_id"], "day": ["day"]}[query.by]
        columns = ", ".join(group)
        sums = ", ".join(f"SUM({k})::bigint AS {k}" for k in USAGE_COLUMNS)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {columns}, {sums} FROM usage_daily {where} GROUP BY {columns} ORDER BY {columns}"
        with unavailable("nothing was read"):
            rows = await self.state.pool.fetch(sql, *values)
        return [daily_row(r["day"], r.get("agent_id"), r.get("session_key"), dict(r)) for r in rows]

    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
        with unavailable("the message was not stored"):  # its budget could not be checked
            row = await self.state.pool.fetchrow(
                "SELECT COALESCE(SUM(input_tokens + output_tokens), 0)::bigint,"
                " COALESCE(SUM(CASE WHEN session_key = $3 THEN input_tokens + output_tokens ELSE 0 END), 0)::bigint"
                " FROM usage_daily WHERE day = $1 AND agent_id = $2",
                day,
                agent_id,
                session_key,
            )
        return (int(row[0]), int(row[1])) if row else (0, 0)
