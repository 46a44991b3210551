"""Token usage per UTC day, agent and key (the ``UsageRecords`` capability): counted by
``add_usage`` on the day the call answered, grouped and filtered as ``GET /v1/usage`` asks, summed
for the daily budgets, and kept across a reopen."""

from __future__ import annotations

from datetime import date, timedelta
from typing import cast

import pytest

from sessions.protocol import UsageRecords
from sessions.usage import UsageQuery
from tests.conftest import FakeClock
from tests.sessions.conformance.support import KEY, Harness, start

pytestmark = pytest.mark.capability("UsageRecords")
BOB = "agent:main:dm:bob"


async def test_usage_is_counted_per_day_agent_and_key_and_survives_a_reopen(
    harness: Harness, clock: FakeClock
) -> None:
    store = await harness.open()
    first_day = clock().date()
    main = await start(store)
    await store.add_usage(main, {"input_tokens": 30, "output_tokens": 9, "cache_read_tokens": 4})
    await store.add_usage(main, {"input_tokens": 10, "output_tokens": 2})
    bob = await start(store, BOB)
    await store.add_usage(bob, {"input_tokens": 5, "output_tokens": 1})
    clock.advance(days=1)
    await store.add_usage(bob, {"input_tokens": 70, "output_tokens": 30, "cache_write_tokens": 3})
    second_day = first_day + timedelta(days=1)

    store = await harness.reopen()
    usage = cast(UsageRecords, store)
    rows = await usage.daily_usage()
    assert [(r["day"], r["agent"], r["key"], r["total_tokens"], r["calls"]) for r in rows] == [
        (first_day.isoformat(), "main", BOB, 6, 1),
        (first_day.isoformat(), "main", KEY, 51, 2),
        (second_day.isoformat(), "main", BOB, 100, 1),
    ]
    assert rows[1]["input_tokens"] == 40 and rows[1]["output_tokens"] == 11 and rows[1]["cache_read_tokens"] == 4
    assert rows[2]["cache_write_tokens"] == 3
    by_day = await usage.daily_usage(UsageQuery(by="day"))
    assert [(r["day"], r["agent"], r["key"], r["total_tokens"], r["calls"]) for r in by_day] == [
        (first_day.isoformat(), None, None, 57, 3),
        (second_day.isoformat(), None, None, 100, 1),
    ]
    by_agent = await usage.daily_usage(UsageQuery(by="agent", since=second_day))
    assert [(r["agent"], r["key"], r["total_tokens"]) for r in by_agent] == [("main", None, 100)]
    assert [r["total_tokens"] for r in await usage.daily_usage(UsageQuery(session_key=BOB, until=first_day))] == [6]
    assert await usage.daily_usage(UsageQuery(agent_id="helper")) == []
    assert await usage.daily_usage(UsageQuery(since=date(2000, 1, 1), until=first_day - timedelta(days=1))) == []

    assert await usage.tokens_spent(first_day.isoformat(), "main", KEY) == (57, 51)
    assert await usage.tokens_spent(second_day.isoformat(), "main", KEY) == (100, 0)
    assert await usage.tokens_spent(second_day.isoformat(), "helper", BOB) == (0, 0)
