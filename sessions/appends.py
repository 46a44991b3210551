"""What an append stores, the same in every backend: the message record (its fields, in order, and
its token estimate), the tool call record, the fields of its event, and whether a run takes it."""

from __future__ import annotations

from typing import Any

from config.errors import RunClosing, SessionPaused
from sessions.records import MessageRecord, NewMessage, RunState, ToolUse
from sessions.tokens import estimate_message


def check_writable(run: RunState, message: NewMessage) -> None:
    """A completing run takes nothing; a paused one takes commands only."""
    if run.closing:
        raise RunClosing(f"run {run.run_id} is completing; retry on the next run")
    if run.status == "paused" and not message.command:
        raise SessionPaused(f"session {run.key!r} is paused; send /resume or POST /v1/sessions/{{key}}/resume first")


def message_record(seq: int, message: NewMessage, timestamp: str) -> MessageRecord:
    record: MessageRecord = {
        "seq": seq,
        "role": message.role,
        "content": message.content,
        "timestamp": timestamp,
        "tokens": 0,
        "tool_name": message.tool_name,
    }
    # Optional fields only when set, in this order (one test per field: this runs per message).
    if message.name is not None:
        record["name"] = message.name
    if message.sender_id is not None:
        record["sender_id"] = message.sender_id
    if message.tool_call_id is not None:
        record["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        record["tool_calls"] = list(message.tool_calls)
    if message.command:
        record["command"] = True
    if message.usage is not None:
        record["usage"] = message.usage
    if message.kind is not None:
        record["kind"] = message.kind
    if message.client_message_id is not None:
        record["client_message_id"] = message.client_message_id
    if message.reply_to is not None:
        record["reply_to"] = message.reply_to
    if message.after is not None:
        record["after"] = message.after
    record["tokens"] = estimate_message(record)
    return record


def event_fields(record: MessageRecord) -> dict[str, Any]:
    return {k: record[k] for k in ("seq", "role", "content", "name", "kind", "command") if k in record}




def tool_record(run: RunState, use: ToolUse, timestamp: str) -> dict[str, Any]:
    """The record of a tool call, numbered with the run's next tool seq (which moves on)."""
    record: dict[str, Any] = {
        "seq": run.next_tool_seq,
        "tool_name": use.tool_name,
        "arguments": use.arguments,
        "result": use.result,
        "error": use.error,
        "timestamp": timestamp,
    }
    run.next_tool_seq += 1
    if use.duration_ms is not None:
        record["duration_ms"] = round(use.duration_ms, 3)
    record.update(use.extra or {})
    return record
