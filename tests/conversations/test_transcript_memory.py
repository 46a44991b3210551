"""Transcripts as a memory source (``memory.sources: [memory, sessions]``): a completed run's final
summary becomes a memory note, found by memory_search and cited ``run:<uuid>`` in direct sessions,
invisible to group sessions, and removed by a purge."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from conversations.transcript_memory import run_citation
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.gateway.test_memory_gateway import wait_ready
from tests.support.openai_server import OpenAIServer, reply, tool_call

MAIN = "agent:main:main"
GROUP = "agent:main:slack:group:G1"


@pytest.mark.parametrize(
    ("citation", "expected"),
    [
        ("memory/sessions/0b7e4c4e-6f0a-4d52-9a53-52d1c1a4f7a1.md#L1-L5", "run:0b7e4c4e-6f0a-4d52-9a53-52d1c1a4f7a1"),
        ("memory/2026-11-29.md#L1-L2", "memory/2026-11-29.md#L1-L2"),
        ("MEMORY.md#L3-L4", "MEMORY.md#L3-L4"),
    ],
)
def test_run_citation(citation: str, expected: str) -> None:
    assert run_citation(citation) == expected


def summary_rule(request: Any) -> Any:
    if "final summary" in request.system_text or "compress a conversation" in request.system_text:
        return reply("The team agreed the warehouse password rotates every Thursday.")
    return None


@pytest.mark.slow
@pytest.mark.allow_blocking  # the first embedding model load in this process holds the GIL for a while
@pytest.mark.timeout(180)
async def test_final_summaries_are_searchable_and_purged(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(summary_rule)
    config = {"memory": {"sources": ["memory", "sessions"]}}
    client = await aiohttp_client(make_app(tmp_path, clock, config, base_url=openai_server.base_url))
    await wait_ready(client)
    first = await (await client.post(f"/v1/sessions/{quote(MAIN, safe='')}/messages",
                                     json={"content": "let us talk about the warehouse", "reply": False})).json()
    assert (await client.post(f"/v1/sessions/{quote(MAIN, safe='')}/complete")).status == 200
    note = tmp_path / "workspaces/main/memory/sessions" / f"{first['run_id']}.md"
    for _ in range(200):
        if note.exists():
            break
        await asyncio.sleep(0.05)
    assert "rotates every Thursday" in note.read_text(encoding="utf-8")
    assert (await client.post("/v1/memory/reindex", json={})).status == 200
    openai_server.script(tool_call("memory_search", {"query": "warehouse password rotation"}), reply("ok"))
    second = await (await client.post(f"/v1/sessions/{quote(MAIN, safe='')}/messages",
                                      json={"content": "when does the password rotate?"})).json()
    tools = [json.loads(line) for line in (tmp_path / "contexts/running" / second["run_id"] / "tools.jsonl")
             .read_text(encoding="utf-8").splitlines()]  # fmt: skip
    citations = [r["citation"] for r in json.loads(tools[-1]["result"])["results"]]
    assert f"run:{first['run_id']}" in citations
    openai_server.script(tool_call("memory_search", {"query": "warehouse password rotation"}), reply("ok"))
    group = await (await client.post(f"/v1/sessions/{quote(GROUP, safe='')}/messages",
                                     json={"content": "group asks about passwords"})).json()
    group_tools = [json.loads(line) for line in (tmp_path / "contexts/running" / group["run_id"] / "tools.jsonl")
                   .read_text(encoding="utf-8").splitlines()]  # fmt: skip
    assert not any(c.startswith("run:") for c in
                   (r["citation"] for r in json.loads(group_tools[-1]["result"])["results"]))  # fmt: skip
    purged = await client.delete(f"/v1/sessions/{quote(MAIN, safe='')}", params={"purge": "true"})
    assert purged.status == 200 and not note.exists()
