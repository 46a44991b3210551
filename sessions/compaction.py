"""Compaction decisions (SPEC section 5, seed 000 ContextCompressor) as pure functions.

``plan_compaction`` says where to cut the current context: everything before the last
``keep_recent`` messages (in the order the model sees them, ``sessions.context_order``) is
summarized, unless fewer than ``min_to_compress`` would be; an assistant message with
``tool_calls`` is never separated from its tool results, and the summarized part is always a seq
range below every kept line (a reply placed before messages that waited for it is summarized with
them or kept). The I/O that carries a plan
out lives in ``sessions.compactor``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

from sessions.context_lines import ContextLine, SummaryLine
from sessions.context_order import clean_cuts, place
from sessions.tokens import estimate_text

COMPACTIONS = "compactions"  # where a compaction keeps the context it replaced: compactions/{summary_id}.jsonl
Line = dict[str, Any]  # a line or record as stored (JSON object); the engine sees ContextLine


@dataclass(frozen=True)
class CompactionPlan:
    previous_summary: SummaryLine | None  # the summary line at the head of the context, folded into the new one
    summarize: tuple[ContextLine, ...]  # the messages to summarize (oldest first)
    keep: tuple[ContextLine, ...]  # the recent messages kept verbatim
    start_seq: int  # the first seq newly compacted (successive compactions cover disjoint ranges)
    end_seq: int
    covers_from: int  # the first seq the new summary covers, the previous summary's included

    @property
    def tokens_before(self) -> int:
        head = int(self.previous_summary.get("tokens", 0)) if self.previous_summary else 0
        return head + sum(int(x.get("tokens", 0)) for x in (*self.summarize, *self.keep))


def is_summary(line: Mapping[str, Any]) -> TypeGuard[SummaryLine]:
    return line.get("kind") == "summary"


def compaction_due(context_tokens: int, overhead_tokens: int, threshold: int) -> bool:
    """Due when system prompt + tool schemas + current context reach the threshold."""
    return context_tokens + overhead_tokens >= threshold


def plan_compaction(lines: Sequence[ContextLine], *, keep_recent: int, min_to_compress: int) -> CompactionPlan | None:
    """Where to cut, or None when fewer than ``min_to_compress`` messages would be summarized."""
    head = lines[0] if lines else None
    previous = head if head is not None and is_summary(head) else None
    body = list(lines[1:] if previous else lines)
    cut = max(0, len(body) - keep_recent)
    clean = clean_cuts([place(x)[1] for x in body])
    while 0 < cut < len(body) and (body[cut].get("role") == "tool" or not clean[cut]):
        cut -= 1  # keep the assistant message whose tool_calls these results answer; cut a seq range
    if cut < min_to_compress:
        return None
    summarize, keep = body[:cut], body[cut:]
    seqs = [seq for x in summarize if (seq := x.get("seq")) is not None]
    start = min(seqs)
    # a summary line written before covers_from named its first seq start_seq
    covers_from = start
    if previous is not None:
        covers_from = int(cast(Any, previous.get("covers_from") or previous.get("start_seq") or start))
    return CompactionPlan(
        previous, tuple(summarize), tuple(keep), start_seq=start, end_seq=max(seqs), covers_from=covers_from
    )


def summary_line(summary_id: int, text: str, *, covers_from: int, end_seq: int) -> SummaryLine:
    """The system message that opens the context after a compaction."""
    content = f"[Summary of the conversation so far (messages {covers_from}-{end_seq})]\n{text}"
    return {
        "seq": None,
        "role": "system",
        "kind": "summary",
        "summary_id": summary_id,
        "covers_from": covers_from,
        "end_seq": end_seq,
        "content": content,
        "tokens": estimate_text(content),
    }


def last_seq(lines: Sequence[Line]) -> int:
    """The highest messages.jsonl seq a context covers (a summary covers up to its end_seq)."""
    best = 0
    for line in lines:
        seq = line.get("seq") if line.get("seq") is not None else line.get("end_seq")
        if isinstance(seq, int) and seq > best:
            best = seq
    return best


def restore_lines(restored: Sequence[Line], current: Sequence[Line]) -> list[Line]:
    """A saved context plus the current lines whose seq is above the last seq it covers."""
    upto = last_seq(restored)
    return [*restored, *(x for x in current if x.get("seq") is not None and x["seq"] > upto)]


def rolled_forward(last: Line, current: Sequence[Line], saved: Sequence[Line] | None) -> list[Line] | None:
    """At recovery: the context the last summaries.jsonl record says is current, or None when
    current.jsonl already agrees. ``saved`` is compactions/{reverts}.jsonl for an uncompact."""
    head = current[0].get("summary_id") if current and is_summary(current[0]) else None
    if last.get("type") == "compaction" and head != last.get("id"):
        end = int(last["end_seq"])
        covers = int(last.get("covers_from") or last["start_seq"])
        line = summary_line(int(last["id"]), str(last["summary"]), covers_from=covers, end_seq=end)
        return [cast(Line, line), *(x for x in current if x.get("seq") is not None and x["seq"] > end)]
    if last.get("type") == "uncompact" and head != last.get("restored_head") and saved is not None:
        return restore_lines(saved, current)
    return None


def archive_name(summary_id: int) -> str:
    return f"{COMPACTIONS}/{summary_id}.jsonl"


def archive_of(record: dict[str, Any]) -> str:
    """The archive a compaction record saved (or an uncompact record restored); records written
    before archives were named by summary id name none and used the compaction number."""
    named = record.get("archive")
    if isinstance(named, str):
        return named
    number = record.get("reverts") if record.get("type") == "uncompact" else record.get("compaction_count")
    return f"{COMPACTIONS}/{number}.jsonl"


def in_effect(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The compaction records not undone, oldest first: each uncompact undoes the latest."""
    stack: list[dict[str, Any]] = []
    for record in records:
        if record.get("type") == "uncompact":
            if stack:
                stack.pop()
        else:
            stack.append(record)
    return stack
