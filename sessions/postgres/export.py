"""Exports on PostgreSQL (``GET /v1/sessions/{key}/export``, ``GET /v1/runs/{uuid}/export``,
``neotask sessions export``): the runs as the files backend's export gives them
(``sessions.export_lines`` writes both), their messages read a page at a time. The export's lines
are produced on a worker thread (the route and the CLI pull them off the event loop); each page is
a query run on the store's loop, which the thread waits for, so a run of any length is exported in
constant memory and the pool is used as everywhere else."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import asyncpg

from config.errors import RunNotFound, SessionNotFound
from sessions.exports import RunExport
from sessions.postgres.faults import unavailable
from sessions.postgres.state import PgState
from sessions.records import RUN_COLUMNS

T = TypeVar("T")
PAGE = 500  # messages per query
WAIT_S = 60.0  # a page not fetched by then (the loop stopped under a streamed export): the export ends
_COLUMNS = ", ".join(f'"{c}"' if c != "uuid" else "run_id AS uuid" for c in RUN_COLUMNS)


class PgRunReader:
    """A run's records for the export writer (``sessions.export_lines``): blocking calls made from a
    worker thread."""

    def __init__(
        self, pool: asyncpg.Pool, run_id: str, final_summary: str | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._pool = pool
        self._run_id = run_id
        self._final = final_summary
        self._loop = loop

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            work.close()
            raise RuntimeError("an export's lines are read off the event loop (asyncio.to_thread)")
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result(timeout=WAIT_S)
        except TimeoutError:
            future.cancel()
            raise

    async def _fetch(self, sql: str, *args: Any) -> list[str]:
        with unavailable("nothing was stored"):
            return [str(r[0]) for r in await self._pool.fetch(sql, self._run_id, *args)]

    def messages(self) -> Iterator[dict[str, Any]]:
        after = 0
        while True:
            page = self._wait(self._fetch(_MESSAGES, after, PAGE))
            for text in page:
                record = json.loads(text)
                after = int(record["seq"])
                yield record
            if len(page) < PAGE:
                return

    def summaries(self) -> list[dict[str, Any]]:
        return [
            json.loads(t)
            for t in self._wait(self._fetch("SELECT record::text FROM summaries WHERE run_id = $1 ORDER BY id"))
        ]

    def final_summary(self) -> str | None:
        return self._final


_MESSAGES = "SELECT record::text FROM messages WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"


class PgExport:
    def __init__(self, state: PgState) -> None:
        self.state = state

    async def export_runs(self, *, key: str | None = None, run_id: str | None = None) -> list[RunExport]:
        """Archived runs too (their rows stay)."""
        pool = self.state.pool
        with unavailable("nothing was stored"):
            if run_id is not None:
                rows = await pool.fetch(f"SELECT {_COLUMNS}, final_summary FROM runs WHERE run_id = $1", run_id)
            else:
                assert key is not None, "export_runs needs a key or a run id"
                rows = await pool.fetch(
                    f"SELECT {_COLUMNS}, final_summary FROM runs WHERE session_key = $1 ORDER BY created_at, run_id",
                    key,
                )
        if not rows:
            if run_id is not None:
                raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
            raise SessionNotFound(f"no session or run with key {key!r}")
        loop = asyncio.get_running_loop()
        out = []
        for row in rows:
            ledger = {c: row[c] for c in RUN_COLUMNS}
            out.append(RunExport(ledger, PgRunReader(pool, str(row["uuid"]), row["final_summary"], loop)))
        return out
