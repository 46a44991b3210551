"""The OpenAI-compatible front door of a real daemon, driven by the official ``openai`` package;
the agent answers through the test suite's local OpenAI-compatible server."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import openai
import pytest
import yaml

from tests.gateway.daemons import Daemon, daemon
from tests.support.openai_server import OpenAIServer, RecordedRequest, Reply, tool_call
from tests.support.sdk import warm_openai_sdk

warm_openai_sdk()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.realtime]
TOKEN = "s3cret-token"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def write_config(tmp_path: Path, server: OpenAIServer, **extra: Any) -> Path:
    data = {
        "gateway": {"tokens": [TOKEN], "openai_compat": {"enabled": True}},
        "agents": {"main": {"model": {"base_url": server.base_url, "name": "test-model", "max_retries": 0}}},
        "compaction": {"memory_flush": {"enabled": False}},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
async def server() -> AsyncIterator[OpenAIServer]:
    async with OpenAIServer() as started:
        yield started


class Gateway:
    """The daemon with the SDK (``oa``) and a plain HTTP session for the native API."""

    def __init__(self, running: Daemon, http: aiohttp.ClientSession, oa: openai.AsyncOpenAI) -> None:
        self.daemon, self.http, self.oa = running, http, oa

    async def get(self, path: str) -> dict[str, Any]:
        async with self.http.get(self.daemon.url + path, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200, await resp.text()
            body: dict[str, Any] = await resp.json()
            return body

    async def session(self, key: str) -> dict[str, Any]:
        return await self.get(f"/v1/sessions/{quote(key, safe='')}")

    async def messages(self, run_id: str) -> list[dict[str, Any]]:
        body = await self.get(f"/v1/runs/{run_id}/messages?limit=1000")
        messages: list[dict[str, Any]] = body["messages"]
        return messages


@pytest.fixture
async def make_gateway(tmp_path: Path, server: OpenAIServer) -> AsyncIterator[Any]:
    opened: list[Any] = []

    async def make(**extra: Any) -> Gateway:
        config = write_config(tmp_path, server, **extra)
        context = daemon(tmp_path / "home", "--config", str(config))
        running = await context.__aenter__()
        http = aiohttp.ClientSession()
        oa = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key=TOKEN, max_retries=0)
        opened.append((context, http, oa))
        return Gateway(running, http, oa)

    yield make
    for context, http, oa in opened:
        await oa.close()
        await http.close()
        await context.__aexit__(None, None, None)


def contexts_digest(home: Path) -> dict[str, str]:
    """Every run file (not the coalesced sessions.json or its temporary copy, the WAL or the logs) with a
    hash of its bytes."""
    out = {}
    for folder, _, files in os.walk(home / "contexts"):
        for name in files:
            path = Path(folder) / name
            coalesced = name in ("sessions.json", ".sessions.json.tmp")  # written later, and its atomic copy
            if name.endswith(("-wal", "-shm")) or coalesced or name.startswith("tasks.db"):
                continue
            out[str(path.relative_to(home))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


async def test_chat_completions_against_a_real_daemon(make_gateway: Any, server: OpenAIServer, tmp_path: Path) -> None:
    gw: Gateway = await make_gateway()
    oa = gw.oa

    # auth: a wrong key and no key are refused in OpenAI's shape
    async with openai.AsyncOpenAI(base_url=f"{gw.daemon.url}/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as denied:
            await bad.chat.completions.create(model="neotask/main", messages=[{"role": "user", "content": "hi"}])
        assert denied.value.status_code == 401 and denied.value.code == "unauthorized"
        assert denied.value.type == "authentication_error"
    async with gw.http.post(f"{gw.daemon.url}/v1/chat/completions", json={"model": "main"}) as resp:
        error = (await resp.json())["error"]
        assert resp.status == 401 and (error["code"], error["type"]) == ("unauthorized", "authentication_error")

    # plain and streamed
    plain = await oa.chat.completions.create(model="neotask/main", messages=[{"role": "user", "content": "hi"}])
    assert plain.object == "chat.completion" and plain.choices[0].message.content == "echo: hi"
    assert plain.choices[0].finish_reason == "stop" and plain.usage is not None and plain.usage.prompt_tokens > 0
    stream = await oa.chat.completions.create(
        model="neotask/main",
        messages=[{"role": "user", "content": "stream this please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: stream this please"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    # a 20-turn conversation resent whole every time is stored once
    history: list[Any] = []
    for turn in range(20):
        history.append({"role": "user", "content": f"turn {turn}: " + "words " * 5})
        raw = await oa.chat.completions.with_raw_response.create(model="neotask/main", messages=history, user="ann")
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    run_id = raw.headers["X-Neotask-Run-Id"]
    stored = await gw.messages(run_id)
    assert [(m["role"], m["content"]) for m in stored] == [(m["role"], m["content"]) for m in history]
    assert server.chat_requests[-1].messages[1:] == history[:-1], "the model saw the conversation once"

    # the user field: one session per user
    await oa.chat.completions.create(model="main", messages=[{"role": "user", "content": "I am ben"}], user="ben")
    ann = await gw.session("agent:main:openai:dm:ann")
    ben = await gw.session("agent:main:openai:dm:ben")
    assert ann["run_id"] == run_id and ben["run_id"] not in (None, run_id) and ben["chat_type"] == "direct"

    # a diverging history (an edited earlier message) starts a new run and says so
    edited = [{"role": "user", "content": "turn 0: EDITED"}, *history[1:]]
    edited.append({"role": "user", "content": "after the edit"})
    raw = await oa.chat.completions.with_raw_response.create(model="neotask/main", messages=edited, user="ann")
    assert raw.headers["X-Neotask-New-Run"] == "diverged" and raw.headers["X-Neotask-Previous-Run-Id"] == run_id
    new_run = raw.headers["X-Neotask-Run-Id"]
    assert new_run != run_id and (await gw.get(f"/v1/runs/{run_id}"))["status"] == "completed"
    assert len(await gw.messages(new_run)) == len(edited) + 1

    # bad bodies: OpenAI's error shape, nothing stored
    before = contexts_digest(tmp_path / "home")
    sessions_before = await gw.get("/v1/sessions?limit=500")
    bad_calls: list[tuple[dict[str, Any], type[openai.APIStatusError], str]] = [
        ({"model": "neotask/main", "messages": []}, openai.BadRequestError, "invalid_field"),
        ({"model": "neotask/nobody", "messages": [{"role": "user", "content": "x"}]}, openai.NotFoundError,
         "model_not_found"),
        ({"model": "main", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
         openai.BadRequestError, "invalid_field"),
        ({"model": "main", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url":
          "http://x"}}]}]}, openai.BadRequestError, "invalid_field"),
    ]  # fmt: skip
    for body, error_class, code in bad_calls:
        with pytest.raises(error_class) as refused:
            await oa.chat.completions.create(**body, user="ann")
        assert refused.value.code == code and isinstance(refused.value.body, dict)
        assert {"message", "type", "code", "param"} <= set(refused.value.body)
    async with gw.http.post(
        f"{gw.daemon.url}/v1/chat/completions",
        data=b"{not json",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    ) as resp:
        error = (await resp.json())["error"]
        assert resp.status == 400 and error["code"] == "invalid_body" and error["type"] == "invalid_request_error"
    assert contexts_digest(tmp_path / "home") == before
    assert await gw.get("/v1/sessions?limit=500") == sessions_before
    assert await gw.daemon.stop() == 0


async def test_tools_commands_compaction_and_responses_against_a_real_daemon(
    make_gateway: Any, server: OpenAIServer
) -> None:
    gw: Gateway = await make_gateway(compaction={"token_threshold": 1200, "memory_flush": {"enabled": False}})
    oa = gw.oa

    # a client tool round trip
    server.script(tool_call("get_weather", {"city": "Kyoto"}, id="call_k"))
    history: list[Any] = [{"role": "user", "content": "weather in Kyoto?"}]
    first = await oa.chat.completions.create(model="main", messages=history, tools=[WEATHER], user="cy")  # type: ignore[list-item]
    call = (first.choices[0].message.tool_calls or [])[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.id == "call_k"
    history += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": "call_k", "content": "rain"}]  # fmt: skip
    server.script(Reply(text="It rains in Kyoto."))
    done = await oa.chat.completions.create(model="main", messages=history, tools=[WEATHER], user="cy")  # type: ignore[list-item]
    assert done.choices[0].message.content == "It rains in Kyoto."
    assert server.chat_requests[-1].messages[-1] == {"role": "tool", "content": "rain", "tool_call_id": "call_k"}
    history.append({"role": "assistant", "content": done.choices[0].message.content})

    # /reset through the endpoint; the next message starts a run that inherits a summary
    history.append({"role": "user", "content": "/reset"})
    reset = await oa.chat.completions.create(model="main", messages=history, user="cy")
    assert "Session reset" in (reset.choices[0].message.content or "")
    history += [{"role": "assistant", "content": reset.choices[0].message.content},
                {"role": "user", "content": "what happened before?"}]  # fmt: skip
    raw = await oa.chat.completions.with_raw_response.create(model="main", messages=history, user="cy")
    sent = server.chat_requests[-1].messages
    assert any(m["role"] == "system" and "Kyoto" in m["content"] for m in sent[1:]), "the inherited summary"
    assert [m["content"] for m in sent if m["role"] == "user"] == ["what happened before?"]
    inherited_run = raw.headers["X-Neotask-Run-Id"]
    assert (await gw.messages(inherited_run))[0]["kind"] == "inheritance"

    # compaction triggered through the endpoint: a long conversation crosses token_threshold
    def summarize(request: RecordedRequest) -> Reply | None:
        return Reply(text="SUMMARY of the notes") if "compress a conversation" in request.system_text else None

    server.add_rule(summarize)
    talk: list[Any] = []
    for turn in range(12):
        talk.append({"role": "user", "content": f"note {turn}: " + "detail " * 40})
        answer = await oa.chat.completions.create(model="main", messages=talk, user="dee")
        talk.append({"role": "assistant", "content": answer.choices[0].message.content})
    session = await gw.session("agent:main:openai:dm:dee")
    assert session["compactions"] >= 1, session
    assert any(
        "SUMMARY of the notes" in m["content"] for m in server.chat_requests[-1].messages if m["role"] == "system"
    )
    stored = await gw.messages(session["run_id"])
    assert [m["content"] for m in stored if m["role"] == "user"] == [m["content"] for m in talk if m["role"] == "user"]

    # responses: three calls chained by previous_response_id stay in one session
    one = await oa.responses.create(model="neotask/main", input="first question", user="eve")
    two = await oa.responses.create(model="neotask/main", input="second question", previous_response_id=one.id)
    async with oa.responses.stream(model="neotask/main", input="third question", previous_response_id=two.id) as st:
        kinds = [event.type async for event in st]
        three = await st.get_final_response()
    assert [one.output_text, two.output_text, three.output_text] == [
        "echo: first question", "echo: second question", "echo: third question"]  # fmt: skip
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    eve = await gw.session("agent:main:openai:dm:eve")
    users = [m["content"] for m in await gw.messages(eve["run_id"]) if m["role"] == "user"]
    assert users == ["first question", "second question", "third question"]
    assert await gw.daemon.stop() == 0
