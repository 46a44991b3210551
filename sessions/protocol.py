"""The session store as the rest of the program sees it: intent methods, no SQL, no entry to mutate.

``SessionStore`` (run folders, tasks.db, sessions.json) is the one implementation. A second
backend (a shared database, later) implements this protocol and must pass the conformance suite in
``tests/sessions/conformance/``, which is written against this protocol only.

Contract, in short (the suite checks each point):

- a key has at most one active run; ``start_run`` on a key with one raises ``Conflict``;
- seqs of a run start at 1, have no gaps, and follow arrival order (``queue_append`` assigns them
  on the event loop); an append is durable when it returns; a failed one consumes no seq;
- ``pause`` keeps the run, refuses non-command appends (``SessionPaused``); ``resume`` undoes it;
  ``complete`` ends the run (``completed``, or ``failed`` with an error), leaves the key's entry
  idle with ``last_run_id`` set; ``delete`` also removes the entry (tasks.db keeps the runs);
- the entry's ``counters`` equal the active run's ``counters`` after every change;
- everything acknowledged survives ``close`` and a reopen of the same home, counters included;
- idempotency records, webhook delivery ids and the OpenAI-compatible records are read back as
  written (the first webhook record of an id wins; a new delivery's record replaces an expired one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from datetime import date
from pathlib import Path
from typing import Any, Protocol

from config.clock import Clock
from sessions.deliveries import Delivery
from sessions.layout import Home
from sessions.records import (
    CompatConversation,
    ContextRewrite,
    EventType,
    HookDelivery,
    IdempotencyRecord,
    KnownKey,
    MessageRecord,
    NewMessage,
    PlanRecord,
    ResponseRef,
    RunRow,
    RunState,
    TaskKey,
)
from sessions.registry import SessionEntry
from sessions.store_base import DurableListener, FinalSummarizer, Listener, RunHook
from sessions.usage import UsageBy


class StoreProtocol(Protocol):
    home: Home  # where run folders and archives are read from (history, exports)
    clock: Clock
    # Hooks (the composition root fills them): names kept as the store has them.
    completion_hooks: dict[str, RunHook]
    stop_hooks: dict[str, RunHook]
    final_summarizer: FinalSummarizer | None
    listeners: list[Listener]
    durable_listeners: list[DurableListener]

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

    async def update_entry(
        self,
        key: str,
        *,
        pinned: bool | None = None,
        label: str | None = None,
        clear_label: bool = False,
        settings: dict[str, Any] | None = None,
    ) -> SessionEntry: ...
    async def set_inherit_next(self, key: str, inherit: bool) -> bool: ...
    async def set_reset_boundary(self, key: str, boundary: str) -> None: ...

    # -- lifecycle --------------------------------------------------------------------------------

    async def start_run(
        self,
        key: str,
        *,
        agent_id: str | None,
        chat_type: str,
        channel: str | None,
        task_key: TaskKey,
        parent_uuid: str | None = None,
        opening: bool = False,
    ) -> RunState: ...
    async def discard_run(self, run: RunState, *, remove_entry: bool) -> None: ...
    async def pause(self, key: str) -> RunState: ...
    async def resume(self, key: str) -> RunState: ...
    async def complete(
        self, key: str, *, error: str | None = None, reason: str = "complete", summarize: bool = True
    ) -> RunState: ...
    async def delete(self, key: str) -> str | None: ...

    # -- appends ----------------------------------------------------------------------------------

    def check_writable(self, run: RunState, message: NewMessage) -> None: ...
    async def append(self, run: RunState, message: NewMessage) -> MessageRecord: ...
    def queue_append(self, run: RunState, message: NewMessage) -> tuple[MessageRecord, asyncio.Future[None]]: ...
    async def finish_append(
        self, run: RunState, message: NewMessage, record: MessageRecord, durable: asyncio.Future[None]
    ) -> MessageRecord: ...
    async def find_delivery(self, key: str, client_message_id: str, *, since: str) -> Delivery | None: ...
    async def record_tool(
        self,
        run: RunState,
        *,
        tool_name: str,
        arguments: Any,
        result: Any = None,
        error: str | None = None,
        duration_ms: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]: ...
    async def record_plan(self, run: RunState, *, plan_type: str, plan_content: str) -> PlanRecord: ...
    async def add_usage(self, run: RunState, usage: dict[str, int]) -> None: ...
    def calibrate_context(
        self, run: RunState, prompt_tokens: int, overhead_tokens: int, *, appended_since: int = 0
    ) -> None: ...
    async def commit_context_rewrite(
        self, run: RunState, commit: Callable[[], ContextRewrite | None]
    ) -> ContextRewrite | None: ...
    async def writable(self) -> str | None: ...
    def recently_writable(self, max_age_s: float) -> bool: ...
    def emit(self, event_type: EventType, run: RunState, **fields: Any) -> None: ...

    # -- reads ------------------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunRow | None: ...
    async def list_runs(
        self,
        *,
        session_key: str | None = None,
        statuses: Sequence[str] = (),
        limit: int = 50,
        before: tuple[str, str] | None = None,
    ) -> list[RunRow]: ...
    async def known_keys(self) -> list[KnownKey]: ...
    async def daily_usage(
        self,
        *,
        agent_id: str | None = None,
        session_key: str | None = None,
        since: date | None = None,
        until: date | None = None,
        by: UsageBy = "key",
    ) -> list[dict[str, Any]]: ...
    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]: ...
    async def locate_run(self, run_id: str) -> tuple[RunRow, Path | None]: ...
    async def read_store(self, folder: Path, name: str) -> list[dict[str, Any]]: ...
    async def read_messages(self, folder: Path, *, after_seq: int, limit: int) -> list[dict[str, Any]]: ...
    async def read_context(self, run: RunState) -> list[dict[str, Any]]: ...

    # -- records beside the runs ------------------------------------------------------------------

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
    async def compat_conversation(self, key: str) -> CompatConversation | None: ...
    async def save_compat_conversation(self, key: str, record: CompatConversation) -> None: ...
    async def compat_response(self, response_id: str) -> ResponseRef | None: ...
    async def latest_compat_response(self, key: str) -> str | None: ...
    async def save_compat_response(self, ref: ResponseRef) -> None: ...
