"""Events and records (issue 13, items 5-9), through the app against the local model server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply, server_error, tool_call

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"


async def next_event(stream: ClientResponse, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            line = (await stream.content.readline()).decode().strip()
            if line.startswith("data: "):
                event: dict[str, Any] = json.loads(line[6:])
                if event["type"] == kind:
                    return event


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def test_reset_command_emits_reset_and_inheritance_names_both_runs(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    stream = await client.get("/v1/events?key=agent%3Amain%3Amain")
    first = await (await client.post(f"{MAIN}/messages", json={"content": "remember the blue door"})).json()
    await (await client.post(f"{MAIN}/commands", json={"command": "/reset"})).json()
    reset = await next_event(stream, "reset")
    assert reset["run_id"] == reset["previous_run_id"] == first["run_id"]
    assert reset["reason"] == "command" and reset["command"] == "/reset"
    second = await (await client.post(f"{MAIN}/messages", json={"content": "what door?"})).json()
    inherited = await next_event(stream, "inheritance")
    assert inherited["run_id"] == second["run_id"] != first["run_id"]
    assert inherited["from_run_id"] == first["run_id"]
    in_reply = [e for e in second["events"] if e["type"] == "inheritance"]
    assert in_reply and in_reply[0]["from_run_id"] == first["run_id"]
    stream.close()


async def test_events_with_a_bad_key_answer_400_invalid_key(aiohttp_client: Any, tmp_path: Path,
                                                            clock: FakeClock) -> None:  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock))
    resp = await client.get("/v1/events?key=bad:key")
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_key"


async def command(client: Client, text: str) -> dict[str, Any]:
    resp = await client.post(f"{MAIN}/commands", json={"command": text})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def context_seqs(client: Client) -> list[Any]:
    return [m.get("seq") for m in (await (await client.get(f"{MAIN}/context")).json())["messages"][1:]]


async def test_compaction_archives_are_named_by_summary_id_and_never_overwritten(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    run_id = ""
    for batch in range(3):
        for i in range(16):
            body = await (
                await client.post(f"{MAIN}/messages", json={"content": f"batch {batch} note {i} " * 20})
            ).json()
            run_id = body["run_id"]
        if batch < 2:
            assert (await command(client, "/compact"))["events"][-1]["type"] == "compaction"
    folder = tmp_path / "contexts/running" / run_id / "compactions"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(before) == ["1.jsonl", "2.jsonl"]
    after_two = await context_seqs(client)
    assert "before compaction 2" in (await command(client, "/uncompact"))["reply"]["content"]
    after_undo = await context_seqs(client)
    assert (await command(client, "/compact"))["events"][-1]["type"] == "compaction"  # summary id 4
    now = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(now) == ["1.jsonl", "2.jsonl", "4.jsonl"]
    assert now["1.jsonl"] == before["1.jsonl"] and now["2.jsonl"] == before["2.jsonl"]
    records = jsonl(folder.parent / "summaries.jsonl")
    assert [(r["type"], r["id"], r.get("archive")) for r in records] == [
        ("compaction", 1, "compactions/1.jsonl"),
        ("compaction", 2, "compactions/2.jsonl"),
        ("uncompact", 3, "compactions/2.jsonl"),
        ("compaction", 4, "compactions/4.jsonl"),
    ]
    await command(client, "/uncompact")  # undoes summary 4, from 4.jsonl
    assert await context_seqs(client) == after_undo != after_two
    await command(client, "/uncompact")  # undoes summary 1, from 1.jsonl
    assert (await context_seqs(client))[0] == 1
    assert jsonl(folder.parent / "summaries.jsonl")[-1]["reverts_id"] == 1


def summary_rule(request: RecordedRequest) -> Any:
    if "compress a conversation" in request.system_text or "final summary" in request.system_text:
        return reply("MODEL SUMMARY")
    return None


def flushes(server: OpenAIServer) -> list[RecordedRequest]:
    return [r for r in server.chat_requests if "about to be compacted" in r.last_user_text]


async def test_runs_start_with_the_seed_layout_and_summarizer_calls_are_recorded_as_tools(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(summary_rule)
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    first = await (await client.post(f"{MAIN}/messages", json={"content": "hello", "reply": False})).json()
    folder = tmp_path / "contexts/running" / first["run_id"]
    for name in ("messages.jsonl", "current.jsonl", "summaries.jsonl", "tools.jsonl", "planning.jsonl"):
        assert (folder / name).is_file(), name
    for i in range(16):
        await client.post(
            f"{MAIN}/messages", json={"content": f"step {i}: " + "we chose the plan " * 10, "reply": False}
        )
    compacted = await command(client, "/compact")
    assert compacted["events"][-1]["summarizer"] == "llm:test-model"
    await command(client, "/reset")
    done = tmp_path / "contexts/completed" / first["run_id"]
    calls = [t for t in jsonl(done / "tools.jsonl") if t["tool_name"] == "summarizer"]
    assert [c["kind"] for c in calls] == ["compaction", "final_summary"]
    for call in calls:
        assert call["model"] == "test-model" and call["error"] is None and call["duration_ms"] >= 0
        assert call["input_tokens"] > 0 and call["output_tokens"] > 0 and call["calls"] == 1
        assert call["result"]["summarizer"] == "llm:test-model"


async def test_compact_says_when_the_model_failed_and_the_extractive_summary_was_used(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(lambda r: server_error(500) if "compress a conversation" in r.system_text else None)
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    run_id = ""
    for i in range(16):
        body = await client.post(
            f"{MAIN}/messages", json={"content": f"step {i}: " + "ticket 4411 " * 12, "reply": False}
        )
        run_id = (await body.json())["run_id"]
    answer = (await command(client, "/compact"))["reply"]["content"]
    assert "The model failed to summarize (test-model: http" in answer
    assert "extractive summary was used" in answer and "Compacted messages" in answer
    tools = jsonl(tmp_path / "contexts/running" / run_id / "tools.jsonl")
    failed = [t for t in tools if t["tool_name"] == "summarizer"][-1]
    assert failed["error"].startswith("http") and failed["result"]["summarizer"] == "extractive"


async def test_compact_on_a_short_session_does_not_flush_memory(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    openai_server.add_rule(summary_rule)
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    for i in range(3):
        await client.post(f"{MAIN}/messages", json={"content": f"short {i}", "reply": False})
    answer = (await command(client, "/compact"))["reply"]["content"]
    assert answer.startswith("Nothing to compact yet") and "would not be shorter" not in answer
    assert flushes(openai_server) == []
    for i in range(16):
        await client.post(f"{MAIN}/messages", json={"content": f"long {i}: " + "details " * 20, "reply": False})
    assert "Compacted messages" in (await command(client, "/compact"))["reply"]["content"]
    assert len(flushes(openai_server)) == 1


@pytest.mark.slow  # memory_append indexes the daily log: the embedding model loads
async def test_memory_append_refuses_a_nothing_to_save_line(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    openai_server.script(
        tool_call("memory_append", {"text": "Nothing to save."}),
        tool_call("memory_append", {"text": "The user's door is blue."}),
    )
    body = await (await client.post(f"{MAIN}/messages", json={"content": "my door is blue"})).json()
    tools = jsonl(tmp_path / "contexts/running" / body["run_id"] / "tools.jsonl")
    appends = [t for t in tools if t["tool_name"] == "memory_append"]
    assert appends[0]["error"].startswith("that says there is nothing to save") and appends[1]["error"] is None
    logs = list((tmp_path / "workspaces/main/memory").glob("*.md"))
    assert len(logs) == 1 and "Nothing to save" not in logs[0].read_text()
    assert "The user's door is blue." in logs[0].read_text()


async def test_a_sessions_json_rebuild_keeps_label_settings_and_pin(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    await client.post(f"{MAIN}/messages", json={"content": "hello"})
    patch = {"pinned": True, "label": "Project X", "settings": {"model": "m2", "queue_mode": "followup"}}
    assert (await client.patch(MAIN, json=patch)).status == 200
    other = "/v1/sessions/agent%3Amain%3Adm%3Abob"
    await client.post(f"{other}/messages", json={"content": "hi"})
    await client.patch(other, json={"label": "Bob"})
    await command(client, "/reset")  # main is idle now: its label lives on through tasks.db
    await client.post(f"{other}/messages", json={"content": "a second run of bob"})  # bob: the label reaches new runs
    await client.close()
    (tmp_path / "contexts/sessions.json").unlink()
    client = await aiohttp_client(make_app(tmp_path, clock))
    main = await (await client.get(MAIN)).json()
    assert (main["label"], main["pinned"], main["settings"]) == ("Project X", True, patch["settings"])
    assert main["status"] == "idle"
    bob = await (await client.get(other)).json()
    assert bob["label"] == "Bob" and bob["run_id"] is not None


async def test_delete_ends_inheritance(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    first = await (await client.post(f"{MAIN}/messages", json={"content": "secret plan"})).json()
    assert (await client.delete(MAIN)).status == 200
    again = await (await client.post(f"{MAIN}/messages", json={"content": "fresh"})).json()
    assert again["run_id"] != first["run_id"]
    assert not [e for e in again["events"] if e["type"] == "inheritance"]
    lines = jsonl(tmp_path / "contexts/running" / again["run_id"] / "messages.jsonl")
    assert [m["content"] for m in lines] == ["fresh"]
    await command(client, "/reset")  # a reset after the delete still inherits, from the new session
    third = await (await client.post(f"{MAIN}/messages", json={"content": "later"})).json()
    assert [e["run_id"] for e in third["events"] if e["type"] == "inheritance"] == [again["run_id"]]


async def test_isolated_cron_firings_inherit_only_when_asked(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    jobs = [
        {"id": "plain", "schedule": "*/5 * * * *", "message": "tick", "isolated": True},
        {"id": "chain", "schedule": "*/5 * * * *", "message": "tick", "isolated": True, "inherit": True},
    ]
    client = await aiohttp_client(make_app(tmp_path, clock, {"cron": {"jobs": jobs}}))
    for job in ("plain", "chain"):
        for _ in range(2):
            assert (await client.post(f"/v1/scheduler/jobs/cron%3A{job}/run")).status == 200
            clock.advance(minutes=5)
    plain = (await (await client.get("/v1/runs?key=cron%3Aplain")).json())["runs"]
    chain = (await (await client.get("/v1/runs?key=cron%3Achain")).json())["runs"]
    assert [r["parent_uuid"] for r in plain] == [None, None]
    newest, oldest = chain  # newest first
    assert oldest["parent_uuid"] is None and newest["parent_uuid"] == oldest["uuid"]
