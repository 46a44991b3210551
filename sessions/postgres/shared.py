"""The PostgreSQL store when several gateway processes share the database (``gateway.workers``
above 1): each key is leased by one process at a time (``sessions.postgres.keylocks``) while it
stores on the key (and a few seconds more, or until another process asks for it): the store's
``lock_for``, ``append`` and ``rewrite_context`` hold the lease;
taking it reads the key's active run and entry from the database again (in place: a turn keeps
its ``RunState``), giving it back waits until the key's appends are durable and writes its entry.
A model turn holds the ``TurnLocks`` turn lock, another advisory lock, for its whole length (so
other processes keep storing messages on the key meanwhile, as one process does).

The view of a key this process does not hold follows the other processes' events: a key named by
one is read again from the database (its active runs and entry; with every other key named within
``VIEW_REFRESH_S``, in two statements), so listings and a session's counters lag by about that
much, plus the writer's entry flush, not until this process next works on the key. A key this
process holds or is taking is never read this way (its own view is the newest), nor is one that
a lease took while the batch was being read (the read may be older than what the lease saw)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from config.errors import Conflict
from sessions.events import StoreEvent
from sessions.postgres.appends import PgAppends
from sessions.postgres.batching import AppendQueue, nothing
from sessions.postgres.keylocks import LOCK_CONNECTIONS, KeyLeases
from sessions.postgres.locks import SharedLock, TurnLock
from sessions.postgres.notify import EventRelay
from sessions.postgres.state import PgState, decode_entry, state_from_row
from sessions.records import ContextRewrite, MessageRecord, NewMessage, RunState, copy_counters
from sessions.rewrites import ContextChange

log = logging.getLogger(__name__)

T = TypeVar("T")

VIEW_REFRESH_S = 0.2  # the other processes' changes are read again in batches this far apart
POOL_CLOSE_S = 10.0

_REFRESHED = (
    "status", "next_seq", "next_summary_id", "context_tokens", "compaction_count", "context_bytes",
    "context_lines", "last_context_seq", "messages_bytes", "next_tool_seq", "next_plan_id", "usage",
)  # fmt: skip


async def _close_pool(pool: asyncpg.Pool) -> None:
    """Close a lock pool, waiting ``POOL_CLOSE_S`` at most for a connection still out (a lock held
    by a task that did not end): then its connections are closed, and the server frees their locks."""
    try:
        await asyncio.wait_for(pool.close(), POOL_CLOSE_S)
    except TimeoutError:
        log.warning("a lock connection was still in use at close: closed")
        pool.terminate()


class PgSharing:
    """The store's keys and events across processes (see the module's doc); alone (``start`` not
    called), ``lock_for`` hands out plain locks and the appends go straight to ``appends``."""

    def __init__(self, state: PgState, queue: AppendQueue, appends: PgAppends) -> None:
        self.state = state
        self.queue = queue
        self.appends = appends
        self.leases: KeyLeases | None = None
        self._turn_pool: asyncpg.Pool | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._follower: Callable[[StoreEvent], object] | None = None
        self._stale: set[str] = set()
        self._reading: frozenset[str] = frozenset()  # the keys a view refresh is reading now
        self._overtaken: set[str] = set()  # of those, the ones a lease took meanwhile: the read is older than it
        self._viewing: asyncio.Task[None] | None = None

    async def start(self, dsn: str, password: str | None) -> None:
        """Lease keys from now on (a pool of connections that hold the keys' locks), and send and
        receive the events (``sessions.postgres.notify``)."""
        pool = await asyncpg.create_pool(dsn, password=password, min_size=0, max_size=LOCK_CONNECTIONS)
        relay = EventRelay(self.state.pool, dsn, password)
        leases = KeyLeases(pool, on_taken=self._refresh_key, on_leaving=self._settle_key, on_waiting=relay.ask)
        relay.asked = leases.asked
        relay.deliver = self._from_others
        self._stale, self._overtaken = set(), set()
        self.leases = leases
        self._turn_pool = await asyncpg.create_pool(dsn, password=password, min_size=0, max_size=LOCK_CONNECTIONS)
        self._locks.clear()
        await relay.start()
        self.state.relay = relay

    async def stop(self) -> None:
        leases, self.leases = self.leases, None
        relay, self.state.relay = self.state.relay, None
        turns, self._turn_pool = self._turn_pool, None
        viewing, self._viewing = self._viewing, None
        if viewing is not None:
            viewing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await viewing
        self._locks.clear()  # the shared locks of the keys point at the leases that close now
        try:
            if relay is not None:
                await relay.close()
            if turns is not None:
                await _close_pool(turns)
        finally:
            if leases is not None:
                try:
                    await leases.close()
                finally:
                    await _close_pool(leases.pool)

    def follow_events(self, deliver: Callable[[StoreEvent], object]) -> None:
        """``SharedEvents``: ``deliver`` gets the events other processes emit (none when alone)."""
        self._follower = deliver

    def _from_others(self, event: StoreEvent) -> None:
        key = event.get("key")
        if isinstance(key, str) and self.leases is not None and not self.leases.known(key):
            self._stale.add(key)
            if self._viewing is None or self._viewing.done():
                self._viewing = asyncio.get_running_loop().create_task(self._refresh_views(), name="postgres-views")
        if self._follower is not None:
            self._follower(event)

    async def _refresh_views(self) -> None:
        """Read again, in one batch, the keys other processes changed (see the module's doc)."""
        while self._stale:
            await asyncio.sleep(VIEW_REFRESH_S)
            keys, self._stale = sorted(self._stale), set()
            self._reading, self._overtaken = frozenset(keys), set()
            try:
                pool = self.state.pool
                async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
                    runs, entries = await self._read_keys(keys, conn)  # one snapshot for both
            except Exception as exc:  # the next event of the key, or a lease, reads it again
                log.debug("views of %d key(s) not read again (%s)", len(keys), exc)
                continue
            finally:
                self._reading = frozenset()
            for key in keys:
                # not held nor taken since the read began: nothing here is newer than what was read
                if key not in self._overtaken and self.leases is not None and not self.leases.known(key):
                    self._apply_key(key, runs.get(key, []), entries.get(key))

    @property
    def shared(self) -> bool:
        return self.leases is not None

    def lock_for(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock() if self.leases is None else SharedLock(self.leases, key)
        return lock

    def turn_lock(self, key: str) -> asyncio.Lock | None:
        """``TurnLocks``: the key's turn lock across processes (None: one process, the engine's own
        lock is enough)."""
        if self.leases is None or self._turn_pool is None:
            return None
        return TurnLock(self._turn_pool, self.leases, key)

    async def _leased(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """``work`` under the key's lease (taken for its length; alone, none)."""
        if self.leases is None:
            return await work()
        await self.leases.enter(key)
        try:
            return await work()
        finally:
            self.leases.leave(key)

    async def append(self, run: RunState, message: NewMessage) -> MessageRecord:
        """Under the key's lease (a turn's reply, a tool's message: the lease is not held for a
        whole turn), so its seq follows what other processes stored meanwhile; a seq taken by a
        killed holder's late append is handled in ``finish_append``."""
        if self.leases is None:
            return await self._append(run, message)
        return await self._leased(run.key, lambda: self._append(run, message))

    async def _append(self, run: RunState, message: NewMessage) -> MessageRecord:
        record, durable = self.appends.queue_append(run, message)
        return await self.finish_append(run, message, record, durable)

    async def finish_append(
        self, run: RunState, message: NewMessage, record: MessageRecord, durable: asyncio.Future[None]
    ) -> MessageRecord:
        """Sent once more when its seq was taken (the claim's bare ``Conflict``, nothing stored): a
        process killed while it held the key frees the lease lock at once, but an append statement
        it had sent on another connection may commit later still, even after the next holder read
        the run (``_refresh_key`` waits only for a statement that already holds the run's row). The
        failed statement took the run's counters from its row, so the second try follows that
        commit; a run that another process completed fails again, as before. Both ways of storing
        come here: ``append`` and a post's ``queue_append`` (seq given under the key's lock, the
        commit awaited after it), so ``record``, the caller's, takes the second try's seq and time."""
        try:
            return await self.appends.finish_append(run, record, durable)
        except Conflict as exc:
            if self.leases is None or type(exc) is not Conflict:  # not the claim's: a closing run, ...
                raise
            log.warning("run %s: seq %s taken by another process's late append; sending again", run.run_id,
                        record["seq"])  # fmt: skip
        await self.leases.enter(run.key)
        try:
            again, durable = self.appends.queue_append(run, message)
        finally:
            self.leases.leave(run.key)
        record.update(again)
        return await self.appends.finish_append(run, record, durable)

    async def rewrite_context(self, run: RunState, change: ContextChange) -> ContextRewrite | None:
        return await self._leased(run.key, lambda: self.appends.rewrite_context(run, change))

    async def _refresh_key(self, key: str, conn: asyncpg.Connection) -> None:
        """Read ``key``'s active run and entry again, the lease just taken: another process may have
        changed them. The runs' rows are read once no append on them is still committing: a
        process killed while it held the lease frees the lock at once, but the append it had sent
        may commit after (CI saw the next holder append with the seq that commit took: 409)."""
        if key in self._reading:
            self._overtaken.add(key)
        runs, entries = await self._read_keys([key], conn, after_writers=True)
        self._apply_key(key, runs.get(key, []), entries.get(key))

    @staticmethod
    async def _read_keys(
        keys: list[str], conn: asyncpg.Connection, *, after_writers: bool = False
    ) -> tuple[dict[str, list[asyncpg.Record]], dict[str, str]]:
        """The active runs' rows and the entry bodies of ``keys``, by key. ``after_writers``: the
        rows are read with a share lock, which waits for a transaction updating them to end."""
        lock = " FOR SHARE" if after_writers else ""
        rows = await conn.fetch(
            f"SELECT * FROM runs WHERE session_key = ANY($1::text[]) AND status IN ('running', 'paused'){lock}", keys
        )
        bodies = await conn.fetch("SELECT key, body::text AS body FROM entries WHERE key = ANY($1::text[])", keys)
        runs: dict[str, list[asyncpg.Record]] = {}
        for row in rows:
            runs.setdefault(row["session_key"], []).append(row)
        return runs, {row["key"]: row["body"] for row in bodies}

    def _apply_key(self, key: str, rows: list[asyncpg.Record], body: str | None) -> None:
        active = {row["run_id"]: state_from_row(dict(row)) for row in rows}
        for run_id, run in list(self.state.runs.items()):
            if run.key == key and run_id not in active and not self.queue.busy(run):
                del self.state.runs[run_id]  # ended by another process
        for run_id, fresh in active.items():
            known = self.state.runs.get(run_id)
            if known is None:
                self.state.runs[run_id] = fresh
            elif not self.queue.busy(known):
                for name in _REFRESHED:
                    setattr(known, name, getattr(fresh, name))
        if key not in self.state.dirty:
            if body is not None:
                self.state.entries[key] = decode_entry(body)
            elif not active:  # deleted by another process (a session never stored has no entry here)
                self.state.entries.pop(key, None)
        entry = self.state.entries.get(key)
        first = next(iter(active), None)
        if first is not None:
            run = self.state.runs[first]
            if entry is None:
                entry = self.state.entries[key] = self.state.new_entry(key, run.agent_id, run.chat_type, run.channel)
            entry.run_id, entry.status, entry.started_at = run.run_id, run.status, run.started_at
            copy_counters(run, entry)
        elif entry is not None and entry.run_id is not None:
            entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"

    async def _settle_key(self, key: str) -> None:
        """Before the lease ends: every append queued for the key durable, its entry written."""
        for run in [r for r in self.state.runs.values() if r.key == key and self.queue.busy(r)]:
            with contextlib.suppress(Exception):  # a failed append fails what follows it: nothing more is queued
                await self.queue.after_queued(run, nothing)
        await self.state.flush_entries(key)
