"""The ingest routes' fast body reading (gateway/api/fastbody.py) against the pydantic models, read
in strict mode as every body is: the two agree on every body, the same values where the model
accepts and None where it refuses (the model then gives its error). Through the routes, refused
bodies get the model's error word for word and change nothing on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.api.fastbody import plain_ingress, plain_message
from gateway.api.sessions import IngressBody, MessageBody
from gateway.http import describe_validation
from tests.gateway.conftest import Client, with_active_run
from tests.gateway.helpers import tree_digest

MESSAGES = "/v1/sessions/agent%3Amain%3Amain/messages"
INGRESS = "/v1/messages"

# Values near every limit and of every JSON type (and the Python types json.loads never makes).
TEXTS = st.sampled_from(
    [
        "",
        " ",
        "x",
        "user",
        "tool",
        "system",
        "assistant",
        "direct",
        "group",
        "channel",
        "dm",
        "USER",
        "x" * 63,
        "x" * 64,
        "x" * 65,
        "y" * 199,
        "y" * 200,
        "y" * 201,
        "/status",
        "é" * 200,
        "😀" * 200,
        "😀" * 201,
    ]
)
VALUES = st.one_of(
    TEXTS,
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 7, 10**199, 10**200, 2**70]),
    st.floats(allow_nan=False),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
MESSAGE_KEYS = st.sampled_from([*MessageBody.model_fields, "extra", "Content", "text"])
INGRESS_KEYS = st.sampled_from([*IngressBody.model_fields, "extra", "content", "Text"])


def _model(model: type[MessageBody] | type[IngressBody], data: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return dict(model.model_validate(data, strict=True))  # as gateway.http.validate reads a body
    except ValidationError:
        return None


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(MESSAGE_KEYS, VALUES, max_size=9))
def test_a_message_body_is_read_as_the_model_reads_it(data: dict[str, Any]) -> None:
    assert plain_message(data) == _model(MessageBody, data)


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(INGRESS_KEYS, VALUES, max_size=13))
def test_an_ingress_body_is_read_as_the_model_reads_it(data: dict[str, Any]) -> None:
    assert plain_ingress(data) == _model(IngressBody, data)


COMMON_MESSAGES = [
    {"content": "hello"},
    {"content": ""},
    {"content": "x", "role": "assistant", "reply": False, "stream": False},
    {"content": "x", "role": "tool", "tool_call_id": "c1", "tool_name": "t", "name": None},
    {"content": "x", "client_message_id": "y" * 200, "name": "n" * 200},
]
COMMON_INGRESS = [
    {"channel": "telegram", "chat_type": "direct", "chat_id": 42, "sender_id": "u1", "text": "hi"},
    {
        "channel": "c" * 64,
        "chat_type": "group",
        "chat_id": "g",
        "sender_id": 7,
        "text": "",
        "thread_id": 3,
        "agent_id": "main",
        "sender_name": "Ann",
        "reply": False,
        "stream": False,
        "client_message_id": "m1",
    },
]


@pytest.mark.parametrize("data", COMMON_MESSAGES)
def test_common_message_bodies_take_the_fast_path(data: dict[str, Any]) -> None:
    assert plain_message(data) is not None
    assert plain_message(data) == _model(MessageBody, data)


@pytest.mark.parametrize("data", COMMON_INGRESS)
def test_common_ingress_bodies_take_the_fast_path(data: dict[str, Any]) -> None:
    assert plain_ingress(data) is not None
    assert plain_ingress(data) == _model(IngressBody, data)


def test_bodies_the_model_refuses_or_converts_are_left_to_it() -> None:
    refused_messages: list[dict[str, Any]] = [
        {},
        {"content": 1},
        {"content": None},
        {"content": "x", "role": "robot"},
        {"content": "x", "stream": None},
        {"content": "x", "name": "n" * 201},
        {"content": "x", "client_message_id": ""},
        {"content": "x", "client_message_id": "y" * 201},
        {"content": "x", "extra": 1},
        {"content": "x", "tool_call_id": 5},
    ]
    for data in refused_messages:
        assert plain_message(data) is None and _model(MessageBody, data) is None, data
    converted: list[dict[str, Any]] = [{"content": "x", "reply": "yes"}, {"content": "x", "reply": 1}]
    for data in converted:  # lax pydantic took these for true; the strict model refuses them too
        assert plain_message(data) is None and _model(MessageBody, data) is None, data
    base = COMMON_INGRESS[0]
    refused_ingress: list[dict[str, Any]] = [
        {k: v for k, v in base.items() if k != "text"},
        {**base, "channel": ""},
        {**base, "channel": "c" * 65},
        {**base, "chat_type": "dm"},
        {**base, "chat_id": True},
        {**base, "chat_id": ""},
        {**base, "sender_id": None},
        {**base, "chat_id": 10**200},
        {**base, "thread_id": ""},
        {**base, "agent_id": 3},
        {**base, "agent_id": ""},
        {**base, "extra": None},
        {**base, "sender_name": "n" * 201},
        {**base, "client_message_id": ""},
    ]
    for data in refused_ingress:
        assert plain_ingress(data) is None and _model(IngressBody, data) is None, data


REFUSED = [
    (MESSAGES, MessageBody, {"content": "x", "reply": "maybe"}),
    (MESSAGES, MessageBody, {"content": "x", "role": "robot", "extra": 1}),
    (MESSAGES, MessageBody, {"role": "user"}),
    (MESSAGES, MessageBody, {"content": "x", "client_message_id": ""}),
    (INGRESS, IngressBody, {"channel": "t", "chat_type": "dm", "chat_id": 1, "sender_id": 2, "text": "x"}),
    (INGRESS, IngressBody, {"channel": "t", "chat_type": "direct", "chat_id": True, "sender_id": 2, "text": "x"}),
    (INGRESS, IngressBody, {"channel": "t", "chat_type": "direct", "sender_id": 2, "text": "x", "x": 1}),
]


@pytest.fixture
async def client(client: Client) -> Client:
    return await with_active_run(client, MESSAGES)


@pytest.mark.parametrize(("path", "model", "data"), REFUSED)
async def test_refused_bodies_get_the_models_error_and_change_nothing(
    client: Any, tmp_path: Path, path: str, model: type[MessageBody] | type[IngressBody], data: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data, strict=True)
    before = tree_digest(tmp_path)
    resp = await client.post(path, json=data)
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_field"
    assert error["message"] == describe_validation(refused.value)
    assert tree_digest(tmp_path) == before


async def test_a_fast_body_is_stored_as_before(client: Any) -> None:
    resp = await client.post(MESSAGES, json={"content": "x", "name": "Ann Lee", "client_message_id": "m-1"})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    got = await (await client.get(f"/v1/runs/{body['run_id']}/messages?after_seq={body['message_seq'] - 1}")).json()
    stored = got["messages"][0]
    assert (stored["role"], stored["content"], stored["name"], stored["client_message_id"]) == (
        "user",
        "x",
        "Ann_Lee",
        "m-1",
    )
    resp = await client.post(
        INGRESS, json={"channel": "t", "chat_type": "direct", "chat_id": 5, "sender_id": 9, "text": "hi"}
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["session_key"] == "agent:main:main"
