"""Typed events (issue 25): every event a conversation produces is one of the TypedDicts of
``sessions.events``, with exactly the keys its type declares: what the answers carry against
``TurnEvent``, what ``GET /v1/events`` streams against ``HubEvent`` (``type``, ``key``, ``run_id``
and ``at`` first). Driven through the app against the local model server, over a message, a
reply, a compaction, an uncompact, a reset, an inheritance, a pause and a resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from gateway import keys as K
from sessions.events import HubEvent, StoreEvent, TurnEvent
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply
from tests.support.typed_dicts import matching_types

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"


def test_the_checker_refuses_a_missing_an_extra_and_an_unknown_key() -> None:
    reset = {"type": "reset", "reason": "command", "previous_run_id": "r", "boundary": None, "command": "/new"}
    assert matching_types(reset, TurnEvent) == ["ResetEvent"]
    assert matching_types({**reset, "extra": 1}, TurnEvent) == []
    assert matching_types({k: v for k, v in reset.items() if k != "command"}, TurnEvent) == []
    assert matching_types({"type": "surprise"}, TurnEvent) == []
    flush = {"type": "memory", "key": "k", "run_id": "r", "at": "t", "action": "flush", "compaction": 1}
    assert matching_types(flush, StoreEvent) == ["MemoryPublished"]
    assert matching_types({**flush, "action": "progress"}, StoreEvent) == []


def _short_summary(request: RecordedRequest) -> Any:
    if "compress a conversation" in request.system_text or "final summary" in request.system_text:
        return reply("MODEL SUMMARY")
    return None


async def _command(client: Client, text: str) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/commands", json={"command": text})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def test_every_event_of_a_conversation_is_one_typed_event(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(_short_summary)
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    answers: list[dict[str, Any]] = []
    for i in range(16):
        resp = await client.post(f"{MAIN}/messages", json={"content": f"note {i} about the blue door " * 20})
        answers.append(await resp.json())
    answers.append(await _command(client, "/compact"))
    answers.append(await _command(client, "/uncompact"))
    assert (await client.post(f"{MAIN}/pause")).status == 200
    assert (await client.post(f"{MAIN}/resume")).status == 200
    answers.append(await _command(client, "/reset"))
    answers.append(await (await client.post(f"{MAIN}/messages", json={"content": "what door?"})).json())

    in_answers = [event for body in answers for event in body["events"]]
    assert {"compaction", "uncompact", "reset", "inheritance"} <= {e["type"] for e in in_answers}
    for event in in_answers:
        assert len(matching_types(event, TurnEvent)) == 1, event

    published: list[HubEvent] = []
    stream = client.app[K.HUB].subscribe(key=None, last_event_id=0, heartbeat_s=0.2)
    async with asyncio.timeout(10):
        async for item in stream:
            if item is None:
                break
            published.append(item.data)
    await stream.aclose()  # type: ignore[attr-defined]
    kinds = {(e["type"], e.get("action")) for e in published}
    assert {("message", None), ("reply", None), ("compaction", None), ("compaction", "uncompact"),
            ("lifecycle", "start"), ("lifecycle", "pause"), ("lifecycle", "resume"), ("lifecycle", "completed"),
            ("reset", None), ("inheritance", None)} <= kinds  # fmt: skip
    for event in published:
        assert len(matching_types(dict(event), StoreEvent)) == 1, event
        assert list(event)[:4] == ["type", "key", "run_id", "at"], event
        assert json.loads(json.dumps(event)) == event
