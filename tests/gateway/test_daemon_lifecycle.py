"""Real daemon processes for what only a process shows: an idle reset done by the scheduler's own
sweep, and SIGKILL in the middle of a compaction."""

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
from tests.support.openai_server import Hang, OpenAIServer, RecordedRequest

MAIN = "/v1/sessions/agent%3Amain%3Amain"
pytestmark = [pytest.mark.slow, pytest.mark.realtime]


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


async def get(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def test_idle_reset_by_the_sweep_of_a_real_daemon(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = write_config(
        tmp_path / "config.yaml",
        {"session": {"reset": {"mode": "idle", "idle_minutes": 0.02}}, "scheduler": {"sweep_seconds": 0.3}},
    )
    async with daemon(home, "--config", str(config)) as gw, aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}{MAIN}/messages", json={"content": "hello"}) as resp:
            first = await resp.json()
        for _ in range(100):
            entry = await get(http, f"{gw.url}{MAIN}")
            if entry["run_id"] is None:
                break
            await asyncio.sleep(0.1)
        assert entry["run_id"] is None and entry["status"] == "idle" and entry["last_run_id"] == first["run_id"]
        run = await get(http, f"{gw.url}/v1/runs/{first['run_id']}")
        assert run["status"] == "completed"
        final = await get(http, f"{gw.url}/v1/runs/{first['run_id']}/final-summary")
        assert "hello" in final["final_summary"]
        async with http.post(f"{gw.url}{MAIN}/messages", json={"content": "again"}) as resp:
            second = await resp.json()
        assert [e["run_id"] for e in second["events"] if e["type"] == "inheritance"] == [first["run_id"]]
        assert await gw.stop() == 0


async def test_sigkill_during_a_compaction_leaves_a_valid_context(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as server:

        def hang_summaries(request: RecordedRequest) -> Any:
            return Hang(60) if "compress a conversation" in request.system_text else None

        server.add_rule(hang_summaries)
        config = write_config(
            tmp_path / "config.yaml",
            {
                "agents": {"main": {"model": {"base_url": server.base_url, "name": "m", "max_retries": 0}}},
                "compaction": {"token_threshold": 1500, "memory_flush": {"enabled": False}},
            },
        )
        async with daemon(home, "--config", str(config)) as gw, aiohttp.ClientSession() as http:
            posted: list[dict[str, Any]] = []
            pending: asyncio.Task[Any] | None = None
            for i in range(40):
                body = {"content": f"note {i}: " + "details " * 30, "reply": False}
                request = asyncio.create_task(http.post(f"{gw.url}{MAIN}/messages", json=body))
                done, _ = await asyncio.wait({request}, timeout=2)
                if not done:  # this append crossed the threshold and its compaction is summarizing
                    pending = request
                    break
                async with request.result() as resp:
                    posted.append(await resp.json())
            assert pending is not None, "the threshold was never reached"
            await server.wait_for_requests(1)
            gw.send(signal.SIGKILL)
            await gw.wait()
            pending.cancel()

        run_dir = home / "contexts/running" / posted[0]["run_id"]
        acknowledged = len(posted) + 1  # the message whose compaction was cut short was durable first
        async with daemon(home) as again, aiohttp.ClientSession() as http:
            context = await get(http, f"{again.url}{MAIN}/context")
            seqs = [m["seq"] for m in context["messages"][1:]]
            assert seqs == list(range(1, acknowledged + 1)), "the old context, whole"
            assert not (run_dir / "summaries.jsonl").exists() or (run_dir / "summaries.jsonl").read_text() == ""
            async with http.post(f"{again.url}{MAIN}/commands", json={"command": "/compact"}) as resp:
                compacted = await resp.json()
            assert "Compacted" in compacted["reply"]["content"], compacted
            summaries = [json.loads(x) for x in (run_dir / "summaries.jsonl").read_text().splitlines()]
            assert [s["compaction_count"] for s in summaries] == [1]
            assert await again.stop() == 0
