"""Start-up with resets that fell due while the gateway was down (issue 13, item 3): the app serves
at once, the resets run in the background at most ``scheduler.reset_concurrency`` at a time, and
a message for a key whose reset is due is handled after that reset, on the new run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gateway.keys import SCHEDULING
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import Hang, OpenAIServer, RecordedRequest

KEYS = [f"agent%3Amain%3Adm%3Apeer{i}" for i in range(5)]
CONFIG = {
    "session": {"reset": {"mode": "idle", "idle_minutes": 5}},
    "scheduler": {"reset_concurrency": 2},
    "compaction": {"memory_flush": {"enabled": False}},
}


def summaries(server: OpenAIServer) -> list[RecordedRequest]:
    return [r for r in server.chat_requests if "final summary" in r.system_text]


async def test_due_resets_run_after_binding_bounded_and_before_a_message_for_their_key(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, CONFIG, base_url=openai_server.base_url))
    old: dict[str, str] = {}
    for i, key in enumerate(KEYS):
        resp = await client.post(f"/v1/sessions/{key}/messages", json={"content": f"note {i}", "reply": False})
        old[key] = (await resp.json())["run_id"]
    await client.close()

    clock.advance(minutes=10)  # every run is now idle past its reset
    release = asyncio.Event()
    openai_server.add_rule(lambda r: Hang(60, until=release) if "final summary" in r.system_text else None)
    client = await aiohttp_client(make_app(tmp_path, clock, CONFIG, base_url=openai_server.base_url))
    assert (await client.get("/healthz")).status == 200  # served while the resets wait for the model
    await openai_server.wait_for_requests(2)
    await asyncio.sleep(0.3)
    assert len(summaries(openai_server)) == 2, "at most reset_concurrency resets at once"
    startup = client.server.app[SCHEDULING].startup
    assert startup is not None and not startup.done()

    target = KEYS[4]  # its reset waits for a free slot
    message = asyncio.create_task(client.post(f"/v1/sessions/{target}/messages", json={"content": "fresh start"}))
    await asyncio.sleep(0.3)
    assert not message.done(), "the message waits for its key's reset"
    release.set()
    resp = await message
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["run_id"] != old[target]
    assert body["reply"]["content"] == "echo: fresh start"
    await startup
    for key, run_id in old.items():
        run = await (await client.get(f"/v1/runs/{run_id}")).json()
        assert run["status"] == "completed", key
    turn = [r for r in openai_server.chat_requests if r.last_user_text == "fresh start"][-1]
    assert "note 4" not in [m["content"] for m in turn.messages if m["role"] == "user"]
    old_lines = (tmp_path / "contexts/completed" / old[target] / "messages.jsonl").read_text().splitlines()
    assert [json.loads(x)["content"] for x in old_lines] == ["note 4"]
