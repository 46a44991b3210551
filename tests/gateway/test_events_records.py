"""Events and records (issue 13, items 5-9), through the app against the local model server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"


async def next_event(stream: ClientResponse, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            line = (await stream.content.readline()).decode().strip()
            if line.startswith("data: "):
                event: dict[str, Any] = json.loads(line[6:])
                if event["type"] == kind:
                    return event


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def test_reset_command_emits_reset_and_inheritance_names_both_runs(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    stream = await client.get("/v1/events?key=agent%3Amain%3Amain")
    first = await (await client.post(f"{MAIN}/messages", json={"content": "remember the blue door"})).json()
    await (await client.post(f"{MAIN}/commands", json={"command": "/reset"})).json()
    reset = await next_event(stream, "reset")
    assert reset["run_id"] == reset["previous_run_id"] == first["run_id"]
    assert reset["reason"] == "command" and reset["command"] == "/reset"
    second = await (await client.post(f"{MAIN}/messages", json={"content": "what door?"})).json()
    inherited = await next_event(stream, "inheritance")
    assert inherited["run_id"] == second["run_id"] != first["run_id"]
    assert inherited["from_run_id"] == first["run_id"]
    in_reply = [e for e in second["events"] if e["type"] == "inheritance"]
    assert in_reply and in_reply[0]["from_run_id"] == first["run_id"]
    stream.close()


async def test_events_with_a_bad_key_answer_400_invalid_key(aiohttp_client: Any, tmp_path: Path,
                                                            clock: FakeClock) -> None:  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock))
    resp = await client.get("/v1/events?key=bad:key")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_key"


async def command(client: Client, text: str) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/commands", json={"command": text})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def context_seqs(client: Client) -> list[Any]:
    return [m.get("seq") for m in (await (await client.get(f"{MAIN}/context")).json())["messages"][1:]]


async def test_compaction_archives_are_named_by_summary_id_and_never_overwritten(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    run_id = ""
    for batch in range(3):
        for i in range(16):
            body = await (
                await client.post(f"{MAIN}/messages", json={"content": f"batch {batch} note {i} " * 20})
            ).json()
            run_id = body["run_id"]
        if batch < 2:
            assert (await command(client, "/compact"))["events"][-1]["type"] == "compaction"
    folder = tmp_path / "contexts/running" / run_id / "compactions"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(before) == ["1.jsonl", "2.jsonl"]
    after_two = await context_seqs(client)
    assert "before compaction 2" in (await command(client, "/uncompact"))["reply"]["content"]
    after_undo = await context_seqs(client)
    assert (await command(client, "/compact"))["events"][-1]["type"] == "compaction"  # summary id 4
    now = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(now) == ["1.jsonl", "2.jsonl", "4.jsonl"]
    assert now["1.jsonl"] == before["1.jsonl"] and now["2.jsonl"] == before["2.jsonl"]
    records = jsonl(folder.parent / "summaries.jsonl")
    assert [(r["type"], r["id"], r.get("archive")) for r in records] == [
        ("compaction", 1, "compactions/1.jsonl"),
        ("compaction", 2, "compactions/2.jsonl"),
        ("uncompact", 3, "compactions/2.jsonl"),
        ("compaction", 4, "compactions/4.jsonl"),
    ]
    await command(client, "/uncompact")  # undoes summary 4, from 4.jsonl
    assert await context_seqs(client) == after_undo != after_two
    await command(client, "/uncompact")  # undoes summary 1, from 1.jsonl
    assert (await context_seqs(client))[0] == 1
    assert jsonl(folder.parent / "summaries.jsonl")[-1]["reverts_id"] == 1
