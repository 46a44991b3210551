"""How a session is shown (``GET /v1/sessions/{key}``, the session list, the CLI)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.contract import NULLABLE_STR, typed
from sessions.entries import SessionEntry
from sessions.records import RunState


def session_view(
    entry: SessionEntry,
    run: RunState | None,
    *,
    threshold: int,
    overhead: int,
    next_reset: datetime | None,
    model: str | None,
) -> dict[str, Any]:
    """The entry with its token use against the compaction threshold, compactions, next reset
    and model (None in store-only mode)."""
    body = entry.to_dict()
    body["tokens"] = {
        "context": (run.context_tokens if run else 0) + overhead,
        "threshold": threshold,
        "input": entry.input_tokens,
        "output": entry.output_tokens,
        "cache_read": entry.cache_read_tokens,
        "cache_write": entry.cache_write_tokens,
    }
    body["threshold"] = threshold
    body["compactions"] = run.compaction_count if run else entry.compaction_count
    body["next_reset"] = next_reset.isoformat() if next_reset else None
    body["model"] = model
    return body


TOKEN_FIELDS = ("context", "threshold", "input", "output", "cache_read", "cache_write")
SESSION = typed(
    "Session",
    SessionEntry,
    add={
        "tokens": {
            "type": "object",
            "description": "the context's size against the compaction threshold, and the run's token use",
            "properties": {name: {"type": "integer"} for name in TOKEN_FIELDS},
        },
        "threshold": {"type": "integer"},
        "compactions": {"type": "integer"},
        "next_reset": NULLABLE_STR,
        "model": NULLABLE_STR,
    },
)
