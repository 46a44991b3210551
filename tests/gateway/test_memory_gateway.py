"""Memory through the gateway with the real packaged model and LanceDB: search, files, auto-recall
(direct only), the model's memory tools and the pre-compaction memory flush."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply, tool_call

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"

MEMORY_MD = """# About the user

## Preferences
The user's favourite tea is genmaicha, brewed at 80 degrees.
They prefer short answers without emoji.

## Work
The user maintains the billing service in repository acme/billing.
Their on-call week starts on Mondays.
"""


async def wait_ready(client: Client) -> None:
    for _ in range(600):
        body = await (await client.get("/v1/memory/status")).json()
        if body["ready"]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the memory index never became ready")


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer) -> Client:
    workspace = tmp_path / "workspaces/main"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(MEMORY_MD)
    (workspace / "memory/2026-11-29.md").write_text("- Booked the dentist for December 3rd at 10:00.\n")
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    await wait_ready(client)
    return client


@pytest.mark.slow
@pytest.mark.allow_blocking  # the first model load in this process holds the GIL for a while
async def test_memory_end_to_end(client: Client, openai_server: OpenAIServer, tmp_path: Path) -> None:
    found = await (await client.get("/v1/memory/search", params={"q": "what tea does the user like?"})).json()
    top = found["results"][0]
    assert top["path"] == "MEMORY.md" and top["citation"].startswith("MEMORY.md#L") and 0 < top["score"] <= 1
    assert {"path", "start_line", "end_line", "heading", "score", "snippet", "citation"} <= set(top)
    assert found["partial"] is False  # the index is level with the files
    nothing = await (await client.get("/v1/memory/search", params={"q": "quantum chromodynamics lattice"})).json()
    assert nothing["results"] == []
    files = await (await client.get("/v1/memory/files")).json()
    assert [f["path"] for f in files["files"]] == ["MEMORY.md", "memory/2026-11-29.md"]
    text = await (await client.get("/v1/memory/files/memory/2026-11-29.md")).json()
    assert "dentist" in text["text"]
    assert (await client.get("/v1/memory/files/..%2Fconfig.yaml")).status in (400, 404)
    assert (await client.get("/v1/memory/search")).status == 400

    # auto-recall before the first user message of a direct run, recorded in the transcript
    body = await (await client.post(f"{MAIN}/messages", json={"content": "Which tea should I brew?"})).json()
    recalled = [e for e in body["events"] if e["type"] == "memory" and e["action"] == "recall"]
    assert recalled and recalled[0]["citations"][0].startswith("MEMORY.md#L")
    sent = openai_server.chat_requests[-1].messages
    assert sent[1]["role"] == "system" and sent[1]["content"].startswith("<relevant-memories>")
    assert "genmaicha" in sent[1]["content"] and "memory/2026-11-29.md" in sent[1]["content"]
    assert sent[2] == {"role": "user", "content": "Which tea should I brew?"}

    # groups never see MEMORY.md: no recall, and the tools leave it out
    group = {"channel": "slack", "chat_type": "group", "chat_id": "G1", "sender_id": "u1", "text": "tea for the team?"}
    openai_server.script(tool_call("memory_get", {"path": "MEMORY.md"}), reply("ok"))
    grouped = await (await client.post("/v1/messages", json=group)).json()
    assert not [e for e in grouped["events"] if e["type"] == "memory"]
    run_dir = tmp_path / "contexts/running" / grouped["run_id"]
    tools = [json.loads(x) for x in (run_dir / "tools.jsonl").read_text().splitlines()]
    assert tools[0]["tool_name"] == "memory_get" and "not available" in tools[0]["error"]

    # the model saves a fact; a duplicate line is skipped
    openai_server.script(
        tool_call("memory_append", {"text": "- The user switched to sencha in winter."}),
        tool_call("memory_append", {"text": "- The user switched to sencha in winter."}),
        reply("noted"),
    )
    await client.post(f"{MAIN}/messages", json={"content": "Remember that I drink sencha in winter."})
    daily = tmp_path / "workspaces/main/memory/2026-11-30.md"
    assert daily.read_text().count("sencha in winter") == 1

    # the pre-compaction flush: one silent turn that may call memory_append, recorded as such
    def flush_rule(request: RecordedRequest) -> Any:
        if "about to be compacted" in request.last_user_text:
            return tool_call("memory_append", {"text": "- Flushed: billing on-call rota discussed."})
        if "compress a conversation" in request.system_text:
            return reply("Summary: notes about the billing on-call rota.")
        return None

    openai_server.add_rule(flush_rule)
    for i in range(16):
        await client.post(f"{MAIN}/messages", json={"content": f"note {i}: " + "rota details " * 20, "reply": False})
    compacted = await (await client.post(f"{MAIN}/commands", json={"command": "/compact"})).json()
    assert "Compacted" in compacted["reply"]["content"]
    assert "Flushed: billing on-call rota" in daily.read_text()
    main_run = tmp_path / "contexts/running" / body["run_id"]
    flushes = [json.loads(x) for x in (main_run / "tools.jsonl").read_text().splitlines()]
    assert any(t.get("memory_flush") for t in flushes)

    # a new file is searchable within 10 s (watcher)
    (tmp_path / "workspaces/main/memory/projects.md").write_text("# Projects\nThe Falcon launch is on March 9.\n")
    for _ in range(100):
        hits = (await (await client.get("/v1/memory/search", params={"q": "Falcon launch date"})).json())["results"]
        if hits and hits[0]["path"] == "memory/projects.md":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the new file was not searchable within 10 s")


@pytest.mark.slow
@pytest.mark.allow_blocking
async def test_a_query_that_is_not_utf8_text_or_a_k_that_is_not_ascii_digits_is_refused(client: Client) -> None:
    """Bytes that are not UTF-8 were read as U+FFFD and searched for, a NUL was searched, and int()
    took " 5", "+5", "1_0" and digits of other scripts: each is now 400 naming its parameter."""
    from yarl import URL

    async def status(query: str) -> tuple[int, Any]:
        response = await client.get(URL(f"/v1/memory/search?{query}", encoded=True))
        return response.status, await response.json()

    for q in ("%FF%FE", "tea%C3", "%ED%A0%80", "tea%00x"):
        code, body = await status(f"q={q}")
        assert code == 400 and body["error"]["field"] == "q", (q, body)
    for k in ("1_0", "%205", "%2B5", "%EF%BC%93", "%D9%A3", "5.0"):
        code, body = await status(f"q=tea&k={k}")
        assert code == 400 and body["error"]["field"] == "k" and "ASCII digits" in body["error"]["message"], (k, body)
    assert (await status("q=tea&k=3"))[0] == 200
    assert (await status("q=caf%C3%A9+%E4%BC%9A%E8%AD%B0"))[0] == 200  # UTF-8, accented and Japanese


@pytest.mark.slow
@pytest.mark.allow_blocking
async def test_a_message_holding_a_nul_is_still_recalled_for(client: Client) -> None:
    """Auto-recall searches memory with the message's text: a NUL in it must not fail the post (a
    first version of the search's NUL check answered such a message 400 "q holds a NUL" after
    storing it; the check belongs to the HTTP search's parameter, not to the search)."""
    response = await client.post(f"{MAIN}/messages", json={"content": "which tea\u0000 should I brew?"})
    assert response.status == 200, await response.text()
