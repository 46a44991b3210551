"""Start-up with resets that fell due while the gateway was down (issue 13, item 3): the app serves
at once, the resets run in the background at most ``scheduler.reset_concurrency`` at a time, and
a message for a key whose reset is due is handled after that reset, on the new run."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.keys import SCHEDULING
from sessions.resets import most_recent_boundary
from tests.conftest import FakeClock
from tests.gateway.daemons import daemon
from tests.gateway.helpers import make_app
from tests.gateway.test_turns_daemon import model, write_config
from tests.support.openai_server import Hang, OpenAIServer, RecordedRequest

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

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


@pytest.mark.slow
async def test_a_daily_reset_missed_while_down_is_not_deferred_by_the_first_message(tmp_path: Path) -> None:
    """Issue 24, item 4, in a real daemon on the real clock: the runs' last activity is before the
    most recent daily boundary (computed from the real clock); the start-up sweep resets one key
    at a time and is held on the first key's final summary, so the messages to the other keys
    arrive before the sweep reaches them. Each must wait for its key's reset and go to a new run:
    before, the message counted as activity after the boundary, deferred the reset and was
    stored in yesterday's run (2 of 3 keys here), and the sweep then skipped those keys."""
    now = datetime.now(UTC)
    at_hour = (now - timedelta(hours=1)).hour
    boundary = most_recent_boundary(now, at_hour, ZoneInfo("UTC"))  # 1 to 2 hours ago
    settings = {
        # defer 600: the cap (boundary + 2 x defer) cannot make the reset due by itself
        "session": {"reset": {"mode": "daily", "at_hour": at_hour, "timezone": "UTC", "defer_if_active_minutes": 600}},
        "scheduler": {"reset_concurrency": 1},
        "compaction": {"memory_flush": {"enabled": False}},
    }
    keys = [f"agent:main:dm:peer{i}" for i in range(3)]
    home = tmp_path / "home"
    seeded = FakeClock(boundary - timedelta(hours=1))  # yesterday's runs, last active before the boundary
    app = make_app(home, seeded, settings)
    old: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        async with TestClient(TestServer(app)) as seed:
            for i, key in enumerate(keys):
                resp = await seed.post(f"/v1/sessions/{quote(key)}/messages", json={"content": f"note {i}"})
                assert resp.status == 200, await resp.text()
                old[key] = (await resp.json())["run_id"]

        async with OpenAIServer() as server:
            release = asyncio.Event()
            server.add_rule(lambda r: Hang(60, until=release) if "final summary" in r.system_text else None)
            config = write_config(tmp_path / "config.yaml", {**settings, "agents": {"main": {"model": model(server)}}})
            async with daemon(home, "--config", str(config)) as gw:
                await server.wait_for_requests(1, timeout=60)  # the sweep holds its first reset
                urls = [f"{gw.url}/v1/sessions/{quote(key)}/messages" for key in keys]
                calls = [asyncio.create_task(http.post(url, json={"content": "morning"})) for url in urls]
                await asyncio.sleep(1.0)
                release.set()
                answers = []
                for call in calls:
                    async with await call as resp:
                        assert resp.status == 200, await resp.text()
                        answers.append(await resp.json())
                for key, body in zip(keys, answers, strict=True):
                    assert body["run_id"] != old[key], f"{key}: the message landed in the run that was due for reset"
                    assert body["reply"]["content"] == "echo: morning"
                    run = await (await http.get(f"{gw.url}/v1/runs/{old[key]}")).json()
                    assert run["status"] == "completed", key
                assert await gw.stop() == 0, gw.stderr()
    for key in keys:
        lines = (home / "contexts/completed" / old[key] / "messages.jsonl").read_text().splitlines()
        assert [json.loads(x)["content"] for x in lines] == [f"note {keys.index(key)}"]


def quote(key: str) -> str:
    return key.replace(":", "%3A")
