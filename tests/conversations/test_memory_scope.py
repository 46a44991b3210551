"""Issue 24, item 3: memory has a scope. What the memory flush wrote from bob's conversation is not
recalled into carol's next session, not found by her memory_search nor read by her memory_get; bob's
next session recalls it; the owner's main session keeps the agent's shared files. With
``memory.scope: shared`` (the owner's opt-in) every session sees the agent's memory, as before."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from conversations.memory_scope import scope_name
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply, tool_call

Client = TestClient[Any, Any]
BOB, CAROL, MAIN = ("/v1/sessions/agent%3Amain%3A" + tail for tail in ("dm%3Abob", "dm%3Acarol", "main"))
FACT = "- Bob's locker code is 4417 and his badge number is B-2231."
QUESTION = "What is the locker code and the badge number?"
pytestmark = [pytest.mark.slow, pytest.mark.allow_blocking]  # the packaged model loads in this process


async def wait_ready(client: Client) -> None:
    for _ in range(600):
        if (await (await client.get("/v1/memory/status")).json())["ready"]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the memory index never became ready")


async def searchable(client: Client, path: str) -> None:
    """Until the owner's search (every scope) finds ``path``: the watcher indexed it."""
    for _ in range(150):
        hits = (await (await client.get("/v1/memory/search", params={"q": QUESTION})).json())["results"]
        if any(h["path"] == path for h in hits):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} was never indexed")


def flush_saves_the_fact(request: RecordedRequest) -> Any:
    if "about to be compacted" in request.last_user_text:
        return tool_call("memory_append", {"text": FACT})
    return None


async def post(client: Client, path: str, content: str) -> dict[str, Any]:
    resp = await client.post(f"{path}/messages", json={"content": content})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


def tool_records(home: Path, run_id: str) -> list[dict[str, Any]]:
    lines = (home / "contexts/running" / run_id / "tools.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


async def app_with_flushed_fact(
    aiohttp_client: Any, home: Path, clock: FakeClock, server: OpenAIServer, overrides: dict[str, Any] | None = None
) -> tuple[Client, str]:
    """An app whose owner keeps MEMORY.md; bob's conversation is reset and its memory flush saves
    FACT. Returns the client and the daily log it was written to."""
    workspace = home / "workspaces/main"
    workspace.mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Owner\nThe owner's gym locker is number 12.\n")
    client = await aiohttp_client(make_app(home, clock, overrides, base_url=server.base_url))
    await wait_ready(client)
    server.add_rule(flush_saves_the_fact)
    await post(client, BOB, "My locker code is 4417 and my badge number is B-2231, remember that.")
    reset = await client.post(f"{BOB}/commands", json={"command": "/reset"})
    assert reset.status == 200, await reset.text()
    shared = "memory/2026-11-30.md"
    written = [p.relative_to(workspace).as_posix() for p in workspace.rglob("2026-11-30.md")]
    assert len(written) == 1 and FACT in (workspace / written[0]).read_text()
    await searchable(client, written[0])
    return client, shared if written[0] == shared else written[0]


async def test_one_persons_flushed_memory_never_reaches_anothers_session(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client, bobs_log = await app_with_flushed_fact(aiohttp_client, tmp_path, clock, openai_server)

    # carol's new session: recall offers nothing of bob's, and her memory tools find and read nothing of his
    openai_server.script(
        tool_call("memory_search", {"query": QUESTION}),
        tool_call("memory_get", {"path": bobs_log}),
        reply("I do not know."),
    )
    carol = await post(client, CAROL, QUESTION)
    prompts = [r for r in openai_server.chat_requests if r.last_user_text == QUESTION]
    assert prompts and all("4417" not in json.dumps(r.messages) for r in prompts)
    assert not [e for e in carol["events"] if e["type"] == "memory" and bobs_log in e["citations"]]
    search, get = tool_records(tmp_path, carol["run_id"])[:2]
    assert search["tool_name"] == "memory_search" and json.loads(search["result"])["results"] == []
    assert get["tool_name"] == "memory_get" and "not available" in get["error"]
    assert "4417" not in json.dumps(tool_records(tmp_path, carol["run_id"]))
    assert "owner's gym locker" not in json.dumps([r.messages for r in prompts])  # nor the owner's MEMORY.md
    assert bobs_log == f"memory/scopes/{scope_name(('dm', 'bob'))}/2026-11-30.md"  # not the shared log

    # the owner's main session: the shared files, not bob's
    await post(client, MAIN, QUESTION)
    owner = openai_server.chat_requests[-1].messages
    assert "4417" not in json.dumps(owner) and "gym locker is number 12" in json.dumps(owner)

    # bob's next session recalls his own log (offered as today's daily log, and found by search)
    bob = await post(client, BOB, QUESTION)
    recalled = [e for e in bob["events"] if e["type"] == "memory" and e["action"] == "recall"]
    assert recalled and bobs_log in recalled[0]["citations"]
    assert "4417" in openai_server.chat_requests[-1].messages[1]["content"]
    openai_server.script(tool_call("memory_search", {"query": QUESTION}), reply("4417"))
    await post(client, BOB, "Search your memory for it.")
    found = json.loads(tool_records(tmp_path, bob["run_id"])[-1]["result"])["results"]
    assert found and all(r["citation"].startswith(bobs_log) for r in found)


async def test_the_owner_can_share_memory_across_sessions(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    overrides = {"memory": {"scope": "shared"}}
    client, log = await app_with_flushed_fact(aiohttp_client, tmp_path, clock, openai_server, overrides)
    assert log == "memory/2026-11-30.md"  # the shared daily log, as before scopes
    carol = await post(client, CAROL, QUESTION)
    assert [e for e in carol["events"] if e["type"] == "memory" and log in e["citations"]]
    assert "4417" in openai_server.chat_requests[-1].messages[1]["content"]
