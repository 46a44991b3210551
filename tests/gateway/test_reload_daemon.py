"""Live reload with a real daemon (issue 29 item 3): SIGHUP with a changed model, a new agent and
binding, then a bad file; ``neotask config reload`` with a key that needs a restart and with a bad
file. A server-sent events connection held across every reload stays open and keeps delivering."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.daemons import Daemon, _reap, child_env, run_cli, start_daemon
from tests.support.openai_server import OpenAIServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.realtime]

START_S = 120.0
ENV = child_env()
MAIN = "agent%3Amain%3Amain"


def config(base_url: str, model: str, *, helper: bool = False, port: int | None = None) -> str:
    lines = ["agents:", "  main:", f"    model: {{base_url: '{base_url}', name: {model}}}"]
    if helper:
        lines += ["  helper: {}", "bindings: [{channel: telegram, chat_id: '-100', agent: helper}]"]
    if port is not None:
        lines += [f"gateway: {{port: {port}}}"]
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def daemon(home: Path) -> AsyncIterator[Daemon]:
    started = await start_daemon(home, env=ENV, wait=False)
    try:
        await started.wait_listening(timeout=START_S)
        yield started
    finally:
        await _reap(started.proc)


async def wait_log(live: Daemon, text: str, count: int = 1) -> None:
    async with asyncio.timeout(30):
        while live.stderr().count(text) < count:
            await asyncio.sleep(0.05)


async def collect(response: aiohttp.ClientResponse, events: list[dict[str, Any]]) -> None:
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data:"):
            events.append(json.loads(line[5:]))


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


async def test_sighup_reloads_without_dropping_a_connection(tmp_path: Path, openai_server: OpenAIServer) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    cfg = home / "config.yaml"
    cfg.write_text(config(openai_server.base_url, "model-a"))
    events: list[dict[str, Any]] = []
    async with daemon(home) as live, aiohttp.ClientSession() as session:
        stream = await session.get(f"{live.url}/v1/events", timeout=aiohttp.ClientTimeout(total=None))
        assert stream.status == 200
        reader = asyncio.create_task(collect(stream, events))
        messages = f"{live.url}/v1/sessions/{MAIN}/messages"
        await post(session, messages, {"content": "one"})
        assert openai_server.chat_requests[-1].body["model"] == "model-a"

        cfg.write_text(config(openai_server.base_url, "model-b", helper=True))  # a changed model, a new binding
        live.send(signal.SIGHUP)
        await wait_log(live, "config reload (SIGHUP)")
        await post(session, messages, {"content": "two"})
        assert openai_server.chat_requests[-1].body["model"] == "model-b"
        routed = await post(
            session,
            f"{live.url}/v1/messages",
            {"channel": "telegram", "chat_type": "group", "chat_id": "-100", "sender_id": "u1", "text": "hi"},
        )
        assert routed["session_key"] == "agent:helper:telegram:group:-100"

        cfg.write_text("agents: {main: {model: {nmae: typo}}}\n")  # a bad file: nothing changes
        live.send(signal.SIGHUP)
        await wait_log(live, "refused")
        assert "nmae" in live.stderr()
        async with session.get(f"{live.url}/v1/admin/config") as resp:
            shown = await resp.json()
        assert shown["settings"]["agents"]["main"]["model"]["name"] == "model-b" and shown["reloads"] == 1
        assert "helper" in shown["settings"]["agents"]

        cfg.write_text(config(openai_server.base_url, "model-c", helper=True, port=1))
        done = await run_cli("config", "reload", "--home", str(home), "--json", env=ENV)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["restart_required"] == ["gateway.port"] and "agents.main.model.name" in answer["changed"]
        cfg.write_text("session: {dm_scope: everyone}\n")
        refused = await run_cli("config", "reload", "--home", str(home), env=ENV)
        assert refused.returncode == 1 and "dm_scope" in refused.stderr and "nothing changed" in refused.stderr

        await post(session, messages, {"content": "three"})
        assert openai_server.chat_requests[-1].body["model"] == "model-c"
        async with asyncio.timeout(10):
            while not any(e.get("content") == "three" for e in events):
                await asyncio.sleep(0.05)
        assert not reader.done() and not stream.closed  # the stream held across three reloads
        contents = [e.get("content") for e in events if e.get("type") == "message"]
        assert {"one", "two", "three"} <= set(contents)
        stream.close()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await reader
        assert await live.stop() == 0
