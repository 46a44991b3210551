"""The session store's part for its extended capabilities (``sessions.protocol``):
``HistorySource`` (the history index kept in contexts/history.db, fed from the run folders and
archives) and ``Maintenance`` (the doctor, cleanup, export, purge). They carry out what
``sessions.files.history``, ``sessions.files.doctor_store``, ``sessions.files.cleanup``,
``sessions.files.export`` and ``sessions.files.purge`` do over the store's state, so nothing
outside the backend needs the store's ledger or home."""

from __future__ import annotations

import asyncio
import functools

from sessions.cleanup_plan import CleanupRequest
from sessions.exports import RunExport
from sessions.files.cleanup import run_cleanup
from sessions.files.doctor_store import check_store
from sessions.files.export import one_run, runs_of_key
from sessions.files.history import HistoryIndex, catch_up, history_path, rebuild_all
from sessions.files.history_doctor import check_index
from sessions.files.history_marks import runs_on_disk
from sessions.files.purge import purge_key
from sessions.files.run_folder import folder_of
from sessions.files.store_lifecycle import Lifecycle
from sessions.files.store_state import StoreState
from sessions.history_index import MAX_BACKLOG, MAX_BATCH, HistoryIndexProtocol, own_index
from sessions.records import PURGE_FINISH, StoredRecord

_ENDED_UNARCHIVED = (
    "SELECT uuid, session_key, agent_id FROM tasks WHERE archived_at IS NULL AND session_key IS NOT NULL"
)


class FilesMaintenance:
    """Over the store's state; a purge completes the key's active run through ``lifecycle``."""

    def __init__(self, state: StoreState, lifecycle: Lifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    # -- HistorySource ----------------------------------------------------------------------------

    def open_history(self, *, max_batch: int | None = None, max_backlog: int = MAX_BACKLOG) -> HistoryIndex:
        """The history index of this home (not opened yet: ``await index.open()``)."""
        path = history_path(self.state.home.contexts)
        return HistoryIndex(path, max_batch=max_batch or MAX_BATCH, max_backlog=max_backlog)

    async def rebuild_history(self, index: HistoryIndexProtocol) -> int:
        return await rebuild_all(own_index(index, HistoryIndex), self.state.ledger, self.state.home)

    async def catch_up_history(self, index: HistoryIndexProtocol) -> None:
        index = own_index(index, HistoryIndex)
        runs = [(r.run_id, r.key, r.agent_id, folder_of(r), r.next_seq - 1) for r in self.state.active_runs()]
        active = {run[0] for run in runs}
        rows = await self.state.ledger.execute(lambda c: [tuple(r) for r in c.execute(_ENDED_UNARCHIVED)])
        ended = [row for row in rows if row[0] not in active]
        runs += await asyncio.to_thread(runs_on_disk, index.marks.locate, ended)  # a crash after a run ended
        await catch_up(index, runs)

    async def check_history(self, index: HistoryIndexProtocol, *, fix: bool) -> list[StoredRecord]:
        findings = await check_index(own_index(index, HistoryIndex), self.state.ledger, self.state.home, fix=fix)
        return [f.as_dict() for f in findings]

    # -- Maintenance ------------------------------------------------------------------------------

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        return [f.as_dict() for f in await check_store(self.state, fix=fix)]

    async def cleanup(self, request: CleanupRequest) -> list[StoredRecord]:
        return await run_cleanup(self.state, request)

    async def export_runs(self, *, key: str | None = None, run_id: str | None = None) -> list[RunExport]:
        if run_id is not None:
            return [await one_run(self.state, run_id)]
        assert key is not None, "export_runs needs a key or a run id"
        return await runs_of_key(self.state, key)

    async def purge(self, key: str, *, history: HistoryIndexProtocol | None) -> StoredRecord:
        index = None if history is None else own_index(history, HistoryIndex)
        end_run = functools.partial(self.lifecycle.complete, end=PURGE_FINISH)
        return (await purge_key(self.state, key, end_run=end_run, history=index)).as_dict()
