"""The payload of an event sent to the other gateway processes (``sessions.postgres.notify``):
whole when it fits the server's 8000 bytes, a reference for a larger message, cut otherwise."""

from __future__ import annotations

import json

from sessions.postgres.notify import MAX_PAYLOAD, encode


def test_an_event_that_fits_goes_whole() -> None:
    event = {"type": "message", "key": "agent:main:main", "run_id": "r1", "seq": 3, "content": "会議"}
    assert json.loads(encode("p1", event)) == {"o": "p1", "e": event}


def test_a_large_message_goes_as_a_reference_without_its_content() -> None:
    event = {
        "type": "message",
        "key": "agent:main:main",
        "run_id": "r1",
        "seq": 3,
        "role": "user",
        "content": "大" * 6000,
    }
    payload = encode("p1", event)
    assert len(payload.encode()) <= MAX_PAYLOAD
    data = json.loads(payload)
    assert data["ref"] is True and data["e"] == {k: v for k, v in event.items() if k != "content"}


def test_another_large_event_has_its_long_text_cut() -> None:
    event = {"type": "compaction", "key": "agent:main:main", "run_id": "r1", "summary": "x" * 20000, "tokens": 5}
    payload = encode("p1", event)
    assert len(payload.encode()) <= MAX_PAYLOAD
    data = json.loads(payload)["e"]
    assert data["truncated"] is True and data["tokens"] == 5 and data["summary"] == "x" * 500
