"""Every extension point of the gateway, declared once (as datasette declares its hook specs).

An object that lets others extend it takes its hooks as a frozen value at construction (as arq's
worker takes ``on_startup``); nothing appends itself to another object afterwards. The one place
that fills them is the composition root, ``gateway/services.py``: it decides who listens to what.

| hook | who calls it | who fills it (in services.py) |
|---|---|---|
| ``StoreHooks.listeners`` | every store event | the event hub, the transcript source |
| ``StoreHooks.durable_listeners`` | an append once durable | the history index |
| ``ConversationHooks.before_post`` | a message, before its lock | resets due on arrival (``Scheduling``) |
| ``ConversationHooks.before_append`` | a message, before its append | auto-recall (``MemoryBridge``) |
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

from sessions.events import TurnEvent
from sessions.protocol import ArchiveStep
from sessions.store_hooks import StoreHooks as StoreHooks  # declared with the store: it takes them at open

if TYPE_CHECKING:
    from conversations.posts import Post, ReplyBody
    from sessions.records import RunState

Event = TurnEvent  # what a hook adds to the answer
BeforePost = Callable[["Post"], Awaitable[list[Event]]]
BeforeAppend = Callable[["RunState", "Post", bool], Awaitable[list[Event]]]
NextReset = Callable[[str], datetime | None]
Deliver = Callable[[str, "ReplyBody"], Awaitable["Delivery"]]  # the Deliverer (channels/delivery.py)
ForgetRuns = Callable[[list[str]], Awaitable[object]]


@dataclass(frozen=True)
class Delivery:
    """How one ``deliver_to`` went (``channels/delivery.py`` POSTs it): delivered or not, after how
    many attempts, and why not."""

    url: str
    delivered: bool
    attempts: int
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "delivered": self.delivered, "attempts": self.attempts, "error": self.error}


@dataclass(frozen=True)
class ConversationHooks:
    """``before_post``: events to add before a message is stored (e.g. a reset that fell due);
    ``before_append``: under the key's lock, before the append (``new_run``: the message opens
    the run; e.g. auto-recall)"""

    before_post: tuple[BeforePost, ...] = ()
    before_append: tuple[BeforeAppend, ...] = ()


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
    archive_step: ArchiveStep | None = None
