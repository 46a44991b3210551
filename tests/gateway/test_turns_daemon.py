"""Turns in a real daemon process (issue 13): SIGTERM during a slow model turn, and start-up with
due resets."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.gateway.daemons import daemon
from tests.support.openai_server import Hang, OpenAIServer

MAIN = "/v1/sessions/agent%3Amain%3Amain"
pytestmark = [pytest.mark.slow, pytest.mark.realtime]


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def model(server: OpenAIServer) -> dict[str, Any]:
    return {"base_url": server.base_url, "name": "m", "max_retries": 0, "timeout_s": 120}


async def test_sigterm_stops_a_slow_turn_answers_its_callers_503_and_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as server:
        server.script(Hang(120))
        config = write_config(tmp_path / "config.yaml", {"agents": {"main": {"model": model(server)}}})
        async with daemon(home, "--config", str(config)) as gw, aiohttp.ClientSession() as http:
            running = asyncio.create_task(http.post(f"{gw.url}{MAIN}/messages", json={"content": "slow one"}))
            await server.wait_for_requests(1, timeout=30)
            waiting = asyncio.create_task(http.post(f"{gw.url}{MAIN}/messages", json={"content": "waits"}))
            for _ in range(200):  # stored (seq 2) and waiting for its turn
                async with http.get(f"{gw.url}{MAIN}") as resp:
                    if (await resp.json())["message_count"] == 2:
                        break
                await asyncio.sleep(0.05)
            status = await gw.stop(signal.SIGTERM, timeout=30)
            answers = []
            for call in (running, waiting):
                async with await call as resp:
                    answers.append((resp.status, (await resp.json())["error"]))
        assert status == 0, gw.stderr()
        assert "did not finish" not in gw.stderr()
        for seq, (code, error) in enumerate(answers, start=1):
            assert code == 503 and error["code"] == "shutting_down"
            assert error["stored"] is True and error["message_seq"] == seq
        assert len(server.chat_requests) == 1
    sessions = json.loads((home / "contexts" / "sessions.json").read_text())["sessions"]
    run_dir = home / "contexts" / "running" / sessions["agent:main:main"]["run_id"]
    stored = [json.loads(x)["content"] for x in (run_dir / "messages.jsonl").read_text().splitlines()]
    assert stored == ["slow one", "waits"]
