"""A session key's entry: what is kept per key between and across runs (its active run, when it
was last used, its settings and label, usage, and the checkpoint of the active run's counters).

Every backend keeps one per key; the files backend writes them to sessions.json
(``sessions.files.registry``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sessions.records import Counters, EntryChange, counter_values


@dataclass(slots=True)
class SessionEntry:
    """What the gateway keeps per key between and across runs (under 2 KB serialized)."""

    key: str
    agent_id: str | None
    chat_type: str
    channel: str | None
    created_at: str
    updated_at: str
    run_id: str | None = None
    status: str = "idle"  # an EntryStatus (sessions.records)
    started_at: str | None = None
    last_interaction_at: str | None = None
    last_user_activity_at: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    context_tokens: int = 0
    message_count: int = 0
    compaction_count: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False
    label: str | None = None
    last_run_id: str | None = None
    last_reset_boundary: str | None = None
    inherit_next: bool = True  # False after /new: the next run starts without inheritance
    # With context_tokens, message_count and compaction_count above: the active run's ``Counters``,
    # checkpointed. When current.jsonl still has this size at start-up (and the compaction count
    # agrees), recovery trusts them instead of re-reading it.
    context_bytes: int = 0
    context_lines: int = 0
    last_context_seq: int = 0
    last_summary_id: int = 0
    messages_bytes: int = 0

    @property
    def counters(self) -> Counters:
        """The checkpoint of the active run's counters (the fields ``Counters`` names)."""
        return Counters._make(counter_values(self))

    def relabel(self, change: EntryChange) -> None:
        """``update_entry``'s label and settings: a setting given as None is removed."""
        if change.label is not None or change.clear_label:
            self.label = change.label
        if change.settings is not None:
            merged = {**self.settings, **change.settings}
            self.settings = {k: v for k, v in merged.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **extra: Any) -> SessionEntry:
        try:
            return cls(**data, **extra)
        except TypeError:  # a field this version does not know (written by a newer one): drop it
            return cls(**{k: v for k, v in {**data, **extra}.items() if k in _ENTRY_FIELDS})

    def encode(self) -> str:
        """The entry's sessions.json text, without its key (the key is the member name).

        Same bytes as ``json.dumps`` of ``to_dict()`` minus the key, without ``asdict``'s deep copy:
        at start-up every entry is encoded once, and with 10,000 of them the copy dominated."""
        body = {name: getattr(self, name) for name in _BODY_FIELDS}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


_ENTRY_FIELDS = frozenset(f.name for f in fields(SessionEntry))
_BODY_FIELDS = tuple(f.name for f in fields(SessionEntry) if f.name != "key")
