"""Model turns interleaved with other requests, against the real local OpenAI-compatible server and real files:
messages that arrive during a tool round, /stop inside a tool round, the token count after a model
call and after a memory flush, a turn that waits while its session is paused, and redelivery of a
client_message_id after the idempotency window."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from conversations.tools import Tool
from gateway import keys as K
from sessions.records import RunState
from tests.conftest import FakeClock
from tests.support.openai_server import Hang, OpenAIServer, reply, tool_call

Client = TestClient[Any, Any]
KEY = "agent:main:main"
MAIN = "/v1/sessions/agent%3Amain%3Amain"


@pytest.fixture
def gateway_base_url(openai_server: OpenAIServer) -> str:
    return openai_server.base_url


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def assert_tool_results_follow_their_calls(lines: list[dict[str, Any]]) -> None:
    """OpenAI's rule (and SPEC section 5's): an assistant message with tool_calls is directly
    followed by one tool message per call, and every tool message answers such a call."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.get("tool_calls"):
            ids = [c["id"] for c in line["tool_calls"]]
            answers = [x.get("tool_call_id") for x in lines[i + 1 : i + 1 + len(ids)]]
            assert answers == ids, f"tool_calls at {line.get('seq')} not followed by their results: {lines}"
            i += 1 + len(ids)
            continue
        assert line.get("role") != "tool", f"orphan tool result: {line}"
        i += 1


def gated_tool(started: asyncio.Event, gate: asyncio.Event) -> Tool:
    async def run(run: RunState, arguments: dict[str, Any]) -> str:
        started.set()
        await gate.wait()
        return "gate opened"

    return Tool(name="wait_gate", description="waits", parameters={"type": "object", "properties": {}}, run=run)


async def test_a_message_stored_during_a_tool_round_does_not_split_the_call_from_its_result(
    client: Client, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    started, gate = asyncio.Event(), asyncio.Event()
    client.app[K.CONVERSATIONS].tools.register(gated_tool(started, gate))
    openai_server.script(tool_call("wait_gate", id="call_1"), reply("done"))
    turn = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "use the tool"}))
    await asyncio.wait_for(started.wait(), 5)
    meanwhile = await client.post(f"{MAIN}/messages", json={"content": "meanwhile", "reply": False})
    assert meanwhile.status == 200
    gate.set()
    body = await (await turn).json()
    assert body["reply"]["content"] == "done"
    folder = tmp_path / "contexts/running" / body["run_id"]
    assert_tool_results_follow_their_calls(jsonl(folder / "messages.jsonl"))
    assert_tool_results_follow_their_calls(jsonl(folder / "current.jsonl"))
    sent = openai_server.chat_requests[-1].messages
    assert_tool_results_follow_their_calls(sent)


async def test_stop_during_a_tool_round_leaves_no_call_without_its_result(
    client: Client, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    started, gate = asyncio.Event(), asyncio.Event()
    client.app[K.CONVERSATIONS].tools.register(gated_tool(started, gate))
    openai_server.script(tool_call("wait_gate", id="call_1"))
    turn = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "use the tool"}))
    await asyncio.wait_for(started.wait(), 5)
    stopped = await (await client.post(f"{MAIN}/commands", json={"command": "/stop"})).json()
    assert stopped["reply"]["content"] == "Stopped the running turn."
    body = await (await turn).json()
    assert body["events"][-1]["type"] == "stopped"
    after = await (await client.post(f"{MAIN}/messages", json={"content": "still usable"})).json()
    assert after["reply"]["content"] == "echo: still usable"
    folder = tmp_path / "contexts/running" / body["run_id"]
    in_context = [m for m in jsonl(folder / "messages.jsonl") if not m.get("command")]
    assert_tool_results_follow_their_calls(in_context)
    assert_tool_results_follow_their_calls(jsonl(folder / "current.jsonl"))
    assert_tool_results_follow_their_calls(openai_server.chat_requests[-1].messages)


async def test_calibration_keeps_the_messages_stored_during_the_model_call(
    client: Client, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.script(Hang(0.3, then=reply("first answer")))
    turn = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "one"}))
    await openai_server.wait_for_requests(1)
    stored = await client.post(f"{MAIN}/messages", json={"content": "a long note " * 100, "reply": False})
    assert stored.status == 200
    body = await (await turn).json()
    assert body["reply"]["content"] == "first answer"
    run = client.app[K.STORE].active_run(KEY)
    assert run is not None
    current = jsonl(tmp_path / "contexts/running" / run.run_id / "current.jsonl")
    assert run.context_tokens == sum(line["tokens"] for line in current)


async def test_a_memory_flush_does_not_count_its_own_prompt_as_context(
    client: Client, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    for i in range(3):
        await client.post(f"{MAIN}/messages", json={"content": f"note {i} " + "words " * 20, "reply": False})
    run = client.app[K.STORE].active_run(KEY)
    assert run is not None
    before = run.context_tokens
    await client.app[K.CONVERSATIONS].memory_flush(run)
    assert any("compacted" in m.get("content", "") for m in openai_server.chat_requests[-1].messages)
    assert run.context_tokens == before


async def test_a_turn_that_waited_while_the_session_was_paused_is_skipped(
    client: Client, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.script(Hang(0.5, then=reply("first answer")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "one"}))
    await openai_server.wait_for_requests(1)
    pause = asyncio.create_task(client.post(f"{MAIN}/pause"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "two"}))
    assert (await first).status == 200 and (await pause).status == 200
    resp = await second
    body = await resp.json()
    assert resp.status == 200, body
    assert body["message_seq"] == 2 and body["reply"] is None
    assert body["events"][-1]["type"] == "turn_skipped"
    assert len(openai_server.chat_requests) == 1


@pytest.mark.parametrize("gateway_base_url", [None])  # store-only
@pytest.mark.parametrize("gateway_overrides", [{"session": {"reset": {"mode": "none"}}}])
async def test_a_client_message_id_reused_after_the_window_is_deduplicated_again(
    client: Client, tmp_path: Path, clock: FakeClock
) -> None:
    payload = {"content": "deliver me", "client_message_id": "m-1"}
    first = await (await client.post(f"{MAIN}/messages", json=payload)).json()
    clock.advance(days=2)
    second = await (await client.post(f"{MAIN}/messages", json=payload)).json()
    assert second["message_seq"] == first["message_seq"] + 1  # the first one expired: stored anew
    clock.advance(hours=1)
    third = await (await client.post(f"{MAIN}/messages", json=payload)).json()
    assert third == second
    stored = jsonl(tmp_path / "contexts/running" / first["run_id"] / "messages.jsonl")
    assert [m["content"] for m in stored] == ["deliver me", "deliver me"]
