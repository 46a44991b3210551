"""A post with a ``client_message_id`` costs what one without costs: on the files backend, a
store-only post writes nothing to tasks.db (the message is its own delivery record, checked in
memory), and a repeat is still answered with the first delivery's seq, stored once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway import keys as K
from tests.gateway.conftest import Client

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
