"""The OpenAI-compatible routes through ``create_app``, with the official ``openai`` package as the
client and the local OpenAI-compatible server as the agent's model (the real-daemon scenarios are
in test_openai_compat_daemon.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app, tree_digest
from tests.support.openai_server import Hang, OpenAIServer, Reply, ToolCallSpec, server_error, tool_call
from tests.support.sdk import warm_openai_sdk

warm_openai_sdk()
Client = TestClient[Any, Any]
ON = {"gateway": {"openai_compat": {"enabled": True}}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def gateway_overrides() -> dict[str, Any]:
    return ON


@pytest.fixture
def gateway_base_url(openai_server: OpenAIServer) -> str:
    return openai_server.base_url


@pytest.fixture
async def oa(client: Client) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0) as sdk:
        yield sdk


def messages_of(home: Path, run_id: str) -> list[dict[str, Any]]:
    for status in ("running", "paused", "completed"):
        path = home / "contexts" / status / run_id / "messages.jsonl"
        if path.exists():
            return [json.loads(x) for x in path.read_text().splitlines()]
    raise AssertionError(f"no run folder for {run_id}")


async def test_a_plain_completion_has_openai_s_shape_and_is_stored(
    client: Client, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": "neotask/main", "user": "alice",
                             "messages": [{"role": "user", "content": "hello"}]})  # fmt: skip
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert set(body) == {"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "neotask/main" and body["created"] == 1796040000
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "echo: hello", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert resp.headers["X-Neotask-Session-Key"] == "agent:main:openai:dm:alice"
    stored = messages_of(tmp_path, resp.headers["X-Neotask-Run-Id"])
    assert [(m["role"], m["content"]) for m in stored] == [("user", "hello"), ("assistant", "echo: hello")]
    assert stored[0]["sender_id"] == "alice"


async def test_a_stream_ends_with_the_usage_chunk_and_done(client: Client) -> None:
    body = {
        "model": "main",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "say three words"}],
    }
    resp = await client.post("/v1/chat/completions", json=body, headers={"X-Neotask-Session-Key": "agent:main:main"})
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    events = [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "echo: say three words"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_the_sdk_streams_and_a_resent_history_is_stored_once(
    oa: openai.AsyncOpenAI, client: Client, tmp_path: Path
) -> None:
    history: list[Any] = []
    for turn in range(5):
        history.append({"role": "user", "content": f"turn {turn}"})
        if turn % 2:
            stream = await oa.chat.completions.create(model="neotask/main", messages=history, user="bob", stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        else:
            text = (await oa.chat.completions.create(model="neotask/main", messages=history, user="bob")).choices[0]
            text = text.message.content
        assert text == f"echo: turn {turn}"
        history.append({"role": "assistant", "content": text})
    run = client.app[K.STORE].active_run("agent:main:openai:dm:bob")
    assert run is not None
    stored = [(m["role"], m["content"]) for m in messages_of(tmp_path, run.run_id)]
    assert stored == [(m["role"], m["content"]) for m in history]


async def test_only_a_streamed_call_streams_from_the_model_and_usage_reaches_tasks_db(
    oa: openai.AsyncOpenAI, client: Client, openai_server: OpenAIServer
) -> None:
    """A plain call asks the model for one plain answer (no stream to parse when nobody reads the
    deltas); a streamed call streams. The usage of both is in tasks.db once they answered."""
    history: list[Any] = [{"role": "user", "content": "first"}]
    plain = await oa.chat.completions.create(model="neotask/main", messages=history, user="carol")
    history += [{"role": "assistant", "content": plain.choices[0].message.content}, {"role": "user", "content": "2"}]
    stream = await oa.chat.completions.create(model="neotask/main", messages=history, user="carol", stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "echo: 2"
    assert [r.body.get("stream") is True for r in openai_server.chat_requests] == [False, True]
    store = client.app[K.STORE]
    run = store.active_run("agent:main:openai:dm:carol")
    assert run is not None
    row = await store.ledger.get_run(run.run_id)
    assert row is not None
    assert row["input_tokens"] == run.usage["input_tokens"] > 0
    assert plain.usage is not None
    assert row["output_tokens"] == run.usage["output_tokens"] > plain.usage.completion_tokens


async def test_a_retried_request_stores_nothing_and_answers_the_same(
    oa: openai.AsyncOpenAI, client: Client, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    history = [{"role": "user", "content": "one"}]
    first = await oa.chat.completions.create(model="main", messages=history, user="carol")
    history += [{"role": "assistant", "content": "echo: one"}, {"role": "user", "content": "two"}]
    second = await oa.chat.completions.create(model="main", messages=history, user="carol")
    calls = len(openai_server.chat_requests)
    again = await oa.chat.completions.create(model="main", messages=history, user="carol")
    assert again.choices[0].message.content == second.choices[0].message.content == "echo: two"
    assert len(openai_server.chat_requests) == calls, "the stored answer is replayed, not asked again"
    run = client.app[K.STORE].active_run("agent:main:openai:dm:carol")
    assert run is not None and len(messages_of(tmp_path, run.run_id)) == 4
    assert first.choices[0].message.content == "echo: one"


async def test_a_diverging_history_starts_a_new_run_and_says_so(
    oa: openai.AsyncOpenAI, client: Client, tmp_path: Path
) -> None:
    history = [{"role": "user", "content": "one"}]
    raw = await oa.chat.completions.with_raw_response.create(model="main", messages=history, user="dave")
    old_run = raw.headers["X-Neotask-Run-Id"]
    assert "X-Neotask-New-Run" not in raw.headers
    edited = [{"role": "user", "content": "ONE (edited)"}, {"role": "assistant", "content": "echo: one"},
              {"role": "user", "content": "two"}]  # fmt: skip
    raw = await oa.chat.completions.with_raw_response.create(model="main", messages=edited, user="dave")
    assert raw.headers["X-Neotask-New-Run"] == "diverged"
    assert raw.headers["X-Neotask-Previous-Run-Id"] == old_run
    new_run = raw.headers["X-Neotask-Run-Id"]
    assert new_run != old_run
    assert (tmp_path / "contexts/completed" / old_run).is_dir()
    stored = [(m["role"], m["content"]) for m in messages_of(tmp_path, new_run)]
    assert stored[:3] == [("user", "ONE (edited)"), ("assistant", "echo: one"), ("user", "two")]
    assert all(m.get("kind") != "inheritance" for m in messages_of(tmp_path, new_run))


async def test_users_get_their_own_sessions_and_no_user_is_a_one_off_run(
    oa: openai.AsyncOpenAI, client: Client, tmp_path: Path
) -> None:
    for name in ("erin", "frank"):
        await oa.chat.completions.create(
            model="main", messages=[{"role": "user", "content": f"I am {name}"}], user=name
        )
    store = client.app[K.STORE]
    assert {"agent:main:openai:dm:erin", "agent:main:openai:dm:frank"} <= {e.key for e in store.entries()}
    raw = await oa.chat.completions.with_raw_response.create(model="main", messages=[{"role": "user", "content": "x"}])
    key = raw.headers["X-Neotask-Session-Key"]
    run_id = raw.headers["X-Neotask-Run-Id"]
    assert key.startswith("hook:openai:")
    for _ in range(200):  # the one-off run is completed after the answer, in the background
        if (tmp_path / "contexts/completed" / run_id).is_dir() and store.entry(key) is None:
            break
        await asyncio.sleep(0.02)
    assert store.entry(key) is None and (tmp_path / "contexts/completed" / run_id).is_dir()
    assert not (tmp_path / "contexts/completed" / run_id / "final_summary.txt").exists()  # nothing inherits it


async def ended(client: Client) -> None:
    """Until the one-off runs ended in the background are done."""
    await client.app[K.COMPAT].close()
    assert not [e for e in client.app[K.STORE].entries() if e.key.startswith("hook:openai:")]


async def test_a_one_off_call_costs_one_model_call(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer, client: Client, tmp_path: Path
) -> None:
    """Issue 24 item 5: nothing can inherit a stateless run, so completing it asks for no final summary."""
    answer = await oa.chat.completions.create(model="main", messages=[{"role": "user", "content": "just once"}])
    assert answer.choices[0].message.content == "echo: just once"
    await oa.responses.create(model="main", input="once more", store=False)
    await ended(client)
    assert len(openai_server.chat_requests) == 2
    assert [p.name for p in (tmp_path / "contexts/completed").glob("*/final_summary.txt")] == []


async def test_a_one_off_call_that_compacts_flushes_no_memory(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    overrides = {**ON, "compaction": {"token_threshold": 400}}
    client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=openai_server.base_url))
    history = []
    for i in range(12):
        history += [{"role": "user", "content": f"fact {i}: " + "the deploy key rotates on fridays " * 3},
                    {"role": "assistant", "content": f"noted {i}"}]  # fmt: skip
    history.append({"role": "user", "content": "what did I say?"})
    resp = await client.post("/v1/chat/completions", json={"model": "main", "messages": history})
    assert resp.status == 200, await resp.text()
    await ended(client)
    assert client.app[K.STORE].home.folder("completed").is_dir()
    asked = [r.last_user_text for r in openai_server.chat_requests]
    assert any("summar" in r.system_text.lower() for r in openai_server.chat_requests), "it compacted"
    assert not [t for t in asked if "about to be compacted" in t], "a memory flush turn was run"
    assert client.app[K.CONVERSATIONS].one_off == set()


async def test_system_messages_are_instructions_for_the_call_not_stored(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    raw = await oa.chat.completions.with_raw_response.create(
        model="main",
        user="gus",
        messages=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}],
    )
    sent = openai_server.chat_requests[-1]
    assert sent.messages[0]["role"] == "system" and sent.messages[0]["content"].endswith("\n\nAnswer in French.")
    assert [m["role"] for m in sent.messages].count("system") == 1
    assert [m["role"] for m in messages_of(tmp_path, raw.headers["X-Neotask-Run-Id"])] == ["user", "assistant"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_tool_round_trip(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer, tmp_path: Path, stream: bool
) -> None:
    openai_server.script(tool_call("get_weather", {"city": "Paris"}, id="call_w1"))
    history: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    if stream:
        chunks = [c async for c in await oa.chat.completions.create(
            model="main", messages=history, tools=[WEATHER], user="hana", stream=True)]  # fmt: skip
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
        call_id, name, arguments = calls[0].id, calls[0].function.name, calls[0].function.arguments
    else:
        first = await oa.chat.completions.create(model="main", messages=history, tools=[WEATHER], user="hana")
        finish, call = first.choices[0].finish_reason, first.choices[0].message.tool_calls[0]
        call_id, name, arguments = call.id, call.function.name, call.function.arguments
    assert (finish, call_id, name, json.loads(arguments)) == ("tool_calls", "call_w1", "get_weather", {"city": "Paris"})
    offered = openai_server.chat_requests[-1].tool_names
    assert "get_weather" in offered and "update_plan" in offered
    history.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})  # fmt: skip
    history.append({"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"})
    openai_server.script(Reply(text="It is sunny in Paris."))
    raw = await oa.chat.completions.with_raw_response.create(
        model="main", messages=history, tools=[WEATHER], user="hana"
    )
    answer = raw.parse()
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content == "It is sunny in Paris."
    sent = openai_server.chat_requests[-1].messages
    assert sent[-1] == {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_w1"}
    assert sent[-2]["tool_calls"][0]["id"] == "call_w1"
    stored = messages_of(tmp_path, raw.headers["X-Neotask-Run-Id"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[2]["tool_name"] == "get_weather"


async def test_own_tools_run_inside_the_turn_and_client_tools_come_back(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    both = Reply(tool_calls=(ToolCallSpec("update_plan", {"plan": "check weather"}, "call_p"),
                             ToolCallSpec("get_weather", {"city": "Oslo"}, "call_w")))  # fmt: skip
    openai_server.script(both)
    raw = await oa.chat.completions.with_raw_response.create(
        model="main", messages=[{"role": "user", "content": "plan and weather"}], tools=[WEATHER], user="ivy"
    )
    message = raw.parse().choices[0].message
    assert [c.id for c in message.tool_calls or ()] == ["call_w"]
    stored = messages_of(tmp_path, raw.headers["X-Neotask-Run-Id"])
    assert [(m["role"], m.get("tool_call_id")) for m in stored] == [
        ("user", None),
        ("assistant", None),
        ("tool", "call_p"),
    ]


async def test_chat_commands_answer_as_the_assistant(oa: openai.AsyncOpenAI, openai_server: OpenAIServer) -> None:
    history: list[Any] = [{"role": "user", "content": "remember the code 4711"}]
    reply = await oa.chat.completions.create(model="main", messages=history, user="jo")
    history += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "/status"},
    ]
    status = await oa.chat.completions.create(model="main", messages=history, user="jo")
    assert status.choices[0].message.content.startswith("Session: agent:main:openai:dm:jo")
    history += [
        {"role": "assistant", "content": status.choices[0].message.content},
        {"role": "user", "content": "/reset"},
    ]
    reset = await oa.chat.completions.create(model="main", messages=history, user="jo")
    assert "Session reset" in (reset.choices[0].message.content or "")
    history += [{"role": "assistant", "content": reset.choices[0].message.content}, {"role": "user", "content": "hi"}]
    await oa.chat.completions.create(model="main", messages=history, user="jo")
    sent = openai_server.chat_requests[-1].messages
    inherited = [m for m in sent if m["role"] == "system" and "4711" in m["content"]]
    assert inherited, "the new run starts with the summary of the reset one"
    assert [m["content"] for m in sent if m["role"] == "user"] == ["hi"]


async def test_responses_chain_in_one_session_and_stream(oa: openai.AsyncOpenAI, client: Client) -> None:
    first = await oa.responses.create(model="neotask/main", input="first", user="kim")
    assert first.output_text == "echo: first" and first.status == "completed"
    second = await oa.responses.create(model="neotask/main", input="second", previous_response_id=first.id)
    async with oa.responses.stream(model="neotask/main", input="third", previous_response_id=second.id) as stream:
        kinds = [event.type async for event in stream]
        third = await stream.get_final_response()
    assert third.output_text == "echo: third" and third.previous_response_id == second.id
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    run = client.app[K.STORE].active_run("agent:main:openai:dm:kim")
    assert run is not None and run.message_count == 6
    with pytest.raises(openai.ConflictError) as fork:
        await oa.responses.create(model="neotask/main", input="fork", previous_response_id=first.id)
    assert fork.value.code == "response_not_latest"


async def test_responses_without_store_keep_no_id(oa: openai.AsyncOpenAI) -> None:
    kept = await oa.responses.create(model="main", input=[{"role": "user", "content": "hello"}])
    assert kept.output_text == "echo: hello"
    await oa.responses.create(model="main", input="more", previous_response_id=kept.id)
    gone = await oa.responses.create(model="main", input="one-off", store=False)
    with pytest.raises(openai.NotFoundError) as missing:
        await oa.responses.create(model="main", input="again", previous_response_id=gone.id)
    assert missing.value.code == "response_not_found"


async def test_responses_client_tool_round_trip(oa: openai.AsyncOpenAI, openai_server: OpenAIServer) -> None:
    openai_server.script(tool_call("get_weather", {"city": "Rome"}, id="call_r"))
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    first = await oa.responses.create(model="main", input="weather in Rome?", tools=[tool])  # type: ignore[list-item]
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.call_id, c.name) for c in calls] == [("call_r", "get_weather")]
    openai_server.script(Reply(text="Rome is warm."))
    output = {"type": "function_call_output", "call_id": "call_r", "output": "warm"}
    second = await oa.responses.create(model="main", input=[output], previous_response_id=first.id, tools=[tool])  # type: ignore[list-item]
    assert second.output_text == "Rome is warm."
    assert openai_server.chat_requests[-1].messages[-1] == {"role": "tool", "content": "warm", "tool_call_id": "call_r"}


async def test_null_options_through_the_sdk_take_openai_s_defaults(oa: openai.AsyncOpenAI) -> None:
    """The SDK sends an explicit None as null; OpenAI takes it as the default (they were 400 here)."""
    chat = await oa.chat.completions.create(
        model="main", messages=[{"role": "user", "content": "hello"}], stream=None, stream_options=None, n=None,
        temperature=0.7, max_tokens=50,
    )  # fmt: skip
    assert chat.choices[0].message.content == "echo: hello"
    kept = await oa.responses.create(model="main", input="hello", store=None, stream=None)
    assert kept.output_text == "echo: hello"
    await oa.responses.create(model="main", input="more", previous_response_id=kept.id)  # null store: stored


async def test_models_list_the_agents(oa: openai.AsyncOpenAI) -> None:
    models = await oa.models.list()
    assert [m.id for m in models.data] == ["neotask/main"]
    assert (await oa.models.retrieve("neotask/main")).owned_by == "neotask"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"model": "neotask/main", "messages": []}, "invalid_field", "messages"),
        ({"model": "neotask/main"}, "invalid_field", "messages"),
        ({"model": "neotask/ghost", "messages": [{"role": "user", "content": "x"}]}, "model_not_found", "model"),
        ({"model": "main", "messages": [{"role": "assistant", "content": "x"}]}, "invalid_field", "messages"),
        ({"model": "main", "messages": [{"role": "robot", "content": "x"}]}, "invalid_field", "messages[0].role"),
        ({"model": "main", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "invalid_field",
         "messages[0].content[0]"),
        ({"model": "main", "messages": [{"role": "user", "content": "x"}], "n": 2}, "invalid_field", "n"),
        ({"model": "main", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "update_plan"}}]}, "invalid_field", "tools"),
    ],
)  # fmt: skip
async def test_bad_bodies_get_openai_s_error_shape_and_store_nothing(
    client: Client, tmp_path: Path, body: dict[str, Any], code: str, param: str
) -> None:
    await client.app[K.STORE].registry.flush()
    before = tree_digest(tmp_path)
    resp = await client.post("/v1/chat/completions", json=body, headers={"X-Neotask-Session-Key": "agent:main:main"})
    error = (await resp.json())["error"]
    assert resp.status == (404 if code == "model_not_found" else 400)
    assert set(error) >= {"message", "type", "code", "param", "request_id"}
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    await client.app[K.STORE].registry.flush()
    assert tree_digest(tmp_path) == before


async def test_invalid_json_and_a_bad_key_header(client: Client) -> None:
    resp = await client.post("/v1/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_body"
    body = {"model": "main", "messages": [{"role": "user", "content": "x"}]}
    resp = await client.post("/v1/chat/completions", json=body, headers={"X-Neotask-Session-Key": "agent:ghost:main"})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_key"
    resp = await client.get("/v1/chat/completions")
    assert resp.status == 405 and (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_off_by_default_and_bearer_auth(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    off = await aiohttp_client(make_app(tmp_path / "off", clock))
    resp = await off.get("/v1/models")
    error = (await resp.json())["error"]
    assert resp.status == 404 and error["code"] == "not_found" and "openai_compat.enabled" in error["message"]
    guarded = await aiohttp_client(
        make_app(tmp_path / "on", clock, {**ON, "gateway": {**ON["gateway"], "tokens": ["t0k"]}})
    )
    base = str(guarded.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=base, api_key="wrong", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError) as denied:
            await sdk.models.list()
        assert denied.value.code == "unauthorized" and denied.value.type == "authentication_error"
    async with openai.AsyncOpenAI(base_url=base, api_key="t0k", max_retries=0) as sdk:
        assert [m.id for m in (await sdk.models.list()).data] == ["neotask/main"]


async def test_a_provider_failure_then_the_retry_stores_the_message_once(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer, client: Client, tmp_path: Path
) -> None:
    openai_server.script(server_error(500))
    history = [{"role": "user", "content": "are you there?"}]
    with pytest.raises(openai.APIStatusError) as failed:
        await oa.chat.completions.create(model="main", messages=history, user="lee")
    assert failed.value.status_code == 502 and failed.value.code == "provider_error"
    assert failed.value.type == "server_error" and failed.value.body["stored"] is True  # type: ignore[index]
    again = await oa.chat.completions.create(model="main", messages=history, user="lee")
    assert again.choices[0].message.content == "echo: are you there?"
    run = client.app[K.STORE].active_run("agent:main:openai:dm:lee")
    assert run is not None
    assert [m["role"] for m in messages_of(tmp_path, run.run_id)] == ["user", "assistant"]


async def test_a_client_that_skips_its_tool_call_leaves_no_call_without_a_result(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer
) -> None:
    openai_server.script(tool_call("get_weather", {"city": "Lima"}, id="call_l"))
    history: list[Any] = [{"role": "user", "content": "weather in Lima?"}]
    first = await oa.chat.completions.create(model="main", messages=history, tools=[WEATHER], user="max")
    history.append(first.choices[0].message.model_dump(exclude_none=True))
    history.append({"role": "user", "content": "never mind, tell me a joke"})
    answer = await oa.chat.completions.create(model="main", messages=history, user="max")
    assert answer.choices[0].message.content == "echo: never mind, tell me a joke"
    sent = openai_server.chat_requests[-1].messages
    assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "user"]
    assert sent[-2]["tool_call_id"] == "call_l" and "did not return a result" in sent[-2]["content"]


async def test_a_failed_one_off_call_still_ends_its_run(
    oa: openai.AsyncOpenAI, openai_server: OpenAIServer, client: Client, tmp_path: Path
) -> None:
    openai_server.script(server_error(500))
    with pytest.raises(openai.APIStatusError) as failed:
        await oa.chat.completions.create(model="main", messages=[{"role": "user", "content": "one-off"}])
    assert failed.value.status_code == 502
    store = client.app[K.STORE]
    for _ in range(200):  # ended in the background
        if not [e for e in store.entries() if e.key.startswith("hook:openai:")]:
            break
        await asyncio.sleep(0.02)
    assert not [e for e in store.entries() if e.key.startswith("hook:openai:")]
    assert len(list((tmp_path / "contexts/completed").iterdir())) == 1


async def test_a_streamed_answer_names_its_session_and_a_diverged_run_in_its_headers(client: Client) -> None:
    first = {"model": "main", "user": "nia", "messages": [{"role": "user", "content": "one"}]}
    assert (await client.post("/v1/chat/completions", json=first)).status == 200
    edited = {
        "model": "main",
        "user": "nia",
        "stream": True,
        "messages": [
            {"role": "user", "content": "one, edited"},
            {"role": "assistant", "content": "echo: one"},
            {"role": "user", "content": "two"},
        ],
    }
    resp = await client.post("/v1/chat/completions", json=edited)
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    assert resp.headers["X-Neotask-Session-Key"] == "agent:main:openai:dm:nia"
    assert resp.headers["X-Neotask-New-Run"] == "diverged" and resp.headers["X-Neotask-Previous-Run-Id"]
    assert (await resp.text()).rstrip().endswith("data: [DONE]")


async def test_calls_waiting_past_max_queued_turns_get_429_with_retry_after(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    overrides = {**ON, "agents": {"main": {"max_queued_turns": 1}}}
    client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=openai_server.base_url))
    openai_server.script(Hang(2.0))
    body = {"model": "main", "messages": [{"role": "user", "content": "slow"}]}
    headers = {"X-Neotask-Session-Key": "agent:main:main"}
    running = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    await openai_server.wait_for_requests(1)
    waiting = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    await asyncio.sleep(0.2)  # the second call is now waiting for the key
    refused = await client.post("/v1/chat/completions", json=body, headers=headers)
    error = (await refused.json())["error"]
    assert refused.status == 429 and refused.headers["Retry-After"] == "1"
    assert (error["code"], error["type"]) == ("session_busy", "rate_limit_error")
    assert (await running).status == 200 and (await waiting).status == 200
