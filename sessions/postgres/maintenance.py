"""The PostgreSQL store's ``Maintenance`` capability, as far as it goes on a database: purge (every
row of a key in one transaction, the history index rows with its runs, a tombstone without
content), export, cleanup and the doctor (``sessions.postgres.doctor``)."""

from __future__ import annotations

import logging
from typing import Any

from config.clock import iso
from config.errors import SessionNotFound
from sessions.postgres.faults import unavailable
from sessions.postgres.lifecycle import PgLifecycle
from sessions.records import StoredRecord

log = logging.getLogger(__name__)

# the tables with a session_key column besides runs (whose rows cascade to messages, the context,
# summaries, archives, tool calls, plans and the history index)
KEYED_TABLES = ("idempotency", "hook_deliveries", "openai_conversations", "openai_responses")


class PgMaintenance(PgLifecycle):
    async def purge(self, key: str, *, history: Any = None) -> StoredRecord:
        """Erase ``key`` for good (``SessionNotFound`` when neither an entry nor a run of it exists);
        the tombstone ``{session_key, deleted_at, runs, messages}``. ``history`` (the index) needs
        nothing: its rows go with the runs. The caller holds the key's lock."""
        with unavailable("nothing"):
            rows = await self.pool.fetch("SELECT run_id, total_messages FROM runs WHERE session_key = $1", key)
        if self.entry(key) is None and not rows:
            raise SessionNotFound(f"no session or run with key {key!r}")
        if self.active_run(key) is not None:
            await self.complete(key, reason="purge", summarize=False)
        stamp = iso(self.clock())
        with unavailable("nothing"):
            async with self.pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch("DELETE FROM runs WHERE session_key = $1 RETURNING run_id, total_messages", key)
                for table in KEYED_TABLES:
                    await conn.execute(f"DELETE FROM {table} WHERE session_key = $1", key)
                await conn.execute("DELETE FROM entries WHERE key = $1", key)
                run_ids: list[str | None] = [r["run_id"] for r in rows] or [None]
                await conn.executemany(
                    "INSERT INTO purge_tombstones (session_key, run_id, purged_at, reason)"
                    " VALUES ($1, $2, $3, 'purge')",
                    [(key, run_id, stamp) for run_id in run_ids],
                )
        self._entries.pop(key, None)
        self._dirty.discard(key)
        tombstone = {
            "session_key": key,
            "deleted_at": stamp,
            "runs": len(rows),
            "messages": sum(int(r["total_messages"] or 0) for r in rows),
        }
        log.info("purged session %s: %d run(s), %d message(s)", key, tombstone["runs"], tombstone["messages"])
        return tombstone

    async def tombstones(self, key: str | None = None) -> list[StoredRecord]:
        sql = "SELECT session_key, run_id, purged_at FROM purge_tombstones"
        with unavailable("nothing"):
            rows = await (self.pool.fetch(sql + " WHERE session_key = $1 ORDER BY id", key) if key is not None
                          else self.pool.fetch(sql + " ORDER BY id"))  # fmt: skip
        return [dict(r) for r in rows]
