"""``PgStore``: the session store on PostgreSQL. ``open`` connects, applies the migrations (refusing
a database a newer neotask migrated), removes runs a start left without their first message, and
loads the entries and the active runs; ``close`` waits for the queued appends and writes the
entries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import asyncpg

from config.clock import Clock
from config.errors import ConfigError
from config.settings import PostgresSettings, Settings
from sessions.entries import SessionEntry
from sessions.history_index import MAX_BATCH, HistoryIndexProtocol, own_index
from sessions.postgres.base import NOWHERE, decode_entry, state_from_row
from sessions.postgres.export import PgExport
from sessions.postgres.faults import quiet_pool_log, refused_at_open, unavailable
from sessions.postgres.history import PgHistoryIndex
from sessions.postgres.maintenance import PgMaintenance
from sessions.postgres.schema import migrate
from sessions.postgres.shared import PgShared
from sessions.protocol import ConversationStore
from sessions.records import Counters, RunState, StoredRecord, counter_values
from sessions.store_hooks import StoreHooks

log = logging.getLogger(__name__)

POOL_SIZE = 10
_DROP_OPENING = (
    "DELETE FROM runs WHERE opening AND next_seq = 1 AND status IN ('running', 'paused') RETURNING run_id, session_key"
)


async def keep_session(_conn: asyncpg.Connection) -> None:
    """The store pool's reset when a connection comes back: nothing beyond asyncpg's own rollback
    of an open transaction. The default reset is a statement (``pg_advisory_unlock_all``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``) on every release: a round trip for each append
    batch, though the store's connections never take a session lock, listen, change a setting
    or keep a cursor (the lock and LISTEN connections are others, with the default reset)."""


class PgStore(PgShared, PgMaintenance, PgExport):
    def __init__(self, settings: Settings, *, clock: Clock, pool: asyncpg.Pool, where: str, hooks: StoreHooks) -> None:
        self.settings = settings
        self.clock = clock
        self.pool = pool
        self.where = where
        self.hooks = hooks
        self._entries: dict[str, SessionEntry] = {}
        self._dirty: set[str] = set()
        self._flush_task: asyncio.Task[None] | None = None
        self._runs: dict[str, RunState] = {}
        self._undiscarded: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._queues = {}
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._calls: set[asyncio.Task[None]] = set()
        self._unsure: set[str] = set()
        self._in_flight: set[str] = set()
        self._sending: set[asyncio.Task[None]] = set()
        self._replies = []
        self._append_error: BaseException | None = None
        self._probed: tuple[float, str | None] = (float("-inf"), None)

    @classmethod
    async def open(
        cls,
        settings: Settings,
        *,
        dsn: str,
        clock: Clock,
        hooks: StoreHooks | None = None,
        password: str | None = None,
        pool_size: int = POOL_SIZE,
        shared: bool = False,
    ) -> PgStore:
        """``shared``: other gateway processes use the database at the same time (``gateway.workers``
        above 1): keys are leased (``sessions.postgres.shared``)."""
        where = redact(dsn)
        quiet_pool_log()
        try:
            pool = await asyncpg.create_pool(dsn, password=password, min_size=1, max_size=pool_size, reset=keep_session)
        except Exception as exc:  # a first connection: what the operator must fix, in one line
            typed = refused_at_open(exc, where, settings.storage.postgres.password_env)
            if typed is None:
                raise
            raise typed from None
        store = cls(settings, clock=clock, pool=pool, where=where, hooks=hooks or StoreHooks())
        try:
            async with pool.acquire() as conn:
                await migrate(conn, where)
            await store._recover(shared=shared)
            if shared:
                await store.start_sharing(dsn, password)
        except BaseException:
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        await self.settle_queues()
        await self.stop_sharing()
        if self._flush_task is not None and not self._flush_task.done():
            self._flush_task.cancel()
        try:
            await self.flush_entries()
        finally:
            await self.pool.close()

    # -- HistorySource (on the ``history`` table: sessions.postgres.history) -----------------------

    def open_history(self, *, max_batch: int | None = None) -> PgHistoryIndex:
        """The history index in this database (not started yet: ``await index.open()``)."""
        return PgHistoryIndex(self.pool, max_batch=max_batch or MAX_BATCH)

    async def rebuild_history(self, index: HistoryIndexProtocol) -> int:
        return await own_index(index, PgHistoryIndex).rebuild()

    async def catch_up_history(self, index: HistoryIndexProtocol) -> None:
        await own_index(index, PgHistoryIndex).catch_up()

    async def check_history(self, index: HistoryIndexProtocol, *, fix: bool) -> list[StoredRecord]:
        return await own_index(index, PgHistoryIndex).check(fix=fix)

    async def _recover(self, *, shared: bool = False) -> None:
        with unavailable("nothing was stored"):
            async with self.pool.acquire() as conn:
                # a start that never stored its first message (a crash, a failed append) leaves nothing;
                # shared, such a run may be another process's start under way: the key's next message uses it
                dropped = [] if shared else await conn.fetch(_DROP_OPENING)
                entries = await conn.fetch("SELECT key, body::text FROM entries")
                rows = await conn.fetch("SELECT * FROM runs WHERE status IN ('running', 'paused')")
        for row in dropped:
            log.warning("run %s of %r never stored its first message: removed", row[0], row[1])
        self._entries = {row[0]: decode_entry(row[1]) for row in entries}
        for row in rows:
            run = state_from_row(dict(row), NOWHERE / row["run_id"])
            entry = self._entries.get(run.key)
            if entry is not None and entry.run_id == run.run_id and _same_but_tokens(entry, run):
                run.context_tokens = entry.context_tokens  # a calibration the row does not hold
            self._runs[run.run_id] = run
        self._reconcile_entries()
        if self._dirty:
            await self.flush_entries()

    def _reconcile_entries(self) -> None:
        """Make the entries agree with the active runs (the runs table is the truth)."""
        for run in self._runs.values():
            entry = self._entries.get(run.key)
            if entry is None:
                entry = self._entries[run.key] = self._new_entry(run.key, run.agent_id, run.chat_type, run.channel)
            if entry.run_id != run.run_id:
                entry.inherit_next = True
            before = (entry.run_id, entry.status, entry.started_at, counter_values(entry))
            entry.run_id, entry.status, entry.started_at = run.run_id, run.status, run.started_at
            self.sync_counters(entry, run)
            if (entry.run_id, entry.status, entry.started_at, counter_values(entry)) != before:
                self._dirty.add(run.key)
        for entry in self._entries.values():
            if entry.run_id is not None and entry.run_id not in self._runs:
                entry.last_run_id, entry.run_id, entry.status = entry.run_id, None, "idle"
                self._dirty.add(entry.key)


def _same_but_tokens(entry: SessionEntry, run: RunState) -> bool:
    """Whether the entry's checkpoint describes the stored run (its token count may then be a
    provider's calibration, which the run's row does not keep)."""
    return Counters._make(counter_values(entry))._replace(context_tokens=0) == run.counters._replace(context_tokens=0)


def connection_options(settings: PostgresSettings, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """The DSN and the password (from the environment variable ``password_env``; None: libpq's own
    PGPASSWORD or a password-less login) of ``storage.postgres``."""
    if not settings.dsn:
        raise ConfigError("storage.postgres.dsn is not set: set it, e.g. postgresql://neotask@127.0.0.1:5432/neotask")
    return settings.dsn, environ.get(settings.password_env) or None


async def open_from_settings(
    settings: Settings, environ: Mapping[str, str], *, clock: Clock, hooks: StoreHooks | None = None
) -> PgStore:
    """``PgStore.open`` as ``storage.postgres`` says (the composition root's one call)."""
    dsn, password = connection_options(settings.storage.postgres, environ)
    return await PgStore.open(
        settings, dsn=dsn, password=password, clock=clock, hooks=hooks, pool_size=settings.storage.postgres.pool_size,
        shared=shared_keys(settings),
    )  # fmt: skip


async def try_login(settings: Settings, environ: Mapping[str, str]) -> None:
    """One login to the database of ``storage.postgres`` (nothing read or changed), for
    ``config check --connect``: ``DatabaseRefused`` naming the setting to fix when it fails."""
    dsn, password = connection_options(settings.storage.postgres, environ)
    try:
        conn = await asyncpg.connect(dsn, password=password, timeout=10)
    except Exception as exc:
        typed = refused_at_open(exc, redact(dsn), settings.storage.postgres.password_env)
        if typed is None:
            raise
        raise typed from None
    await conn.close()


def shared_keys(settings: Settings) -> bool:
    """Whether keys are leased across processes: ``storage.postgres.shared``, or by default when
    this gateway runs several workers (several gateways on one database set it true)."""
    shared = settings.storage.postgres.shared
    return settings.gateway.workers > 1 if shared is None else shared


def redact(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or "@" not in rest:
        return dsn
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


def _conforms(store: PgStore) -> ConversationStore:
    return store  # mypy checks here that PgStore has the base and record capabilities
