"""Leadership: one process leads; when its connection dies (the process was killed) the lock goes
with it and the next process to try takes over."""

from __future__ import annotations

import asyncio

import asyncpg

from sessions.postgres.leader import Leadership
from tests.support.postgres import DATABASE, PgServer


async def test_one_leads_and_another_takes_over_when_the_leader_dies(postgres_server: PgServer) -> None:
    dsn = await postgres_server.database(DATABASE)
    first, second = Leadership(dsn), Leadership(dsn)
    try:
        assert await first.try_lead() is True
        assert await second.try_lead() is False
        assert await first.try_lead() is True and await second.try_lead() is False  # stays put
        # the leader's process dies: the server ends its connection (as it does for a killed client)
        assert first._conn is not None
        pid = first._conn.get_server_pid()
        admin = await asyncpg.connect(postgres_server.dsn())
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        for _ in range(50):  # the backend exits and its lock is released
            if await second.try_lead():
                break
            await asyncio.sleep(0.1)
        assert second.leading is True
        assert await first.try_lead() is False  # back, but no longer the leader
        await second.resign()
        assert await first.try_lead() is True
    finally:
        await first.resign()
        await second.resign()


async def test_watch_reports_each_change(postgres_server: PgServer) -> None:
    dsn = await postgres_server.database(DATABASE)
    holder, watcher = Leadership(dsn), Leadership(dsn)
    changes: list[bool] = []
    assert await holder.try_lead()
    task = asyncio.create_task(watcher.watch(0.05, changes.append))
    try:
        await asyncio.sleep(0.3)
        assert changes == []
        await holder.resign()
        for _ in range(100):
            if changes:
                break
            await asyncio.sleep(0.05)
        assert changes == [True]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watcher.resign()
    assert changes == [True, False]
