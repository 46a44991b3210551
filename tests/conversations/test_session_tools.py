"""The agent tools over sessions: visibility and send policy (tables), then real model turns
against the local OpenAI-compatible server calling sessions_list, sessions_history,
sessions_search and sessions_send, each recorded in tools.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from config.settings import SendRule
from conversations.session_tools import KeyInfo, send_allowed, visible
from gateway.keys import HISTORY
from sessions.records import RunState, TaskKey
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, tool_call

MAIN = "agent:main:main"
ALICE = "agent:main:dm:alice"
GROUP = "agent:main:telegram:group:g1"
OTHER = "agent:ops:main"
KEYS = [KeyInfo(MAIN, "main", "direct"), KeyInfo(ALICE, "main", "direct"), KeyInfo(GROUP, "main", "group"),
        KeyInfo(OTHER, "ops", "direct")]  # fmt: skip


def caller(key: str, chat_type: str) -> RunState:
    return RunState(run_id="r", key=key, agent_id="main", chat_type=chat_type, channel=None, status="running",
                    started_at="", task_key=TaskKey("agent", key))  # fmt: skip


@pytest.mark.parametrize(
    ("key", "chat_type", "visibility", "expected"),
    [
        (MAIN, "direct", "self", [MAIN]),
        (MAIN, "direct", "agent", [MAIN, ALICE, GROUP]),
        (MAIN, "direct", "all", [MAIN, ALICE, GROUP, OTHER]),
        (GROUP, "group", "agent", [GROUP]),  # a group never sees direct sessions under `agent`
        (GROUP, "group", "all", [MAIN, ALICE, GROUP, OTHER]),
        (GROUP, "group", "self", [GROUP]),
    ],
)
def test_visibility(key: str, chat_type: str, visibility: str, expected: list[str]) -> None:
    assert [k.key for k in visible(caller(key, chat_type), KEYS, visibility)] == expected


RULES = (
    SendRule(action="allow", key_prefix="agent:main:telegram:group:ok"),
    SendRule(action="deny", channel="telegram"),
    SendRule(action="deny", chat_type="direct", key_prefix="agent:main:dm:"),
)


@pytest.mark.parametrize(
    ("key", "channel", "chat_type", "default", "allowed"),
    [
        ("agent:main:telegram:group:ok1", "telegram", "group", "allow", True),  # first match wins
        ("agent:main:telegram:group:g2", "telegram", "group", "allow", False),
        ("agent:main:dm:bob", None, "direct", "allow", False),
        ("agent:main:main", None, "direct", "allow", True),
        ("agent:main:main", None, "direct", "deny", False),
        ("cron:nightly", None, "cron", "allow", True),
    ],
)
def test_send_policy(key: str, channel: str | None, chat_type: str, default: str, allowed: bool) -> None:
    assert send_allowed(RULES, default, key=key, channel=channel, chat_type=chat_type) is allowed


def k(key: str) -> str:
    return quote(key, safe="")


def tools_of(home: Path, run_id: str) -> list[dict[str, Any]]:
    path = home / "contexts" / "running" / run_id / "tools.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# The first model request of a process builds the openai client's SSL context and lazy modules on
# the loop (conversations/provider.py, ~0.6 s quiet, over 1 s when the machine is loaded): not these tools.
@pytest.mark.allow_blocking
async def test_the_tools_in_real_turns(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    rules = [{"action": "deny", "key_prefix": "agent:main:telegram:"}]
    config = {"agents": {"main": {"tools": {"sessions": {"send_rules": rules, "send_timeout_s": 10}}}}}
    client = await aiohttp_client(make_app(tmp_path, clock, config, base_url=openai_server.base_url))

    async def post(key: str, content: str, reply: bool = True) -> dict[str, Any]:
        resp = await client.post(f"/v1/sessions/{k(key)}/messages", json={"content": content, "reply": reply})
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body

    await post(ALICE, "the lighthouse code is 4711", reply=False)
    await post(ALICE, "/status")
    await post(GROUP, "group chatter about the lighthouse", reply=False)
    await client.app[HISTORY].flush()

    openai_server.script(tool_call("sessions_search", {"query": "lighthouse"}))
    main = await post(MAIN, "what was the code?")
    openai_server.script(tool_call("sessions_list", {}))
    await post(MAIN, "which sessions exist?")
    openai_server.script(tool_call("sessions_history", {"key": ALICE}))
    await post(MAIN, "read alice")
    openai_server.script(tool_call("sessions_send", {"key": ALICE, "message": "ping from main", "wait": True}))
    await post(MAIN, "ask alice")
    openai_server.script(tool_call("sessions_send", {"key": GROUP, "message": "hello group"}))
    await post(MAIN, "tell the group")
    records = tools_of(tmp_path, main["run_id"])
    assert [r["tool_name"] for r in records] == [
        "sessions_search", "sessions_list", "sessions_history", "sessions_send", "sessions_send"]  # fmt: skip
    found = json.loads(records[0]["result"])["results"]
    assert {r["session_key"] for r in found} == {ALICE, GROUP} and all("<mark>" in r["snippet"] for r in found)
    listed = {s["key"] for s in json.loads(records[1]["result"])["sessions"]}
    assert listed == {MAIN, ALICE, GROUP}
    history = json.loads(records[2]["result"])
    assert [m["content"] for m in history["messages"]] == ["the lighthouse code is 4711"]  # no /status lines
    sent = json.loads(records[3]["result"])
    assert sent["key"] == ALICE and sent["reply"] == "echo: ping from main"
    assert records[4]["error"] and "send policy" in records[4]["error"]
    alice_lines = [m["content"] for m in (await (await client.get(f"/v1/runs/{sent['run_id']}/messages")).json())[
        "messages"]]  # fmt: skip
    assert "ping from main" in alice_lines and "hello group" not in json.dumps(await (await client.get(
        f"/v1/sessions/{k(GROUP)}/context")).json())  # fmt: skip

    # from the group, under the default visibility, direct sessions stay out of sight
    openai_server.script(tool_call("sessions_search", {"query": "lighthouse"}))
    group = await post(GROUP, "search from the group")
    openai_server.script(tool_call("sessions_history", {"key": ALICE}))
    await post(GROUP, "read alice from the group")
    group_records = tools_of(tmp_path, group["run_id"])
    seen = {r["session_key"] for r in json.loads(group_records[0]["result"])["results"]}
    assert seen == {GROUP}
    assert group_records[1]["error"] and ALICE in group_records[1]["error"]
