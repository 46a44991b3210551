"""What the in-memory backend keeps, outside any open store: runs (their row and records),
entries, and the records beside the runs. A store opened again on the same ``MemoryData`` finds
it all, as a restart finds a home."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sessions.records import CompatConversation, Counters, ResponseRef, RunRow, StoredRecord
from sessions.usage import DailyKey


def line_size(record: StoredRecord) -> int:
    """A line's size as a JSON Lines file would hold it (the byte counters of ``Counters``)."""
    return len(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")) + 1


@dataclass
class StoredRun:
    """One run: its row and everything appended to it."""

    row: RunRow
    metadata: dict[str, Any]
    messages: list[StoredRecord] = field(default_factory=list)
    context: list[StoredRecord] = field(default_factory=list)
    summaries: list[StoredRecord] = field(default_factory=list)
    tools: list[StoredRecord] = field(default_factory=list)
    planning: list[StoredRecord] = field(default_factory=list)
    saved_contexts: dict[str, list[StoredRecord]] = field(default_factory=dict)  # by the archive name
    final_summary: str | None = None
    counters: Counters = field(default_factory=Counters)  # checkpointed after every change


@dataclass
class Idempotency:
    created_at: str
    run_id: str | None
    seq: int | None
    response: str | None = None


@dataclass
class MemoryData:
    runs: dict[str, StoredRun] = field(default_factory=dict)  # insertion order: creation order
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # SessionEntry.to_dict() per key
    idempotency: dict[tuple[str, str], Idempotency] = field(default_factory=dict)
    hook_deliveries: dict[str, tuple[str, str, str | None, int | None]] = field(default_factory=dict)
    compat_conversations: dict[str, CompatConversation] = field(default_factory=dict)
    compat_responses: list[tuple[ResponseRef, str]] = field(default_factory=list)
    usage_daily: dict[DailyKey, dict[str, int]] = field(default_factory=dict)  # USAGE_COLUMNS per day, agent, key
    history: dict[tuple[str, int], tuple[Any, ...]] | None = None  # the history index's rows (None: never opened)
    tombstones: list[StoredRecord] = field(default_factory=list)  # one per purged key, without content
