"""One key worked on by one gateway process at a time, across every process on the database
(``gateway.workers`` above 1): a session-level advisory lock on a hash of the key. A lock taken at
once is held on the process's *holder* connection (one connection holds any number of them); a lock
another process has is waited for on a connection of its own, which then holds it. The connection
that holds a key's lock going away (a database restart, a killed backend) drops the lease: the
next user takes the key again and reads it again.

A process *leases* a key when its first local user enters (a post storing a message, an append
of a turn, a lifecycle change: the store's ``lock_for``, ``append`` and ``rewrite_context``), and
keeps it while it has users; in between the in-process locks order the process's own users as with
one process. When the last user left, the lease *lingers* (``LINGER_S``): the next message on the
key, which usually comes to the same process (a client's connection stays with the worker that
accepted it), finds the lease held and costs no statement more than with one process. The lease is
given back, once every append it queued for the key is durable, when the linger ends, when another
process asks for the key (it failed to take the lock at once and said so on ``LEASE_CHANNEL``: the
holder gives the key back as soon as its own users are done), when the process needs the
connection for another key that it must wait for (the longest idle of those goes first), and at
close. A process waiting for a key asks again every ``ASK_AGAIN_S`` (a notification is lost while
the holder's listening connection reconnects). On taking a
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
from dataclasses import KW_ONLY, dataclass, field

import asyncpg

from config.errors import StorageUnavailable
from sessions.postgres.faults import RETRY_AFTER_S, database_error

log = logging.getLogger(__name__)

LOCK_CONNECTIONS = 32  # the holder's connection, and one per lease that had to wait for its lock
LINGER_S = 5.0  # how long an unused lease is kept for the key's next message
ASK_AGAIN_S = 2.0  # a process waiting for a key asks for it again this often (an ask may be lost)
LEASE_CHANNEL = "neotask_leases"  # "I wait for this lock": payload "<origin> <lock number>"

Taken = Callable[[str, asyncpg.Connection], Awaitable[None]]
Leaving = Callable[[str], Awaitable[None]]
Asking = Callable[[int], object]


def key_lock_id(key: str, *, space: bytes = b"neotask-key") -> int:
    """The advisory lock number of ``key``: 64 bits of its BLAKE2b hash (personalised by
    ``space``: the lease's and the turn's are different locks), signed as bigint."""
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=space).digest(), "big")
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass(eq=False)
class _Lease:
    ready: asyncio.Future[None]
    users: int = 0
    entered: int = 0  # users that ever entered (one that came and went during the leaving counts)
    conn: asyncpg.Connection | None = None
    leaving: asyncio.Task[None] | None = None
    unlocking: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    lingering: asyncio.TimerHandle | None = None  # set while no user holds it and it is kept
    idle_since: float = 0.0
    wanted: bool = False  # another process waits for it: given back when its users are done
    own: bool = False  # the lock is held on a connection of its own (it had to wait), not the holder's
    on_lost: Callable[[object], None] | None = None


@dataclass(eq=False)
class KeyLeases:
    """The keys this process holds; ``on_taken`` runs once a key's lock is taken (on its
    connection), ``on_leaving`` before it is given back, ``on_waiting`` when this process waits
    for a lock another holds (it asks for it: ``LEASE_CHANNEL``)."""

    pool: asyncpg.Pool
    _: KW_ONLY
    on_taken: Taken
    on_leaving: Leaving
    on_waiting: Asking | None = None
    linger_s: float = LINGER_S
    capacity: int = LOCK_CONNECTIONS
    waits: int = field(default=0, init=False)  # leases that had to wait for another process (tests, /metrics)
    takes: int = field(default=0, init=False)  # leases taken (a message on a key this process holds takes none)
    _leases: dict[str, _Lease] = field(default_factory=dict, init=False)
    _by_lock: dict[int, str] = field(default_factory=dict, init=False)
    _holder: asyncpg.Connection | None = field(default=None, init=False)  # holds every lock taken without waiting
    _holder_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)  # one statement at a time on it
    _taking: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _closing: bool = field(default=False, init=False)

    def known(self, key: str) -> bool:
        """Whether this process holds ``key``, is taking it or giving it back."""
        return key in self._leases

    def held(self, key: str) -> bool:
        lease = self._leases.get(key)
        return (
            lease is not None
            and lease.ready.done()
            and not lease.ready.exception()
            and lease.conn is not None
            and not lease.unlocking
        )

    async def enter(self, key: str) -> None:
        """Hold ``key`` for one more local user (taking its lock first when none holds it)."""
        if self._closing:
            raise _shutting_down()
        while True:
            lease = self._leases.get(key)
            if lease is None or not lease.unlocking:
                break
            await lease.gone.wait()
        if lease is None:
            lease = self._leases[key] = _Lease(asyncio.get_running_loop().create_future())
            self._by_lock[key_lock_id(key)] = key
            task = asyncio.get_running_loop().create_task(self._take(key, lease), name=f"lease {key}")
            self._taking.add(task)
            task.add_done_callback(self._taken)
        else:
            _stop_lingering(lease)
        lease.users += 1
        lease.entered += 1
        try:
            await asyncio.shield(lease.ready)
        except BaseException:
            self.leave(key)
            raise

    def leave(self, key: str) -> None:
        """One local user is done with ``key``; after the last one the lease lingers (or is given
        back at once when another process asked for it, or it was not taken)."""
        lease = self._leases.get(key)
        if lease is None:
            return
        lease.users -= 1
        if lease.users > 0 or lease.leaving is not None:
            return
        loop = asyncio.get_running_loop()
        if (
            lease.wanted
            or lease.unlocking  # its lock went with its connection
            or lease.conn is None
            or self.linger_s <= 0
            or not lease.ready.done()
            or lease.ready.exception()
            or (lease.own and self._short_of_room())
        ):
            self._give_back(key, lease)
        elif lease.lingering is None:
            lease.idle_since = loop.time()
            lease.lingering = loop.call_later(self.linger_s, self._linger_ended, key, lease)

    def _give_back(self, key: str, lease: _Lease) -> None:
        _stop_lingering(lease)
        if lease.leaving is None:
            lease.leaving = asyncio.get_running_loop().create_task(self._leave(key, lease), name=f"unlease {key}")

    def _linger_ended(self, key: str, lease: _Lease) -> None:
        lease.lingering = None
        if self._leases.get(key) is lease and lease.users == 0:
            self._give_back(key, lease)

    def _taken(self, task: asyncio.Task[None]) -> None:
        self._taking.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the lease's users get it

    def _short_of_room(self) -> bool:
        """Whether the leases on connections of their own use them all and one more is wanted."""
        own = [lease for lease in self._leases.values() if lease.own]
        holding = sum(1 for lease in own if lease.conn is not None)
        return holding >= self.capacity - 1 and any(lease.conn is None for lease in own)

    def _make_room(self) -> None:
        """Before a lease that waits on a connection of its own: when the pool's connections are
        all taken (one is the holder's), the longest idle such lease goes."""
        own = [(lease.idle_since, key) for key, lease in self._leases.items() if lease.own and lease.conn]
        if len(own) < self.capacity - 1:
            return
        idle = [(since, key) for since, key in own if self._leases[key].lingering is not None]
        if idle:
            key = min(idle)[1]
            self._give_back(key, self._leases[key])

    async def _holder_connection(self) -> asyncpg.Connection:
        """The connection that holds the locks taken at once (under ``_holder_lock``)."""
        if self._holder is None or _closed(self._holder):
            conn = await self.pool.acquire()
            conn.add_termination_listener(self._holder_lost)
            self._holder = conn
        return self._holder

    def _holder_lost(self, conn: object) -> None:
        """The holder's connection closed (a database restart, a killed backend): every lock on it
        is gone, and so are the leases."""
        if self._holder is not None and (conn is self._holder or _closed(self._holder)):
            lost, self._holder = self._holder, None
            for key, lease in list(self._leases.items()):
                if lease.conn is lost:
                    self._lost(key, lease)

    def _lost(self, key: str, lease: _Lease) -> None:
        """``key``'s lock went with its connection: the lease is dropped (at once when nobody uses
        it; else its users finish, and who comes next waits for them and takes the key again)."""
        log.warning("key %r: the connection holding its lease was lost; the key is taken again on next use", key)
        lease.conn = None
        _stop_lingering(lease)
        if lease.users == 0 and lease.leaving is None:
            if self._leases.get(key) is lease:
                self._forget(key)
            lease.gone.set()
        else:
            lease.unlocking = True

    def asked(self, lock: int) -> None:
        """Another process waits for the lock ``lock``: a lease of it goes back when its users are
        done (at once if it has none)."""
        key = self._by_lock.get(lock)
        lease = self._leases.get(key) if key is not None else None
        if key is None or lease is None:
            return
        lease.wanted = True
        if lease.users == 0:
            self._give_back(key, lease)

    async def _take(self, key: str, lease: _Lease) -> None:
        """The lock at once on the holder's connection (no connection per key: a process may lease
        thousands), or, when another process has it, waiting on a connection of its own."""
        lock = key_lock_id(key)
        conn: asyncpg.Connection | None = None
        try:
            async with self._holder_lock:
                holder = await self._holder_connection()
                try:
                    taken = await holder.fetchval("SELECT pg_try_advisory_lock($1)", lock)
                except BaseException:  # the lock may be taken or not: the holder goes, and its locks
                    await drop_connection(self.pool, holder)
                    raise
                if taken:
                    lease.conn = conn = holder
                    self.takes += 1
                    await self.on_taken(key, holder)
            if conn is None:
                self.waits += 1
                lease.own = True
                self._make_room()
                conn = await self.pool.acquire()
                await self._wait_for(conn, lock)
                lease.conn = conn
                lease.on_lost = lambda _conn: self._lost(key, lease)
                conn.add_termination_listener(lease.on_lost)
                self.takes += 1
                await self.on_taken(key, conn)
        except BaseException as exc:
            if conn is not None and lease.own:
                await drop_connection(self.pool, conn)  # the lock, if taken, goes with the connection
            elif conn is not None:
                await self._unlock(key, lease, conn)
            lease.conn = None
            if not lease.ready.done():  # a lost database is the typed 503 its users answer
                stopped = self._closing or not isinstance(exc, Exception)
                lease.ready.set_exception(database_error(exc) or (_shutting_down() if stopped else exc))
                lease.ready.exception()  # retrieved: every user re-raises it
            if self._leases.get(key) is lease and lease.users == 0:
                self._forget(key)
            if not isinstance(exc, Exception):
                raise
            return
        lease.ready.set_result(None)

    async def _wait_for(self, conn: asyncpg.Connection, lock: int) -> None:
        """Take ``lock`` on ``conn`` once the process holding it gives it back, asking it to (again
        every ``ASK_AGAIN_S``: a notification is lost while a listener reconnects). The server's
        ``lock_timeout`` ends each wait cleanly: the lock is then not held, nor half taken."""
        await conn.execute(f"SET lock_timeout = {int(ASK_AGAIN_S * 1000)}")  # the pool's reset undoes it
        while True:
            if self.on_waiting is not None:
                self.on_waiting(lock)
            try:
                await conn.execute("SELECT pg_advisory_lock($1)", lock)
                return
            except asyncpg.LockNotAvailableError:
                continue

    async def reread(self, key: str) -> None:
        """Read the view of a key this process holds again (``on_taken``): writes that need no
        lease (usage, tool records) of the process that held it before are seen."""
        lease = self._leases.get(key)
        if lease is None or lease.conn is None or lease.unlocking:
            return
        if lease.own:
            await self.on_taken(key, lease.conn)
            return
        async with self._holder_lock:
            holder = self._holder
            if holder is not None and holder is lease.conn:
                await self.on_taken(key, holder)

    async def _leave(self, key: str, lease: _Lease) -> None:
        try:
            await asyncio.wait([lease.ready])
            while lease.conn is not None:
                entered = lease.entered
                try:
                    await self.on_leaving(key)
                except Exception as exc:  # the next holder reads the runs table, the truth
                    log.warning("key %r: its entry was not written before the lease ended (%s)", key, exc)
                if lease.users > 0:  # a user came back meanwhile: keep holding
                    lease.leaving = None
                    return
                if lease.entered == entered:  # none came and went meanwhile (queuing appends)
                    break
            lease.unlocking = True
            if lease.conn is not None:
                await asyncio.shield(self._unlock(key, lease, lease.conn))
        finally:
            if lease.unlocking or lease.conn is None:
                if self._leases.get(key) is lease:
                    self._forget(key)
                lease.gone.set()

    def _forget(self, key: str) -> None:
        del self._leases[key]
        self._by_lock.pop(key_lock_id(key), None)

    async def close(self) -> None:
        """Give every lease back, a lingering one settled first (its entry written); a take under
        way is stopped (its connection closed: the lock, if taken, goes with it)."""
        self._closing = True
        for task in list(self._taking):
            task.cancel()
        if self._taking:
            await asyncio.gather(*self._taking, return_exceptions=True)
        for key, lease in list(self._leases.items()):
            if lease.users == 0:
                self._give_back(key, lease)
        tasks = [lease.leaving for lease in self._leases.values() if lease.leaving is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for key, lease in list(self._leases.items()):
            if lease.conn is not None and not lease.unlocking:
                lease.unlocking = True
                await self._unlock(key, lease, lease.conn)
            lease.gone.set()
        self._leases.clear()
        self._by_lock.clear()
        holder, self._holder = self._holder, None
        if holder is not None:
            with contextlib.suppress(Exception):  # the pool's reset unlocks whatever is left on it
                holder.remove_termination_listener(self._holder_lost)
                await self.pool.release(holder)

    async def _unlock(self, key: str, lease: _Lease, conn: asyncpg.Connection) -> None:
        """Give ``key``'s lock back on ``conn``, the lease's own connection (then back to the pool)
        or the holder's (kept). A connection that fails the statement is closed: its locks go."""
        if lease.own:
            if lease.on_lost is not None:
                with contextlib.suppress(Exception):  # a connection already lost and detached
                    conn.remove_termination_listener(lease.on_lost)
                lease.on_lost = None
            await release_lock(self.pool, conn, key)
            return
        try:
            async with self._holder_lock:
                holder = self._holder
                if holder is not None and holder is conn:
                    await holder.execute("SELECT pg_advisory_unlock($1)", key_lock_id(key))
        except Exception:  # the holder is broken: closing it frees its locks and drops its leases
            await drop_connection(self.pool, conn)


def _stop_lingering(lease: _Lease) -> None:
    if lease.lingering is not None:
        lease.lingering.cancel()
        lease.lingering = None


def _shutting_down() -> StorageUnavailable:
    return StorageUnavailable(
        "the gateway is shutting down: the message was not stored; send it again shortly",
        stored=False,
        retry_after_s=RETRY_AFTER_S,
    )


def _closed(conn: asyncpg.Connection) -> bool:
    """Whether ``conn`` is closed (a pooled connection lost and detached from the pool raises)."""
    try:
        return bool(conn.is_closed())
    except Exception:
        return True


async def release_lock(pool: asyncpg.Pool, conn: asyncpg.Connection, key: str, lock: int | None = None) -> None:
    """Unlock the key's advisory lock (or ``lock``) and give the connection back to the pool."""
    try:
        await conn.execute("SELECT pg_advisory_unlock($1)", key_lock_id(key) if lock is None else lock)
    except Exception:  # a lost connection took its lock with it
        await drop_connection(pool, conn)
        return
    await pool.release(conn)


async def drop_connection(pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    """A connection whose lock state is unknown: closed, never given back to the pool as it is."""
    with contextlib.suppress(Exception):  # a lost connection may be back in the pool already
        conn.terminate()
    with contextlib.suppress(Exception):
        await pool.release(conn)
