"""The idempotency check of the append statement (``sessions.postgres.batching``): a message whose
``client_message_id`` was already delivered within ``DELIVERY_WINDOW`` is found by the same
statement that would store it, and the run it belongs to stores nothing of that statement.

``SEEN`` is the statement's lookup (in the ``idempotency`` records and in the run's own messages),
``RECORD`` writes the reply bodies queued for it (``ReplyRecord``), ``claims`` reads its answer
back as the runs stored and the repeats found (``PriorDelivery``, by seq).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg

from sessions.codec import decode
from sessions.deliveries import PriorDelivery

# Each append line whose id is checked ($10 run, $11 seq, $13 client_message_id, $19 key) against
# the key's idempotency records and the run's messages newer than $20; src 1 and 2 tell them apart.
SEEN = """seen AS (
    SELECT u.run_id, u.seq, 1 AS src, p.run_id AS prior_run, p.message_seq AS prior_seq,
        p.response AS prior_response, NULL::text AS prior_reply
    FROM u JOIN idempotency p ON p.session_key = u.once_key AND p.client_message_id = u.cmid
        AND p.created_at >= $20
    WHERE u.once_key IS NOT NULL
    UNION ALL
    SELECT u.run_id, u.seq, 2, d.run_id, d.seq, NULL, (SELECT r.record::text FROM messages r
        WHERE r.run_id = d.run_id AND r.reply_to = d.seq AND r.record->'tool_calls' IS NULL ORDER BY r.seq LIMIT 1)
    FROM u CROSS JOIN LATERAL (SELECT m.run_id, m.seq FROM messages m WHERE m.run_id = u.run_id
        AND m.client_message_id = u.cmid AND m.client_message_id IS NOT NULL AND m.created_at >= $20
        ORDER BY m.seq DESC LIMIT 1) d
    WHERE u.once_key IS NOT NULL
"""
# The reply bodies queued for the statement ($21-$26): one per (key, id), merged with what is there.
RECORD = """i AS (
    INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq, response)
    SELECT * FROM unnest($21::text[], $22::text[], $23::text[], $24::text[], $25::bigint[], $26::text[])
    ON CONFLICT (session_key, client_message_id) DO UPDATE SET run_id = excluded.run_id,
        message_seq = excluded.message_seq, response = COALESCE(excluded.response, idempotency.response)
"""


@dataclass
class ReplyRecord:
    """A reply body to record for a delivery (``remember_reply``): it rides in the next statement."""

    key: str
    client_message_id: str
    created_at: str
    run_id: str | None
    seq: int | None
    response: str
    future: asyncio.Future[None]


def take_replies(waiting: list[ReplyRecord]) -> tuple[list[ReplyRecord], list[ReplyRecord]]:
    """The reply records for the next statement, one per (key, id), and those left to wait (a later
    one of the same pair, for the statement after); a record whose caller was cancelled is dropped."""
    taken: list[ReplyRecord] = []
    seen: set[tuple[str, str]] = set()
    left: list[ReplyRecord] = []
    for reply in waiting:
        if reply.future.done():  # its caller was cancelled
            continue
        marker = (reply.key, reply.client_message_id)
        if marker in seen:
            left.append(reply)
            continue
        seen.add(marker)
        taken.append(reply)
    return taken, left


def claims(rows: list[asyncpg.Record]) -> tuple[set[str], dict[str, dict[int, PriorDelivery]]]:
    """The runs the statement stored, and per run not stored for it, the appends (by seq) that
    repeat a delivery with what that delivery was (its record's reply body, its transcript's reply)."""
    claimed: set[str] = set()
    repeats: dict[str, dict[int, PriorDelivery]] = {}
    for run_id, seq, src, prior_run, prior_seq, response, reply in rows:
        if src == 0:
            claimed.add(run_id)
            continue
        found = repeats.setdefault(run_id, {})
        before = found.get(seq)
        answer = None
        if reply is not None:
            record = decode(reply.encode())
            answer = {"content": record.get("content"), "seq": record.get("seq")}
        if before is None:
            found[seq] = PriorDelivery(prior_run, prior_seq, response, answer)
        elif src == 1:  # the record's place and body; the transcript's reply
            found[seq] = PriorDelivery(prior_run, prior_seq, response, before.reply)
        else:
            found[seq] = PriorDelivery(before.run_id, before.seq, before.response, answer)
    return claimed, repeats


def reply_arguments(replies: list[ReplyRecord]) -> list[list[Any]]:
    """The statement's 6 arrays of reply records (key, id, time, run, seq, body)."""
    columns: list[list[Any]] = [[] for _ in range(6)]
    for reply in replies:
        for column, value in zip(columns, (
            reply.key, reply.client_message_id, reply.created_at, reply.run_id, reply.seq, reply.response,
        ), strict=True):  # fmt: skip
            column.append(value)
    return columns
