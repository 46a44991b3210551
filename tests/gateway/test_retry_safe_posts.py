"""A post with a ``client_message_id`` costs what one without costs: on the files backend, a
store-only post writes nothing to tasks.db (the message is its own delivery record, checked in
memory), and a repeat is still answered with the first delivery's seq, stored once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.conftest import Client
from tests.gateway.helpers import make_app
from tests.support.postgres import DATABASE, PgServer, empty_database

MAIN = "/v1/sessions/agent%3Amain%3Amain"


async def _tasks_db_changes(client: Client) -> int:
    """Rows tasks.db's connection has written since it opened (SQLite's ``total_changes``)."""
    store = client.app[K.STORE]
    return int(await store.ledger.execute(lambda c: c.total_changes))


async def _post(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/messages", json=body)
    data: dict[str, Any] = await resp.json()
    assert resp.status == 200, data
    return data


@pytest.mark.parametrize("gateway_overrides", [{"session": {"reset": {"mode": "none"}}}])
async def test_store_only_posts_with_ids_write_nothing_to_tasks_db_and_repeats_store_nothing(
    client: Client,
) -> None:
    await _post(client, {"content": "opens the run", "client_message_id": "m-0"})
    before = await _tasks_db_changes(client)
    bodies = await asyncio.gather(
        *(_post(client, {"content": f"message {i}", "client_message_id": f"m-{i}"}) for i in range(1, 31))
    )
    assert await _tasks_db_changes(client) == before  # no lookup, no delivery record, no reply record
    seqs = {f"m-{i}": body["message_seq"] for i, body in enumerate(bodies, start=1)}
    assert sorted(seqs.values()) == list(range(2, 32))
    repeats = await asyncio.gather(
        *(_post(client, {"content": f"message {i}", "client_message_id": f"m-{i}"}) for i in (1, 7, 7, 30))
    )
    assert [body["message_seq"] for body in repeats] == [seqs["m-1"], seqs["m-7"], seqs["m-7"], seqs["m-30"]]
    assert repeats[0] == {**bodies[0], "events": repeats[0]["events"]}
    store = client.app[K.STORE]
    run = store.active_run("agent:main:main")
    lines = [json.loads(line) for line in (run.dir / "messages.jsonl").read_text().splitlines()]
    assert len(lines) == 31 and len({line["client_message_id"] for line in lines}) == 31


@pytest.fixture
async def pg_client(aiohttp_client: Any, postgres_server: PgServer, tmp_path: Path, clock: FakeClock) -> Client:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    overrides = {"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}
    result: Client = await aiohttp_client(
        make_app(tmp_path, clock, {**overrides, "session": {"reset": {"mode": "none"}}})
    )
    return result


async def test_on_postgres_the_append_answers_repeats_and_stores_each_id_once(pg_client: Client) -> None:
    """On PostgreSQL no lookup precedes the append once the key has a run: the append statement
    finds the repeats, and each is answered with its first delivery's seq."""
    first = await _post(pg_client, {"content": "opens the run", "client_message_id": "p-0"})
    assert pg_client.app[K.STORE].checks_deliveries("agent:main:main")
    bodies = await asyncio.gather(
        *(_post(pg_client, {"content": f"message {i % 10}", "client_message_id": f"p-{i % 10}"}) for i in range(1, 41))
    )
    by_id: dict[str, set[int]] = {}
    for i, body in enumerate(bodies, start=1):
        by_id.setdefault(f"p-{i % 10}", set()).add(body["message_seq"])
    assert by_id["p-0"] == {first["message_seq"]}
    assert all(len(seqs) == 1 for seqs in by_id.values())  # every retry got its first delivery's seq
    assert sorted(seq for seqs in by_id.values() for seq in seqs) == list(range(1, 11))
    later = await _post(pg_client, {"content": "message 3", "client_message_id": "p-3"})  # none in flight
    assert later["message_seq"] in by_id["p-3"] and later["reply"] is None
    run_id = first["run_id"]
    async with pg_client.get(f"/v1/runs/{run_id}/messages") as resp:
        stored = (await resp.json())["messages"]
    assert [m["seq"] for m in stored] == list(range(1, 11))
    assert len({m["client_message_id"] for m in stored}) == 10
