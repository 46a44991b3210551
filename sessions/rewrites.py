"""A rewrite of a run's context given as data (SPEC section 5): what a compaction or an uncompact
asks the store to do, and the pure functions every backend uses to carry it out.

The caller (``sessions.compactor``) decides the summary and where to cut; the store keeps the old
context (the archive the summary record names), appends the record and replaces the context, in
the order that lets its recovery roll forward. A rewrite that would not make the context smaller
changes nothing (``None``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sessions.compaction import Line, archive_of, in_effect, is_summary, restore_lines
from sessions.context_lines import SummaryLine


@dataclass(frozen=True)
class Compaction:
    """Replace the context's lines up to ``end_seq`` by ``head`` (the summary line) and record it."""

    summary_id: int
    compaction_count: int  # the run's count once this is committed
    head: SummaryLine  # the summary line that opens the new context
    end_seq: int  # lines with a seq above this are kept
    record: Mapping[str, object] = field(default_factory=dict)  # the summaries record; tokens_* filled in


@dataclass(frozen=True)
class Uncompaction:
    """Restore the context saved by the latest compaction still in effect (plus what came after)."""

    summary_id: int  # the id of the uncompact record
    compaction_count: int  # the count being undone (the run's count before this)
    created_at: str


ContextChange = Compaction | Uncompaction


def tokens_of(lines: Sequence[Line]) -> int:
    return sum(int(line.get("tokens", 0)) for line in lines)


def compacted(change: Compaction, current: Sequence[Line]) -> tuple[list[Line], Line] | None:
    """The new context and the record to append; None when the summary frees nothing."""
    before = tokens_of(current)
    new_lines = [dict(change.head), *(x for x in current if x.get("seq") is not None and x["seq"] > change.end_seq)]
    after = tokens_of(new_lines)
    if after >= before:
        return None
    record: Line = {**change.record, "tokens_before": before, "tokens_after": after, "tokens_saved": before - after}
    return new_lines, record


def to_undo(summaries: list[Line]) -> tuple[Line, str] | None:
    """The compaction record an uncompact undoes and the name of the context it saved."""
    undone = in_effect(summaries)
    if not undone:
        return None
    return undone[-1], archive_of(undone[-1])


def uncompacted(
    change: Uncompaction, undone: Line, archive: str, restored: list[Line], current: Sequence[Line]
) -> tuple[list[Line], Line]:
    """The restored context and the uncompact record to append."""
    new_lines = restore_lines(restored, list(current))
    head = restored[0].get("summary_id") if restored and is_summary(restored[0]) else None
    record: Line = {
        "id": change.summary_id,
        "type": "uncompact",
        "reverts": change.compaction_count,
        "reverts_id": undone.get("id"),
        "archive": archive,
        "restored_head": head,
        "created_at": change.created_at,
        "compaction_count": change.compaction_count - 1,
    }
    return new_lines, record
