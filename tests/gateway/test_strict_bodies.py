"""A body field of the wrong JSON type is refused, never converted: pydantic's lax mode took
``"yes"`` and ``1`` for true and ``"5"`` for 5, so ``{"force": "yes"}`` rebuilt a whole memory
index and ``{"dry_run": "false"}`` deleted what a dry run would only have listed. Every operation
with a JSON body is taken from /openapi.json, and each of its typed fields is sent the values of
the other JSON types: 400 ``invalid_field`` naming the field and what was sent, nothing on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gateway.openapi import build
from tests.gateway.conftest import Client, settled
from tests.gateway.helpers import tree_digest

MAIN = "agent:main:main"
# a value of each JSON type that lax mode would have converted to the field's type where it could
WRONG: dict[str, list[Any]] = {
    "boolean": ["yes", "true", "false", 1, 0],
    "integer": ["1", True],
    "string": [5, True],
}


@pytest.fixture
def gateway_overrides() -> dict[str, Any]:
    return {"gateway": {"openai_compat": {"enabled": True}}}


@pytest.fixture
async def client(client: Client) -> Client:
    first = await client.post(f"/v1/sessions/{quote(MAIN, safe='')}/messages", json={"content": "hi"})
    assert first.status == 200
    await settled(client)
    return client


def typed_fields(document: dict[str, Any]) -> list[tuple[str, str, str, set[str]]]:
    """(method, path, field, the JSON types the document allows) of every body field whose
    schema names its types."""
    out = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "$ref" in schema:
                schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            for name, prop in schema.get("properties", {}).items():
                kinds = {s.get("type") for s in prop.get("anyOf", [prop])}
                if kinds and None not in kinds and kinds & set(WRONG):
                    out.append((method, path, name, kinds))
    return sorted(out, key=lambda row: (row[0], row[1], row[2]))


async def test_every_typed_body_field_refuses_the_other_json_types(client: Any, tmp_path: Path) -> None:
    runs = (await (await client.get("/v1/runs")).json())["runs"]
    run_id = next(run["uuid"] for run in runs if run["session_key"] == MAIN)
    fields = typed_fields(build(client.app.router.routes()))
    routes = {(method, path) for method, path, _, _ in fields}
    assert {("post", "/v1/memory/reindex"), ("post", "/v1/admin/cleanup"), ("patch", "/v1/sessions/{key}")} <= routes
    assert {("post", "/v1/chat/completions"), ("post", "/v1/messages"), ("post", "/v1/runs/{uuid}/tools")} <= routes
    before = tree_digest(tmp_path)
    sent = 0
    for method, path, name, kinds in fields:
        url = path.replace("{key}", quote(MAIN, safe="")).replace("{uuid}", run_id)
        wrong = [v for kind in kinds & set(WRONG) for v in WRONG[kind] if _json_type(v) not in kinds]
        for value in wrong:
            resp = await client.request(method.upper(), url, json={name: value})
            text = await resp.text()
            assert resp.status == 400, (method, path, name, value, text)
            error = (await resp.json())["error"]
            assert error["code"] == "invalid_field", (path, name, value, text)
            assert f"field '{name}'" in error["message"] and " not " in error["message"], (path, name, value, text)
            sent += 1
    assert sent >= 40
    await settled(client)
    assert tree_digest(tmp_path) == before


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "string"


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/memory/reindex", {"force": "yes"}, "field 'force': Input should be a valid boolean, not the string"),
        ("/v1/admin/cleanup", {"dry_run": "false"}, "field 'dry_run': Input should be a valid boolean, not the string"),
        ("/v1/admin/doctor", {"fix": 1}, "field 'fix': Input should be a valid boolean, not the number 1"),
    ],
)
async def test_the_error_says_what_was_sent_and_nothing_runs(
    client: Any, tmp_path: Path, path: str, body: dict[str, Any], says: str
) -> None:
    before = tree_digest(tmp_path)
    resp = await client.post(path, json=body)
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert error["message"].startswith(says), error
    assert json.dumps(body[next(iter(body))]) in error["message"]  # the value sent, as JSON
    assert "openapi.json" in error["message"]
    await settled(client)
    assert tree_digest(tmp_path) == before


async def test_json_numbers_and_booleans_of_the_right_type_are_still_taken(client: Any) -> None:
    patched = await client.patch(f"/v1/sessions/{quote(MAIN, safe='')}", json={"pinned": True, "label": "x"})
    assert patched.status == 200, await patched.text()
    assert (await patched.json())["pinned"] is True
    cleanup = await client.post("/v1/admin/cleanup", json={"dry_run": True})
    assert cleanup.status == 200 and (await cleanup.json())["dry_run"] is True
    ingress = {"channel": "t", "chat_type": "direct", "chat_id": 5, "sender_id": 7, "text": "hi", "reply": False}
    resp = await client.post("/v1/messages", json=ingress)
    assert resp.status == 200, await resp.text()


def test_a_unions_members_are_one_field_and_list_items_stay_apart() -> None:
    from config.errors import BadRequest
    from gateway.http import validate
    from gateway.openai_compat.bodies import ChatCompletionBody, ResponsesBody

    def said(model: Any, data: dict[str, Any]) -> tuple[str, str]:
        with pytest.raises(BadRequest) as refused:
            validate(model, data)
        return refused.value.message, refused.value.extra["field"]

    message, field = said(ChatCompletionBody, {"model": "m", "messages": [{}], "tool_choice": 5})
    assert field == "tool_choice"
    assert "field 'tool_choice': Input should be a valid string or a valid dictionary, not the number 5" in message
    # two items of one list are two errors, not one merged ("a valid dictionary or a valid dictionary")
    message, field = said(ChatCompletionBody, {"model": "m", "messages": [5, 5]})
    assert field == "messages.0" and "field 'messages.1'" in message and " or " not in message
    # a member's tag is not shown as a field ("input.str")
    message, field = said(ResponsesBody, {"model": "m", "input": [5]})
    assert field == "input" and ".str" not in message and "field 'input.0'" in message
    message, _ = said(ChatCompletionBody, {"model": "m", "messages": "x" * 500})
    assert "x" * 41 not in message  # what was sent is shown cut
