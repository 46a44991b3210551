"""The message routes' answer encoded by orjson: the same JSON values, field order and headers as
``json_response``; answers orjson would write differently or refuses go through json."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.http import json_response, message_response

BODY = {
    "session_key": "agent:main:dm:ünïcode \U0001f600 \u2028",
    "run_id": "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab",
    "message_seq": 123,
    "reply": {"content": 'a "quoted" \\ line\nnext', "seq": 124},
    "events": [],
    "usage": {"input_tokens": 0, "output_tokens": 7},
}


def _decoded(response: Any) -> Any:
    assert isinstance(response.body, bytes)
    return json.loads(response.body.decode("utf-8"), object_pairs_hook=list)


@pytest.mark.parametrize("reply", [None, BODY["reply"]])
def test_same_values_order_and_headers_as_json_response(reply: Any) -> None:
    body = {**BODY, "reply": reply}
    fast, slow = message_response(body), json_response(body)
    assert _decoded(fast) == _decoded(slow)
    assert fast.status == slow.status == 200
    assert fast.headers["Content-Type"] == slow.headers["Content-Type"] == "application/json; charset=utf-8"
    assert b", " not in fast.body  # compact: orjson's encoding, not json's


@pytest.mark.parametrize(
    "body",
    [
        {**BODY, "events": [{"type": "compaction", "ratio": 1e16}]},  # orjson would write 1e16, json 1e+16
        {**BODY, "message_seq": 2**70},  # beyond orjson's 64-bit integers
        {**BODY, "usage": {1: 2}},  # a key that is no string: orjson refuses it
    ],
)
def test_what_orjson_would_change_or_refuses_goes_through_json(body: dict[str, Any]) -> None:
    fast, slow = message_response(body), json_response(body)
    assert fast.body == slow.body
