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
