"""The PostgreSQL store's ``Maintenance`` capability, as far as it goes on a database: purge (every
row of a key in one transaction, the history index rows with its runs, a tombstone without
content), cleanup and the doctor's database checks (export is ``sessions.postgres.export``)."""

from __future__ import annotations

import logging
from typing import Any

from config.clock import iso
from config.errors import SessionNotFound
from sessions.cleanup_plan import CleanupRequest, carry_out, describe, facts_in_place, plan_cleanup, records_cutoffs
from sessions.findings import finding as _finding
from sessions.postgres.faults import unavailable
from sessions.postgres.lifecycle import PgLifecycle
from sessions.postgres.state import PgState
from sessions.records import PURGE_FINISH, StoredRecord

log = logging.getLogger(__name__)

# the tables with a session_key column besides runs (whose rows cascade to messages, the context,
# summaries, archives, tool calls, plans and the history index): a purge empties them of the key,
# as the files backend's does every table of tasks.db with a session_key column
KEYED_TABLES = ("idempotency", "hook_deliveries", "openai_conversations", "openai_responses", "usage_daily")


class PgMaintenance:
    def __init__(self, state: PgState, lifecycle: PgLifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    async def purge(self, key: str, *, history: Any = None) -> StoredRecord:
        """In one transaction (``SessionNotFound`` when neither an entry nor a run of ``key`` exists);
        the tombstone ``{session_key, deleted_at, runs, messages}``. ``history`` (the index) needs
        nothing: its rows go with the runs. The caller holds the key's lock."""
        with unavailable("nothing was stored"):
            rows = await self.state.pool.fetch("SELECT run_id, total_messages FROM runs WHERE session_key = $1", key)
        if self.state.entry(key) is None and not rows:
            raise SessionNotFound(f"no session or run with key {key!r}")
        if self.state.active_run(key) is not None:
            await self.lifecycle.complete(key, PURGE_FINISH)
        stamp = iso(self.state.clock())
        with unavailable("nothing was stored"):
            async with self.state.pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch("DELETE FROM runs WHERE session_key = $1 RETURNING run_id, total_messages", key)
                for table in KEYED_TABLES:
                    await conn.execute(f"DELETE FROM {table} WHERE session_key = $1", key)
                await conn.execute("DELETE FROM entries WHERE key = $1", key)
                run_ids: list[str | None] = [r["run_id"] for r in rows] or [None]
                messages = sum(int(r["total_messages"] or 0) for r in rows)
                await conn.executemany(
                    "INSERT INTO purge_tombstones (session_key, run_id, purged_at, reason, runs, messages)"
                    " VALUES ($1, $2, $3, 'purge', $4, $5)",
                    [(key, run_id, stamp, len(rows), messages) for run_id in run_ids],
                )
        self.state.entries.pop(key, None)
        self.state.dirty.discard(key)
        tombstone = {
            "session_key": key,
            "deleted_at": stamp,
            "runs": len(rows),
            "messages": messages,
        }
        log.info("purged session %s: %d run(s), %d message(s)", key, tombstone["runs"], tombstone["messages"])
        return tombstone

    async def tombstones(self, key: str | None = None) -> list[StoredRecord]:
        sql = "SELECT session_key, run_id, purged_at FROM purge_tombstones"
        with unavailable("nothing was stored"):
            rows = await (self.state.pool.fetch(sql + " WHERE session_key = $1 ORDER BY id", key) if key is not None
                          else self.state.pool.fetch(sql + " ORDER BY id"))  # fmt: skip
        return [dict(r) for r in rows]

    # -- cleanup (the plan of sessions.cleanup_plan; an archive is the run's rows marked archived) --

    async def cleanup(self, request: CleanupRequest) -> list[StoredRecord]:
        """The files backend's decisions (``plan_cleanup``) on the database: ``archive`` marks a
        run's row archived (its rows stay, readable; no tar.gz on this backend), ``delete_archive``
        deletes the run's rows (its messages, records and index rows with them); expired
        idempotency and webhook delivery records are forgotten."""
        with unavailable("nothing was stored"):
            rows = await self.state.pool.fetch(_FACTS)
        facts = facts_in_place(((r["run_id"], r) for r in rows), self.state.entry)
        actions = plan_cleanup(*facts, request.settings, request.now)
        if request.dry_run:
            return [{**describe(a), "done": False} for a in actions]
        pool = self.state.pool

        async def archive(run_id: str) -> None:
            with unavailable("nothing was stored"):
                await pool.execute(
                    "UPDATE runs SET archived_at = $2 WHERE run_id = $1", run_id, iso(self.state.clock())
                )

        async def delete(run_id: str) -> None:
            with unavailable("nothing was stored"):
                await pool.execute("DELETE FROM runs WHERE run_id = $1", run_id)

        report = await carry_out(actions, request, active=self.state.active_run, archive=archive, delete=delete)
        keys_before, hooks_before = records_cutoffs(request.now)
        with unavailable("nothing was stored"):
            keys = await self.state.pool.execute("DELETE FROM idempotency WHERE created_at < $1", keys_before)
            hooks = await self.state.pool.execute("DELETE FROM hook_deliveries WHERE created_at < $1", hooks_before)
        trimmed = int(keys.split()[-1]) + int(hooks.split()[-1])
        if trimmed:
            log.info("cleanup: forgot %d idempotency and webhook delivery record(s) past their window", trimmed)
        return report

    # -- the doctor ---------------------------------------------------------------------------------

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        """What can be checked on the database: seq gaps, one active run per key (also a
        constraint), entries naming no active run.
        Archives (tar.gz) and run folders are files-only: nothing to check here."""
        findings: list[StoredRecord] = []
        with unavailable("nothing was stored"):
            gaps = await self.state.pool.fetch(_GAPS)
            doubled = await self.state.pool.fetch(_DOUBLED)
        for row in gaps:
            detail = f"run {row[0]} has {row[1]} message(s) but seqs up to {row[2]}: seqs are missing"
            findings.append(_finding("seq_gaps", "error", detail, None, run_id=row[0], key=row[3]))
        for row in doubled:
            detail = f"key {row[0]} has {row[1]} active runs (the constraint runs_one_active_per_key is missing?)"
            findings.append(_finding("active_runs", "error", detail, None, key=row[0]))
        for entry in list(self.state.entries.values()):
            if entry.run_id is not None and self.state.active_run(entry.key) is None:
                detail = f"the entry of {entry.key} names run {entry.run_id}, which is not active"
                if fix:
                    entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
                    await self.state.flush_entries(entry.key)
                findings.append(_finding("entries", "warning", detail, "set the entry idle", key=entry.key, fixed=fix))
        return findings


_FACTS = (
    "SELECT run_id, session_key, chat_type, status, completed_at, updated_at, created_at, pinned, archived_at"
    " FROM runs ORDER BY created_at, run_id"
)
_GAPS = (
    "SELECT m.run_id, count(*), max(m.seq), r.session_key FROM messages m JOIN runs r USING (run_id)"
    " GROUP BY m.run_id, r.session_key HAVING count(*) <> max(m.seq)"
)
_DOUBLED = (
    "SELECT session_key, count(*) FROM runs WHERE status IN ('running', 'paused')"
    " GROUP BY session_key HAVING count(*) > 1"
)
