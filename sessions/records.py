"""Value types the session engine takes and returns: the vocabulary (chat types, statuses), the
records that cross module boundaries (message lines, tasks.db rows, ledger records), and the
derived counters every layer of the store keeps the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, NamedTuple, NotRequired, Protocol, get_args

from typing_extensions import TypedDict  # pydantic derives the API's answer schemas from these (gateway/contract.typed)

from config.settings import ChatType
from sessions.deliveries import RunDeliveries

StoredRecord = dict[str, Any]  # a JSON object as a store keeps it (a line of a run's records, a row)
Role = Literal["user", "assistant", "tool", "system"]
ROLES: tuple[Role, ...] = ("user", "assistant", "tool", "system")
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")

# ChatType is declared once, in config.settings (config imports nothing of the project).
CHAT_TYPES: tuple[ChatType, ...] = get_args(ChatType)
IngressChatType = Literal["direct", "group", "channel"]  # what a channel may post as
RunStatus = Literal["running", "paused", "completed", "failed"]  # a run (tasks.db ``status``)
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
ActiveStatus = Literal["running", "paused"]  # a run with a folder under running/ or paused/
ACTIVE_STATUSES: tuple[ActiveStatus, ...] = get_args(ActiveStatus)
FINISHED_STATUSES: tuple[RunStatus, ...] = ("completed", "failed")
EntryStatus = Literal["running", "paused", "idle"]  # a key (sessions.json ``status``)
ENTRY_STATUSES: tuple[EntryStatus, ...] = get_args(EntryStatus)

__all__ = ["ChatType"]  # re-exported: the sessions layer names it from here


class Counters(NamedTuple):
    """The eight counters derived from a run's stores. The run state keeps them live, sessions.json
    checkpoints them per key, recovery trusts a checkpoint whose store sizes still match (and
    recounts otherwise), and tasks.db's statistics columns are computed from them. A named tuple:
    one is made per entry at start-up (10,000 of them), where a frozen dataclass costs ten times more."""

    context_tokens: int = 0
    message_count: int = 0
    compaction_count: int = 0
    context_bytes: int = 0  # current.jsonl's size once queued appends land
    context_lines: int = 0
    last_context_seq: int = 0
    last_summary_id: int = 0
    messages_bytes: int = 0  # messages.jsonl's size, likewise


COUNTER_FIELDS: tuple[str, ...] = Counters._fields
counter_values = attrgetter(*COUNTER_FIELDS)  # an object's counters as a plain tuple, in that order


class Counted(Protocol):
    """What keeps a run's counters as it counts them (the run state, a recovered run): the next
    seq and summary id rather than the last ones."""

    next_seq: int
    next_summary_id: int
    context_tokens: int
    compaction_count: int
    context_bytes: int
    context_lines: int
    last_context_seq: int
    messages_bytes: int


def counters_of(run: Counted) -> Counters:
    return Counters(
        context_tokens=run.context_tokens,
        message_count=run.next_seq - 1,
        compaction_count=run.compaction_count,
        context_bytes=run.context_bytes,
        context_lines=run.context_lines,
        last_context_seq=run.last_context_seq,
        last_summary_id=run.next_summary_id - 1,
        messages_bytes=run.messages_bytes,
    )


def restore_counters(run: Counted, counters: Counters) -> None:
    """The inverse of ``counters_of``."""
    run.next_seq, run.next_summary_id = counters.message_count + 1, counters.last_summary_id + 1
    run.context_tokens, run.compaction_count = counters.context_tokens, counters.compaction_count
    run.context_bytes, run.context_lines = counters.context_bytes, counters.context_lines
    run.last_context_seq, run.messages_bytes = counters.last_context_seq, counters.messages_bytes


def copy_counters(source: Any, target: Any) -> None:
    """Copy the counters by name (no value is built: this runs once per append)."""
    for name in COUNTER_FIELDS:
        setattr(target, name, getattr(source, name))


class MessageRecord(TypedDict):
    """A messages.jsonl line (the optional keys only when set)."""

    seq: int
    role: Role
    content: str
    timestamp: str
    tokens: int
    tool_name: str | None
    name: NotRequired[str]
    sender_id: NotRequired[str]
    tool_call_id: NotRequired[str]
    tool_calls: NotRequired[list[dict[str, Any]]]
    command: NotRequired[bool]
    usage: NotRequired[dict[str, int]]
    kind: NotRequired[str]
    client_message_id: NotRequired[str]
    reply_to: NotRequired[int]
    after: NotRequired[int]


class PlanRecord(TypedDict):
    """A planning.jsonl line."""

    id: int
    plan_type: str
    plan_content: str
    created_at: str


# the columns of a run row (``RunRow``), in the order tasks.db and the ``runs`` table hold them
RUN_COLUMNS = (
    "uuid", "status", "task_type", "task_identifier", "repository", "user", "created_at",
    "updated_at", "completed_at", "metadata", "total_messages", "total_summaries",
    "total_tool_calls", "final_token_count", "final_message_count", "error_message",
    "session_key", "agent_id", "channel", "chat_type", "parent_uuid", "input_tokens",
    "output_tokens", "cache_read_tokens", "cache_write_tokens", "compaction_count", "pinned",
    "archived_at",
)  # fmt: skip


class RunRow(TypedDict, total=False):
    """A tasks.db ``tasks`` row (``SELECT *``); ``uuid``, ``status`` and ``created_at`` are always set."""

    uuid: str
    status: RunStatus
    task_type: str
    task_identifier: str | None
    repository: str | None
    user: str | None
    created_at: str
    updated_at: str | None
    completed_at: str | None
    metadata: str | None
    total_messages: int
    total_summaries: int
    total_tool_calls: int
    final_token_count: int | None
    final_message_count: int | None
    error_message: str | None
    session_key: str | None
    agent_id: str | None
    channel: str | None
    chat_type: str | None
    parent_uuid: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    compaction_count: int
    pinned: int
    archived_at: str | None


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """What a ``client_message_id`` of a key was stored as, and the reply body once answered."""

    run_id: str | None
    message_seq: int | None
    response: str | None  # the JSON reply body, None while the turn has not answered


@dataclass(frozen=True, slots=True)
class HookDelivery:
    """A webhook delivery id already stored: where its message went."""

    session_key: str | None
    message_seq: int | None


@dataclass(frozen=True, slots=True)
class KnownKey:
    """A key some run of tasks.db was on (sessions.json may have lost or deleted its entry)."""

    key: str
    agent_id: str | None
    chat_type: str | None


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs ``list_runs`` gives, newest first by (created_at, uuid): those of ``session_key``,
    with one of ``statuses`` (RunStatus values), before the cursor ``before`` (the (created_at,
    uuid) of the last row seen), ``limit`` of them at the most; empty filters take all."""

    session_key: str | None = None
    statuses: tuple[str, ...] = ()
    limit: int = 50
    before: tuple[str, str] | None = None


NEWEST_RUNS = RunQuery()  # the newest runs of all keys


@dataclass(frozen=True, slots=True)
class CompatConversation:
    """What a key's OpenAI-compatible client held after its last call (``openai_conversations``)."""

    epoch: int
    base_count: int
    request_count: int
    request_digest: str
    answered_count: int
    answered_digest: str
    answer: str | None = None  # the call's answer (JSON), replayed to a retry; None: not answered


@dataclass(frozen=True, slots=True)
class ResponseRef:
    """An OpenAI-compatible response id and the message it answered (``openai_responses``)."""

    response_id: str
    session_key: str
    run_id: str | None
    seq: int | None


@dataclass(frozen=True)
class NewMessage:
    """A message to append. ``command`` lines are kept in messages.jsonl but never reach the
    model; ``user_activity`` says whether it defers a daily reset (cron and system turns do not)."""

    role: Role
    content: str
    name: str | None = None
    sender_id: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    command: bool = False
    usage: dict[str, int] | None = None
    kind: str | None = None
    client_message_id: str | None = None
    user_activity: bool | None = None
    reply_to: int | None = None  # on a reply or a command's answer: the seq of what it answers
    after: int | None = None  # on a model turn's lines: its place in the context (sessions.context_order)
    # its client_message_id is stored at most once per key within sessions.deliveries.DELIVERY_WINDOW:
    # the append checks it as it stores it and raises AlreadyDelivered (storing nothing) on a repeat
    once: bool = False

    @property
    def counts_as_activity(self) -> bool:
        if self.user_activity is not None:
            return self.user_activity
        return self.role == "user" and not self.command


@dataclass(frozen=True)
class TaskKey:
    """The seed's task key columns (section 1 of the SPEC maps chat runs onto them)."""

    task_type: str
    task_identifier: str | None
    repository: str | None = None
    user: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "task_type": self.task_type,
            "task_identifier": self.task_identifier,
            "repository": self.repository,
            "user": self.user,
        }


@dataclass(frozen=True, slots=True)
class EntryChange:
    """What ``update_entry`` changes on a key's entry: ``pinned`` when not None, the label when
    ``label`` is given or ``clear_label`` says so, the settings merged with ``settings`` (a setting
    given as None is removed)."""

    pinned: bool | None = None
    label: str | None = None
    clear_label: bool = False
    settings: Mapping[str, object] | None = None

    @property
    def relabels(self) -> bool:
        """Whether the label or the settings change (what the files part writes to tasks.db)."""
        return self.label is not None or self.clear_label or self.settings is not None


@dataclass(frozen=True, slots=True)
class RunFinish:
    """How ``complete`` ends a key's run: failed with ``error`` (else completed), ``reason`` in the
    lifecycle event, the ``final_summary`` it is given kept; ``summarize=False`` (a purge, a
    one-off run nothing inherits) runs no completion hook and keeps no final summary."""

    error: str | None = None
    reason: str = "complete"
    summarize: bool = True
    final_summary: str | None = None


PLAIN_FINISH = RunFinish()  # completed, summarized, for no particular reason
PURGE_FINISH = RunFinish(reason="purge", summarize=False)  # a purged key's run: no hook, no final summary


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One tool call as ``record_tool`` keeps it: the tool, its arguments, its result or ``error``,
    how long it took, and ``extra`` fields merged into the record (e.g. ``tool_call_id``)."""

    tool_name: str
    arguments: Any
    result: Any = None
    error: str | None = None
    duration_ms: float | None = None
    extra: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RunStart:
    """What ``start_run`` starts: a run for the session ``key`` of ``agent_id`` on ``channel``, under
    ``task_key``, inheriting from ``parent_uuid``. With ``opening`` the run exists for the message
    about to be appended (the store undoes it when that message cannot be stored)."""

    key: str
    agent_id: str | None
    chat_type: str
    channel: str | None
    task_key: TaskKey
    parent_uuid: str | None = None
    opening: bool = False


@dataclass
class RunState:
    """An active (running or paused) run held in memory; the files are the truth."""

    run_id: str
    key: str
    agent_id: str | None
    chat_type: str
    channel: str | None
    status: RunStatus
    started_at: str
    task_key: TaskKey
    parent_uuid: str | None = None
    next_seq: int = 1
    context_tokens: int = 0
    context_lines: int = 0
    context_bytes: int = 0  # current.jsonl's size once queued appends land (the recovery checkpoint)
    messages_bytes: int = 0  # messages.jsonl's size, likewise
    last_context_seq: int = 0
    next_summary_id: int = 1
    compaction_count: int = 0
    next_tool_seq: int = 1
    next_plan_id: int = 1
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    closing: bool = False
    hold_compaction: bool = False  # after /uncompact: no automatic compaction until the next model call
    flushed_at_count: int | None = None  # the compaction count the last memory flush ran for
    appends_pending: int = 0  # messages queued and not yet durable (or failed)
    failed_seq: int | None = None  # the lowest seq of the appends that failed while others were pending
    failed_context_seq: int = 0  # last_context_seq as it was before that append
    deliveries: RunDeliveries | None = None  # made on first use
    opening: bool = False  # started for a message not yet durable (its folder carries a marker)

    @property
    def message_count(self) -> int:
        return self.next_seq - 1

    @property
    def last_summary_id(self) -> int:
        return self.next_summary_id - 1

    @property
    def counters(self) -> Counters:
        return counters_of(self)


@dataclass(frozen=True, slots=True)
class ContextRewrite:
    """What a compaction or an uncompact did to current.jsonl, as its commit measured it."""

    tokens_after: int  # the rewritten context's tokens
    line_delta: int  # lines added (negative: removed)
    context_bytes: int  # current.jsonl's size after the rewrite
    compaction_count: int
    summary_id: int  # the summaries.jsonl record the commit appended
    tokens_before: int = 0
