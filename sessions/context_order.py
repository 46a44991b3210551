"""The order of the context a model sees: pure functions of current.jsonl's lines.

messages.jsonl keeps arrival order (seq), and so does current.jsonl. A model turn's own lines (its
reply, its tool calls and their results) can get seqs above messages that arrived while it ran
and that it never saw; in the context they belong right after what the turn saw, and the messages
that waited come after them. Such a line carries ``after``: where the last line its model call saw
stands in this order. A line's place is ``(after, seq)`` when it has one, else ``(seq, seq)``:
ordered by it, each reply follows the messages it answered, the waiting messages follow the reply,
and a context without ``after`` keeps seq order; a tool result a client posted later stands
with the call it answers. The order depends on the lines alone, not on the
file's order, so appends, compaction and recovery rebuilding current.jsonl from messages.jsonl
give the same context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

Line = Mapping[str, Any]
L = TypeVar("L", bound=Line)


def place(line: Line) -> tuple[int, int]:
    """Where ``line`` stands in the context; a line without a seq (the summary that opens a
    compacted context) stands first."""
    seq = line.get("seq")
    if not isinstance(seq, int):
        return (-1, -1)
    after = line.get("after")
    return (after if isinstance(after, int) else seq, seq)


def placer(lines: Sequence[Line]) -> Callable[[Line], tuple[int, int]]:
    """``place`` within ``lines``: a tool result without ``after`` (one an OpenAI client posted for
    a call the model made) stands with the assistant line holding its call, so no message that
    waited can come between a call and its result."""
    calls: dict[str, int] = {}
    for line in lines:
        for call in line.get("tool_calls") or ():
            if isinstance(call, Mapping) and isinstance(call.get("id"), str) and isinstance(line.get("seq"), int):
                calls[call["id"]] = place(line)[0]
    if not calls:
        return place

    def placed(line: Line) -> tuple[int, int]:
        own = place(line)
        if line.get("role") == "tool" and "after" not in line:
            at = calls.get(line.get("tool_call_id"))  # type: ignore[arg-type]
            if at is not None and at < own[0]:
                return (at, own[1])
        return own

    return placed


def in_model_order(lines: Sequence[L]) -> list[L]:
    """``lines`` in the order the model sees them (stable: lines without a seq keep their order)."""
    return sorted(lines, key=placer(lines))


def anchor(seen: Sequence[Line]) -> int:
    """The ``after`` of a line a model call writes, given what that call saw (in model order):
    the place of the last line it saw, so the line follows it and everything placed before it."""
    where = placer(seen)
    for line in reversed(seen):
        if isinstance(line.get("seq"), int):
            return where(line)[0]
        end = line.get("end_seq")
        if isinstance(end, int):
            return end
    return 0


def clean_cuts(seqs: Sequence[int]) -> list[bool]:
    """For each index ``i`` of ``seqs`` (a context's seqs in model order) and its end, whether
    cutting before ``i`` splits the context into a seq range and what follows it: every seq before
    the cut below every seq after it. Compactions cover seq ranges (summaries.jsonl's
    ``start_seq``/``end_seq``; the commit and recovery keep the lines above ``end_seq``), so a cut
    must be clean."""
    n = len(seqs)
    suffix_min = [0] * (n + 1)
    low = None
    for i in range(n - 1, -1, -1):
        low = seqs[i] if low is None else min(low, seqs[i])
        suffix_min[i] = low
    clean = [True] * (n + 1)
    high = None
    for i in range(1, n):
        high = seqs[i - 1] if high is None else max(high, seqs[i - 1])
        clean[i] = high < suffix_min[i]
    return clean


def in_context(record: Mapping[str, Any]) -> bool:
    """Whether a messages.jsonl line belongs in what the model sees."""
    return not record.get("command")


def context_line(record: Mapping[str, Any]) -> dict[str, Any]:
    """The current.jsonl line for a messages.jsonl line (OpenAI-compatible, plus seq/tokens)."""
    line = {k: v for k, v in record.items() if k not in ("timestamp", "client_message_id", "usage", "sender_id")}
    if line.get("tool_name") is None:
        line.pop("tool_name", None)
    return line
