"""What a store is given at open to tell the rest of the program what happened: who hears its
events, who hears each durable append, and what runs when a run stops or completes.

Every backend takes one ``StoreHooks`` at open and never changes it; nothing appends itself to a
store afterwards (the composition root, ``gateway/services.py``, decides who listens)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from sessions.events import StoreEvent
from sessions.records import MessageRecord, RunState

Listener = Callable[[StoreEvent], object]
DurableListener = Callable[[RunState, MessageRecord], object]
RunHook = Callable[[RunState], Awaitable[None]]


@dataclass(frozen=True)
class StoreHooks:
    """``listeners`` hear every event (lifecycle, message, compaction...); ``durable_listeners``
    hear each append once it is durable; ``completion_hooks`` run before a run completes (not on a
    purge), ``stop_hooks`` before it pauses. The final summary is no hook: the engine writes it
    and hands the text to ``complete`` (``conversations/run_end.py``)."""

    listeners: tuple[Listener, ...] = ()
    durable_listeners: tuple[DurableListener, ...] = ()
    completion_hooks: Mapping[str, RunHook] = field(default_factory=dict)
    stop_hooks: Mapping[str, RunHook] = field(default_factory=dict)


log = logging.getLogger(__name__)


async def run_hook(kind: str, name: str, hook: RunHook, run: RunState) -> None:
    """Run one completion or stop hook; a broken hook must not stop the lifecycle change (logged)."""
    try:
        await hook(run)
    except Exception:
        log.exception("%s hook %r failed for run %s", kind, name, run.run_id)
