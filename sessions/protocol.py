"""The session store as the rest of the program sees it, split by capability.

The Protocol speaks of keys, runs and records only: no folder, no path, no SQL, no callable that
writes a file. A backend implements the capabilities it has; the conformance suite
(``tests/sessions/conformance/``) runs each case over every backend that has the capability the
case needs (``support.BACKENDS`` says which backend has which), as LangGraph's checkpoint
conformance suite splits its base and extended capabilities.

| capability | what it is | files (``sessions.files``) | memory (``sessions.inmemory``) |
|---|---|---|---|
| ``RunStore`` (base) | keys, runs, lifecycle, appends, reads by run id, the context rewrite | yes | yes |
| ``DeliveryRecords`` | idempotency records, deliveries in the transcript, webhook delivery ids | yes | yes |
| ``CompatRecords`` | the OpenAI-compatible routes' conversations and response ids | yes | yes |
| ``UsageRecords`` | token usage per UTC day, agent and key (``GET /v1/usage``, budgets) | yes | yes |
| ``HistorySource`` | feeds, rebuilds and checks the full-text history index | yes | yes |
| ``Doctor`` | the doctor's check (and fix); also with no daemon (``sessions.backends.open_doctor``) | yes | yes |
| ``Maintenance`` | doctor (check and fix), cleanup (archive, expire, trim), export, purge | yes | yes |
| ``Backup`` | the store's part of a backup, staged at one point as a files home | yes | no |
| ``TurnLocks`` (optional) | a turn lock held across processes sharing the store | no | no |
| ``SharedEvents`` (optional) | the events other processes sharing the store emit | no | no |

``ConversationStore`` (base + delivery + compat records) is what the conversation engine needs;
``StoreProtocol`` (every capability) is what the daemon's composition root opens
(``storage.backend``). A backend is given its hooks at open (``sessions.store_hooks.StoreHooks``).

Contract of the base capability, in short (the suite checks each point):

- a key has at most one active run; ``start_run`` on a key with one raises ``Conflict``;
- seqs of a run start at 1, have no gaps, and follow arrival order (``queue_append`` assigns them
  on the event loop); an append is durable when it returns; a failed one consumes no seq;
- ``pause`` keeps the run, refuses non-command appends (``SessionPaused``); ``resume`` undoes it;
  ``complete`` ends the run (``completed``, or ``failed`` with an error), leaves the key's entry
  idle with ``last_run_id`` set; ``delete`` also removes the entry (the runs stay listed);
- the entry's ``counters`` equal the active run's ``counters`` after every change;
- everything acknowledged survives ``close`` and a reopen of the same storage, counters included;
- a storage failure is a typed error (``StorageUnavailable``, ``InsufficientStorage``), never a
  backend's own exception type;
- delivery records and the OpenAI-compatible records are read back as written (the first webhook
  record of an id wins; a new delivery's record replaces an expired one);
- an append marked ``once`` whose ``client_message_id`` the key stored within the window (in the
  active run, or recorded for an ended one) raises ``AlreadyDelivered`` and stores nothing; a
  message is its own delivery record (no record call is needed after it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from config.clock import Clock
from sessions.cleanup_plan import CleanupRequest
from sessions.context_lines import ContextLine
from sessions.deliveries import Delivery, PriorDelivery
from sessions.entries import SessionEntry
from sessions.events import StoreEvent
from sessions.history_index import MAX_BACKLOG, HistoryIndexProtocol
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
)
from sessions.rewrites import ContextChange
from sessions.usage import ALL_USAGE, DailyUsage, UsageQuery

if TYPE_CHECKING:
    from sessions.backup import BackupPoint, StagedHome
    from sessions.exports import RunExport

RecordKind = Literal["summaries", "tools", "planning"]  # a run's records besides its messages
CompleteRun = Callable[[str], Awaitable[None]]  # cleanup completes a stale run of a key through it
ArchiveStep = Callable[[str], None]  # called at each step of archiving a run (a test hook)
ARCHIVE_STEPS = ("packed", "archived", "recorded", "detached", "removing")  # those steps, in their order


class RunStore(Protocol):
    """Base capability: keys and their entries, runs and their lifecycle, appends, reads by run id."""

    @property
    def clock(self) -> Clock: ...

    async def close(self) -> None: ...

    # -- lookups (in memory) ----------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None: ...
    def require_entry(self, key: str) -> SessionEntry: ...
    def entries(self) -> Iterable[SessionEntry]: ...
    def active_run(self, key: str) -> RunState | None: ...
    def run_state(self, run_id: str) -> RunState | None: ...
    def active_runs(self) -> Iterable[RunState]: ...
    def lock_for(self, key: str) -> asyncio.Lock: ...

    # -- the entry outside a run's lifecycle ------------------------------------------------------

    async def update_entry(self, key: str, change: EntryChange) -> SessionEntry: ...
    async def set_inherit_next(self, key: str, inherit: bool) -> bool: ...
    async def set_reset_boundary(self, key: str, boundary: str) -> None: ...

    # -- lifecycle --------------------------------------------------------------------------------

    async def start_run(self, start: RunStart) -> RunState: ...
    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None: ...
    async def pause(self, key: str) -> RunState: ...
    async def resume(self, key: str) -> RunState: ...
    async def complete(self, key: str, end: RunFinish = PLAIN_FINISH) -> RunState: ...
    async def delete(self, key: str) -> str | None: ...

    # -- appends ----------------------------------------------------------------------------------

    def check_writable(self, run: RunState, message: NewMessage) -> None: ...
    async def append(self, run: RunState, message: NewMessage) -> MessageRecord: ...
    def queue_append(self, run: RunState, message: NewMessage) -> tuple[MessageRecord, asyncio.Future[None]]: ...
    async def finish_append(
        self, run: RunState, message: NewMessage, record: MessageRecord, durable: asyncio.Future[None]
    ) -> MessageRecord: ...
    async def record_tool(self, run: RunState, use: ToolUse) -> StoredRecord: ...
    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> PlanRecord: ...
    async def add_usage(self, run: RunState, usage: Mapping[str, int]) -> None: ...
    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None: ...
    async def rewrite_context(self, run: RunState, change: ContextChange) -> ContextRewrite | None:
        """Carry out a compaction or an uncompact given as data (``sessions.rewrites``), after every
        append queued before it; None when it changed nothing. A caller cancelled meanwhile does
        not undo it: the run's counters follow it once it is done."""
        ...

    async def writable(self) -> str | None: ...
    def recently_writable(self, max_age_s: float) -> bool: ...
    def emit(self, event: StoreEvent) -> None:
        """Publish an event of the engine's (``sessions.events``: reply, memory, inheritance, reset,
        compaction) to the store's listeners, as the store publishes its own."""
        ...

    # -- reads by run id --------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunRow | None: ...
    async def require_run(self, run_id: str) -> RunRow:
        """The run's row; ``RunNotFound`` when there is none."""
        ...

    async def list_runs(self, query: RunQuery = NEWEST_RUNS) -> list[RunRow]: ...
    async def known_keys(self) -> list[KnownKey]: ...
    async def previous_runs(self, *, key: str, task_key: TaskKey | None, within_days: float) -> list[RunRow]:
        """The completed or failed runs of ``key`` (or of ``task_key``) that ended within
        ``within_days``, newest first; not those of a deleted session (a new session starts clean)."""
        ...

    async def read_messages(self, run_id: str, *, after_seq: int, limit: int) -> list[StoredRecord]:
        """A page of the run's messages by seq (an ended or archived run too); ``RunNotFound``."""
        ...

    async def read_records(self, run_id: str, kind: RecordKind) -> list[StoredRecord]: ...
    async def read_final_summary(self, run_id: str) -> str | None: ...
    async def read_context(self, run: RunState) -> list[ContextLine]:
        """The run's context lines in the order the model sees them (``sessions.context_order``)."""
        ...


class DeliveryRecords(Protocol):
    """Idempotent redelivery: records per (key, client_message_id), deliveries found in the active
    run's transcript, and webhook delivery ids."""

    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None: ...
    async def recall_delivery(self, key: str, client_message_id: str, *, since: str) -> PriorDelivery | None:
        """An earlier delivery of ``client_message_id`` on ``key`` stored at or after ``since``, in
        one lookup: its idempotency record, else the message in the active run's transcript (with
        its reply). What a post looks up when its append cannot check (``checks_deliveries``)."""
        ...

    def checks_deliveries(self, key: str) -> bool:
        """True when an append to ``key``'s active run marked ``NewMessage.once`` checks its
        ``client_message_id`` itself, in the statement that stores it (a post then looks nothing
        up first); False: look it up first (``recall_delivery``). Every backend refuses a repeat
        marked ``once`` with ``AlreadyDelivered``, consuming no seq; the check in the append is
        what makes it atomic across processes sharing the store."""
        ...

    async def find_idempotency(self, key: str, client_message_id: str, *, since: str) -> IdempotencyRecord | None: ...
    async def remember_delivery(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None
    ) -> None: ...
    async def remember_reply(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None, response: str
    ) -> None: ...
    async def hook_delivery(self, delivery_id: str) -> HookDelivery | None: ...
    async def record_hook_delivery(
        self, delivery_id: str, hook: str, *, session_key: str | None, message_seq: int | None
    ) -> None: ...


class CompatRecords(Protocol):
    """The OpenAI-compatible routes' conversation per key and their response ids."""

    async def compat_conversation(self, key: str) -> CompatConversation | None: ...
    async def save_compat_conversation(self, key: str, record: CompatConversation) -> None: ...
    async def compat_response(self, response_id: str) -> ResponseRef | None: ...
    async def latest_compat_response(self, key: str) -> str | None: ...
    async def save_compat_response(self, ref: ResponseRef) -> None: ...


class UsageRecords(Protocol):
    """Token usage per UTC day, agent and key, counted by ``add_usage`` (``GET /v1/usage``, the
    daily budgets ``agents.<id>.limits``)."""

    async def daily_usage(self, query: UsageQuery = ALL_USAGE) -> list[DailyUsage]:
        """Per day and ``query.by`` (``key``, ``agent``: the keys summed, ``day``: all summed),
        oldest day first; ``since`` and ``until`` inclusive."""
        ...

    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
        """Input plus output tokens of ``day`` (``YYYY-MM-DD``, UTC): the agent's, and the key's."""
        ...


class HistorySource(Protocol):
    """A backend whose messages feed the full-text history index kept beside its runs."""

    def open_history(self, *, max_batch: int | None = None, max_backlog: int = MAX_BACKLOG) -> HistoryIndexProtocol: ...
    async def rebuild_history(self, index: HistoryIndexProtocol) -> int: ...
    async def catch_up_history(self, index: HistoryIndexProtocol) -> None:
        """Index what a crash left unindexed (active runs, and runs ended since the last batch)."""
        ...

    async def check_history(self, index: HistoryIndexProtocol, *, fix: bool) -> list[StoredRecord]: ...


class Doctor(Protocol):
    """The doctor of a backend's storage: the daemon's store is one (``Maintenance``); with no
    daemon, ``sessions.backends.open_doctor`` gives one (the files backend's reads the home's
    files as they are, with no start-up recovery first, and checks the history index too)."""

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        """The doctor's findings (``{"check", "severity", "detail", "fix", "fixed", ...}``)."""
        ...


class Maintenance(Doctor, Protocol):
    """The doctor (``check``), cleanup, export and purge of a backend's storage."""

    async def cleanup(self, request: CleanupRequest) -> list[StoredRecord]:
        """Complete stale runs (through ``complete``), archive old ended ones, delete expired
        archives, forget expired delivery records; the actions, done or planned (``dry_run``)."""
        ...

    async def export_runs(self, *, key: str | None = None, run_id: str | None = None) -> list[RunExport]:
        """Every readable run of ``key`` oldest first, or the one run ``run_id``, to stream out."""
        ...

    async def purge(self, key: str, *, history: HistoryIndexProtocol | None) -> StoredRecord:
        """Erase ``key`` for good (every run, record and index row of it); its tombstone."""
        ...


class Backup(Protocol):
    """A backend whose storage a backup can take (files, postgres): its part of a backup, staged
    at one consistent point as a files home (``sessions.backup``). The daemon's store gives one
    (``StoreProtocol.backup``); with no daemon, ``sessions.backends.offline_backup``."""

    async def stage_backup(self, stage: StagedHome) -> BackupPoint:
        """Write this store's runs, entries and records as they are at one point into ``stage``
        (new, empty); the point. Everything acknowledged before the call is in, each once, and
        nothing stored after the point is."""
        ...


@runtime_checkable
class TurnLocks(Protocol):
    """A store other processes share (postgres with ``gateway.workers`` above 1): a model turn on
    a key holds ``turn_lock(key)``, which keeps every other process's turns and appends off the
    key. None: this process is alone, the engine's in-process lock is enough."""

    def turn_lock(self, key: str) -> asyncio.Lock | None: ...


@runtime_checkable
class SharedEvents(Protocol):
    """A store other processes share: ``deliver`` gets the events they emit (``/v1/events``
    subscribers of every process see every event)."""

    def follow_events(self, deliver: Callable[[StoreEvent], object]) -> None: ...


class ConversationStore(RunStore, DeliveryRecords, CompatRecords, Protocol):
    """What the conversation engine needs: every base and record capability."""


class StoreProtocol(ConversationStore, UsageRecords, HistorySource, Maintenance, Protocol):
    """Every capability: what the daemon opens (``gateway.services``)."""

    @property
    def backup(self) -> Backup:
        """The store's ``Backup``."""
        ...
