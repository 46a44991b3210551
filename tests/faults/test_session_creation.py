"""Issue 10 item 12: a new session does not rewrite sessions.json (the rewrite is coalesced like
appends; the run folder and tasks.db are the durable truth), and a kill -9 before the coalesced
rewrite loses no session. The cost ratio itself is measured by ``bench.session_creation``."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import pytest

from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.faults.ops_support import call, write_config
from tests.gateway.daemons import daemon
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

KEYS = [f"agent:main:dm:peer{i}" for i in range(30)]


async def test_new_runs_do_not_rewrite_sessions_json_each(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock, {"storage": {"sessions_flush_ms": 60_000}})
    try:
        before = store.registry.rewrites
        for key in KEYS:
            run = await start(store, key)
            await store.append(run, NewMessage(role="user", content="hello"))
        assert store.registry.rewrites == before  # not one rewrite per new run: coalesced
        assert store.registry.pending
    finally:
        await store.close()
    assert store.registry.rewrites == before + 1  # one rewrite holds them all
    reopened = await open_store(tmp_path, clock)
    try:
        assert {e.key for e in reopened.entries() if e.run_id} == set(KEYS)
    finally:
        await reopened.close()


@pytest.mark.slow
async def test_kill_before_the_coalesced_rewrite_loses_no_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = write_config(tmp_path / "config.yaml", {"storage": {"sessions_flush_ms": 600_000}})
    created: dict[str, str] = {}
    async with daemon(home, "--config", str(config)) as gw, aiohttp.ClientSession() as http:
        await call(http, "GET", f"{gw.url}/healthz")
        for key in KEYS[:10]:
            status, body = await call(http, "POST", f"{gw.url}/v1/sessions/{key}/messages", {"content": "hi"})
            assert status == 200, body
            created[key] = body["run_id"]
        gw.send(signal.SIGKILL)
        assert await gw.wait() == -signal.SIGKILL
    text = await asyncio.to_thread((home / "contexts" / "sessions.json").read_text)
    assert not any(run_id in text for run_id in created.values())  # never written before the kill
    async with daemon(home, "--config", str(config)) as gw, aiohttp.ClientSession() as http:
        for key, run_id in created.items():
            status, entry = await call(http, "GET", f"{gw.url}/v1/sessions/{key}")
            assert status == 200 and entry["run_id"] == run_id and entry["status"] == "running", entry
            status, page = await call(http, "GET", f"{gw.url}/v1/runs/{run_id}/messages")
            assert [m["content"] for m in page["messages"]] == ["hi"]
        assert await gw.stop() == 0
