"""Issue 24, item 2: the context a model sees puts each reply right after the messages it answered
and the messages that waited for a later turn after it; messages.jsonl keeps arrival order. The
order holds in every prompt the local model server records: after a restart of the store, after
current.jsonl is rebuilt from messages.jsonl at open, and after a compaction."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.conftest import FakeClock
from tests.conversations.test_queue_modes import MAIN, Client, bodies, burst, client_for, contents, transcript
from tests.support.openai_server import Hang, OpenAIServer, RecordedRequest, reply

Q1 = "q1: " + "tell me about the migration plan and its risks " * 8
ANSWERED_THEN_WAITING = [Q1, "a1", "q2", "q3", "echo: q3"]


def last_turn(server: OpenAIServer) -> RecordedRequest:
    return [r for r in server.chat_requests if "summary" not in r.system_text][-1]


async def reordered_session(client: Client, server: OpenAIServer) -> str:
    """q1 runs a turn that answers a1 once q2 and q3 are stored; one collected turn answers both.
    Seqs: q1 1, q2 2, q3 3, a1 4, the answer to q2 and q3 5. Returns the run id."""
    gate = asyncio.Event()
    server.script(Hang(30, until=gate, then=reply("a1")))
    first = asyncio.create_task(client.post(f"{MAIN}/messages", json={"content": Q1}))
    await server.wait_for_requests(1)
    rest = await burst(client, ["q2", "q3"])
    gate.set()
    answers = await bodies([first, *rest])
    assert [a["reply"]["seq"] for a in answers] == [4, 5, 5]
    assert contents(server.chat_requests[1]) == [Q1, "a1", "q2", "q3"]  # ends with the waiting question
    return str(answers[0]["run_id"])


async def context_of(client: Client) -> list[str]:
    lines = (await (await client.get(f"{MAIN}/context")).json())["messages"]
    return [str(line["content"]) for line in lines[1:]]  # after the system prompt


async def ask(client: Client, text: str) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/messages", json={"content": text})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def test_the_order_survives_a_restart_and_a_rebuild_of_current_jsonl(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)
    run_id = await reordered_session(client, openai_server)
    assert await context_of(client) == ANSWERED_THEN_WAITING
    await client.close()

    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)  # the store opens again
    await ask(client, "q4")
    assert contents(last_turn(openai_server)) == [*ANSWERED_THEN_WAITING, "q4"]
    await client.close()

    current = tmp_path / "contexts/running" / run_id / "current.jsonl"
    current.write_bytes(current.read_bytes().splitlines(keepends=True)[0])  # lost all but q1: rebuilt at open
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)
    await ask(client, "q5")
    assert contents(last_turn(openai_server)) == [*ANSWERED_THEN_WAITING, "q4", "echo: q4", "q5"]
    lines = transcript(tmp_path, run_id)
    assert [m["seq"] for m in lines] == list(range(1, 10))  # messages.jsonl: arrival order, seqs unchanged
    assert [m["content"] for m in lines[:5]] == [Q1, "q2", "q3", "a1", "echo: q3"]


async def test_a_compaction_never_cuts_between_a_reply_and_the_messages_placed_after_it(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    overrides = {"compaction": {"keep_recent": 3, "min_to_compress": 1}}
    client = await client_for(aiohttp_client, tmp_path, clock, openai_server, overrides)
    openai_server.add_rule(lambda r: reply("q1 asked about the plan") if "summar" in r.system_text else None)
    run_id = await reordered_session(client, openai_server)
    # keep_recent 3 of q1 a1 q2 q3 echo would cut after a1 (seqs 1 and 4): q2 and q3 (2, 3) would be
    # below the summarized range's end and dropped; the cut moves back to a seq range, q1 alone
    compacted = await client.post(f"{MAIN}/commands", json={"command": "/compact"})
    assert compacted.status == 200, await compacted.text()
    summaries = (tmp_path / "contexts/running" / run_id / "summaries.jsonl").read_text().splitlines()
    record = json.loads(summaries[-1])
    assert (record["start_seq"], record["end_seq"]) == (1, 1)
    after_compaction = await context_of(client)
    assert after_compaction[1:] == ANSWERED_THEN_WAITING[1:]
    await client.close()

    client = await client_for(aiohttp_client, tmp_path, clock, openai_server)
    assert await context_of(client) == after_compaction
    await ask(client, "q4")
    turn = contents(last_turn(openai_server))
    assert turn[1:] == [*ANSWERED_THEN_WAITING[1:], "q4"] and Q1 not in turn
