"""Token usage per UTC day, agent and session key: tasks.db's ``usage_daily`` table (ledger
migration 6). The statements run on the ledger thread (``Ledger.add_usage``, ``Ledger.execute``);
``GET /v1/usage`` and the daily budgets (``agents.<id>.limits``) read them.

Model calls are counted from the day the table exists (runs before the upgrade keep their totals
in ``tasks``, without a day)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

from sessions.records import USAGE_KEYS

UsageBy = Literal["key", "agent", "day"]
USAGE_COLUMNS = (*USAGE_KEYS, "calls")

MIGRATION = """
CREATE TABLE usage_daily (
    day TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    session_key TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, agent_id, session_key)
);
CREATE INDEX idx_usage_daily_key ON usage_daily(session_key, day);
"""

_ADD = (
    "INSERT INTO usage_daily (day, agent_id, session_key, input_tokens, output_tokens, cache_read_tokens,"
    " cache_write_tokens, calls) VALUES (?, ?, ?, ?, ?, ?, ?, 1)"
    " ON CONFLICT (day, agent_id, session_key) DO UPDATE SET"
    " input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,"
    " cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,"
    " cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens, calls = calls + 1"
)


def usage_day(now: datetime) -> str:
    """The UTC day a usage at ``now`` counts toward (``YYYY-MM-DD``)."""
    return now.astimezone(UTC).date().isoformat()


@dataclass(frozen=True)
class DailyKey:
    day: str
    agent_id: str
    session_key: str


def add(conn: sqlite3.Connection, where: DailyKey, usage: dict[str, int]) -> None:
    """One model call's usage added to its day, agent and key."""
    conn.execute(_ADD, [where.day, where.agent_id, where.session_key, *(int(usage.get(k, 0)) for k in USAGE_KEYS)])


def spent(conn: sqlite3.Connection, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
    """Input plus output tokens of ``day``: the agent's (every key), and the key's."""
    row = conn.execute(
        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0),"
        " COALESCE(SUM(CASE WHEN session_key = ? THEN input_tokens + output_tokens ELSE 0 END), 0)"
        " FROM usage_daily WHERE day = ? AND agent_id = ?",
        (session_key, day, agent_id),
    ).fetchone()
    return int(row[0]), int(row[1])


def rows(
    conn: sqlite3.Connection,
    *,
    agent_id: str | None = None,
    session_key: str | None = None,
    since: date | None = None,
    until: date | None = None,
    by: UsageBy = "key",
) -> list[dict[str, Any]]:
    """Usage per day and ``by`` (``key``: per agent and key; ``agent``: the keys of an agent summed;
    ``day``: everything of a day summed), oldest day first; ``since`` and ``until`` inclusive."""
    clauses, values = [], []
    for column, value in (("agent_id", agent_id), ("session_key", session_key)):
        if value is not None:
            clauses.append(f"{column} = ?")
            values.append(value)
    if since is not None:
        clauses.append("day >= ?")
        values.append(since.isoformat())
    if until is not None:
        clauses.append("day <= ?")
        values.append(until.isoformat())
    group = {"key": ["day", "agent_id", "session_key"], "agent": ["day", "agent_id"], "day": ["day"]}[by]
    sums = ", ".join(f"SUM({k}) AS {k}" for k in USAGE_COLUMNS)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    columns = ", ".join(group)
    sql = f"SELECT {columns}, {sums} FROM usage_daily {where} GROUP BY {columns} ORDER BY {columns}"
    out = []
    for row in conn.execute(sql, values):
        item = dict(row)
        item["agent"] = item.pop("agent_id", None)
        item["key"] = item.pop("session_key", None)
        item["total_tokens"] = item["input_tokens"] + item["output_tokens"]
        out.append(item)
    return out
