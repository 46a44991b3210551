"""The reply records one append statement carries (``sessions.postgres.repeats.take_replies``): one
per (key, client_message_id), the later ones of a pair kept for the next statement in their order,
those whose caller was cancelled dropped. The statement's lookup itself runs against a real server
in the conformance suite (``tests/sessions/conformance/test_deliveries.py``)."""

from __future__ import annotations

import asyncio

from sessions.postgres.repeats import ReplyRecord, take_replies


def _reply(loop: asyncio.AbstractEventLoop, key: str, cmid: str, body: str) -> ReplyRecord:
    return ReplyRecord(key, cmid, "2026-01-01T00:00:00+00:00", "r1", 1, body, loop.create_future())


async def test_one_reply_per_key_and_id_a_statement_the_rest_wait_in_order() -> None:
    loop = asyncio.get_running_loop()
    first, again, other_key, other_id, third = (
        _reply(loop, "k1", "a", "first"),
        _reply(loop, "k1", "a", "again"),
        _reply(loop, "k2", "a", "other key"),
        _reply(loop, "k1", "b", "other id"),
        _reply(loop, "k1", "a", "third"),
    )
    cancelled = _reply(loop, "k3", "c", "gone")
    cancelled.future.cancel()
    taken, left = take_replies([first, again, cancelled, other_key, other_id, third])
    assert taken == [first, other_key, other_id]
    assert left == [again, third]
    taken, left = take_replies(left)
    assert (taken, left) == ([again], [third])
    assert take_replies([]) == ([], [])
