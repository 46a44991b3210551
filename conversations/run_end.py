"""Ending a run, written once: ``/new`` and ``/reset``, the daily and idle resets, cleanup, cron
jobs, the lifecycle routes, deleting a session and the OpenAI-compatible routes all call
:func:`end_run`.

In order: the memory flush (when asked: a reset, ``/reset``), the final summary (the engine writes
it, the store keeps the text it is given), the store's ``complete`` (or fail), the reset boundary
(a daily reset), one ``reset`` event (the store's listeners, the SSE hub among them, hear it; the
caller may add it to its answer) and the resets counter. The caller holds the key's
``Conversations.exclusive`` lock."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from config.clock import iso
from conversations.turns import Conversations
from sessions.events import ResetEvent, reset_published
from sessions.records import RunFinish, RunState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunEnd:
    """How a run ends. ``reason``: why, as the ``reset`` event says it (``daily``, ``idle``,
    ``command``, ``cleanup``, ``cron``, ``complete``, ``fail``, ``delete``, ``openai-diverged``,
    ``openai-stateless``); ``store_reason``: the store's lifecycle reason when it differs
    (``reset:daily``, ``new``); ``error``: fail the run instead of completing it; ``flush``: the
    memory flush first; ``summarize``: a final summary (False: a one-off run nothing inherits);
    ``boundary``: the reset boundary the entry keeps; ``command``: the chat command that ended it;
    ``counted``: the label of the resets counter (None: not a reset)."""

    reason: str
    store_reason: str | None = None
    error: str | None = None
    flush: bool = False
    summarize: bool = True
    boundary: datetime | None = None
    command: str | None = None
    counted: str | None = None


def reset_event(run: RunState, how: RunEnd) -> ResetEvent:
    """The one shape of the event a run's end publishes and answers carry."""
    return {
        "type": "reset",
        "reason": how.reason,
        "previous_run_id": run.run_id,
        "boundary": iso(how.boundary) if how.boundary is not None else None,
        "command": how.command,
    }


async def end_run(conv: Conversations, key: str, how: RunEnd) -> tuple[RunState, ResetEvent] | None:
    """End the key's active run as ``how`` says; the ended run and its ``reset`` event, None when
    the key has no active run (nothing is done then)."""
    store = conv.store
    run = store.active_run(key)
    if run is None:
        return None
    return await _end(conv, key, run, how)


async def end_active_run(conv: Conversations, key: str, how: RunEnd) -> tuple[RunState, ResetEvent]:
    """:func:`end_run` for a key that must have an active run (``NoActiveRun`` otherwise)."""
    return await _end(conv, key, conv.ensure_active(key), how)


async def _end(conv: Conversations, key: str, run: RunState, how: RunEnd) -> tuple[RunState, ResetEvent]:
    store = conv.store
    if how.flush:
        await conv.memory_flush(run)
    text = None
    if how.summarize:
        try:
            text = await conv.final_summary(run, how.store_reason or how.reason)
        except Exception:  # the run must still end; the summary is best effort
            log.exception("final summary of run %s failed", run.run_id)
    reason = how.store_reason or how.reason
    finish = RunFinish(error=how.error, reason=reason, summarize=how.summarize, final_summary=text)
    ended = await store.complete(key, finish)
    if how.boundary is not None:
        await store.set_reset_boundary(key, iso(how.boundary))
    event = reset_event(ended, how)
    store.emit(reset_published(ended, iso(store.clock()), event))
    if how.counted is not None:
        conv.metrics.resets.labels(how.counted).inc()
    return ended, event
