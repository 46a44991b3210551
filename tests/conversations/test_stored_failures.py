"""Issue 10 item 3: once a message is durable, no failure of its turn answers an error inviting a
resend. A tool that fails for real (planning.jsonl of the run is a directory: the plan cannot be
recorded) answers 500 ``turn_failed`` with ``stored: true`` and ``message_seq``; a retry with the
same client_message_id stores nothing again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, reply, tool_call

Client = TestClient[Any, Any]
PLAN = {"plan": "1. read 2. write", "plan_type": "initial"}


def contents(run_dir: Path) -> list[str]:
    lines = (run_dir / "messages.jsonl").read_text().splitlines()
    return [str(json.loads(line).get("content")) for line in lines]


def break_planning(run_dir: Path) -> None:
    path = run_dir / "planning.jsonl"
    path.unlink(missing_ok=True)
    path.mkdir()  # a directory where the file belongs: no write can land there, even as root


ROUTES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("session", "/v1/sessions/agent%3Amain%3Amain/messages", {"content": "first"}, {"content": "plan it"}),
    (
        "ingress",
        "/v1/messages",
        {"channel": "tg", "chat_type": "direct", "chat_id": "c", "sender_id": "s", "text": "first"},
        {"channel": "tg", "chat_type": "direct", "chat_id": "c", "sender_id": "s", "text": "plan it"},
    ),
]


@pytest.mark.parametrize(("name", "url", "opening", "body"), ROUTES, ids=[r[0] for r in ROUTES])
async def test_a_tool_failing_after_the_message_is_stored_says_stored(
    aiohttp_client: Any,
    tmp_path: Path,
    clock: FakeClock,
    openai_server: OpenAIServer,
    name: str,
    url: str,
    opening: dict[str, Any],
    body: dict[str, Any],
) -> None:
    client: Client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    first = await client.post(url, json=opening)
    assert first.status == 200, await first.text()
    run_dir = tmp_path / "contexts" / "running" / (await first.json())["run_id"]
    break_planning(run_dir)

    openai_server.script(tool_call("update_plan", PLAN))
    failed = await client.post(url, json={**body, "client_message_id": "c1"})
    assert failed.status == 500, await failed.text()
    error = (await failed.json())["error"]
    assert error["code"] == "turn_failed" and error["stored"] is True and error["message_seq"] == 3
    assert "do not send it again" in error["message"]
    assert contents(run_dir).count("plan it") == 1

    openai_server.script(reply("planned"))  # the retry runs the turn again, storing nothing new
    again = await client.post(url, json={**body, "client_message_id": "c1"})
    assert again.status == 200, await again.text()
    answered = await again.json()
    assert answered["message_seq"] == 3 and answered["reply"]["content"] == "planned"
    assert contents(run_dir).count("plan it") == 1


async def test_the_openai_route_says_stored_too(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    on = {"gateway": {"openai_compat": {"enabled": True}}}
    client: Client = await aiohttp_client(make_app(tmp_path, clock, on, base_url=openai_server.base_url))
    url = "/v1/chat/completions"
    headers = {"X-Neotask-Session-Key": "agent:main:main"}
    history = [{"role": "user", "content": "first"}]
    first = await client.post(url, json={"model": "neotask/main", "messages": history}, headers=headers)
    assert first.status == 200, await first.text()
    run_dir = next((tmp_path / "contexts" / "running").iterdir())
    break_planning(run_dir)

    openai_server.script(tool_call("update_plan", PLAN))
    answer = (await first.json())["choices"][0]["message"]["content"]
    messages = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": "plan it"}]
    failed = await client.post(url, json={"model": "neotask/main", "messages": messages}, headers=headers)
    assert failed.status == 500, await failed.text()
    error = (await failed.json())["error"]
    assert error["code"] == "turn_failed" and error["stored"] is True and error["message_seq"] == 3
    assert contents(run_dir).count("plan it") == 1


async def test_a_compaction_failing_after_a_store_only_message_says_stored(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    """No model turn (store-only), but the compaction the message makes due fails: its archive
    folder ``compactions`` is a file, so the compacted lines cannot be saved."""
    client: Client = await aiohttp_client(make_app(tmp_path, clock, {"compaction": {"token_threshold": 1000}}))
    url = "/v1/sessions/agent%3Amain%3Amain/messages"
    first = await client.post(url, json={"content": "opening"})
    assert first.status == 200, await first.text()
    run_dir = tmp_path / "contexts" / "running" / (await first.json())["run_id"]
    (run_dir / "compactions").write_text("in the way\n")

    for i in range(60):
        body = {"content": f"message number {i} about ticket #{i} " + "x" * 100, "client_message_id": f"m{i}"}
        resp = await client.post(url, json=body)
        if resp.status != 200:
            break
    else:
        pytest.fail("no compaction fell due")
    assert resp.status == 500, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "turn_failed" and error["stored"] is True and error["message_seq"] == i + 2
    again = await client.post(url, json=body)
    assert again.status in (200, 500)
    assert contents(run_dir).count(body["content"]) == 1  # stored once, whatever the retry answered
