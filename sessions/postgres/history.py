"""The history index on PostgreSQL: the ``history`` table (one row per indexed message, with a
``tsvector`` of the ``simple`` configuration under a GIN index), fed in batches after each durable
append, searched with the files backend's rules (``sessions.history_text``). The text handed to
``to_tsvector`` is the words the files index's FTS5 tokenizer makes of it (``sessions.history_words``:
URLs, addresses, hosts, paths and versions split into words, Porter stems, accents folded), and so
are the words of a query: both backends find the same messages.

CJK text takes the files backend's path: each run of kana, kanji or hangul is indexed as its
overlapping character bigrams (``index_text``), which PostgreSQL's parser sees as words; a query of
two or more CJK characters is the phrase of its bigrams, one character a prefix match. pg_trgm was
not used: it ships outside core PostgreSQL (contrib) and, like FTS5's trigram tokenizer, cannot
match a two-character word such as 会議 through its index.

Rows refer to their run (``ON DELETE CASCADE``): a purge that deletes a key's runs deletes their
index rows in the same transaction, so no text of a purged message stays searchable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from sessions.findings import finding
from sessions.history_index import MAX_BACKLOG, MAX_BATCH, Backlog, HistoryHit, HistoryQuery, HistoryStats, row_values
from sessions.history_text import index_text, query_terms, snippet
from sessions.history_words import words as fts5_words
from sessions.postgres.faults import unavailable

log = logging.getLogger(__name__)

BATCH_WAIT_S = 0.05  # after a quiet moment the index lags ingest by this much (plus the commit), times the workers
BUSY_WAIT_S = 0.1  # while rows keep coming, one insert this often at most, times the workers


@dataclass(frozen=True)
class Pacing:
    """How long the index gathers rows: ``quiet_s`` before the first insert after a quiet moment
    (what a search right after a post sees), ``busy_s`` from one insert's start to the next while
    rows keep coming (back to back, a busy gateway sent one per round trip, each of few rows: the
    GIN index and the statement cost more per row)."""

    quiet_s: float = BATCH_WAIT_S
    busy_s: float = BUSY_WAIT_S


def pacing(workers: int) -> Pacing:
    """The pacing of each of ``workers`` gateway processes' index: the fleet sends as many inserts
    a second as one process would, each of as many rows (N processes paced as one sent N times the
    statements, each of 1/N of the rows)."""
    n = max(1, workers)
    return Pacing(BATCH_WAIT_S * n, BUSY_WAIT_S * n)
RETRY_S = 1.0  # a failed batch (the database away) is tried again after this
# what a row's own content makes the database or the tokenizer refuse, whenever it is tried: a data
# exception (class 22), a program limit (class 54: a tsvector over 1 MB), SQLite's string cap
REFUSED: tuple[type[Exception], ...] = (asyncpg.DataError, asyncpg.ProgramLimitExceededError, sqlite3.DataError)
FLUSH_WAIT_S = 5.0  # the doctor waits this long for the rows in flight
MAX_PENDING = 100_000  # rows kept while the database is away; beyond, catch-up at the next start

MIGRATION = """
CREATE TABLE history (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL REFERENCES runs ON DELETE CASCADE,
    seq bigint NOT NULL,
    session_key text NOT NULL,
    agent_id text,
    role text NOT NULL,
    "timestamp" text,
    tool boolean NOT NULL,
    content text NOT NULL,
    body tsvector NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE INDEX history_body ON history USING gin (body);
CREATE INDEX history_by_key ON history (session_key);
"""

_INSERT = """
INSERT INTO history (run_id, seq, session_key, agent_id, role, "timestamp", tool, content, body)
SELECT u.run_id, u.seq, u.session_key, u.agent_id, u.role, u.ts, u.tool, u.content, to_tsvector('simple', u.body)
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::boolean[], $8::text[],
            $9::text[]) AS u(run_id, seq, session_key, agent_id, role, ts, tool, content, body)
WHERE EXISTS (SELECT 1 FROM runs r WHERE r.run_id = u.run_id)
ON CONFLICT (run_id, seq) DO NOTHING
"""

# messages of runs the index lacks (what a crash or a failed batch left unindexed)
_UNINDEXED = """
SELECT m.run_id, r.session_key, r.agent_id, m.record::text FROM messages m JOIN runs r USING (run_id)
WHERE r.session_key IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM history h WHERE h.run_id = m.run_id AND h.seq = m.seq)
ORDER BY m.run_id, m.seq
"""
_ORPHANS = "FROM history h WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.run_id = h.run_id AND m.seq = h.seq)"
_STALE = "SELECT count(*) " + _ORPHANS
_DELETE_STALE = "DELETE " + _ORPHANS

Row = tuple[Any, ...]


def tsquery_sql(q: str, first: int) -> tuple[str, list[str]] | None:
    """The SQL of the tsquery matching every term of ``q`` (parameters from ``$first``) and its
    values; None when ``q`` has no term. Each term is a bound parameter: nothing a user types is
    read as tsquery syntax."""
    words, runs = query_terms(q)
    parts: list[str] = []
    values: list[str] = []
    for word in fts5_words().of(words):  # as the index holds it: stemmed, accents folded
        if not word:
            continue
        values.append(word)
        parts.append(f"plainto_tsquery('simple', ${first + len(values) - 1})")
    for run in runs:
        if len(run) == 1:
            values.append(run)
            parts.append(f"to_tsquery('simple', ${first + len(values) - 1} || ':*')")
        else:
            values.append(" ".join(run[i : i + 2] for i in range(len(run) - 1)))
            parts.append(f"phraseto_tsquery('simple', ${first + len(values) - 1})")
    if not parts:
        return None
    return "(" + " && ".join(parts) + ")", values


def _columns(rows: list[Row]) -> list[list[Any]]:
    """The batch as the INSERT's arrays (the last one the words handed to the parser: SQLite's
    tokenizer runs here, so a batch is built in a thread)."""
    columns: list[list[Any]] = [[] for _ in range(9)]
    bodies = fts5_words().of([index_text(row[7]) for row in rows])
    for (run_id, seq, key, agent_id, role, timestamp, tool, content), body in zip(rows, bodies, strict=True):
        for column, value in zip(
            columns, (run_id, seq, key, agent_id, role, timestamp, bool(tool), content, body), strict=True
        ):
            column.append(value)
    return columns


class PgHistoryIndex:
    """The interface of ``sessions.files.history.HistoryIndex`` that the daemon, the session tools
    and the history routes use, on the ``history`` table."""

    def __init__(
        self, pool: asyncpg.Pool, *, max_batch: int = MAX_BATCH, pace: Pacing = Pacing(), max_backlog: int = MAX_BACKLOG
    ) -> None:
        self.pool = pool
        self.max_batch = max_batch
        self.pace = pace
        self.stats = HistoryStats()
        self.backlog = Backlog(max_backlog)  # rows in ``_pending``
        self._pending: list[Row] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> bool:
        """Start the batch writer; True when the index is empty but messages are stored (then
        ``rebuild_history`` fills it), as the files index says it was created."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="pg-history-index")
        with unavailable("nothing was stored"):
            empty = await self.pool.fetchval("SELECT NOT EXISTS (SELECT 1 FROM history)")
            stored = await self.pool.fetchval("SELECT EXISTS (SELECT 1 FROM messages)")
        return bool(empty and stored)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), timeout=5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def feed(self, run_id: str, key: str, agent_id: str | None, record: Mapping[str, Any]) -> None:
        row = row_values(run_id, key, agent_id, record)
        if row is None or self._task is None:
            return
        if len(self._pending) >= MAX_PENDING:
            return  # the database has been away long: catch-up at the next start indexes these
        self._pending.append(row)
        self.backlog.added()
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every fed row is written."""
        if self._task is None:
            return
        await self._idle.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.pace.quiet_s)
            while self._pending:
                started = loop.time()
                batch = self._pending[: self.max_batch]
                try:
                    await self.write(batch)
                except Exception as exc:  # the database away, its disk full, a deadlock: keep the rows, try again
                    log.warning("history index batch of %d row(s) failed (%s): retrying", len(batch), exc)
                    self.backlog.paused = True  # posts waiting would not bring the database back
                    await asyncio.sleep(RETRY_S)
                    continue
                self.backlog.paused = False
                del self._pending[: len(batch)]
                self.backlog.written(len(batch))
                if 0 < len(self._pending) < self.max_batch:  # rows came meanwhile: more gather
                    await asyncio.sleep(max(0.0, started + self.pace.busy_s - loop.time()))
            self._idle.set()

    async def write(self, rows: list[Row]) -> int:
        """Insert ``rows``; a batch the database refuses for one of its rows (a message whose
        tsvector is over PostgreSQL's 1 MB) is inserted row by row, and a row refused alone is
        logged and left out of the index: retried, it would hold every row behind it for good.
        Any other failure (the database away, a deadlock, a timeout) raises: the caller keeps the
        rows and tries again."""
        try:
            return await self.insert(rows)
        except REFUSED as exc:
            log.warning("history index batch of %d row(s) refused (%s): indexing them one by one", len(rows), exc)
        added = 0
        for row in rows:
            try:
                added += await self.insert([row])
            except REFUSED as exc:
                self.stats.refused += 1
                log.warning("history index: message %s of run %s (%s) cannot be indexed (%s): it is not searchable",
                            row[1], row[0], row[2], exc)  # fmt: skip
        return added

    async def insert(self, rows: list[Row]) -> int:
        if not rows:
            return 0
        columns = await asyncio.to_thread(_columns, rows)
        with unavailable("the history rows were not stored"):
            status = await self.pool.execute(_INSERT, *columns)
        inserted = int(status.split()[-1])
        self.stats.indexed += inserted
        self.stats.batches += 1
        return inserted

    async def delete_runs(self, run_ids: Iterable[str]) -> int:
        ids = list(run_ids)
        with unavailable("nothing was stored"):
            status = await self.pool.execute("DELETE FROM history WHERE run_id = ANY($1::text[])", ids)
        deleted = int(status.split()[-1])
        self.stats.deleted += deleted
        return deleted

    async def delete_key(self, key: str) -> int:
        with unavailable("nothing was stored"):
            status = await self.pool.execute("DELETE FROM history WHERE session_key = $1", key)
        deleted = int(status.split()[-1])
        self.stats.deleted += deleted
        return deleted

    async def scrub(self) -> None:
        """Deleted rows are gone from every query at commit; VACUUM then frees their space."""
        with unavailable("nothing was stored"):
            await self.pool.execute("VACUUM history")

    async def catch_up(self) -> int:
        """Index every stored message the index lacks; the number of rows added."""
        with unavailable("nothing was stored"):
            stored = await self.pool.fetch(_UNINDEXED)
        rows = [r for r in (row_values(s[0], s[1], s[2], json.loads(s[3])) for s in stored) if r is not None]
        added = 0
        for start in range(0, len(rows), self.max_batch):
            added += await self.write(rows[start : start + self.max_batch])
        return added

    async def rebuild(self) -> int:
        """Empty the index and index every stored message again."""
        with unavailable("nothing was stored"):
            await self.pool.execute("DELETE FROM history")
        self.stats.rebuilt_runs += 1
        return await self.catch_up()

    async def check(self, *, fix: bool) -> list[dict[str, Any]]:
        """The doctor's findings on the index: rows of no stored message, stored messages it lacks."""
        findings: list[dict[str, Any]] = []
        with contextlib.suppress(TimeoutError):  # rows in flight are not holes (a database away: they are)
            await asyncio.wait_for(self.flush(), timeout=FLUSH_WAIT_S)
        with unavailable("nothing was stored"):
            stale = int(await self.pool.fetchval(_STALE))
            stored = await self.pool.fetch(_UNINDEXED)
        lacking = [r for r in (row_values(s[0], s[1], s[2], json.loads(s[3])) for s in stored) if r is not None]
        if stale:
            if fix:
                with unavailable("nothing was stored"):
                    await self.pool.execute(_DELETE_STALE)
            findings.append(finding("history_stale", "warning", f"{stale} index row(s) have no stored message",
                                    "delete their index rows", fixed=fix))  # fmt: skip
        if lacking:
            if fix:
                for start in range(0, len(lacking), self.max_batch):
                    await self.write(lacking[start : start + self.max_batch])
            runs = len({row[0] for row in lacking})
            findings.append(finding("history_holes", "warning", f"{len(lacking)} message(s) of {runs} run(s) are"
                                    " missing from the history index", "index them", fixed=fix))  # fmt: skip
        return findings

    async def search(self, query: HistoryQuery) -> list[HistoryHit]:
        """Best first (``ts_rank``, then newest); the files index's filters."""
        built = tsquery_sql(query.q, 1)
        if built is None:
            return []
        tsquery, values = built
        params: list[Any] = list(values)
        clauses = ["h.body @@ q.q"]
        for column, value in (("h.agent_id", query.agent), ("h.session_key", query.key), ("h.role", query.role)):
            if value is not None:
                params.append(value)
                clauses.append(f"{column} = ${len(params)}")
        if query.since is not None:
            params.append(query.since)
            clauses.append(f'h."timestamp" >= ${len(params)}')
        if query.until is not None:
            params.append(query.until)
            clauses.append(f'h."timestamp" < ${len(params)}')
        if query.keys is not None:
            if not query.keys:
                return []
            params.append(sorted(query.keys))
            clauses.append(f"h.session_key = ANY(${len(params)}::text[])")
        params.extend([query.limit, query.offset])
        sql = (
            'SELECT h.session_key, h.run_id, h.seq, h.role, h."timestamp", h.content, h.agent_id, h.tool,'
            f" ts_rank(h.body, q.q) AS score FROM history h, (SELECT {tsquery}) AS q(q) WHERE {' AND '.join(clauses)}"
            f" ORDER BY score DESC, h.id DESC LIMIT ${len(params) - 1} OFFSET ${len(params)}"
        )
        with unavailable("nothing was stored"):
            rows = await self.pool.fetch(sql, *params)
        return [
            HistoryHit(
                session_key=r[0],
                run_id=r[1],
                seq=int(r[2]),
                role=r[3],
                timestamp=r[4],
                snippet=snippet(r[5], query.q),
                score=round(float(r[8]), 4),
                agent_id=r[6],
                tool=bool(r[7]),
            )
            for r in rows
        ]

    async def count(self) -> int:
        with unavailable("nothing was stored"):
            return int(await self.pool.fetchval("SELECT count(*) FROM history"))

    async def seqs(self, run_id: str) -> set[int]:
        with unavailable("nothing was stored"):
            return {int(r[0]) for r in await self.pool.fetch("SELECT seq FROM history WHERE run_id = $1", run_id)}

    async def run_ids(self) -> set[str]:
        with unavailable("nothing was stored"):
            return {r[0] for r in await self.pool.fetch("SELECT DISTINCT run_id FROM history")}
