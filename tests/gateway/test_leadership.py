"""Leadership in the composition root (``gateway/leading.py``), two object graphs on one PostgreSQL
database standing for two gateway processes: one leads and runs the schedule's firings, the other
skips them; the leader whose database connection is terminated stops its firing under way and its
memory indexing, and the other takes over."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import asyncpg

from gateway.services import Parts, Services, open_services
from sessions.postgres.leader import Leadership
from tests.conftest import FakeClock
from tests.gateway.helpers import gateway_config
from tests.support.postgres import DATABASE, PgServer, empty_database

# isolated: each firing its own run, ended after it (a run left active by one process is not yet
# known to another's cache: that is the turn locks' part of several processes, not leadership's)
CRON = {"id": "tick", "schedule": "* * * * *", "message": "tick", "isolated": True}
INTERVAL_S = 0.2


def overrides(dsn: str) -> dict[str, Any]:
    return {
        "storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2, "leader_interval_s": INTERVAL_S}},
        "cron": {"jobs": [CRON]},
    }


async def until(check: Any, timeout: float = 15.0) -> float:
    """Poll ``check()`` until true; the seconds it took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while not check():
        assert loop.time() - began < timeout, "timed out"
        await asyncio.sleep(0.05)
    return loop.time() - began


def leadership(services: Services) -> Leadership:
    assert services.leader is not None
    held = services.leader.leadership
    assert isinstance(held, Leadership)
    return held


async def cron_messages(dsn: str) -> int:
    """The cron job's messages stored: one per firing that ran."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM messages WHERE record->>'name' = 'cron'"))
    finally:
        await conn.close()


async def test_the_leader_runs_the_firings_and_stops_when_its_connection_is_lost(
    postgres_server: PgServer, tmp_path: Path, clock: FakeClock
) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    parts = Parts(memory=False)
    clock.advance(seconds=30)  # between two due times: nothing to catch up at the start
    for home in ("a", "b"):
        (tmp_path / home).mkdir()
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_services(gateway_config(tmp_path / "a", overrides(dsn)), clock=clock, parts=parts)
        )
        assert a.leader is not None and a.leader.shared
        await until(lambda: a.leader is not None and a.leader.leading)
        b = await stack.enter_async_context(
            open_services(gateway_config(tmp_path / "b", overrides(dsn)), clock=clock, parts=parts)
        )
        assert b.leader is not None
        await asyncio.sleep(4 * INTERVAL_S)
        assert b.leader.leading is False  # one leader

        # a firing of the schedule runs on the leader only, and once per due time
        assert await b.scheduler.fire_scheduled("cron:tick") is None
        outcome = await a.scheduler.fire_scheduled("cron:tick")
        assert outcome is not None and outcome.status == "stored"  # type: ignore[attr-defined]
        assert await a.scheduler.fire_scheduled("cron:tick") is None  # that minute's firing is claimed
        assert await cron_messages(dsn) == 1

        # the next minute's firing is under way on the leader (held at the key's lock) when the
        # leader's database connection is terminated: the firing is cancelled, nothing is stored
        clock.advance(seconds=60)
        async with a.conversations.exclusive("cron:tick"):
            firing = asyncio.create_task(a.scheduler.fire_scheduled("cron:tick"))
            await asyncio.sleep(0.3)
            assert not firing.done()
            admin = await asyncpg.connect(postgres_server.dsn())
            try:
                conn = leadership(a)._conn
                assert conn is not None
                assert await admin.fetchval("SELECT pg_terminate_backend($1)", conn.get_server_pid())
            finally:
                await admin.close()
            lost_after = await until(lambda: a.leader is not None and not a.leader.leading)
            await until(firing.done, timeout=5)
        assert firing.cancelled()
        assert lost_after < 3 * INTERVAL_S + 1  # noticed at the next check
        assert await cron_messages(dsn) == 1

        # a firing cut short is not run again (at most once: it was claimed); the one that comes
        # due while no process leads is run by the next leader as it takes over
        clock.advance(seconds=60)
        taken_after = await until(lambda: b.leader is not None and b.leader.leading)
        assert a.leader.leading is False  # never two leaders
        assert taken_after < 10
        await until(lambda: not b.scheduler.jobs()[-1].running and b.scheduler.jobs()[-1].last_runs != ())
        assert await cron_messages(dsn) == 2
        assert await b.scheduler.fire_scheduled("cron:tick") is None  # claimed by its catch-up
        assert await a.scheduler.fire_scheduled("cron:tick") is None  # not the leader
        clock.advance(seconds=60)
        outcome = await b.scheduler.fire_scheduled("cron:tick")
        assert outcome is not None and outcome.status == "stored"  # type: ignore[attr-defined]
        assert await cron_messages(dsn) == 3


async def test_a_lock_nobody_held_lately_is_led_at_once(
    postgres_server: PgServer, tmp_path: Path, clock: FakeClock
) -> None:
    """A single gateway on its database said ``leader: false`` for its first 5-10 s: every taker of
    the lock waited the grace (twice the check interval and more) that only a takeover from a
    leader who may not know yet it lost the lock needs. Now the leader writes when it last checked
    (``leader_seen``): a first start, and a start after a leader that resigned at shutdown, lead
    at once; the takeover from a lost leader still waits (the test above)."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    slow = overrides(dsn)
    slow["storage"]["postgres"]["leader_interval_s"] = 2  # the default: a grace of 4.5 s
    parts = Parts(memory=False)
    for home in ("first", "next"):
        (tmp_path / home).mkdir()
        async with open_services(gateway_config(tmp_path / home, slow), clock=clock, parts=parts) as services:
            assert services.leader is not None and services.leader.shared
            await until(lambda: services.leader is not None and services.leader.leading, timeout=2.5)
            assert leadership(services).seen_lately is False  # nobody had checked in: no grace
        # closing resigns: the next process needs no grace either
