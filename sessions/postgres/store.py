"""``PgStore``: the session store on PostgreSQL, composed of its parts over one ``PgState``
(``sessions.postgres.state``): the append queue (``batching``), ``appends``, ``reads``,
``records``, ``usage``, ``lifecycle``, ``maintenance``, ``export`` and the keys shared across
processes (``shared``); each method of the port is one call of a part. ``open`` connects, applies
the migrations (refusing a database a newer neotask migrated), removes runs a start left without
their first message, and loads the entries and the active runs; ``close`` waits for the queued
appends and writes the entries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import asyncpg

from config.clock import Clock
from config.errors import ConfigError
from config.settings import PostgresSettings, Settings
from sessions.appends import check_writable
from sessions.delegate import Delegate
from sessions.entries import SessionEntry
from sessions.history_index import MAX_BACKLOG, MAX_BATCH, HistoryIndexProtocol, own_index
from sessions.postgres.appends import PgAppends
from sessions.postgres.backup import PgBackup, online_backup
from sessions.postgres.batching import AppendQueue
from sessions.postgres.export import PgExport
from sessions.postgres.faults import quiet_pool_log, refused_at_open
from sessions.postgres.history import PgHistoryIndex, pacing
from sessions.postgres.lifecycle import PgLifecycle
from sessions.postgres.maintenance import PgMaintenance
from sessions.postgres.reads import PgReads
from sessions.postgres.records import PgRecords
from sessions.postgres.schema import migrate
from sessions.postgres.shared import PgSharing
from sessions.postgres.state import PgState, load_view
from sessions.postgres.usage import PgUsage
from sessions.protocol import StoreProtocol
from sessions.records import RunState, StoredRecord
from sessions.store_hooks import StoreHooks

POOL_SIZE = 10


async def keep_session(_conn: asyncpg.Connection) -> None:
    """The store pool's reset when a connection comes back: nothing beyond asyncpg's own rollback
    of an open transaction. The default reset is a statement (``pg_advisory_unlock_all``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``) on every release: a round trip for each append
    batch, though the store's connections never take a session lock, listen, change a setting
    or keep a cursor (the lock and LISTEN connections are others, with the default reset)."""


class PgStore:
    """Every capability of the store port (``sessions.protocol``) on PostgreSQL. Each method is one
    of the parts below: they share one ``PgState`` (the pool, the keys' entries, the active runs)
    and are given at construction the other parts they call."""

    def __init__(self, settings: Settings, *, clock: Clock, pool: asyncpg.Pool, where: str, hooks: StoreHooks) -> None:
        self.clock = clock
        self.state = state = PgState(settings, clock, pool, where, hooks)
        self.queue = queue = AppendQueue(state)  # the append statements (group commit)
        self.appends = appends = PgAppends(state, queue)
        self.sharing = PgSharing(state, queue, appends)  # keys leased across processes (``shared``)
        self.reads = PgReads(state)
        self.records = PgRecords(state, queue)
        self.usage = PgUsage(state)
        self.lifecycle = lifecycle = PgLifecycle(state, queue)
        self.maintenance = PgMaintenance(state, lifecycle)
        self.export = PgExport(state)

    @property
    def pool(self) -> asyncpg.Pool:
        return self.state.pool

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
            await load_view(store.state, shared=shared)
            if shared:
                await store.sharing.start(dsn, password)
        except BaseException:
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        await self.queue.settle()
        await self.sharing.stop()
        flush_task = self.state.flush_task
        if flush_task is not None and not flush_task.done():
            flush_task.cancel()
        try:
            await self.state.flush_entries()
        finally:
            await self.state.pool.close()

    async def flush_entries(self, *keys: str) -> None:
        await self.state.flush_entries(*keys)

    @property
    def backup(self) -> PgBackup:
        return online_backup(self.state)

    # -- lookups (in memory), locks, events: the state, ``sessions.postgres.shared`` ---------------

    entry = Delegate("state", PgState.entry)
    require_entry = Delegate("state", PgState.require_entry)
    active_run = Delegate("state", PgState.active_run)
    emit = Delegate("state", PgState.emit)
    lock_for = Delegate("sharing", PgSharing.lock_for)
    turn_lock = Delegate("sharing", PgSharing.turn_lock)
    follow_events = Delegate("sharing", PgSharing.follow_events)

    def entries(self) -> Iterable[SessionEntry]:
        return self.state.entries.values()

    def run_state(self, run_id: str) -> RunState | None:
        return self.state.runs.get(run_id)

    def active_runs(self) -> Iterable[RunState]:
        return self.state.runs.values()

    @property
    def shared(self) -> bool:
        return self.sharing.shared

    # -- the entry, the lifecycle: ``sessions.postgres.lifecycle`` ----------------------------------

    update_entry = Delegate("lifecycle", PgLifecycle.update_entry)
    set_inherit_next = Delegate("lifecycle", PgLifecycle.set_inherit_next)
    set_reset_boundary = Delegate("lifecycle", PgLifecycle.set_reset_boundary)
    start_run = Delegate("lifecycle", PgLifecycle.start_run)
    discard_run = Delegate("lifecycle", PgLifecycle.discard_run)
    pause = Delegate("lifecycle", PgLifecycle.pause)
    resume = Delegate("lifecycle", PgLifecycle.resume)
    complete = Delegate("lifecycle", PgLifecycle.complete)
    delete = Delegate("lifecycle", PgLifecycle.delete)

    # -- appends: ``sessions.postgres.appends`` (under the key's lease when shared) ---------------

    check_writable = staticmethod(check_writable)
    append = Delegate("sharing", PgSharing.append)
    queue_append = Delegate("appends", PgAppends.queue_append)
    finish_append = Delegate("sharing", PgSharing.finish_append)
    record_tool = Delegate("appends", PgAppends.record_tool)
    record_plan = Delegate("appends", PgAppends.record_plan)
    add_usage = Delegate("appends", PgAppends.add_usage)
    calibrate_context = Delegate("appends", PgAppends.calibrate_context)
    rewrite_context = Delegate("sharing", PgSharing.rewrite_context)
    read_context = Delegate("appends", PgAppends.read_context)
    writable = Delegate("appends", PgAppends.writable)
    recently_writable = Delegate("appends", PgAppends.recently_writable)

    # -- reads by run id: ``sessions.postgres.reads`` -----------------------------------------------

    get_run = Delegate("reads", PgReads.get_run)
    require_run = Delegate("reads", PgReads.require_run)
    list_runs = Delegate("reads", PgReads.list_runs)
    known_keys = Delegate("reads", PgReads.known_keys)
    previous_runs = Delegate("reads", PgReads.previous_runs)
    read_messages = Delegate("reads", PgReads.read_messages)
    read_records = Delegate("reads", PgReads.read_records)
    read_final_summary = Delegate("reads", PgReads.read_final_summary)

    # -- DeliveryRecords, CompatRecords: ``sessions.postgres.records`` -------------------------------

    find_delivery = Delegate("appends", PgAppends.find_delivery)
    recall_delivery = Delegate("records", PgRecords.recall_delivery)
    checks_deliveries = Delegate("records", PgRecords.checks_deliveries)
    find_idempotency = Delegate("records", PgRecords.find_idempotency)
    remember_delivery = Delegate("records", PgRecords.remember_delivery)
    remember_reply = Delegate("records", PgRecords.remember_reply)
    hook_delivery = Delegate("records", PgRecords.hook_delivery)
    record_hook_delivery = Delegate("records", PgRecords.record_hook_delivery)
    compat_conversation = Delegate("records", PgRecords.compat_conversation)
    save_compat_conversation = Delegate("records", PgRecords.save_compat_conversation)
    compat_response = Delegate("records", PgRecords.compat_response)
    latest_compat_response = Delegate("records", PgRecords.latest_compat_response)
    save_compat_response = Delegate("records", PgRecords.save_compat_response)

    # -- UsageRecords: ``sessions.postgres.usage`` ---------------------------------------------------

    daily_usage = Delegate("usage", PgUsage.daily_usage)
    tokens_spent = Delegate("usage", PgUsage.tokens_spent)

    # -- HistorySource (on the ``history`` table: ``sessions.postgres.history``) -------------------

    def open_history(self, *, max_batch: int | None = None, max_backlog: int = MAX_BACKLOG) -> PgHistoryIndex:
        """The history index in this database (not started yet: ``await index.open()``)."""
        pace = pacing(self.state.settings.gateway.appenders)
        return PgHistoryIndex(self.state.pool, max_batch=max_batch or MAX_BATCH, pace=pace, max_backlog=max_backlog)

    async def rebuild_history(self, index: HistoryIndexProtocol) -> int:
        return await own_index(index, PgHistoryIndex).rebuild()

    async def catch_up_history(self, index: HistoryIndexProtocol) -> None:
        await own_index(index, PgHistoryIndex).catch_up()

    async def check_history(self, index: HistoryIndexProtocol, *, fix: bool) -> list[StoredRecord]:
        return await own_index(index, PgHistoryIndex).check(fix=fix)

    # -- Maintenance: ``sessions.postgres.maintenance``, ``sessions.postgres.export`` ----------------

    check = Delegate("maintenance", PgMaintenance.check)
    cleanup = Delegate("maintenance", PgMaintenance.cleanup)
    export_runs = Delegate("export", PgExport.export_runs)
    purge = Delegate("maintenance", PgMaintenance.purge)


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


def _conforms(store: PgStore) -> StoreProtocol:
    return store  # mypy checks here that PgStore has every capability
