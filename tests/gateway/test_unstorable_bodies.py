"""Bodies that cannot be stored are refused with 400 invalid_body (never a 500) and write nothing:
unpaired surrogate escapes, nesting deeper than the parser can follow, a body whose declared
Content-Encoding does not decode, NaN / Infinity / a number no double holds, an integer past
Python's digit limit."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import Client, with_active_run
from tests.gateway.helpers import tree_digest

MESSAGES = "/v1/sessions/agent%3Amain%3Amain/messages"
HOOK = "/hooks/plain"
JSON = {"Content-Type": "application/json"}

BAD_BODIES = [
    pytest.param(b'{"content": "half \\ud800 a pair"}', {}, id="lone-surrogate"),
    pytest.param(b'{"content": "x", "name": "\\udfff"}', {}, id="lone-low-surrogate"),
    pytest.param(b'{"content": "' + b"[" * 10 + b'"}' + b"[" * 100_000, {}, id="too-deep"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, {}, id="too-deep-balanced"),
    pytest.param(b'{"content": "x"}', {"Content-Encoding": "gzip"}, id="not-gzip"),
    # Python's parser takes these and JSON has not: stored, they came back as invalid JSON
    pytest.param(b'{"content": "x", "text": "x", "n": NaN}', {}, id="nan"),
    pytest.param(b'{"content": "x", "text": "x", "n": -Infinity}', {}, id="infinity"),
    pytest.param(b'{"content": "x", "text": "x", "n": 1e400}', {}, id="overflowing-float"),
    # past Python's integer digit limit the parser raised a ValueError: answered 500
    pytest.param(b'{"content": "x", "text": "x", "n": ' + b"1" * 5000 + b"}", {}, id="huge-integer"),
]


@pytest.fixture
def gateway_overrides() -> dict[str, Any]:
    return {"hooks": {"plain": {"message_template": "${text}"}}}


@pytest.fixture
async def client(client: Client) -> Client:
    return await with_active_run(client, MESSAGES)


@pytest.mark.parametrize("path", [MESSAGES, HOOK])
@pytest.mark.parametrize(("data", "headers"), BAD_BODIES)
async def test_unstorable_bodies_are_invalid_body_and_change_nothing(
    client: Any, tmp_path: Path, path: str, data: bytes, headers: dict[str, str]
) -> None:
    before = tree_digest(tmp_path)
    resp = await client.post(path, data=data, headers={**JSON, **headers})
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_body" and error["message"] and error["request_id"]
    assert tree_digest(tmp_path) == before


async def test_a_hook_payload_with_a_lone_surrogate_in_a_templated_value_is_refused(
    client: Any, tmp_path: Path
) -> None:
    before = tree_digest(tmp_path)
    resp = await client.post(HOOK, data=b'{"text": "\\ud83d"}', headers=JSON)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_body"
    assert tree_digest(tmp_path) == before


async def test_surrogate_pairs_and_an_escaped_backslash_u_are_still_accepted(client: Any, tmp_path: Path) -> None:
    resp = await client.post(MESSAGES, data=b'{"content": "\\ud83d\\ude00 and \\\\ud800"}', headers=JSON)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    got = await (await client.get(f"/v1/runs/{body['run_id']}/messages?after_seq=1")).json()
    assert got["messages"][0]["content"] == "\U0001f600 and \\ud800"


async def test_a_gzip_body_is_read_decompressed(client: Any) -> None:
    resp = await client.post(MESSAGES, data=gzip.compress(b'{"content": "zipped"}'),
                             headers={**JSON, "Content-Encoding": "gzip"})  # fmt: skip
    assert resp.status == 200, await resp.text()


async def test_a_body_without_content_type_is_told_to_send_one(client: Any, tmp_path: Path) -> None:
    """aiohttp reads a missing Content-Type as application/octet-stream, and the error named that."""
    before = tree_digest(tmp_path)
    for path in (MESSAGES, HOOK):
        resp = await client.post(path, data=b'{"content": "x"}', skip_auto_headers=["Content-Type"])
        assert resp.status == 400, await resp.text()
        message = (await resp.json())["error"]["message"]
        assert "no Content-Type" in message and "octet-stream" not in message, message
    resp = await client.post(MESSAGES, data=b'{"content": "x"}', headers={"Content-Type": "text/plain"})
    assert "not text/plain" in (await resp.json())["error"]["message"]
    assert tree_digest(tmp_path) == before
