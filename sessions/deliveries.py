"""Deliveries: which ``client_message_id`` a run's messages hold, read from what is stored.

The durable truth for idempotent redelivery. A message posted with a ``client_message_id`` is its
own delivery record while its run is active: the line carries the id, and the reply carries
``reply_to`` (the seq it answers), so a redelivery is recognised from what is stored whatever
happened around it. A run that ends leaves an idempotency record per id it stored (tasks.db, the
``idempotency`` table); a reply body worth replaying (a model's answer, events) is recorded there
too. An append marked ``NewMessage.once`` is checked against both as it is stored (in the
append's own statement on PostgreSQL, in memory on the files backend): a repeat raises
``AlreadyDelivered`` and stores nothing, so a retry-safe post costs no lookup of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

DELIVERY_WINDOW = timedelta(days=1)  # SPEC section 8: a repeat within a day answers the first answer


@dataclass(frozen=True, slots=True)
class PriorDelivery:
    """An earlier delivery of a ``client_message_id`` on a key: where it was stored, the reply body
    recorded for it (JSON; None when none was), and the reply found in the transcript (``{content,
    seq}``; None when none was stored)."""

    run_id: str | None
    seq: int | None
    response: str | None = None
    reply: dict[str, Any] | None = None


class RecordedId(NamedTuple):
    """An idempotency record as a store keeps it in memory to check an append without a lookup."""

    created_at: str
    run_id: str | None
    seq: int | None


class AlreadyDelivered(Exception):
    """An append marked ``once`` whose ``client_message_id`` the key already stored within the
    window: nothing was stored, no seq was taken; ``prior`` is what the first delivery was."""

    def __init__(self, prior: PriorDelivery) -> None:
        super().__init__(f"delivered before as seq {prior.seq} of run {prior.run_id}")
        self.prior = prior


@dataclass(frozen=True)
class Delivery:
    """A stored message that carried a ``client_message_id``, and its reply if one was stored."""

    run_id: str
    seq: int
    timestamp: str
    reply: dict[str, Any] | None = None


@dataclass
class RunDeliveries:
    """Per active run, in memory: client_message_id -> (seq, timestamp) of its latest delivery, and
    seq -> reply.

    Appends made by this process are added as they become durable; ``scanned`` says whether the
    file's earlier lines (from before a restart) have been read in."""

    by_id: dict[str, tuple[int, str]] = field(default_factory=dict)
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    scanned: bool = False

    def add(self, record: Mapping[str, Any]) -> None:
        cmid = record.get("client_message_id")
        if isinstance(cmid, str):  # the latest delivery of an id (an earlier one had expired)
            found, seq = self.by_id.get(cmid), int(record["seq"])
            if found is None or found[0] < seq:
                self.by_id[cmid] = (seq, str(record.get("timestamp") or ""))
        answered = record.get("reply_to")
        if isinstance(answered, int) and not record.get("tool_calls"):
            self.replies.setdefault(answered, {"content": record.get("content"), "seq": record.get("seq")})

    def forget(self, record: Mapping[str, Any]) -> None:
        """An append counted by ``add`` when queued that failed (its seq is given back)."""
        cmid = record.get("client_message_id")
        found = self.by_id.get(cmid) if isinstance(cmid, str) else None
        if found is not None and found[0] == record["seq"]:
            del self.by_id[str(cmid)]

    def merge(self, other: RunDeliveries) -> None:
        for cmid, found in other.by_id.items():
            mine = self.by_id.get(cmid)
            if mine is None or mine[0] < found[0]:
                self.by_id[cmid] = found
        for seq, reply in other.replies.items():
            self.replies.setdefault(seq, reply)
        self.scanned = True

    def find(self, run_id: str, cmid: str, since: str) -> Delivery | None:
        found = self.by_id.get(cmid)
        if found is None or found[1] < since:
            return None
        return Delivery(run_id, found[0], found[1], self.replies.get(found[0]))


def prior_of(found: Delivery) -> PriorDelivery:
    """A delivery found in the transcript as a prior delivery (no reply body recorded)."""
    return PriorDelivery(found.run_id, found.seq, None, found.reply)
