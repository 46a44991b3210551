"""The PostgreSQL backend's side of ``sessions.copying``: a database read whole into a
``Snapshot``, and a ``Snapshot`` written into an empty database in one transaction (nothing is
left behind when it fails). Lines go in and come out as the text they were stored as."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from sessions.copy_snapshot import RECORD_TABLES, USAGE_FIELDS, RunCopy, Snapshot, line_text
from sessions.postgres.schema import migrate
from sessions.records import RUN_COLUMNS

# the ledger's columns under their PostgreSQL names (``uuid`` is ``run_id`` there)
_RUN_COLUMNS = tuple("run_id" if c == "uuid" else c for c in RUN_COLUMNS)
_ACTIVE = ("running", "paused")
_RECORD_ORDER = {"openai_responses": "ord"}  # what keeps the insertion order of a table


async def dump(conn: asyncpg.Connection) -> Snapshot:
    """Everything the database holds, in one repeatable-read transaction."""
    snapshot = Snapshot()
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        runs = await conn.fetch("SELECT * FROM runs ORDER BY created_at, run_id")
        for row in runs:
            run_id = row["run_id"]
            copy = RunCopy(row={c: row[p] for c, p in zip(RUN_COLUMNS, _RUN_COLUMNS, strict=True)})
            copy.final_summary = row["final_summary"]
            copy.messages = await _texts(
                conn, "SELECT record::text FROM messages WHERE run_id = $1 ORDER BY seq", run_id
            )
            copy.context = await _texts(
                conn, "SELECT line::text FROM context_lines WHERE run_id = $1 ORDER BY pos", run_id
            )
            copy.summaries = await _texts(
                conn, "SELECT record::text FROM summaries WHERE run_id = $1 ORDER BY id", run_id
            )
            copy.tools = await _texts(
                conn, "SELECT record::text FROM tool_calls WHERE run_id = $1 ORDER BY seq", run_id
            )
            copy.plans = await _texts(conn, "SELECT record::text FROM plans WHERE run_id = $1 ORDER BY id", run_id)
            for name, lines in await conn.fetch(
                "SELECT name, lines::text FROM context_archives WHERE run_id = $1 ORDER BY name", run_id
            ):
                copy.archives[name] = [line_text(line) for line in json.loads(lines)]
            snapshot.runs.append(copy)
        snapshot.entries = {
            key: json.loads(body) for key, body in await conn.fetch("SELECT key, body::text FROM entries")
        }
        for table in RECORD_TABLES:
            order = _RECORD_ORDER.get(table, "1")
            rows = await conn.fetch(f"SELECT * FROM {table} ORDER BY {order}")
            snapshot.records[table] = [{k: v for k, v in dict(r).items() if k != "ord"} for r in rows]
        usage = await conn.fetch(f"SELECT {', '.join(USAGE_FIELDS)} FROM usage_daily ORDER BY 1, 2, 3")
        snapshot.usage = [{k: (int(v) if k not in _USAGE_TEXT else v) for k, v in dict(r).items()} for r in usage]
        snapshot.tombstones = [
            {"session_key": r["session_key"], "deleted_at": r["purged_at"], "runs": int(r["runs"]),
             "messages": int(r["messages"])}
            for r in await conn.fetch(_TOMBSTONES)
        ]  # fmt: skip
    return snapshot


_USAGE_TEXT = ("day", "agent_id", "session_key")
# one tombstone per purge (a purge writes a row per run id, each with the purge's totals; a row
# from before migration 4 has no totals: its runs are its rows, its messages unknown, 0)
_TOMBSTONES = (
    "SELECT session_key, purged_at, coalesce(max(runs), count(run_id)) AS runs,"
    " coalesce(max(messages), 0) AS messages FROM purge_tombstones"
    " GROUP BY session_key, purged_at ORDER BY min(id)"
)


async def _texts(conn: asyncpg.Connection, sql: str, run_id: str) -> list[str]:
    return [str(r[0]) for r in await conn.fetch(sql, run_id)]


async def is_empty(conn: asyncpg.Connection, where: str) -> str | None:
    """None when the database has no neotask schema yet or no run, entry or record; else what it holds."""
    if not await conn.fetchval("SELECT to_regclass('runs') IS NOT NULL"):
        return None
    runs = int(await conn.fetchval("SELECT count(*) FROM runs"))
    entries = int(await conn.fetchval("SELECT count(*) FROM entries"))
    records = 0
    for table in (*RECORD_TABLES, "usage_daily", "purge_tombstones"):
        if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
            records += int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    if runs or entries or records:
        return f"{where} already holds {runs} runs, {entries} sessions and {records} records"
    return None


async def load(conn: asyncpg.Connection, snapshot: Snapshot, where: str) -> None:
    """Write ``snapshot`` into the database (migrated first), all or nothing."""
    await migrate(conn, where)
    async with conn.transaction():
        for run in snapshot.runs:
            await _insert_run(conn, run, snapshot.entries.get(str(run.row.get("session_key") or "")))
        if snapshot.entries:
            await conn.executemany(
                "INSERT INTO entries (key, body) VALUES ($1, $2::json)",
                [(key, line_text(body)) for key, body in snapshot.entries.items()],
            )
        for table in RECORD_TABLES:
            rows = snapshot.records[table]
            if not rows:
                continue
            names = list(rows[0])
            quoted = ", ".join(f'"{n}"' for n in names)
            marks = ", ".join(f"${i}" for i in range(1, len(names) + 1))
            await conn.executemany(
                f"INSERT INTO {table} ({quoted}) VALUES ({marks})",
                [tuple(row.get(n) for n in names) for row in rows],
            )
        await conn.executemany(
            f"INSERT INTO usage_daily ({', '.join(USAGE_FIELDS)}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            [tuple(row[k] for k in USAGE_FIELDS) for row in snapshot.usage],
        )
        await conn.executemany(  # one row per purge: the run ids are not known on every backend
            "INSERT INTO purge_tombstones (session_key, run_id, purged_at, reason, runs, messages)"
            " VALUES ($1, NULL, $2, 'purge', $3, $4)",
            [(t["session_key"], t["deleted_at"], t["runs"], t["messages"]) for t in snapshot.tombstones],
        )


async def _insert_run(conn: asyncpg.Connection, run: RunCopy, entry: dict[str, Any] | None) -> None:
    row = dict(zip(_RUN_COLUMNS, (run.row.get(c) for c in RUN_COLUMNS), strict=True))
    messages = [json.loads(text) for text in run.messages]
    context = [json.loads(text) for text in run.context]
    in_context = [int(line["seq"]) for line in context if isinstance(line, dict) and isinstance(line.get("seq"), int)]
    summary_ids = [int(s["id"]) for s in map(json.loads, run.summaries) if isinstance(s.get("id"), int)]
    active_entry = entry if entry is not None and entry.get("run_id") == run.run_id else None
    row.update(
        final_summary=run.final_summary,
        # the live counters an active run carries on (an ended run keeps them for the record)
        next_seq=max((int(m["seq"]) for m in messages), default=0) + 1,
        next_pos=len(context) + 1,
        context_lines=len(context),
        context_bytes=sum(len(text.encode("utf-8")) + 1 for text in run.context),
        context_tokens=int(active_entry["context_tokens"])
        if active_entry
        else sum(int(line.get("tokens") or 0) for line in context if isinstance(line, dict)),
        last_context_seq=max(in_context, default=0),
        last_summary_id=max(summary_ids, default=0),
        messages_bytes=sum(len(text.encode("utf-8")) + 1 for text in run.messages),
        next_tool_seq=len(run.tools) + 1,
        next_plan_id=len(run.plans) + 1,
    )
    names = list(row)
    quoted = ", ".join(f'"{n}"' for n in names)
    marks = ", ".join(f"${i}" for i in range(1, len(names) + 1))
    await conn.execute(f"INSERT INTO runs ({quoted}) VALUES ({marks})", *row.values())
    run_id = run.run_id
    await conn.executemany(
        "INSERT INTO messages (run_id, seq, created_at, client_message_id, reply_to, record)"
        " VALUES ($1, $2, $3, $4, $5, $6::json)",
        [
            (
                run_id,
                int(m["seq"]),
                str(m.get("timestamp") or row["created_at"]),
                m.get("client_message_id"),
                m.get("reply_to"),
                text,
            )
            for m, text in zip(messages, run.messages, strict=True)
        ],
    )
    await conn.executemany(
        "INSERT INTO context_lines (run_id, pos, line) VALUES ($1, $2, $3::json)",
        [(run_id, pos, text) for pos, text in enumerate(run.context, start=1)],
    )
    for table, key_name, lines in (("summaries", "id", run.summaries), ("tool_calls", "seq", run.tools),
                                   ("plans", "id", run.plans)):  # fmt: skip
        await conn.executemany(
            f"INSERT INTO {table} (run_id, {key_name}, record) VALUES ($1, $2, $3::json)",
            [(run_id, _number(text, key_name, n), text) for n, text in enumerate(lines, start=1)],
        )
    await conn.executemany(
        "INSERT INTO context_archives (run_id, name, lines) VALUES ($1, $2, $3::json)",
        [(run_id, name, "[" + ",".join(lines) + "]") for name, lines in run.archives.items()],
    )


def _number(text: str, key_name: str, fallback: int) -> int:
    value = json.loads(text).get(key_name)
    return int(value) if isinstance(value, int) else fallback
