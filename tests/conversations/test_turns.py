"""Model turns against the real local OpenAI-compatible server: replies, streaming, tools, usage,
provider failures, turn order, the queue limit, /stop, and events."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import (
    Hang,
    Malformed,
    OpenAIServer,
    context_length_error,
    reply,
    server_error,
    tool_call,
)

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"


@pytest.fixture
def gateway_base_url(openai_server: OpenAIServer) -> str:
    return openai_server.base_url


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_a_user_message_gets_a_reply_with_usage(
    client: Client, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    resp = await client.post(f"{MAIN}/messages", json={"content": "hello there"})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["reply"]["content"] == "echo: hello there" and body["reply"]["seq"] == 2
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
    sent = openai_server.chat_requests[-1].messages
    assert sent[0]["role"] == "system" and sent[-1] == {"role": "user", "content": "hello there"}
    stored = jsonl(tmp_path / "contexts/running" / body["run_id"] / "messages.jsonl")
    assert stored[1]["role"] == "assistant" and stored[1]["usage"]["output_tokens"] > 0
    entry = await (await client.get(MAIN)).json()
    assert entry["input_tokens"] == body["usage"]["input_tokens"]


async def test_store_only_roles_and_reply_false_need_no_turn(client: Client, openai_server: OpenAIServer) -> None:
    for payload in ({"content": "quiet", "reply": False}, {"role": "assistant", "content": "said"},
                    {"role": "system", "content": "note"}):  # fmt: skip
        body = await (await client.post(f"{MAIN}/messages", json=payload)).json()
        assert body["reply"] is None
    assert openai_server.chat_requests == []


async def test_group_speakers_are_named(client: Client, openai_server: OpenAIServer) -> None:
    message = {"channel": "tg", "chat_type": "group", "chat_id": "g1", "sender_id": "7", "sender_name": "Zoë K.",
               "text": "hi all"}  # fmt: skip
    await client.post("/v1/messages", json=message)
    assert openai_server.chat_requests[-1].messages[-1]["name"] == "Zo_K"


async def test_speakers_whose_names_openai_s_name_cannot_hold_are_named_in_the_text(
    client: Client, openai_server: OpenAIServer
) -> None:
    """``name`` holds ``[A-Za-z0-9_-]`` only: "田中 太郎" and "Алиса" were sent with no name at all,
    and "Zoë K." as "Zo_K"; the model could not tell who spoke."""
    group = {"channel": "tg", "chat_type": "group", "chat_id": "g2"}
    said = [("1", "田中 太郎", "こんにちは"), ("2", "Алиса", "привет"), ("3", "Zoë K.", "hi"),
            ("4", "Ann Lee", "hello")]  # fmt: skip
    for sender, name, text in said:
        resp = await client.post("/v1/messages", json={**group, "sender_id": sender, "sender_name": name, "text": text})
        assert resp.status == 200, await resp.text()
    sent = [m for m in openai_server.chat_requests[-1].messages if m["role"] == "user"]
    assert [(m["content"], m.get("name")) for m in sent] == [
        ("田中 太郎: こんにちは", None), ("Алиса: привет", None), ("Zoë K.: hi", "Zo_K"), ("hello", "Ann_Lee"),
    ]  # fmt: skip
    body = await resp.json()
    stored = (await (await client.get(f"/v1/runs/{body['run_id']}/messages")).json())["messages"]
    assert [m.get("name") for m in stored if m["role"] == "user"] == ["田中 太郎", "Алиса", "Zoë K.", "Ann_Lee"]


async def test_streaming_sends_deltas_then_the_final_body(client: Client, openai_server: OpenAIServer) -> None:
    resp = await client.post(f"{MAIN}/messages", json={"content": "stream me please", "stream": True})
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    text = await resp.text()
    events = [block for block in text.split("\n\n") if block.strip()]
    kinds = [b.split("\n")[0].removeprefix("event: ") for b in events]
    assert kinds[-1] == "final" and kinds.count("delta") >= 2
    deltas = "".join(json.loads(b.split("data: ", 1)[1])["content"] for b in events if b.startswith("event: delta"))
    final = json.loads(events[-1].split("data: ", 1)[1])
    assert deltas == final["reply"]["content"] == "echo: stream me please"


async def test_tool_calls_are_executed_recorded_and_bounded(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(
        make_app(tmp_path, clock, {"agents": {"main": {"max_tool_rounds": 2}}}, base_url=openai_server.base_url)
    )
    openai_server.script(
        tool_call("update_plan", {"plan": "1. read 2. write", "plan_type": "initial"}),
        tool_call("nonexistent_tool", {}),
        tool_call("update_plan", {"plan": "never offered"}),
    )
    body = await (await client.post(f"{MAIN}/messages", json={"content": "plan it"})).json()
    run = tmp_path / "contexts/running" / body["run_id"]
    tools = jsonl(run / "tools.jsonl")
    assert [t["tool_name"] for t in tools] == ["update_plan", "nonexistent_tool"]
    assert tools[0]["error"] is None and tools[0]["duration_ms"] >= 0 and tools[1]["error"].startswith("unknown tool")
    plans = jsonl(run / "planning.jsonl")
    assert plans == [{**plans[0], "plan_type": "initial", "plan_content": "1. read 2. write"}]
    requests = openai_server.chat_requests
    assert "update_plan" in requests[0].tool_names and requests[2].tool_names == []
    roles = [m["role"] for m in jsonl(run / "messages.jsonl")]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert body["reply"]["seq"] == 6
    tool_messages = [m for m in requests[2].messages if m["role"] == "tool"]
    assert tool_messages[0]["tool_call_id"] and tool_messages[1]["content"].startswith("error: unknown tool")


@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [
        (server_error(500), "http"),
        (Malformed(), "malformed"),
        (context_length_error(100, 200), "overflow"),
    ],
)
async def test_provider_failures_answer_502_with_the_message_stored(
    client: Client, openai_server: OpenAIServer, tmp_path: Path, behaviour: Any, kind: str
) -> None:
    openai_server.script(behaviour)
    resp = await client.post(f"{MAIN}/messages", json={"content": "will fail"})
    assert resp.status == 502, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "provider_error" and error["stored"] is True and error["message_seq"] == 1
    assert error["kind"] == kind
    again = await (await client.post(f"{MAIN}/messages", json={"content": "works now"})).json()
    assert again["reply"]["content"] == "echo: works now" and again["message_seq"] == 2


async def test_timeout_is_a_provider_error(aiohttp_client: Any, tmp_path: Path, clock: FakeClock,
                                           openai_server: OpenAIServer) -> None:  # fmt: skip
    app = make_app(tmp_path, clock, {"agents": {"main": {"model": {"timeout_s": 0.3}}}},
                   base_url=openai_server.base_url)  # fmt: skip
    client = await aiohttp_client(app)
    openai_server.script(Hang(3))
    resp = await client.post(f"{MAIN}/messages", json={"content": "slow"})
    assert resp.status == 502 and (await resp.json())["error"]["kind"] == "timeout"


async def test_a_failed_turn_is_retried_by_redelivery_without_storing_twice(
    client: Client, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(server_error(500))
    first = await client.post(f"{MAIN}/messages", json={"content": "retry me", "client_message_id": "c1"})
    assert first.status == 502
    second = await client.post(f"{MAIN}/messages", json={"content": "retry me", "client_message_id": "c1"})
    body = await second.json()
    assert second.status == 200 and body["reply"]["content"] == "echo: retry me" and body["message_seq"] == 1
    third = await (
        await client.post(f"{MAIN}/messages", json={"content": "retry me", "client_message_id": "c1"})
    ).json()
    assert third == body
    stored = jsonl(tmp_path / "contexts/running" / body["run_id"] / "messages.jsonl")
    assert [m["content"] for m in stored] == ["retry me", "echo: retry me"]


async def test_turns_run_one_at_a_time_in_arrival_order(client: Client, openai_server: OpenAIServer,
                                                        tmp_path: Path) -> None:  # fmt: skip
    openai_server.script(Hang(0.5, then=reply("first answer")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "one"}))
    await openai_server.wait_for_requests(1)
    second = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "two"}))
    await asyncio.sleep(0.1)
    body1 = await (await first).json()
    body2 = await (await second).json()
    assert (body1["message_seq"], body2["message_seq"]) == (1, 2)  # the second was stored during the first turn
    assert body1["reply"]["content"] == "first answer" and body1["reply"]["seq"] == 3
    assert body2["reply"]["seq"] == 4
    second_request = openai_server.chat_requests[1].messages
    # the answer follows the message it answered; "two" waited for it (issue 24, item 2)
    assert [m["content"] for m in second_request[1:]] == ["one", "first answer", "two"]


async def test_too_many_waiting_turns_get_429_and_write_nothing(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    app = make_app(tmp_path, clock, {"agents": {"main": {"max_queued_turns": 2}}}, base_url=openai_server.base_url)
    client = await aiohttp_client(app)
    gate = asyncio.Event()
    openai_server.script(Hang(30, until=gate))
    calls = [asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "m0"}))]
    await openai_server.wait_for_requests(1)
    queue = client.server.app[K.CONVERSATIONS].queue
    for i in (1, 2):  # one running and two waiting: within the limit of 2 waiting
        calls.append(asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": f"m{i}"})))
        async with asyncio.timeout(10):
            while queue.waiting("agent:main:main") < i:
                await asyncio.sleep(0.01)
    busy = await client.post(f"{MAIN}/messages", json={"content": "one too many"})
    busy_error = (await busy.json())["error"]
    assert busy.status == 429 and busy_error["code"] == "session_busy" and busy_error["stored"] is False
    assert busy.headers["Retry-After"] == "1"
    gate.set()
    store_only = await client.post(f"{MAIN}/messages", json={"content": "no turn", "reply": False})
    assert store_only.status == 200
    for call in calls:
        assert (await call).status == 200
    run_id = (await store_only.json())["run_id"]
    contents = [m["content"] for m in jsonl(tmp_path / "contexts/running" / run_id / "messages.jsonl")]
    assert "one too many" not in contents and "no turn" in contents


async def test_stop_cancels_the_running_turn(client: Client, openai_server: OpenAIServer) -> None:
    openai_server.script(Hang(5))
    call = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "long task"}))
    await openai_server.wait_for_requests(1)
    stopped = await (await client.post(f"{MAIN}/commands", json={"command": "/stop"})).json()
    assert stopped["reply"]["content"] == "Stopped the running turn."
    resp = await call
    body = await resp.json()
    assert resp.status == 200 and body["reply"] is None and body["events"][-1]["type"] == "stopped"
    after = await (await client.post(f"{MAIN}/messages", json={"content": "still usable"})).json()
    assert after["reply"]["content"] == "echo: still usable"


async def test_model_command_overrides_the_session_model(client: Client, openai_server: OpenAIServer) -> None:
    await client.post(f"{MAIN}/messages", json={"content": "hi"})
    await client.post(f"{MAIN}/commands", json={"command": "/model other-model"})
    await client.post(f"{MAIN}/messages", json={"content": "again"})
    assert openai_server.chat_requests[-1].body["model"] == "other-model"
    status = await (await client.post(f"{MAIN}/commands", json={"command": "/status"})).json()
    assert "Model: other-model" in status["reply"]["content"]


async def test_events_stream_messages_and_replies(client: Client) -> None:
    events = await client.get("/v1/events?key=agent%3Amain%3Amain")
    assert events.status == 200
    await client.post(f"{MAIN}/messages", json={"content": "watch this"})
    seen: list[dict[str, Any]] = []
    ids: list[int] = []
    while len(seen) < 4:
        line = (await asyncio.wait_for(events.content.readline(), 5)).decode().strip()
        if line.startswith("id: "):
            ids.append(int(line[4:]))
        if line.startswith("data: "):
            seen.append(json.loads(line[6:]))
    types = [e["type"] for e in seen]
    assert types[:4] == ["lifecycle", "message", "message", "reply"]
    assert all({"type", "key", "run_id", "at"} <= set(e) for e in seen)
    assert seen[1]["seq"] == 1 and seen[1]["role"] == "user" and seen[1]["content"] == "watch this"
    assert ids == sorted(ids)
    events.close()
    replay = await client.get("/v1/events", headers={"Last-Event-ID": str(ids[1])})
    replayed = []
    while len(replayed) < 2:
        line = (await asyncio.wait_for(replay.content.readline(), 5)).decode().strip()
        if line.startswith("data: "):
            replayed.append(json.loads(line[6:]))
    assert [e["type"] for e in replayed] == ["message", "reply"]
    replay.close()
