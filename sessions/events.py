"""The events of a conversation, typed: one TypedDict per event type (the wire is their JSON, so a
typed event and the dict it replaced serialize byte for byte alike).

Two families, SPEC section 8:

- ``TurnEvent``: what an answer carries (``Outcome.events``, ``ReplyBody.events``; a redelivery
  replays them, a webhook or cron job delivers them): compaction, uncompact, reset, inheritance,
  memory recall, tool limit, stopped, turn skipped.
- ``StoreEvent``: what a store publishes to its listeners (the event hub, ``GET /v1/events``; the
  transcript source): each names its ``type``, ``key``, ``run`` and time (``at``) first, then the
  fields of its type. The engine builds the ones it publishes with the functions below and hands
  them to ``RunStore.emit``; the backends publish ``message`` and ``lifecycle`` themselves.
  ``HubEvent`` adds the one event no run owns (the memory reindex's progress).

Keys are listed in the order they go on the wire (a dict keeps its insertion order)."""

# No ``from __future__ import annotations`` here: TypedDict reads ``NotRequired`` at class creation
# (``__required_keys__``, which the tests check events against).
from typing import Literal, NotRequired

from typing_extensions import TypedDict  # pydantic reads these (gateway/contract.typed)

from sessions.records import Role, RunState

EventType = Literal["message", "reply", "memory", "inheritance", "reset", "compaction", "lifecycle"]
LifecycleAction = Literal["start", "discard", "pause", "resume", "completed", "failed"]

# -- what an answer carries (TurnEvent) ------------------------------------------------------------


class CompactionEvent(TypedDict):
    """A compaction ran (``/compact``, the threshold, an overflow)."""

    type: Literal["compaction"]
    compaction: int
    summary_id: int
    start_seq: int
    end_seq: int
    compressed: int
    tokens_before: int
    tokens_after: int
    summarizer: str
    trigger: str


class UncompactEvent(TypedDict):
    """``/uncompact`` reverted this many compactions."""

    type: Literal["uncompact"]
    reverts: int


class ResetEvent(TypedDict):
    """The key's run ended (``conversations/run_end.py``: the one shape of every reset)."""

    type: Literal["reset"]
    reason: str
    previous_run_id: str
    boundary: str | None
    command: str | None


class InheritanceEvent(TypedDict):
    """The new run starts from the summary of ``run_id`` (the earlier run, as SPEC section 6 has it
    for replies; ``from_run_id`` names it again)."""

    type: Literal["inheritance"]
    run_id: str
    ended_at: str
    comment: str
    from_run_id: NotRequired[str]


class RecallEvent(TypedDict):
    """Auto-recall put these memory citations before the message ``seq``."""

    type: Literal["memory"]
    action: Literal["recall"]
    seq: int
    citations: list[str]


class ToolLimitEvent(TypedDict):
    type: Literal["tool_limit"]
    max_tool_rounds: int


class StoppedEvent(TypedDict):
    type: Literal["stopped"]
    reason: str


class TurnSkippedEvent(TypedDict):
    type: Literal["turn_skipped"]
    reason: str


TurnEvent = (
    CompactionEvent
    | UncompactEvent
    | ResetEvent
    | InheritanceEvent
    | RecallEvent
    | ToolLimitEvent
    | StoppedEvent
    | TurnSkippedEvent
)

# -- what a store publishes (StoreEvent) -----------------------------------------------------------


class MessagePublished(TypedDict):
    """A message is durable (the backends publish it)."""

    type: Literal["message"]
    key: str
    run_id: str
    at: str
    seq: int
    role: Role
    content: str
    name: NotRequired[str]
    kind: NotRequired[str]
    command: NotRequired[bool]


class ReplyPublished(TypedDict):
    type: Literal["reply"]
    key: str
    run_id: str
    at: str
    seq: int
    content: str
    model: str | None


class MemoryPublished(TypedDict):
    """``recall``: citations before ``seq``; ``flush``: the memory flush of ``compaction``."""

    type: Literal["memory"]
    key: str
    run_id: str
    at: str
    action: Literal["recall", "flush"]
    seq: NotRequired[int]
    citations: NotRequired[list[str]]
    compaction: NotRequired[int]


class InheritancePublished(TypedDict):
    """``run_id``: the new run; ``from_run_id``: the run it inherits from."""

    type: Literal["inheritance"]
    key: str
    run_id: str
    at: str
    ended_at: str
    comment: str
    from_run_id: str


class ResetPublished(TypedDict):
    type: Literal["reset"]
    key: str
    run_id: str
    at: str
    reason: str
    previous_run_id: str
    boundary: str | None
    command: str | None


class CompactionPublished(TypedDict):
    """A compaction (its fields as ``CompactionEvent``'s), or an uncompact (``action``, ``reverts``)."""

    type: Literal["compaction"]
    key: str
    run_id: str
    at: str
    action: NotRequired[Literal["uncompact"]]
    reverts: NotRequired[int]
    compaction: int
    summary_id: NotRequired[int]
    start_seq: NotRequired[int]
    end_seq: NotRequired[int]
    compressed: NotRequired[int]
    tokens_before: NotRequired[int]
    tokens_after: NotRequired[int]
    summarizer: NotRequired[str]
    trigger: NotRequired[str]


class LifecyclePublished(TypedDict):
    """A run started (``parent_uuid``), was discarded, paused, resumed, completed or failed
    (``reason``, ``error``); the backends publish it."""

    type: Literal["lifecycle"]
    key: str
    run_id: str
    at: str
    action: LifecycleAction
    parent_uuid: NotRequired[str | None]
    reason: NotRequired[str]
    error: NotRequired[str | None]


StoreEvent = (
    MessagePublished
    | ReplyPublished
    | MemoryPublished
    | InheritancePublished
    | ResetPublished
    | CompactionPublished
    | LifecyclePublished
)


class MemoryProgress(TypedDict):
    """The memory reindex's progress (``POST /v1/memory/reindex``): no key, no run."""

    type: Literal["memory"]
    key: None
    run_id: None
    action: Literal["progress"]
    done: int
    total: int


HubEvent = StoreEvent | MemoryProgress

# -- the engine's events as a store publishes them -------------------------------------------------


def reply_published(run: RunState, at: str, *, seq: int, content: str, model: str | None) -> ReplyPublished:
    return {"type": "reply", "key": run.key, "run_id": run.run_id, "at": at, "seq": seq, "content": content,
            "model": model}  # fmt: skip


def recall_published(run: RunState, at: str, event: RecallEvent) -> MemoryPublished:
    return {"type": "memory", "key": run.key, "run_id": run.run_id, "at": at, "action": "recall",
            "seq": event["seq"], "citations": event["citations"]}  # fmt: skip


def flush_published(run: RunState, at: str) -> MemoryPublished:
    return {"type": "memory", "key": run.key, "run_id": run.run_id, "at": at, "action": "flush",
            "compaction": run.compaction_count}  # fmt: skip


def inheritance_published(run: RunState, at: str, event: InheritanceEvent) -> InheritancePublished:
    """``run``: the new run (the event's ``run_id`` is the earlier one: ``from_run_id`` here)."""
    return {"type": "inheritance", "key": run.key, "run_id": run.run_id, "at": at, "ended_at": event["ended_at"],
            "comment": event["comment"], "from_run_id": event["run_id"]}  # fmt: skip


def reset_published(run: RunState, at: str, event: ResetEvent) -> ResetPublished:
    return {"type": "reset", "key": run.key, "run_id": run.run_id, "at": at, "reason": event["reason"],
            "previous_run_id": event["previous_run_id"], "boundary": event["boundary"],
            "command": event["command"]}  # fmt: skip


def compaction_published(run: RunState, at: str, event: CompactionEvent) -> CompactionPublished:
    return {"type": "compaction", "key": run.key, "run_id": run.run_id, "at": at,
            "compaction": event["compaction"], "summary_id": event["summary_id"], "start_seq": event["start_seq"],
            "end_seq": event["end_seq"], "compressed": event["compressed"], "tokens_before": event["tokens_before"],
            "tokens_after": event["tokens_after"], "summarizer": event["summarizer"],
            "trigger": event["trigger"]}  # fmt: skip


def uncompact_published(run: RunState, at: str, reverts: int) -> CompactionPublished:
    return {"type": "compaction", "key": run.key, "run_id": run.run_id, "at": at, "action": "uncompact",
            "reverts": reverts, "compaction": reverts - 1}  # fmt: skip
