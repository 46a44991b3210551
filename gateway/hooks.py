"""Every extension point of the gateway, declared once (as datasette declares its hook specs).

An object that lets others extend it takes its hooks as a frozen value at construction (as arq's
worker takes ``on_startup``); nothing appends itself to another object afterwards. The one place
that fills them is the composition root, ``gateway/services.py``: it decides who listens to what.

| hook | who calls it | who fills it (in services.py) |
|---|---|---|
| ``StoreHooks.final_summarizer`` | ``SessionStore.complete`` | ``Conversations.final_summary`` |
| ``StoreHooks.listeners`` | every store event | the event hub, the transcript source |
| ``StoreHooks.durable_listeners`` | an append once durable | the history index |
| ``ConversationHooks.before_post`` | a message, before its lock | resets due on arrival (``Scheduling``) |
| ``ConversationHooks.before_append`` | a message, before its append | auto-recall (``MemoryBridge``) |
| ``ConversationHooks.archive_text`` | inheritance from an archived run | ``Archives.text`` |
| ``CommandHooks.next_reset`` | ``/status``, the sessions routes | ``Scheduling.next_reset`` |
| ``SchedulingHooks.deliver`` | a cron job's ``deliver_to`` | the ``Deliverer`` |
| ``SchedulingHooks.forget_runs`` | cleanup deleting archives | the history index |
| ``SchedulingHooks.archive_step`` | each archiving step (tests) | ``gateway.crashpoints`` |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sessions.files.archive import Step

if TYPE_CHECKING:
    from gateway.delivery import Delivery
    from gateway.posts import ReplyBody
    from gateway.turns import Post
    from sessions.records import MessageRecord, RunState, StoreEvent

Event = dict[str, Any]
Listener = Callable[["StoreEvent"], object]
DurableListener = Callable[["RunState", "MessageRecord"], object]
FinalSummarizer = Callable[["RunState", str], Awaitable[str | None]]
BeforePost = Callable[["Post"], Awaitable[list[Event]]]
BeforeAppend = Callable[["RunState", "Post", bool], Awaitable[list[Event]]]
ArchiveText = Callable[[str, str], Awaitable[str | None]]
NextReset = Callable[[str], datetime | None]
Deliver = Callable[[str, "ReplyBody"], Awaitable["Delivery"]]
ForgetRuns = Callable[[list[str]], Awaitable[object]]


@dataclass(frozen=True)
class StoreHooks:
    """What ``SessionStore.open`` is given: the final summary of a completing run, and who hears
    its events (``listeners``) and its durable appends (``durable_listeners``)."""

    final_summarizer: FinalSummarizer | None = None
    listeners: tuple[Listener, ...] = ()
    durable_listeners: tuple[DurableListener, ...] = ()


@dataclass(frozen=True)
class ConversationHooks:
    """``before_post``: events to add before a message is stored (e.g. a reset that fell due);
    ``before_append``: under the key's lock, before the append (``new_run``: the message opens
    the run; e.g. auto-recall); ``archive_text``: reads a member of an archived run (inheritance)."""

    before_post: tuple[BeforePost, ...] = ()
    before_append: tuple[BeforeAppend, ...] = ()
    archive_text: ArchiveText | None = None


@dataclass(frozen=True)
class CommandHooks:
    next_reset: NextReset | None = None


@dataclass(frozen=True)
class SchedulingHooks:
    """``deliver``: POST a cron job's answer to its ``deliver_to``; ``forget_runs``: the runs whose
    archives cleanup deleted (the history index follows); ``archive_step``: a test hook called at
    each archiving step (``gateway.crashpoints``)."""

    deliver: Deliver | None = None
    forget_runs: ForgetRuns | None = None
    archive_step: Step | None = None
