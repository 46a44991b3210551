"""PostgreSQL's ``Backup`` (``sessions.protocol``): the point is one REPEATABLE READ transaction
over the database (``bulk.dump``), written into the stage as the files home it would be copied
to (``StagedHome.load``: run folders, archives, tasks.db with the records, usage and tombstones,
sessions.json); the active runs' last seqs are the point's. A backup restores as a files home;
``neotask storage copy`` moves it into an empty database. The manifest says ``"backend":
"postgres"``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from config.clock import Clock, iso
from sessions.backup import BackupPoint, StagedHome
from sessions.copy_snapshot import Snapshot
from sessions.postgres import bulk
from sessions.postgres.faults import unavailable
from sessions.postgres.state import PgState

ACTIVE = ("running", "paused")
META = {
    "backend": "postgres",
    "restore": "a files home (neotask restore FILE --home DIR); add --to postgres://… to copy it into an empty"
    " database",
}


class PgBackup:
    """A backup of a database: ``dump`` takes its snapshot (on the daemon's pool, or on a
    connection of its own with no daemon)."""

    def __init__(self, dump: Callable[[], Awaitable[Snapshot]], clock: Clock) -> None:
        self._dump = dump
        self._clock = clock

    async def stage_backup(self, stage: StagedHome) -> BackupPoint:
        at = iso(self._clock())
        snapshot = await self._dump()
        await asyncio.to_thread(stage.load, snapshot)
        return BackupPoint(at, active_runs(snapshot), meta=META)


def active_runs(snapshot: Snapshot) -> dict[str, dict[str, Any]]:
    """Each active run of the snapshot with its last seq, as the files backup records them."""
    runs: dict[str, dict[str, Any]] = {}
    for run in snapshot.runs:
        if run.row.get("status") in ACTIVE:
            last = json.loads(run.messages[-1])["seq"] if run.messages else 0
            runs[run.run_id] = {"state": run.row["status"], "seq": int(last)}
    return runs


def online_backup(store: PgState) -> PgBackup:
    """The daemon's: this process's coalesced entry changes first (as a files backup takes the
    entries it holds), then the dump on a connection of the store's pool."""

    async def dump() -> Snapshot:
        await store.flush_entries()
        with unavailable("nothing was stored"):
            async with store.pool.acquire() as conn:
                snapshot: Snapshot = await bulk.dump(conn)
        return snapshot

    return PgBackup(dump, store.clock)
