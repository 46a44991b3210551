"""Leadership: one process leads; when its connection dies (the process was killed) the lock goes
with it and the next process to try takes over; a scheduled firing is claimed once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from sessions.postgres.leader import Leadership
from sessions.postgres.store import PgStore
from tests.sessions.postgres.conftest import Opener
from tests.support.postgres import DATABASE, PgServer


async def terminate(server: PgServer, leadership: Leadership) -> None:
    """End the leader's connection from the server's side (as when its process or machine dies)."""
    assert leadership._conn is not None
    admin = await asyncpg.connect(server.dsn())
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", leadership._conn.get_server_pid())
    finally:
        await admin.close()


async def test_one_leads_and_another_takes_over_when_the_leader_dies(postgres_server: PgServer) -> None:
    dsn = await postgres_server.database(DATABASE)
    first, second = Leadership(dsn), Leadership(dsn)
    try:
        assert await first.try_lead() is True
        assert await second.try_lead() is False
        assert await first.try_lead() is True and await second.try_lead() is False  # stays put
        # the leader's process dies: the server ends its connection (as it does for a killed client)
        await terminate(postgres_server, first)
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
    holder, watcher = Leadership(dsn), Leadership(dsn, interval_s=0.05, grace_s=0.2)
    changes: list[bool] = []
    assert await holder.try_lead()
    task = asyncio.create_task(watcher.watch(changes.append))
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


async def test_a_firing_is_claimed_once_and_only_by_the_leader(
    postgres_server: PgServer, open_store: Opener
) -> None:
    store: PgStore = await open_store()  # the migrations (scheduler_claims)
    dsn = postgres_server.dsn(DATABASE)
    first, second = Leadership(dsn), Leadership(dsn)
    due = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    try:
        assert await first.try_lead() and not await second.try_lead()
        assert await second.claim("cron:tick", due) is False  # not the leader
        assert await first.claim("cron:tick", due) is True
        assert await first.claim("cron:tick", due) is False  # that firing is taken
        assert await first.claim("cron:other", due) is True  # another job, the same minute
        # the leader dies after its claim; the next leader's clock is behind: it fires the same
        # minute again, and the claim refuses it (no double firing across the takeover)
        await terminate(postgres_server, first)
        assert await first.claim("cron:tick", due.replace(minute=1)) is False  # its connection is gone
        for _ in range(50):
            if await second.try_lead():
                break
            await asyncio.sleep(0.1)
        assert second.leading
        assert await second.claim("cron:tick", due) is False
        assert await second.claim("cron:tick", due.replace(minute=1)) is True
        rows = await store.pool.fetch("SELECT job, scheduled_at, claimed_by FROM scheduler_claims ORDER BY 1, 2")
        assert [(r["job"], r["scheduled_at"]) for r in rows] == [
            ("cron:other", due), ("cron:tick", due), ("cron:tick", due.replace(minute=1)),
        ]  # fmt: skip
    finally:
        await first.resign()
        await second.resign()
