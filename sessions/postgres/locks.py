"""The locks the PostgreSQL store hands out per key (``PgStore.lock_for`` and the turn lock), both
``asyncio.Lock``: :class:`SharedLock` holds the key's lease (``keylocks.KeyLeases``) while it is
held; :class:`TurnLock` is a key's model-turn lock across processes, an advisory lock of its own."""

from __future__ import annotations

import asyncio
from typing import Literal

import asyncpg

from sessions.postgres.faults import database_error
from sessions.postgres.keylocks import KeyLeases, drop_connection, key_lock_id, release_lock


def turn_lock_id(key: str) -> int:
    return key_lock_id(key, space=b"neotask-turn")


class SharedLock(asyncio.Lock):
    """An ``asyncio.Lock`` for one key that also holds the key's lease while it is held."""

    def __init__(self, leases: KeyLeases, key: str) -> None:
        super().__init__()
        self._leases, self._key = leases, key

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        try:
            await self._leases.enter(self._key)
        except BaseException:
            super().release()
            raise
        return True

    def release(self) -> None:
        super().release()
        self._leases.leave(self._key)


class TurnLock(asyncio.Lock):
    """A key's model-turn lock across processes: an advisory lock (not the lease's number) on a
    connection of ``pool`` held for the turn, so turns on a key run one at a time everywhere while
    other processes still store messages on it (each append takes the lease for its own length).
    Taking it also makes this process's view of the key fresh (the lease taken and given back, if
    this process did not hold it). A process killed mid-turn frees it with its connection."""

    def __init__(self, pool: asyncpg.Pool, leases: KeyLeases, key: str) -> None:
        super().__init__()
        self._pool, self._leases, self._key = pool, leases, key
        self._conn: asyncpg.Connection | None = None
        self._unlocks: set[asyncio.Task[None]] = set()

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        try:
            try:
                conn = await self._pool.acquire()
            except Exception as exc:  # a lost database is the typed 503 the post answers
                raise (database_error(exc) or exc) from exc
            try:
                lock = turn_lock_id(self._key)
                if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock):
                    self._leases.waits += 1
                    await conn.execute("SELECT pg_advisory_lock($1)", lock)
            except BaseException:
                await drop_connection(self._pool, conn)
                raise
            self._conn = conn
            try:
                await self._leases.enter(self._key)  # the view of the key as it is now
            except BaseException:
                self._give_back()
                raise
            try:  # a lease held already (lingering) did not read the key: what needs no lease
                await self._leases.reread(self._key)  # (usage, tool records) may have changed
            except Exception as exc:
                self._give_back()
                typed = database_error(exc)
                if typed is None:
                    raise
                raise typed from exc
            except BaseException:
                self._give_back()
                raise
            finally:
                self._leases.leave(self._key)
        except BaseException:
            super().release()
            raise
        return True

    def release(self) -> None:
        self._give_back()
        super().release()

    def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            task = asyncio.get_running_loop().create_task(
                release_lock(self._pool, conn, self._key, turn_lock_id(self._key))
            )
            self._unlocks.add(task)
            task.add_done_callback(self._unlocks.discard)
