"""A real daemon on each event loop (gateway.event_loop): it stores, answers and stops cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from gateway.eventloop import uvloop_available
from tests.gateway.daemons import child_env, daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90), pytest.mark.realtime]


@pytest.mark.parametrize(
    "choice",
    [
        "asyncio",
        pytest.param("uvloop", marks=pytest.mark.skipif(not uvloop_available(), reason="uvloop is not installed")),
    ],
)
async def test_daemon_stores_and_stops_on_either_loop(tmp_path: Path, choice: str) -> None:
    home = tmp_path / "home"
    env = child_env(NEOTASK_GATEWAY__EVENT_LOOP=choice)
    url = "/v1/sessions/" + quote("agent:main:main", safe="") + "/messages"
    async with daemon(home, env=env) as d:
        async with aiohttp.ClientSession(d.url) as http:
            for i in range(3):
                async with http.post(url, json={"content": f"hello {i}"}) as resp:
                    assert resp.status == 200, await resp.text()
                    assert (await resp.json())["message_seq"] == i + 1
        assert await d.stop() == 0
    stored = [json.loads(line) for path in home.glob("contexts/running/*/messages.jsonl")
              for line in path.read_text().splitlines()]  # fmt: skip
    assert [m["content"] for m in stored] == ["hello 0", "hello 1", "hello 2"]
