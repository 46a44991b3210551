"""The composition root (``gateway/services.py``): one object graph whose hooks are connected in
one place, the timers only when asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

from conversations.events import Event
from conversations.turns import Post
from gateway import operations
from gateway.services import Parts, open_services
from sessions.keys import parse_key
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.gateway.helpers import gateway_config


async def test_without_timers_a_reset_writes_the_final_summary_and_its_events_reach_the_hub(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = gateway_config(tmp_path)
    key = parse_key("agent:main:main", agents=config.settings.agents)
    async with open_services(config, clock=clock, parts=Parts(memory=False, timers=False)) as services:
        assert services.scheduler.ready is False  # no APScheduler without timers
        assert services.memory is None and services.memory_ready is None
        message = NewMessage(role="user", content="the sky is teal")
        stored = await services.conversations.post(Post(key=key, message=message))
        outcome = await operations.run_command(services.commands, key, "/reset")
        assert any(e["type"] == "reset" and e["previous_run_id"] == stored.run_id for e in outcome.events)
        # run_end writes the final summary (Conversations.final_summary: extractive without a model)
        summary = tmp_path / "contexts" / "completed" / str(stored.run_id) / "final_summary.txt"
        assert "the sky is teal" in summary.read_text()
        entry = services.store.entry(key.raw)
        assert entry is not None and entry.inherit_next
        # the store's listeners hook reaches the event hub
        replay = cast(AsyncGenerator[Event | None], services.hub.subscribe(key=None, last_event_id=0, heartbeat_s=60))
        first = await anext(replay)
        assert first is not None and first.data["type"] == "lifecycle" and first.data["action"] == "start"
        await replay.aclose()
    assert key.raw in json.loads((tmp_path / "contexts" / "sessions.json").read_text())["sessions"]


async def test_with_timers_the_scheduler_runs_until_close(tmp_path: Path, clock: FakeClock) -> None:
    async with open_services(gateway_config(tmp_path), clock=clock, parts=Parts(memory=False)) as services:
        assert services.scheduler.ready is True
        scheduler = services.scheduler
    assert scheduler.ready is False
