"""What a store is given at open to tell the rest of the program what happened: who hears its
events, who hears each durable append, and what runs when a run stops or completes.

Every backend takes one ``StoreHooks`` at open and never changes it; nothing appends itself to a
store afterwards (the composition root, ``gateway/services.py``, decides who listens)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from sessions.records import MessageRecord, RunState, StoreEvent

Listener = Callable[[StoreEvent], object]
DurableListener = Callable[[RunState, MessageRecord], object]
RunHook = Callable[[RunState], Awaitable[None]]
FinalSummarizer = Callable[[RunState, str], Awaitable[str | None]]


@dataclass(frozen=True)
class StoreHooks:
    """``listeners`` hear every event (lifecycle, message, compaction...); ``durable_listeners``
    hear each append once it is durable; ``completion_hooks`` run before a run completes (not on a
    purge), ``stop_hooks`` before it pauses; ``final_summarizer`` gives the text kept as the run's
    final summary (``None``: none is written)."""

    listeners: tuple[Listener, ...] = ()
    durable_listeners: tuple[DurableListener, ...] = ()
    completion_hooks: Mapping[str, RunHook] = field(default_factory=dict)
    stop_hooks: Mapping[str, RunHook] = field(default_factory=dict)
    final_summarizer: FinalSummarizer | None = None
