"""One key worked on by one gateway process at a time, across every process on the database
(``gateway.workers`` above 1): a session-level advisory lock on a hash of the key, held on a
connection of its own while the process has anything under way on the key.

A process *leases* a key when its first local user enters (a post storing a message, an append
of a turn, a lifecycle change: the store's ``lock_for``, ``append`` and ``rewrite_context``), and
gives the lease back when the last one left and every append it queued for the key is durable; in
between the in-process locks order the process's own users as with one process. On taking a
lease the process reads the key's active run and entry from the database again (another process
may have appended, started or ended a run), so seqs stay contiguous; before giving it back it
writes the key's entry. A model turn holds ``TurnLock``, another advisory lock of the key, for its
whole length: turns run one at a time across processes while messages are still stored. A process
killed mid-turn loses its connections, and the server releases their locks: the next process takes
the key at once.

Why an advisory lock and not a row lock (``SELECT ... FOR UPDATE`` on a row of the key in an open
transaction): measured with ``python -m bench.key_locks`` (durable server, 64 tasks, load 7-8 on 2
cores) an advisory hold runs 1.43x the row lock's holds/s on 64 keys and 1.83x on 4 contended keys
(p99 225 vs 487 ms); it needs no transaction open for the length of a turn, exists for a key that
has no run yet, and dies with its connection (a worker killed with SIGKILL frees its keys at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import asyncpg

from sessions.postgres.faults import database_error

log = logging.getLogger(__name__)

LOCK_CONNECTIONS = 32  # keys one process may hold at once (each lease holds a connection)

Taken = Callable[[str, asyncpg.Connection], Awaitable[None]]
Leaving = Callable[[str], Awaitable[None]]


def key_lock_id(key: str, *, space: bytes = b"neotask-key") -> int:
    """The advisory lock number of ``key``: 64 bits of its BLAKE2b hash (personalised by
    ``space``: the lease's and the turn's are different locks), signed as bigint."""
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=space).digest(), "big")
    return value - (1 << 64) if value >= 1 << 63 else value


def turn_lock_id(key: str) -> int:
    return key_lock_id(key, space=b"neotask-turn")


@dataclass(eq=False)
class _Lease:
    ready: asyncio.Future[None]
    users: int = 0
    entered: int = 0  # users that ever entered (one that came and went during the leaving counts)
    conn: asyncpg.Connection | None = None
    leaving: asyncio.Task[None] | None = None
    unlocking: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event)


class KeyLeases:
    """The keys this process holds; ``on_taken`` runs once a key's lock is taken (on its
    connection), ``on_leaving`` before it is given back."""

    def __init__(self, pool: asyncpg.Pool, *, on_taken: Taken, on_leaving: Leaving) -> None:
        self.pool = pool
        self._on_taken = on_taken
        self._on_leaving = on_leaving
        self._leases: dict[str, _Lease] = {}
        self.waits = 0  # leases that had to wait for another process (for tests and /metrics)

    def held(self, key: str) -> bool:
        lease = self._leases.get(key)
        return lease is not None and lease.ready.done() and not lease.ready.exception()

    async def enter(self, key: str) -> None:
        """Hold ``key`` for one more local user (taking its lock first when none holds it)."""
        while True:
            lease = self._leases.get(key)
            if lease is None or not lease.unlocking:
                break
            await lease.gone.wait()
        if lease is None:
            lease = self._leases[key] = _Lease(asyncio.get_running_loop().create_future())
            task = asyncio.get_running_loop().create_task(self._take(key, lease), name=f"lease {key}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        lease.users += 1
        lease.entered += 1
        try:
            await asyncio.shield(lease.ready)
        except BaseException:
            self.leave(key)
            raise

    def leave(self, key: str) -> None:
        """One local user is done with ``key``; the last one gives the lease back (in a task)."""
        lease = self._leases.get(key)
        if lease is None:
            return
        lease.users -= 1
        if lease.users == 0 and lease.leaving is None:
            lease.leaving = asyncio.get_running_loop().create_task(self._leave(key, lease), name=f"unlease {key}")

    async def _take(self, key: str, lease: _Lease) -> None:
        conn: asyncpg.Connection | None = None
        try:
            conn = await self.pool.acquire()
            lock = key_lock_id(key)
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock):
                self.waits += 1
                await conn.execute("SELECT pg_advisory_lock($1)", lock)
            lease.conn = conn
            await self._on_taken(key, conn)
        except BaseException as exc:
            if conn is not None:
                await _drop(self.pool, conn)  # the lock, if taken, goes with the connection
            lease.conn = None
            if not lease.ready.done():  # a lost database is the typed 503 its users answer
                lease.ready.set_exception(database_error(exc, "the message") or exc)
                lease.ready.exception()  # retrieved: every user re-raises it
            if self._leases.get(key) is lease and lease.users == 0:
                del self._leases[key]
            if not isinstance(exc, Exception):
                raise
            return
        lease.ready.set_result(None)

    async def _leave(self, key: str, lease: _Lease) -> None:
        try:
            await asyncio.wait([lease.ready])
            while lease.conn is not None:
                entered = lease.entered
                try:
                    await self._on_leaving(key)
                except Exception as exc:  # the next holder reads the runs table, the truth
                    log.warning("key %r: its entry was not written before the lease ended (%s)", key, exc)
                if lease.users > 0:  # a user came back meanwhile: keep holding
                    lease.leaving = None
                    return
                if lease.entered == entered:  # none came and went meanwhile (queuing appends)
                    break
            lease.unlocking = True
            if lease.conn is not None:
                await _unlock(self.pool, lease.conn, key)
        finally:
            if lease.unlocking or lease.conn is None:
                if self._leases.get(key) is lease:
                    del self._leases[key]
                lease.gone.set()

    async def close(self) -> None:
        """Give every lease back (the store closes: its appends are settled already)."""
        tasks = [lease.leaving for lease in self._leases.values() if lease.leaving is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for key, lease in list(self._leases.items()):
            if lease.conn is not None and not lease.unlocking:
                lease.unlocking = True
                await _unlock(self.pool, lease.conn, key)
            lease.gone.set()
        self._leases.clear()


async def _unlock(pool: asyncpg.Pool, conn: asyncpg.Connection, key: str, lock: int | None = None) -> None:
    try:
        await conn.execute("SELECT pg_advisory_unlock($1)", key_lock_id(key) if lock is None else lock)
    except Exception:  # a lost connection took its lock with it
        await _drop(pool, conn)
        return
    await pool.release(conn)


async def _drop(pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    with contextlib.suppress(Exception):  # a lost connection may be back in the pool already
        conn.terminate()
    with contextlib.suppress(Exception):
        await pool.release(conn)


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
                raise (database_error(exc, "the message") or exc) from exc
            try:
                lock = turn_lock_id(self._key)
                if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock):
                    self._leases.waits += 1
                    await conn.execute("SELECT pg_advisory_lock($1)", lock)
            except BaseException:
                await _drop(self._pool, conn)
                raise
            self._conn = conn
            try:
                await self._leases.enter(self._key)  # the view of the key as it is now
            except BaseException:
                self._give_back()
                raise
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
            task = asyncio.get_running_loop().create_task(_unlock(self._pool, conn, self._key, turn_lock_id(self._key)))
            self._unlocks.add(task)
            task.add_done_callback(self._unlocks.discard)
