"""Every way a run ends goes through ``conversations/run_end.py``: ``/new``, ``/reset``, the daily
and idle resets, cleanup, a cron job, the lifecycle routes, deleting a session and the
OpenAI-compatible routes (a diverged history, a stateless call). Each ends the run once, with one
``reset`` event of one shape on the event hub, and (but for a one-off run) a final summary."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from conversations.events import EventHub
from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"
SHAPE = {"type", "key", "run_id", "at", "reason", "previous_run_id", "boundary", "command"}
NO_RESETS = {"session": {"reset": {"mode": "none"}}}
DAILY = {"session": {"reset": {"mode": "daily", "at_hour": 4, "timezone": "UTC", "defer_if_active_minutes": 0}}}
OPENAI = {**NO_RESETS, "gateway": {"openai_compat": {"enabled": True}}}
CRON = {**NO_RESETS, "cron": {"jobs": [{"id": "digest", "schedule": "0 9 * * *", "message": "digest please",
                                        "isolated": True}]}}  # fmt: skip


async def stored(client: Client, text: str) -> str:
    resp = await client.post(f"{MAIN}/messages", json={"content": text})
    assert resp.status == 200, await resp.text()
    run_id: str = (await resp.json())["run_id"]
    return run_id


async def by_command(client: Client, clock: FakeClock, command: str) -> str:
    run_id = await stored(client, "the sky is teal")
    resp = await client.post(f"{MAIN}/messages", json={"content": command})
    assert resp.status == 200, await resp.text()
    assert [e["type"] for e in (await resp.json())["events"]] == ["reset"]
    return run_id


async def new(client: Client, clock: FakeClock) -> str:
    return await by_command(client, clock, "/new")


async def reset(client: Client, clock: FakeClock) -> str:
    return await by_command(client, clock, "/reset")


async def daily(client: Client, clock: FakeClock) -> str:
    run_id = await stored(client, "the sky is teal")
    clock.set(datetime(2026, 11, 30, 4, 10, tzinfo=UTC))
    assert await client.app[K.SCHEDULING].sweep() == 1
    return run_id


async def idle(client: Client, clock: FakeClock) -> str:
    run_id = await stored(client, "the sky is teal")
    clock.advance(minutes=2)
    assert await client.app[K.SCHEDULING].sweep() == 1
    return run_id


async def cleanup(client: Client, clock: FakeClock) -> str:
    run_id = await stored(client, "the sky is teal")
    clock.advance(days=2)
    resp = await client.post("/v1/admin/cleanup", json={})
    assert resp.status == 200, await resp.text()
    return run_id


async def cron(client: Client, clock: FakeClock) -> str:
    scheduling = client.app[K.SCHEDULING]
    outcome = await scheduling.run_cron(scheduling.settings.cron.jobs[0])
    assert outcome.status == "stored" and outcome.body is not None
    return str(outcome.body["run_id"])


async def by_route(client: Client, clock: FakeClock, action: str) -> str:
    run_id = await stored(client, "the sky is teal")
    resp = await (client.delete(MAIN) if action == "delete" else client.post(f"{MAIN}/{action}"))
    assert resp.status == 200, await resp.text()
    return run_id


async def complete(client: Client, clock: FakeClock) -> str:
    return await by_route(client, clock, "complete")


async def fail(client: Client, clock: FakeClock) -> str:
    return await by_route(client, clock, "fail")


async def delete(client: Client, clock: FakeClock) -> str:
    return await by_route(client, clock, "delete")


async def chat(client: Client, messages: list[dict[str, str]], **fields: str) -> dict[str, str]:
    resp = await client.post("/v1/chat/completions", json={"model": "main", "messages": messages, **fields})
    assert resp.status == 200, await resp.text()
    return dict(resp.headers)


async def diverged(client: Client, clock: FakeClock) -> str:
    first = await chat(client, [{"role": "user", "content": "one"}], user="dave")
    edited = [{"role": "user", "content": "ONE (edited)"}, {"role": "assistant", "content": "echo: one"},
              {"role": "user", "content": "two"}]  # fmt: skip
    again = await chat(client, edited, user="dave")
    assert again["X-Neotask-New-Run"] == "diverged"
    return first["X-Neotask-Run-Id"]


async def stateless(client: Client, clock: FakeClock) -> str:
    headers = await chat(client, [{"role": "user", "content": "once"}])
    return headers["X-Neotask-Run-Id"]


Path_ = Callable[[Client, FakeClock], Awaitable[str]]
PATHS: list[tuple[Path_, dict[str, Any], str, str | None]] = [  # how, config, reason, command
    (new, NO_RESETS, "command", "/new"),
    (reset, NO_RESETS, "command", "/reset"),
    (daily, DAILY, "daily", None),
    (idle, {"session": {"reset": {"mode": "idle", "idle_minutes": 1}}}, "idle", None),
    (cleanup, {**NO_RESETS, "cleanup": {"retention_days": 1}}, "cleanup", None),
    (cron, CRON, "cron", None),
    (complete, NO_RESETS, "complete", None),
    (fail, NO_RESETS, "fail", None),
    (delete, NO_RESETS, "delete", None),
    (diverged, OPENAI, "openai-diverged", None),
    (stateless, OPENAI, "openai-stateless", None),
]


async def collect(hub: EventHub, into: list[dict[str, Any]]) -> None:
    async for event in hub.subscribe(key=None, last_event_id=None, heartbeat_s=60):
        if event is not None and event.data["type"] == "reset":
            into.append(dict(event.data))


@pytest.mark.parametrize(("how", "overrides", "reason", "command"), PATHS, ids=[p[0].__name__ for p in PATHS])
async def test_every_way_a_run_ends_is_one_operation_with_one_event_shape(
    aiohttp_client: Any,
    tmp_path: Path,
    clock: FakeClock,
    openai_server: OpenAIServer,
    how: Path_,
    overrides: dict[str, Any],
    reason: str,
    command: str | None,
) -> None:
    clock.set(datetime(2026, 11, 30, 3, 30, tzinfo=UTC))
    base_url = None if how is cron else openai_server.base_url  # a cron job without a model: stored
    client: Client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=base_url))
    resets: list[dict[str, Any]] = []
    listening = asyncio.create_task(collect(client.app[K.SERVICES].hub, resets))
    await asyncio.sleep(0)
    try:
        run_id = await how(client, clock)
        async with asyncio.timeout(10):
            while not resets:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a second reset event for the same end would arrive now
    finally:
        listening.cancel()
    assert len(resets) == 1, resets
    event = resets[0]
    assert set(event) == SHAPE
    assert (event["run_id"], event["previous_run_id"]) == (run_id, run_id)
    assert (event["reason"], event["command"]) == (reason, command)
    assert (event["boundary"] is not None) is (how is daily)
    summary = await client.app[K.STORE].read_final_summary(run_id)
    assert (summary is None) is (how is stateless), summary  # a one-off run: nothing inherits it
