"""Value types the session engine takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Role = Literal["user", "assistant", "tool", "system"]
ROLES: tuple[Role, ...] = ("user", "assistant", "tool", "system")
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


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


@dataclass
class RunState:
    """An active (running or paused) run held in memory; the files are the truth."""

    run_id: str
    key: str
    agent_id: str | None
    chat_type: str
    channel: str | None
    status: str
    dir: Path
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
    deliveries: Any = None  # sessions.deliveries.RunDeliveries, made on first use
    opening: bool = False  # started for a message not yet durable (its folder carries a marker)

    @property
    def message_count(self) -> int:
        return self.next_seq - 1
