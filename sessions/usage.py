"""Token usage per UTC day, agent and session key (the ``UsageRecords`` capability of
``sessions.protocol``): the files backend's tasks.db ``usage_daily`` table (ledger migration 6,
whose statements run on the ledger thread: ``Ledger.add_usage``, ``Ledger.execute``), PostgreSQL's
``usage_daily`` table (``sessions.postgres.schema``), the in-memory backend's :func:`tally`.
``GET /v1/usage`` and the daily budgets (``agents.<id>.limits``) read them.

Model calls are counted from the day the table exists (runs before the upgrade keep their totals
in ``tasks``, without a day)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal, TypedDict

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


class DailyUsage(TypedDict):
    """One row of usage: ``agent`` and ``key`` are None where ``by`` summed them."""

    day: str
    agent: str | None
    key: str | None
    total_tokens: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    calls: int


def daily_row(day: str, agent: str | None, key: str | None, sums: Mapping[str, int]) -> DailyUsage:
    counts = {k: int(sums.get(k) or 0) for k in USAGE_COLUMNS}
    return DailyUsage(
        day=day,
        agent=agent,
        key=key,
        total_tokens=counts["input_tokens"] + counts["output_tokens"],
        input_tokens=counts["input_tokens"],
        output_tokens=counts["output_tokens"],
        cache_read_tokens=counts["cache_read_tokens"],
        cache_write_tokens=counts["cache_write_tokens"],
        calls=counts["calls"],
    )


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


@dataclass(frozen=True)
class UsageQuery:
    """What ``UsageRecords.daily_usage`` is asked: per day and ``by`` (``key``: per agent and key;
    ``agent``: the keys of an agent summed; ``day``: everything of a day summed), of one agent or
    key or all, ``since`` and ``until`` inclusive."""

    agent_id: str | None = None
    session_key: str | None = None
    since: date | None = None
    until: date | None = None
    by: UsageBy = "key"


ALL_USAGE = UsageQuery()  # every agent's and key's usage, per key


class UsageBook:
    """``UsageRecords`` over the two lookups a backend makes its own way: the rows of a
    ``UsageQuery``, and the tokens an agent and a key spent on a day."""

    def __init__(
        self,
        rows: Callable[[UsageQuery], Awaitable[list[DailyUsage]]],
        spent: Callable[[str, str, str], Awaitable[tuple[int, int]]],
    ) -> None:
        self._rows = rows
        self._spent = spent

    async def daily_usage(self, query: UsageQuery = ALL_USAGE) -> list[DailyUsage]:
        return await self._rows(query)

    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
        return await self._spent(day, agent_id, session_key)


def rows(conn: sqlite3.Connection, query: UsageQuery) -> list[DailyUsage]:
    """The query's rows of ``usage_daily``, oldest day first."""
    clauses, values = [], []
    for column, value in (("agent_id", query.agent_id), ("session_key", query.session_key)):
        if value is not None:
            clauses.append(f"{column} = ?")
            values.append(value)
    if query.since is not None:
        clauses.append("day >= ?")
        values.append(query.since.isoformat())
    if query.until is not None:
        clauses.append("day <= ?")
        values.append(query.until.isoformat())
    group = {"key": ["day", "agent_id", "session_key"], "agent": ["day", "agent_id"], "day": ["day"]}[query.by]
    sums = ", ".join(f"SUM({k}) AS {k}" for k in USAGE_COLUMNS)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    columns = ", ".join(group)
    sql = f"SELECT {columns}, {sums} FROM usage_daily {where} GROUP BY {columns} ORDER BY {columns}"
    out = []
    for row in conn.execute(sql, values):
        item = dict(row)
        out.append(daily_row(item["day"], item.get("agent_id"), item.get("session_key"), item))
    return out


def tally(counts: Iterable[tuple[DailyKey, Mapping[str, int]]], query: UsageQuery) -> list[DailyUsage]:
    """:func:`rows` over counts kept in memory (each ``DailyKey``'s ``USAGE_COLUMNS``)."""
    agent_id, session_key, by = query.agent_id, query.session_key, query.by
    low = query.since.isoformat() if query.since else ""
    high = query.until.isoformat() if query.until else "9999-12-31"
    groups: dict[tuple[str, str | None, str | None], dict[str, int]] = {}
    for where, sums in counts:
        if (agent_id is not None and where.agent_id != agent_id) or (
            session_key is not None and where.session_key != session_key
        ):
            continue
        if not low <= where.day <= high:
            continue
        agent = None if by == "day" else where.agent_id
        group = groups.setdefault((where.day, agent, where.session_key if by == "key" else None), {})
        for k in USAGE_COLUMNS:
            group[k] = group.get(k, 0) + int(sums.get(k) or 0)
    return [daily_row(day, agent, key, sums) for (day, agent, key), sums in sorted(groups.items(), key=_order)]


def _order(item: tuple[tuple[str, str | None, str | None], dict[str, int]]) -> tuple[str, str, str]:
    (day, agent, key), _ = item
    return day, agent or "", key or ""


def tokens_of(
    counts: Iterable[tuple[DailyKey, Mapping[str, int]]], day: str, agent_id: str, key: str
) -> tuple[int, int]:
    """:func:`spent` over counts kept in memory."""
    agent_total = key_total = 0
    for where, sums in counts:
        if where.day == day and where.agent_id == agent_id:
            spent_here = int(sums.get("input_tokens") or 0) + int(sums.get("output_tokens") or 0)
            agent_total += spent_here
            key_total += spent_here if where.session_key == key else 0
    return agent_total, key_total
