"""Deliveries: which ``client_message_id`` a run's messages hold, read from what is stored.

The durable truth for idempotent redelivery. The idempotency rows in tasks.db commit after the
message is durable, so a crash (or a locked tasks.db) between the two leaves a stored message with
no row; the message line itself carries its ``client_message_id``, and the reply carries
``reply_to`` (the seq it answers), so a redelivery is recognised from the file whatever happened
to the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Delivery:
    """A stored message that carried a ``client_message_id``, and its reply if one was stored."""

    run_id: str
    seq: int
    timestamp: str
    reply: dict[str, Any] | None = None


@dataclass
class RunDeliveries:
    """Per active run, in memory: client_message_id -> (seq, timestamp), and seq -> reply.

    Appends made by this process are added as they become durable; ``scanned`` says whether the
    file's earlier lines (from before a restart) have been read in."""

    by_id: dict[str, tuple[int, str]] = field(default_factory=dict)
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    scanned: bool = False

    def add(self, record: Mapping[str, Any]) -> None:
        cmid = record.get("client_message_id")
        if isinstance(cmid, str):
            self.by_id.setdefault(cmid, (int(record["seq"]), str(record.get("timestamp") or "")))
        answered = record.get("reply_to")
        if isinstance(answered, int) and not record.get("tool_calls"):
            self.replies.setdefault(answered, {"content": record.get("content"), "seq": record.get("seq")})

    def merge(self, other: RunDeliveries) -> None:
        for cmid, found in other.by_id.items():
            self.by_id.setdefault(cmid, found)
        for seq, reply in other.replies.items():
            self.replies.setdefault(seq, reply)
        self.scanned = True

    def find(self, run_id: str, cmid: str, since: str) -> Delivery | None:
        found = self.by_id.get(cmid)
        if found is None or found[1] < since:
            return None
        return Delivery(run_id, found[0], found[1], self.replies.get(found[0]))
