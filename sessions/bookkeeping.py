"""The bookkeeping every backend does the same way: the run's statistics columns, the
counters an append moves, and what the key's entry says as a run starts, is discarded, ends or
takes a message, and the checks and hooks a lifecycle change starts with. The backends call
these and persist the result their own way (sessions.json, ``MemoryData``, the ``entries``
table)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from config.errors import NoActiveRun, RunActive, SessionNotFound
from sessions.entries import SessionEntry
from sessions.records import (
    USAGE_KEYS,
    ContextRewrite,
    MessageRecord,
    NewMessage,
    PlanRecord,
    RunFinish,
    RunState,
    RunStatus,
)
from sessions.store_hooks import StoreHooks, run_hook


class _Lookups(Protocol):
    def require_entry(self, key: str) -> SessionEntry: ...
    def active_run(self, key: str) -> RunState | None: ...


def require_active(store: _Lookups, key: str) -> RunState:
    """The key's active run: ``SessionNotFound`` without an entry, ``NoActiveRun`` without a run."""
    store.require_entry(key)
    run = store.active_run(key)
    if run is None:
        raise NoActiveRun(f"session {key!r} has no active run")
    return run


def found_entry(entry: SessionEntry | None, key: str) -> SessionEntry:
    """``require_entry``'s answer: the key's entry, or ``SessionNotFound``."""
    if entry is None:
        raise SessionNotFound(f"no session with key {key!r}; post a message to create it")
    return entry


def inherit_next(entry: SessionEntry | None, inherit: bool) -> bool:
    """``set_inherit_next`` on the key's entry: False when it has none or says so already."""
    if entry is None or entry.inherit_next == inherit:
        return False
    entry.inherit_next = inherit
    return True


def mark_reset_boundary(entry: SessionEntry | None, boundary: str) -> bool:
    """``set_reset_boundary`` on the key's entry: False when it has none (nothing to save)."""
    if entry is None:
        return False
    entry.last_reset_boundary = boundary
    return True


def refuse_second_run(entry: SessionEntry | None, key: str) -> None:
    """``RunActive`` when the key's entry names an active run (a key has at most one)."""
    if entry is not None and entry.run_id is not None:
        raise RunActive(f"session {key!r} already has an active run {entry.run_id}")


async def to_pause(store: _Lookups, key: str, hooks: StoreHooks) -> tuple[RunState, bool]:
    """The key's active run, and whether it is to be paused (False: it is paused already); its
    stop hooks have run when it is."""
    run = require_active(store, key)
    if run.status == "paused":
        return run, False
    for name, hook in list(hooks.stop_hooks.items()):
        await run_hook("stop", name, hook, run)
    return run, True


async def to_complete(
    store: _Lookups, key: str, hooks: StoreHooks, end: RunFinish
) -> tuple[RunState, RunStatus]:
    """The key's active run, marked closing, and the status it ends in (``failed`` with an
    ``error``); its completion hooks have run unless ``summarize`` is False (a purge, a one-off
    run nothing inherits)."""
    run = require_active(store, key)
    run.closing = True
    for name, hook in list(hooks.completion_hooks.items()) if end.summarize else ():
        await run_hook("completion", name, hook, run)
    return run, "failed" if end.error is not None else "completed"


async def end_to_delete(store: _Lookups, key: str, complete: Callable[..., Awaitable[RunState]]) -> str | None:
    """Before a key's entry is deleted: its active run completed (``reason="delete"``), if any;
    that run's id. ``SessionNotFound`` without an entry."""
    store.require_entry(key)
    if store.active_run(key) is None:
        return None
    return (await complete(key, RunFinish(reason="delete"))).run_id


def run_stats(run: RunState) -> dict[str, int]:
    """The seed's statistics columns of a run (tasks.db, the ``runs`` row), from its counters."""
    counters = run.counters
    return {
        "total_messages": counters.message_count,
        "total_summaries": counters.last_summary_id,
        "total_tool_calls": run.next_tool_seq - 1,
        "final_token_count": counters.context_tokens,
        "final_message_count": counters.context_lines,
    }


def count_append(run: RunState, record: MessageRecord, record_bytes: int, line_bytes: int | None) -> None:
    """The run's counters once an append is queued: ``record_bytes`` of messages, and
    ``line_bytes`` of context when the message enters the context (None: it does not)."""
    run.appends_pending += 1
    run.messages_bytes += record_bytes
    if line_bytes is not None:
        run.context_bytes += line_bytes
        run.context_tokens += record["tokens"]
        run.context_lines += 1
        run.last_context_seq = record["seq"]


def count_rewrite(run: RunState, done: ContextRewrite, tokens_at_call: int, bytes_at_call: int) -> None:
    """The run's counters once a context rewrite is done; what was appended since it was called
    (``tokens_at_call``, ``bytes_at_call``: the counters then) stays counted on top."""
    run.context_bytes = done.context_bytes + (run.context_bytes - bytes_at_call)
    run.context_tokens = done.tokens_after + (run.context_tokens - tokens_at_call)
    run.context_lines += done.line_delta
    run.compaction_count = done.compaction_count
    run.next_summary_id = done.summary_id + 1


async def counted_rewrite(
    run: RunState, future: asyncio.Future[ContextRewrite | None], counted: Callable[[], object]
) -> ContextRewrite | None:
    """Wait for a context rewrite under way elsewhere (a writer thread, a transaction), then count
    it into the run (``counted`` follows, e.g. the entry's checkpoint). A caller cancelled
    meanwhile does not stop it: it is counted once done, or the run's counters (its compaction
    count, its next summary id) would fall behind what is stored."""
    tokens_at_call, bytes_at_call = run.context_tokens, run.context_bytes

    def count(done: ContextRewrite | None) -> None:
        if done is not None:
            count_rewrite(run, done, tokens_at_call, bytes_at_call)
            counted()

    try:
        done = await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(lambda f: None if f.cancelled() or f.exception() else count(f.result()))
        raise
    count(done)
    return done


def note_message(entry: SessionEntry, message: NewMessage, stamp: str) -> None:
    """The entry's times after a message: any but a system line is an interaction; a user's
    message (``counts_as_activity``) defers a daily reset."""
    if message.role != "system":
        entry.last_interaction_at = stamp
    if message.counts_as_activity:
        entry.last_user_activity_at = stamp
    entry.updated_at = stamp


def start_entry(entry: SessionEntry, run_id: str, now: str) -> None:
    """The entry of a key whose run ``run_id`` just started (its counters: the caller copies them)."""
    entry.run_id, entry.status, entry.started_at, entry.updated_at = run_id, "running", now, now


def idle_entry(entry: SessionEntry) -> None:
    """The entry of a key whose run was discarded (never had a message that stayed)."""
    entry.run_id, entry.status = None, "idle"
    entry.context_tokens = entry.message_count = 0


def end_entry(entry: SessionEntry, run_id: str, now: str) -> None:
    """The entry of a key whose run ``run_id`` completed or failed: idle, ``last_run_id`` set."""
    entry.last_run_id = run_id
    idle_entry(entry)
    entry.updated_at = now


def add_usage_counts(run: RunState, entry: SessionEntry | None, usage: Mapping[str, int]) -> dict[str, int]:
    """A model call's usage added to the run's and the entry's totals; the usage, every key of
    ``USAGE_KEYS`` an int (what the backend then adds to its rows)."""
    clean = {k: int(usage.get(k) or 0) for k in USAGE_KEYS}
    for k, v in clean.items():
        run.usage[k] += v
    if entry is not None:
        for k, v in clean.items():
            setattr(entry, k, getattr(entry, k) + v)
    return clean


def plan_record(run: RunState, plan_type: str, plan_content: str, stamp: str) -> PlanRecord:
    """The run's next planning record (its id taken)."""
    record: PlanRecord = {"id": run.next_plan_id, "plan_type": plan_type, "plan_content": plan_content,
                          "created_at": stamp}  # fmt: skip
    run.next_plan_id += 1
    return record
