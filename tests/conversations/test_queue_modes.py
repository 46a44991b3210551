"""Queue modes (issue 13, item 1): collect, followup and steer, against the real local
OpenAI-compatible server recording what each model request contained."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import Hang, OpenAIServer, RecordedRequest, reply, server_error, tool_call

Client = TestClient[Any, Any]
KEY = "agent:main:main"
MAIN = "/v1/sessions/agent%3Amain%3Amain"


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)


def contents(request: RecordedRequest) -> list[str]:
    return [m["content"] for m in request.messages[1:]]


def transcript(home: Path, run_id: str) -> list[dict[str, Any]]:
    path = home / "contexts/running" / run_id / "messages.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


async def client_for(aiohttp_client: Any, home: Path, clock: FakeClock, server: OpenAIServer,
                     overrides: dict[str, Any] | None = None) -> Client:  # fmt: skip
    return await aiohttp_client(make_app(home, clock, overrides, base_url=server.base_url))


async def burst(client: Client, texts: list[str]) -> list[asyncio.Task[Any]]:
    """Post ``texts`` one after another, each once the previous is stored (seq = list order)."""
    conv = client.server.app[K.CONVERSATIONS]
    calls = []
    for text in texts:
        before = conv.store.active_run(KEY).next_seq
        calls.append(asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": text})))
        await until(lambda before=before: conv.store.active_run(KEY).next_seq > before)  # type: ignore[misc]
    return calls


async def bodies(calls: list[asyncio.Task[Any]]) -> list[dict[str, Any]]:
    out = []
    for call in calls:
        resp = await call
        assert resp.status == 200, await resp.text()
        out.append(await resp.json())
    return out


async def test_collect_answers_a_burst_with_one_turn_that_every_caller_sees(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(Hang(30, until=gate, then=reply("first answer")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "order 1"}))
    await openai_server.wait_for_requests(1)
    rest = await burst(client, [f"order {i}" for i in range(2, 7)])
    gate.set()
    answers = await bodies([first, *rest])
    assert [a["message_seq"] for a in answers] == [1, 2, 3, 4, 5, 6]
    assert answers[0]["reply"] == {"content": "first answer", "seq": 7}
    assert all(a["reply"] == {"content": "echo: order 6", "seq": 8} for a in answers[1:])
    requests = openai_server.chat_requests
    assert len(requests) == 2
    # the reply follows the message it answered; the messages that waited for it come after it
    assert contents(requests[1]) == ["order 1", "first answer"] + [f"order {i}" for i in range(2, 7)]
    lines = transcript(tmp_path, answers[0]["run_id"])
    assert [m["role"] for m in lines] == ["user"] * 6 + ["assistant"] * 2  # the durable log keeps arrival order
    assert [m["seq"] for m in lines] == list(range(1, 9))
    assert [m.get("after") for m in lines[6:]] == [1, 6]


async def test_collect_is_the_default_and_a_failed_turn_fails_every_caller_with_its_own_seq(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(Hang(30, until=gate), server_error(500))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "one"}))
    await openai_server.wait_for_requests(1)
    rest = await burst(client, ["two", "three"])
    gate.set()
    assert (await first).status == 200
    for seq, call in zip((2, 3), rest, strict=True):
        resp = await call
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == "provider_error" and error["stored"] is True and error["message_seq"] == seq
        assert f"(seq {seq})" in error["message"]
    assert len(openai_server.chat_requests) == 2


async def test_followup_runs_one_turn_per_message_each_seeing_only_up_to_its_own(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(
        aiohttp_client, tmp_path, clock, openai_server, {"session": {"queue": {"mode": "followup"}}}
    )
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(Hang(30, until=gate, then=reply("first answer")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "one"}))
    await openai_server.wait_for_requests(1)
    rest = await burst(client, ["two", "three"])
    gate.set()
    answers = await bodies([first, *rest])
    assert [a["reply"]["content"] for a in answers] == ["first answer", "echo: two", "echo: three"]
    assert [a["reply"]["seq"] for a in answers] == [4, 5, 6]
    requests = openai_server.chat_requests
    assert len(requests) == 3
    assert contents(requests[0]) == ["one"]
    assert contents(requests[1]) == ["one", "first answer", "two"]  # not "three": that one waits for its turn
    assert contents(requests[2]) == ["one", "first answer", "two", "echo: two", "three"]


async def test_steer_adds_a_message_to_the_running_turn_before_its_next_model_call(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(
        aiohttp_client, tmp_path, clock, openai_server, {"agents": {"main": {"queue_mode": "steer"}}}
    )
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(
        Hang(30, until=gate, then=tool_call("update_plan", {"plan": "1. look"})), reply("both handled")
    )
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "start a plan"}))
    await openai_server.wait_for_requests(1)
    rest = await burst(client, ["also check the logs"])
    gate.set()
    answers = await bodies([first, *rest])
    assert [a["message_seq"] for a in answers] == [1, 2]
    assert answers[0]["reply"] == answers[1]["reply"] == {"content": "both handled", "seq": 5}
    requests = openai_server.chat_requests
    assert len(requests) == 2  # no separate turn for the steering message
    assert contents(requests[0]) == ["start a plan"]
    # the tool round answers what its model call saw; the steering message follows it
    assert [m["role"] for m in requests[1].messages[1:]] == ["user", "assistant", "tool", "user"]
    assert contents(requests[1])[-1] == "also check the logs"


async def test_steer_gives_a_message_the_turn_could_not_see_a_turn_of_its_own(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server, {"session": {"queue": {"mode": "steer"}}})
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(Hang(30, until=gate, then=reply("first answer")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "one"}))
    await openai_server.wait_for_requests(1)
    rest = await burst(client, ["two"])
    gate.set()
    answers = await bodies([first, *rest])
    assert [a["reply"]["content"] for a in answers] == ["first answer", "echo: two"]
    assert len(openai_server.chat_requests) == 2


async def test_the_session_setting_overrides_the_queue_mode_and_is_validated(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)
    await client.post(f"{MAIN}/messages", json={"content": "hello"})
    bad = await client.patch(MAIN, json={"settings": {"queue_mode": "fifo"}})
    assert bad.status == 400 and (await bad.json())["error"]["field"] == "settings.queue_mode"
    ok = await client.patch(MAIN, json={"settings": {"queue_mode": "followup"}})
    assert ok.status == 200 and (await ok.json())["settings"]["queue_mode"] == "followup"
    openai_server.clear()
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(Hang(30, until=gate, then=reply("slow")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "a"}))
    await openai_server.wait_for_requests(1)
    rest = await burst(client, ["b", "c"])
    gate.set()
    answers = await bodies([first, *rest])
    assert [a["reply"]["content"] for a in answers] == ["slow", "echo: b", "echo: c"]


@pytest.mark.parametrize("limit", [1, 2])
async def test_busy_only_past_the_limit_of_waiting_calls_with_retry_after(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, limit: int
) -> None:
    # The model's timeout (5 s in these tests) outlasts the burst even on a loaded machine: a first
    # turn timed out before "one too many" arrives would free the queue and admit it.
    agent = {"max_queued_turns": limit, "model": {"timeout_s": 60}}
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server, {"agents": {"main": agent}})
    gate = asyncio.Event()  # the first turn's model call answers once the burst is stored
    openai_server.script(Hang(30, until=gate))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "running"}))
    await openai_server.wait_for_requests(1)
    waiting = await burst(client, [f"waiting {i}" for i in range(limit)])
    busy = await client.post(f"{MAIN}/messages", json={"content": "one too many"})
    assert busy.status == 429, await busy.text()
    assert busy.headers["Retry-After"] == "1" and (await busy.json())["error"]["retry_after_s"] == 1
    gate.set()
    answers = await bodies([first, *waiting])
    assert all(a["reply"] is not None for a in answers)
    stored = [m["content"] for m in transcript(tmp_path, answers[0]["run_id"])]
    assert "one too many" not in stored


async def test_calls_arriving_together_cannot_all_pass_the_limit(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    """Three calls sent at once while a turn runs, with room for one: the place is taken when a
    call is checked, not once its message is stored, so exactly one is admitted (counted only
    once stored, all three passed the check while the first was being stored)."""
    agent = {"max_queued_turns": 1, "model": {"timeout_s": 60}}
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server, {"agents": {"main": agent}})
    gate = asyncio.Event()
    openai_server.script(Hang(30, until=gate))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": "running"}))
    await openai_server.wait_for_requests(1)
    calls = [asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": f"together {i}"})) for i in range(3)]
    await until(lambda: sum(c.done() for c in calls) >= 2)  # the refused answer at once
    gate.set()
    statuses = sorted([(await c).status for c in calls])
    assert statuses == [200, 429, 429], statuses
    answers = await bodies([first])
    stored = [m["content"] for m in transcript(tmp_path, answers[0]["run_id"])]
    assert sum(text.startswith("together") for text in stored) == 1
