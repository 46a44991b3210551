"""``PgStore``: the session store on PostgreSQL, composed of its parts over one ``PgState``
(``sessions.postgres.state``): the append queue (``batching``), ``appends``, ``reads``,
``records``, ``usage``, ``lifecycle``, ``maintenance``, ``export`` and the keys shared across
processes (``shared``); each method of the port is one call of a part. ``open`` connects, applies
the migrations (refusing a database a newer neotask migrated), removes runs a start left without
their first message, and loads the entries and the active runs; ``close`` waits for the queued
appends and writes the entries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

import asyncpg

from config.clock import Clock
from config.errors import ConfigError
from config.settings import PostgresSettings, Settings
from sessions.appends import check_writable
from sessions.cleanup_plan import CleanupRequest
from sessions.context_lines import ContextLine
from sessions.deliveries import Delivery, PriorDelivery
from sessions.entries import SessionEntry
from sessions.events import StoreEvent
from sessions.exports import RunExport
from sessions.history_index import MAX_BATCH, HistoryIndexProtocol, own_index
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
from sessions.protocol import RecordKind, StoreProtocol
from sessions.records import (
    NEWEST_RUNS,
    PLAIN_FINISH,
    CompatConversation,
    ContextRewrite,
    EntryChange,
    HookDelivery,
    IdempotencyRecord,
    KnownKey,
    MessageRecord,
    NewMessage,
    PlanRecord,
    ResponseRef,
    RunFinish,
    RunQuery,
    RunRow,
    RunStart,
    RunState,
    StoredRecord,
    TaskKey,
    ToolUse,
)  # fmt: skip
from sessions.rewrites import ContextChange
from sessions.store_hooks import StoreHooks
from sessions.usage import ALL_USAGE, DailyUsage, UsageQuery

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

    def entry(self, key: str) -> SessionEntry | None:
        return self.state.entries.get(key)

    def require_entry(self, key: str) -> SessionEntry:
        return self.state.require_entry(key)

    def entries(self) -> Iterable[SessionEntry]:
        return self.state.entries.values()

    def active_run(self, key: str) -> RunState | None:
        return self.state.active_run(key)

    def run_state(self, run_id: str) -> RunState | None:
        return self.state.runs.get(run_id)

    def active_runs(self) -> Iterable[RunState]:
        return self.state.runs.values()

    def emit(self, event: StoreEvent) -> None:
        self.state.emit(event)

    def lock_for(self, key: str) -> asyncio.Lock:
        return self.sharing.lock_for(key)

    def turn_lock(self, key: str) -> asyncio.Lock | None:
        return self.sharing.turn_lock(key)

    def follow_events(self, deliver: Callable[[StoreEvent], object]) -> None:
        self.sharing.follow_events(deliver)

    @property
    def shared(self) -> bool:
        return self.sharing.shared

    # -- the entry, the lifecycle: ``sessions.postgres.lifecycle`` ----------------------------------

    async def update_entry(self, key: str, change: EntryChange) -> SessionEntry:
        return await self.lifecycle.update_entry(key, change)

    async def set_inherit_next(self, key: str, inherit: bool) -> bool:
        return await self.lifecycle.set_inherit_next(key, inherit)

    async def set_reset_boundary(self, key: str, boundary: str) -> None:
        await self.lifecycle.set_reset_boundary(key, boundary)

    async def start_run(self, start: RunStart) -> RunState:
        return await self.lifecycle.start_run(start)

    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None:
        await self.lifecycle.discard_run(run, remove_entry=remove_entry)

    async def pause(self, key: str) -> RunState:
        return await self.lifecycle.pause(key)

    async def resume(self, key: str) -> RunState:
        return await self.lifecycle.resume(key)

    async def complete(self, key: str, end: RunFinish = PLAIN_FINISH) -> RunState:
        return await self.lifecycle.complete(key, end)

    async def delete(self, key: str) -> str | None:
        return await self.lifecycle.delete(key)

    # -- appends: ``sessions.postgres.appends`` (under the key's lease when shared) ---------------

    def check_writable(self, run: RunState, message: NewMessage) -> None:
        check_writable(run, message)

    async def append(self, run: RunState, message: NewMessage) -> MessageRecord:
        return await self.sharing.append(run, message)

    def queue_append(self, run: RunState, message: NewMessage) -> tuple[MessageRecord, asyncio.Future[None]]:
        return self.appends.queue_append(run, message)

    async def finish_append(
        self, run: RunState, message: NewMessage, record: MessageRecord, durable: asyncio.Future[None]
    ) -> MessageRecord:
        return await self.sharing.finish_append(run, message, record, durable)

    async def record_tool(self, run: RunState, use: ToolUse) -> StoredRecord:
        return await self.appends.record_tool(run, use)

    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> PlanRecord:
        return await self.appends.record_plan(run, plan_type=plan_type, plan_content=plan_content)

    async def add_usage(self, run: RunState, usage: Mapping[str, int]) -> None:
        await self.appends.add_usage(run, usage)

    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None:
        self.appends.calibrate_context(run, prompt_tokens, overhead_tokens, appended_since=appended_since)

    async def rewrite_context(self, run: RunState, change: ContextChange) -> ContextRewrite | None:
        return await self.sharing.rewrite_context(run, change)

    async def read_context(self, run: RunState) -> list[ContextLine]:
        return await self.appends.read_context(run)

    async def writable(self) -> str | None:
        return await self.appends.writable()

    def recently_writable(self, max_age_s: float) -> bool:
        return self.appends.recently_writable(max_age_s)

    # -- reads by run id: ``sessions.postgres.reads`` -----------------------------------------------

    async def get_run(self, run_id: str) -> RunRow | None:
        return await self.reads.get_run(run_id)

    async def require_run(self, run_id: str) -> RunRow:
        return await self.reads.require_run(run_id)

    async def list_runs(self, query: RunQuery = NEWEST_RUNS) -> list[RunRow]:
        return await self.reads.list_runs(query)

    async def known_keys(self) -> list[KnownKey]:
        return await self.reads.known_keys()

    async def previous_runs(self, *, key: str, task_key: TaskKey | None, within_days: float) -> list[RunRow]:
        return await self.reads.previous_runs(key=key, task_key=task_key, within_days=within_days)

    async def read_messages(self, run_id: str, *, after_seq: int, limit: int) -> list[StoredRecord]:
        return await self.reads.read_messages(run_id, after_seq=after_seq, limit=limit)

    async def read_records(self, run_id: str, kind: RecordKind) -> list[StoredRecord]:
        return await self.reads.read_records(run_id, kind)

    async def read_final_summary(self, run_id: str) -> str | None:
        return await self.reads.read_final_summary(run_id)

    # -- DeliveryRecords, CompatRecords: ``sessions.postgres.records`` -------------------------------

    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None:
        return await self.appends.find_delivery(key, client_message_id, since=since)

    async def recall_delivery(self, key: str, client_message_id: str, *, since: str) -> PriorDelivery | None:
        return await self.records.recall_delivery(key, client_message_id, since=since)

    def checks_deliveries(self, key: str) -> bool:
        return self.records.checks_deliveries(key)

    async def find_idempotency(self, key: str, client_message_id: str, *, since: str) -> IdempotencyRecord | None:
        return await self.records.find_idempotency(key, client_message_id, since=since)

    async def remember_delivery(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None
    ) -> None:
        await self.records.remember_delivery(key, client_message_id, run_id=run_id, seq=seq)

    async def remember_reply(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None, response: str
    ) -> None:
        await self.records.remember_reply(key, client_message_id, run_id=run_id, seq=seq, response=response)

    async def hook_delivery(self, delivery_id: str) -> HookDelivery | None:
        return await self.records.hook_delivery(delivery_id)

    async def record_hook_delivery(
        self, delivery_id: str, hook: str, *, session_key: str | None, message_seq: int | None
    ) -> None:
        await self.records.record_hook_delivery(delivery_id, hook, session_key=session_key, message_seq=message_seq)

    async def compat_conversation(self, key: str) -> CompatConversation | None:
        return await self.records.compat_conversation(key)

    async def save_compat_conversation(self, key: str, record: CompatConversation) -> None:
        await self.records.save_compat_conversation(key, record)

    async def compat_response(self, response_id: str) -> ResponseRef | None:
        return await self.records.compat_response(response_id)

    async def latest_compat_response(self, key: str) -> str | None:
        return await self.records.latest_compat_response(key)

    async def save_compat_response(self, ref: ResponseRef) -> None:
        await self.records.save_compat_response(ref)

    # -- UsageRecords: ``sessions.postgres.usage`` ---------------------------------------------------

    async def daily_usage(self, query: UsageQuery = ALL_USAGE) -> list[DailyUsage]:
        return await self.usage.daily_usage(query)

    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
        return await self.usage.tokens_spent(day, agent_id, session_key)

    # -- HistorySource (on the ``history`` table: ``sessions.postgres.history``) -------------------

    def open_history(self, *, max_batch: int | None = None) -> PgHistoryIndex:
        """The history index in this database (not started yet: ``await index.open()``)."""
        pace = pacing(self.state.settings.gateway.workers)
        return PgHistoryIndex(self.state.pool, max_batch=max_batch or MAX_BATCH, pace=pace)

    async def rebuild_history(self, index: HistoryIndexProtocol) -> int:
        return await own_index(index, PgHistoryIndex).rebuild()

    async def catch_up_history(self, index: HistoryIndexProtocol) -> None:
        await own_index(index, PgHistoryIndex).catch_up()

    async def check_history(self, index: HistoryIndexProtocol, *, fix: bool) -> list[StoredRecord]:
        return await own_index(index, PgHistoryIndex).check(fix=fix)

    # -- Maintenance: ``sessions.postgres.maintenance``, ``sessions.postgres.export`` ----------------

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        return await self.maintenance.check(fix=fix)

    async def cleanup(self, request: CleanupRequest) -> list[StoredRecord]:
        return await self.maintenance.cleanup(request)

    async def export_runs(self, *, key: str | None = None, run_id: str | None = None) -> list[RunExport]:
        return await self.export.export_runs(key=key, run_id=run_id)

    async def purge(self, key: str, *, history: HistoryIndexProtocol | None) -> StoredRecord:
        return await self.maintenance.purge(key, history=history)


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
