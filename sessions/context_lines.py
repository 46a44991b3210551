"""The lines of a run's context (current.jsonl in the files backend, ``context_lines`` rows in
postgres, a list in memory), typed: a message as the model is sent it (``ContextMessage``: a user
or system message, an assistant reply and the tool calls it makes, a tool result) and the summary
that opens a compacted context (``SummaryLine``). TypedDicts: a line is stored as its JSON, key
for key, so the files on disk stay byte for byte what they were."""

# No ``from __future__ import annotations`` here: TypedDict reads ``NotRequired`` at class creation.
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, cast

from typing_extensions import TypedDict

from sessions.context_order import in_model_order
from sessions.records import Role


class ContextMessage(TypedDict):
    """A message's line: its messages.jsonl record without the timestamp, client_message_id,
    usage and sender_id (``sessions.context_order.context_line``)."""

    seq: int
    role: Role
    content: str
    tokens: int
    tool_name: NotRequired[str]  # a tool result: the tool that gave it
    name: NotRequired[str]
    tool_call_id: NotRequired[str]
    tool_calls: NotRequired[list[dict[str, Any]]]  # an assistant line that calls tools
    command: NotRequired[bool]
    kind: NotRequired[str]
    reply_to: NotRequired[int]
    after: NotRequired[int]


class SummaryLine(TypedDict):
    """The system message that opens the context after a compaction (``summary_line``)."""

    seq: None
    role: Literal["system"]
    kind: Literal["summary"]
    summary_id: int
    covers_from: int
    end_seq: int
    content: str
    tokens: int


ContextLine = ContextMessage | SummaryLine


def read_back(lines: Sequence[Mapping[str, Any]]) -> list[ContextLine]:
    """A run's context lines as a backend read them back (JSON objects it stored from these types),
    in the order the model sees them (``sessions.context_order``)."""
    return in_model_order(cast(Sequence[ContextLine], lines))
