"""The small surprises of issue 13 (items 11, 12, 15, 17, 19): commands typed with an IME, the
tool-round limit, /model in store-only mode, paths in the extractive summary, and the CLI's
output into a closed pipe."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FakeClock
from tests.gateway.daemons import REPO, child_env, cli_args
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, tool_call

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

MAIN = "/v1/sessions/agent%3Amain%3Amain"


async def command(client: Any, text: str) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/commands", json={"command": text})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def test_full_width_commands_are_normalised_and_unknown_ones_get_the_help(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    await client.post(f"{MAIN}/messages", json={"content": "hello"})
    sent = len(openai_server.chat_requests)
    full_width_status = "\uff0f\uff53\uff54\uff41\uff54\uff55\uff53"
    typed = await (await client.post(f"{MAIN}/messages", json={"content": full_width_status})).json()
    assert typed["reply"]["content"] == (await command(client, "/status"))["reply"]["content"]
    assert len(openai_server.chat_requests) == sent, "a command never reaches the model"
    for text in ("/ステータス", "\uff0fステータス 詳しく", "/2"):
        answer = (await command(client, text))["reply"]["content"]
        assert answer.startswith("Unknown command /") and "/status" in answer, text
    bad = await client.post(f"{MAIN}/commands", json={"command": "status"})
    assert bad.status == 400 and (await bad.json())["error"]["field"] == "command"


async def test_running_out_of_tool_rounds_asks_for_a_final_answer_and_says_so(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    app = make_app(tmp_path, clock, {"agents": {"main": {"max_tool_rounds": 1}}}, base_url=openai_server.base_url)
    client = await aiohttp_client(app)
    openai_server.script(tool_call("update_plan", {"plan": "1. a"}), tool_call("update_plan", {"plan": "2. b"}))
    body = await (await client.post(f"{MAIN}/messages", json={"content": "plan forever"})).json()
    last = openai_server.chat_requests[-1]
    assert last.tool_names == [] and "used all 1 tool rounds" in last.messages[-1]["content"]
    assert body["reply"]["content"].startswith("(I reached the limit of 1 tool rounds")
    assert {"type": "tool_limit", "max_tool_rounds": 1} in body["events"]
    openai_server.script(tool_call("update_plan", {"plan": "3. c"}))
    answered = await (await client.post(f"{MAIN}/messages", json={"content": "once more"})).json()
    assert answered["reply"]["content"] == "echo: once more"  # the last call's own answer when it gives one


async def test_model_in_store_only_mode_says_no_model_is_configured(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    await client.post(f"{MAIN}/messages", json={"content": "hello"})
    answer = (await command(client, "/model"))["reply"]["content"]
    assert answer.startswith("No model is configured (store-only mode)") and "gpt-4o-mini" not in answer
    status = (await command(client, "/status"))["reply"]["content"]
    assert "Model: none (store-only mode)" in status


async def test_the_extractive_summary_keeps_absolute_paths(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    for i in range(16):
        text = f"step {i}: loaded /var/data/{i}.csv and ~/notes/n{i}.md " + "with some prose around it " * 6
        await client.post(f"{MAIN}/messages", json={"content": text})
    assert "Compacted" in (await command(client, "/compact"))["reply"]["content"]
    summary = (await (await client.get(f"{MAIN}/context")).json())["messages"][1]["content"]
    assert "/var/data/1.csv" in summary and "~/notes/n1.md" in summary
    assert " var/data/1.csv" not in summary


@pytest.mark.slow
async def test_json_output_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head` that has already exited: every write fails with EPIPE
    try:
        proc = await asyncio.create_subprocess_exec(
            *cli_args("config", "show", "--json", "--home", str(tmp_path / "home")),
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            cwd=REPO,
        )
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert err.decode() == ""
    assert proc.returncode == 141


async def test_ingress_takes_integer_ids_and_percent_encodes_other_scripts(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    overrides = {"session": {"dm_scope": "per-peer"}, "bindings": [{"channel": "telegram", "chat_id": -100123,
                                                                   "agent": "main"}]}  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=openai_server.base_url))
    group = {"channel": "telegram", "chat_type": "group", "chat_id": -100123, "sender_id": 42, "thread_id": 7,
             "sender_name": "Ann", "text": "hi group"}  # fmt: skip
    body = await (await client.post("/v1/messages", json=group)).json()
    assert body["session_key"] == "agent:main:telegram:group:-100123:topic:7"
    direct = {"channel": "line", "chat_type": "direct", "chat_id": "x", "sender_id": "田中", "text": "こんにちは"}
    resp = await client.post("/v1/messages", json=direct)
    assert resp.status == 200, await resp.text()
    key = (await resp.json())["session_key"]
    assert key == "agent:main:dm:%E7%94%B0%E4%B8%AD"
    entry = await client.get("/v1/sessions/" + key.replace("%", "%25").replace(":", "%3A"))
    assert entry.status == 200 and (await entry.json())["key"] == key
    again = await (await client.post("/v1/messages", json=direct)).json()
    assert again["session_key"] == key and again["message_seq"] == 3  # the same session, reversibly
    for bad in ({"sender_id": "a b"}, {"sender_id": True}, {"chat_id": 1.5}):
        resp = await client.post("/v1/messages", json={**direct, **bad})
        assert resp.status == 400, bad
