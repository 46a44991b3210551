"""The run-folder store's extended capabilities (``sessions.protocol``): ``HistorySource`` (the
history index kept in contexts/history.db, fed from the run folders and archives) and
``Maintenance`` (the doctor, cleanup). They carry out what ``sessions.files.history``,
``sessions.files.doctor`` and ``sessions.files.cleanup`` do, so nothing outside the backend needs
the store's ledger or home."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING

from config.settings import CleanupSettings
from sessions.files.history import MAX_BATCH, HistoryIndex, catch_up, history_path, rebuild_all
from sessions.files.history_marks import runs_on_disk
from sessions.files.store_lifecycle import LifecycleStore
from sessions.protocol import ArchiveStep, CompleteRun
from sessions.records import StoredRecord

if TYPE_CHECKING:  # export imports the store
    from sessions.files.export import RunExport

_ENDED_UNARCHIVED = (
    "SELECT uuid, session_key, agent_id FROM tasks WHERE archived_at IS NULL AND session_key IS NOT NULL"
)


class MaintenanceStore(LifecycleStore):
    # -- HistorySource ----------------------------------------------------------------------------

    def open_history(self, *, max_batch: int | None = None) -> HistoryIndex:
        """The history index of this home (not opened yet: ``await index.open()``)."""
        return HistoryIndex(history_path(self.home.contexts), max_batch=max_batch or MAX_BATCH)

    async def rebuild_history(self, index: HistoryIndex) -> int:
        return await rebuild_all(index, self.ledger, self.home)

    async def catch_up_history(self, index: HistoryIndex) -> None:
        runs = [(r.run_id, r.key, r.agent_id, r.dir, r.next_seq - 1) for r in self.active_runs()]
        active = {run[0] for run in runs}
        rows = await self.ledger.execute(lambda c: [tuple(r) for r in c.execute(_ENDED_UNARCHIVED)])
        ended = [row for row in rows if row[0] not in active]
        runs += await asyncio.to_thread(runs_on_disk, index.marks.locate, ended)  # a crash after a run ended
        await catch_up(index, runs)

    async def check_history(self, index: HistoryIndex, *, fix: bool) -> list[StoredRecord]:
        from sessions.files.history_doctor import check_index  # it imports the doctor, which imports the store

        return [f.as_dict() for f in await check_index(index, self.ledger, self.home, fix=fix)]

    # -- Maintenance ------------------------------------------------------------------------------

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        from sessions.files.doctor import check_store  # the doctor imports the store

        return [f.as_dict() for f in await check_store(self, fix=fix)]  # type: ignore[arg-type]

    async def cleanup(
        self,
        settings: CleanupSettings,
        *,
        now: datetime,
        dry_run: bool,
        complete: CompleteRun,
        step: ArchiveStep | None = None,
    ) -> list[StoredRecord]:
        from sessions.files.cleanup import run_cleanup  # cleanup imports the store

        return await run_cleanup(self, settings, now=now, dry_run=dry_run, complete=complete, step=step)  # type: ignore[arg-type]

    async def export_runs(self, *, key: str | None = None, run_id: str | None = None) -> list[RunExport]:
        from sessions.files.export import one_run, runs_of_key  # export imports the store

        if run_id is not None:
            return [await one_run(self, run_id)]  # type: ignore[arg-type]
        assert key is not None, "export_runs needs a key or a run id"
        return await runs_of_key(self, key)  # type: ignore[arg-type]

    async def purge(self, key: str, *, history: HistoryIndex | None) -> StoredRecord:
        from sessions.files.purge import purge_key  # purge imports the store

        return (await purge_key(self, key, history=history)).as_dict()  # type: ignore[arg-type]
