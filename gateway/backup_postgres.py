"""Backups of a PostgreSQL deployment (``storage.backend: postgres``): the same archive as a files
home's, so ``neotask backup verify`` and ``neotask restore`` take it as they are.

The point is one REPEATABLE READ transaction over the database (``sessions.postgres.bulk.dump``,
the dump ``neotask storage copy`` verifies against): every message acknowledged before it
started is in (an append is acknowledged after its COMMIT), nothing committed later is, across
every gateway process on the database. That snapshot is written into the stage as the files
backend leaves a home (``sessions.files.bulk.load``: run folders, archives, tasks.db with the
usage and the tombstones, sessions.json), beside channels.db, the workspaces inside the home, the
memory tables and the config; then ``backups.pack.finish`` checks and packs it as for any home.

A restore gives a files home (``neotask restore FILE --home DIR``); ``--to postgres://…`` then
copies it into an empty database (``sessions.copying``, verified). The manifest says
``"backend": "postgres"``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from backups import stage
from config.loader import LoadedConfig
from home.layout import Home
from sessions.copy_snapshot import Snapshot
from sessions.files import bulk as files_bulk

ACTIVE = ("running", "paused")


async def online_snapshot(store: Any) -> Snapshot:
    """The point of a running gateway's database, on a connection of its pool (a ``PgStore``)."""
    from sessions.postgres import bulk as pg_bulk
    from sessions.postgres.faults import unavailable

    await store.flush_entries()  # this process's coalesced entry changes, as a files backup takes them
    with unavailable("nothing was stored"):
        async with store.pool.acquire() as conn:
            snapshot: Snapshot = await pg_bulk.dump(conn)
    return snapshot


def offline_snapshot(config: LoadedConfig, env: Mapping[str, str]) -> Snapshot:
    """The point of the configured database, without a daemon (its own connection)."""
    from sessions.copying import configured_end, dump

    return asyncio.run(dump(configured_end(config.settings, config.home, env)))


def stage_snapshot(config: LoadedConfig, home: Home, target: Home, snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot and the home's other parts into the stage (blocking); the point's runs
    (each active run with its last seq), as the files backup records them."""
    files_bulk.load(target.root, snapshot)
    stage.backup_sqlite(home.root / "channels.db", target.root / "channels.db")
    for db in sorted(home.root.glob("matrix/*/*.db")):  # the Matrix accounts' crypto stores
        stage.backup_sqlite(db, target.root / db.relative_to(home.root))
    runs: dict[str, Any] = {}
    for run in snapshot.runs:
        if run.row.get("status") in ACTIVE:
            last = json.loads(run.messages[-1])["seq"] if run.messages else 0
            runs[run.run_id] = {"state": run.row["status"], "seq": int(last)}
    return runs


def meta() -> dict[str, Any]:
    return {
        "backend": "postgres",
        "restore": "a files home (neotask restore FILE --home DIR); add --to postgres://… to copy it into an empty"
        " database",
    }
