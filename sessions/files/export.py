"""The files backend's runs to export (``Maintenance.export_runs``): each run's row from tasks.db
and a reader of its run folder, or of its archive streamed out of the tar.gz (the writer is
``sessions.export_lines``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from config.errors import RunNotFound, SessionNotFound
from home import layout
from home.layout import Home
from sessions.exports import RunExport
from sessions.files import archive
from sessions.files.history_sources import RunSource, iter_run_messages, sources_from_rows
from sessions.files.jsonl import read_records
from sessions.files.store_state import StoreState

__all__ = ["FolderReader", "one_run", "runs_of_key"]


@dataclass(frozen=True)
class FolderReader:
    """``ExportReader`` over a run folder or its archive (blocking)."""

    source: RunSource

    def messages(self) -> Iterator[dict[str, Any]]:
        return iter_run_messages(self.source)

    def summaries(self) -> list[dict[str, Any]]:
        source = self.source
        if source.folder is not None:
            return read_records(source.folder / layout.SUMMARIES)
        if source.archive is not None:
            return archive.read_records(source.archive, source.run_id, layout.SUMMARIES)
        return []

    def final_summary(self) -> str | None:
        source = self.source
        if source.folder is not None:
            try:
                return (source.folder / layout.FINAL_SUMMARY).read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
        if source.archive is not None:
            return archive.read_member(source.archive, source.run_id, layout.FINAL_SUMMARY)
        return None


def _sources(rows: list[dict[str, Any]], home: Home) -> list[RunExport]:
    by_id = {s.run_id: s for s in sources_from_rows(rows, home)}
    return [RunExport(row, FolderReader(by_id[row["uuid"]])) for row in rows if row["uuid"] in by_id]


async def runs_of_key(store: StoreState, key: str) -> list[RunExport]:
    """Every readable run of ``key``, oldest first (NotFound when the key has no run)."""
    sql = "SELECT * FROM tasks WHERE session_key = ? ORDER BY created_at, rowid"
    rows = await store.ledger.execute(lambda c: [dict(r) for r in c.execute(sql, (key,))])
    if not rows:
        raise SessionNotFound(f"no session or run with key {key!r}")
    return await asyncio.to_thread(_sources, rows, store.home)


async def one_run(store: StoreState, run_id: str) -> RunExport:
    row = await store.ledger.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
    found = await asyncio.to_thread(_sources, [row], store.home)
    if not found:
        raise RunNotFound(f"run {run_id} has no readable folder or archive")
    return found[0]
