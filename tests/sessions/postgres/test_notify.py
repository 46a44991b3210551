"""The payload of an event sent to the other gateway processes (``sessions.postgres.notify``):
whole when it fits the server's 8000 bytes, a reference for a larger message, cut otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import asyncpg
import pytest

from sessions.events import StoreEvent
from sessions.postgres import notify
from sessions.postgres.notify import MAX_PAYLOAD, EventRelay, encode, pack
from tests.support.postgres import PgServer


@contextlib.asynccontextmanager
async def relays(pg_dsn: str) -> AsyncIterator[tuple[asyncpg.Pool, EventRelay, EventRelay, list[StoreEvent]]]:
    """Two started relays on one database, as two processes have: the pool, the listener (its
    deliveries in the list), the sender."""
    pool = await asyncpg.create_pool(pg_dsn, min_size=0, max_size=2)
    got: list[StoreEvent] = []
    listener, sender = EventRelay(pool, pg_dsn, None), EventRelay(pool, pg_dsn, None)
    try:
        await listener.start()
        await sender.start()
        listener.deliver = got.append
        yield pool, listener, sender, got
    finally:
        await listener.close()
        await sender.close()
        await pool.close()


async def counted(sender: EventRelay, statements: int) -> None:
    """Wait until the sender has counted ``statements``: the listener can hear a notification
    (sent at the commit) before the sender's own ``execute`` returns and counts it."""
    async with asyncio.timeout(30):
        while sender.statements < statements:
            await asyncio.sleep(0.01)


def test_an_event_that_fits_goes_whole() -> None:
    event = {"type": "message", "key": "agent:main:main", "run_id": "r1", "seq": 3, "content": "会議"}
    assert json.loads(encode("p1", event)) == {"o": "p1", "e": event}
    assert "会議" in encode("p1", event)  # characters kept, not escaped: they count once against the size


def test_an_integer_beyond_64_bits_is_encoded_too() -> None:
    event = {"type": "tool", "key": "agent:main:main", "run_id": "r1", "result": 2**70}
    assert json.loads(encode("p1", event)) == {"o": "p1", "e": event}


def test_a_large_message_goes_as_a_reference_without_its_content() -> None:
    event = {
        "type": "message",
        "key": "agent:main:main",
        "run_id": "r1",
        "seq": 3,
        "role": "user",
        "content": "大" * 6000,
    }
    payload = encode("p1", event)
    assert len(payload.encode()) <= MAX_PAYLOAD
    data = json.loads(payload)
    assert data["ref"] is True and data["e"] == {k: v for k, v in event.items() if k != "content"}


def test_another_large_event_has_its_long_text_cut() -> None:
    event = {"type": "compaction", "key": "agent:main:main", "run_id": "r1", "summary": "x" * 20000, "tokens": 5}
    payload = encode("p1", event)
    assert len(payload.encode()) <= MAX_PAYLOAD
    data = json.loads(payload)["e"]
    assert data["truncated"] is True and data["tokens"] == 5 and data["summary"] == "x" * 500


async def test_the_relay_listens_again_after_its_connection_is_lost(postgres_server: PgServer) -> None:
    """A database restart or a terminated backend closes the LISTEN connection: the relay listens
    again by itself, and the other processes' events reach it once more."""
    async with relays(await postgres_server.database("neotask_notify")) as (pool, listener, sender, got):
        assert listener._conn is not None
        await pool.execute("SELECT pg_terminate_backend($1)", listener._conn.get_server_pid())
        async with asyncio.timeout(30):
            while listener.reconnects == 0:
                await asyncio.sleep(0.05)
        event = {"type": "message", "key": "agent:main:main", "run_id": "r1", "seq": 1, "content": "after"}
        sender.send(event)
        async with asyncio.timeout(30):
            while not got:
                await asyncio.sleep(0.05)
        assert got == [event]


def test_payloads_are_packed_into_arrays_under_the_size_limit() -> None:
    payloads = [encode("p1", {"type": "message", "seq": i, "content": "x" * 300}) for i in range(100)]
    packed = pack(payloads)
    assert 1 < len(packed) < 10
    assert all(len(p.encode()) < 8000 for p in packed)  # the server refuses 8000 bytes and more
    assert [item["e"]["seq"] for p in packed for item in json.loads(p)] == list(range(100))
    big = encode("p1", {"type": "message", "run_id": "r1", "seq": 1, "content": "x" * 7700})  # whole, nearly full
    assert len(big.encode()) <= MAX_PAYLOAD
    assert [len(json.loads(p)) for p in pack([big, payloads[0], big])] == [1, 1, 1]  # neither fits beside it
    assert all(len(p.encode()) < 8000 for p in pack([big, payloads[0], big]))
    half = next(p for n in range(1800, 2000) if len((p := encode("p1", {"seq": 2, "c": "é" * n})).encode()) >= 3949)
    two = pack([half, half])  # each just under half the limit: one array, brackets and comma over MAX_PAYLOAD
    assert len(two) == 1 and MAX_PAYLOAD < len(two[0].encode()) < 8000


async def test_events_sent_together_arrive_in_order_in_few_notifications(postgres_server: PgServer) -> None:
    """300 events emitted at once reach the other process in their order, and the server carries
    them in a few notifications, not one each (every listener reads every notification)."""
    pg_dsn = await postgres_server.database("neotask_notify_pack")
    seen: list[str] = []
    raw = await asyncpg.connect(pg_dsn)
    await raw.add_listener("neotask_events", lambda _c, _p, _ch, payload: seen.append(payload))
    try:
        async with relays(pg_dsn) as (_pool, _listener, sender, got):
            events = [{"type": "message", "key": f"k{i % 7}", "run_id": "r1", "seq": i, "content": "y" * 200}
                      for i in range(300)]  # fmt: skip
            for event in events:
                sender.send(event)
            async with asyncio.timeout(30):
                while len(got) < len(events):
                    await asyncio.sleep(0.05)
            assert got == events
            async with asyncio.timeout(30):  # the sender counts once its statement returns, which may
                while sender.sent < len(events):  # be after the other connections heard the NOTIFYs
                    await asyncio.sleep(0.05)
            async with asyncio.timeout(30):  # the raw listener hears them on a connection of its own
                while len(seen) < sender.notifications:
                    await asyncio.sleep(0.05)
            assert sender.sent == 300 and sender.notifications == len(seen) <= 20
            assert sender.received == 0  # its own notifications are skipped
    finally:
        await raw.close()


async def test_events_emitted_soon_after_a_statement_gather_into_the_next(
    postgres_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every NOTIFY statement wakes every listener, the sender's own included: under load the
    relay sends one statement per ``SEND_EVERY_S`` at most, and the events emitted meanwhile go
    in it, in order. The first event after a quiet moment goes out alone, at once."""
    monkeypatch.setattr(notify, "SEND_EVERY_S", 0.5)
    loop = asyncio.get_running_loop()
    async with relays(await postgres_server.database("neotask_notify_pace")) as (_pool, _listener, sender, got):
        events = [{"type": "message", "key": f"k{i % 3}", "run_id": "r1", "seq": i, "content": "z"} for i in range(21)]
        started = loop.time()  # statements start after it, at least SEND_EVERY_S apart
        sender.send(events[0])
        async with asyncio.timeout(30):
            while not got:
                await asyncio.sleep(0.01)
        await counted(sender, 1)
        assert sender.statements == 1
        for event in events[1:]:  # 20 events, 10 ms apart: one statement each before
            sender.send(event)
            await asyncio.sleep(0.01)
        elapsed = loop.time() - started
        async with asyncio.timeout(30):
            while len(got) < len(events):
                await asyncio.sleep(0.01)
        assert got == events
        # all but the last statement started before the last send, SEND_EVERY_S apart from the first
        assert sender.statements <= 2 + int(elapsed / notify.SEND_EVERY_S), (sender.statements, elapsed)


async def test_the_first_event_after_a_quiet_moment_is_not_held(
    postgres_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pacing holds only what follows a statement: with a 60 s window, a first event still arrives
    at once (a relay that waited before its first statement would take a minute)."""
    monkeypatch.setattr(notify, "SEND_EVERY_S", 60.0)
    async with relays(await postgres_server.database("neotask_notify_first")) as (_pool, _listener, sender, got):
        event = {"type": "message", "key": "k", "run_id": "r1", "seq": 1, "content": "first"}
        sender.send(event)
        async with asyncio.timeout(20):
            while not got:
                await asyncio.sleep(0.01)
        await counted(sender, 1)
        assert got == [event] and sender.statements == 1


async def test_a_reference_keeps_its_place_among_the_events_around_it(
    postgres_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message too large for a notification goes as a reference that the receiver reads from the
    store; the events after it wait for it, those of its own notification and those of a later one
    that arrives while it is being read, and every event is delivered in the order sent."""
    async with relays(await postgres_server.database("neotask_notify_ref")) as (pool, listener, sender, got):
        resolve = listener._resolve
        reading = asyncio.Event()

        async def slow_resolve(event: dict[str, Any]) -> dict[str, Any]:
            reading.set()
            await asyncio.sleep(0.5)  # the later notification arrives meanwhile
            return await resolve(event)

        monkeypatch.setattr(listener, "_resolve", slow_resolve)
        await pool.execute("CREATE TABLE messages (run_id text, seq bigint, record json, PRIMARY KEY (run_id, seq))")
        large = {"seq": 2, "role": "user", "content": "大" * 6000, "timestamp": "2026-12-02T10:00:00Z"}
        await pool.execute("INSERT INTO messages VALUES ('r1', 2, $1::json)", json.dumps(large, ensure_ascii=False))
        small = [{"type": "message", "key": "k", "run_id": "r1", "seq": i, "role": "user", "content": f"m{i}"}
                 for i in (1, 3, 4)]  # fmt: skip
        big = {"type": "message", "key": "k", "run_id": "r1", "seq": 2, "role": "user", "content": large["content"]}
        for event in (small[0], big):  # one statement: one packed notification, the reference last
            sender.send(event)
        async with asyncio.timeout(30):
            await reading.wait()
        for event in small[1:]:  # a second statement, heard while the reference is read (the inbox is empty)
            sender.send(event)
        async with asyncio.timeout(30):
            while len(got) < 4:
                await asyncio.sleep(0.01)
        assert [cast(dict[str, Any], e)["seq"] for e in got] == [1, 2, 3, 4]
        assert got[1] == big and got[0] == small[0] and got[2:] == small[1:]
        await counted(sender, 2)
        assert sender.statements == 2 and listener.received == 4
