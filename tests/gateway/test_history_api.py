"""History over HTTP: search (filters, cursor, errors), the index rebuilt at start and following
cleanup, export of sessions and runs (JSON Lines and Markdown, archived runs too), and purge that
leaves no trace of the conversation anywhere in the home."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient

from gateway.keys import HISTORY
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app, tree_digest

Client = TestClient[Any, Any]
KEY = "agent:main:main"
GROUP = "agent:main:telegram:group:g1"


def k(key: str) -> str:
    return quote(key, safe="")


async def post(client: Client, key: str, content: str, **extra: Any) -> dict[str, Any]:
    resp = await client.post(f"/v1/sessions/{k(key)}/messages", json={"content": content, **extra})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


def compact_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in body["events"] if e["type"] == "compaction"]


async def flushed(client: Client) -> None:
    await client.app[HISTORY].flush()


async def test_search_finds_messages_of_active_completed_and_archived_runs(client: Client, clock: FakeClock) -> None:
    first = await post(client, KEY, "We decided to ship the parser on Friday")
    await post(client, KEY, "/status")
    await post(client, KEY, "parser tool says ok", role="tool", tool_call_id="c1")
    assert (await client.post(f"/v1/sessions/{k(KEY)}/complete")).status == 200
    clock.advance(days=40)
    cleanup = await client.post("/v1/admin/cleanup", json={"dry_run": False})
    assert any(a["action"] == "archive" and a["done"] for a in (await cleanup.json())["actions"])
    second = await post(client, KEY, "明日の会議で予算を決めます")
    await post(client, GROUP, "the parser is late again")
    await flushed(client)
    resp = await client.get("/v1/history/search", params={"q": "parser"})
    assert resp.status == 200
    results = (await resp.json())["results"]
    assert {(r["session_key"], r["seq"]) for r in results} == {(KEY, 1), (KEY, 4), (GROUP, 1)}
    by_seq = {r["seq"]: r for r in results if r["session_key"] == KEY}
    assert by_seq[1]["run_id"] == first["run_id"] and "<mark>parser</mark>" in by_seq[1]["snippet"]
    assert by_seq[4]["tool_result"] is True and by_seq[1]["tool_result"] is False
    assert by_seq[1]["link"] == f"/ui#/run/{first['run_id']}?seq=1"
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    # the archived run's message is readable where the link points
    messages = await client.get(f"/v1/runs/{first['run_id']}/messages")
    assert (await messages.json())["messages"][0]["content"].startswith("We decided")
    japanese = (await (await client.get("/v1/history/search", params={"q": "予算"})).json())["results"]
    assert [(r["run_id"], r["seq"]) for r in japanese] == [(second["run_id"], 1)]
    status = (await (await client.get("/v1/history/search", params={"q": "status"})).json())["results"]
    assert status == []  # commands and their answers are not indexed
    only_group = await client.get("/v1/history/search", params={"q": "parser", "key": GROUP})
    assert [r["session_key"] for r in (await only_group.json())["results"]] == [GROUP]
    tools = await client.get("/v1/history/search", params={"q": "parser", "role": "tool"})
    assert [r["seq"] for r in (await tools.json())["results"]] == [4]
    page = await (await client.get("/v1/history/search", params={"q": "parser", "limit": "2"})).json()
    rest = await (await client.get("/v1/history/search", params={"q": "parser", "cursor": page["next_cursor"]})).json()
    assert len(page["results"]) == 2 and len(rest["results"]) == 1 and rest["next_cursor"] is None


@pytest.mark.parametrize(
    ("params", "code", "field"),
    [
        ({}, "invalid_field", "q"),
        ({"q": "  ?! "}, "invalid_field", "q"),
        ({"q": "x", "agent": "nobody"}, "invalid_field", "agent"),
        ({"q": "x", "role": "robot"}, "invalid_field", "role"),
        ({"q": "x", "since": "yesterday"}, "invalid_field", "since"),
        # before year 1 or after 9999 in UTC: OverflowError, answered 500 before
        ({"q": "x", "since": "0001-01-01T00:00:00+01:00"}, "invalid_field", "since"),
        ({"q": "x", "until": "9999-12-31T23:59:59-01:00"}, "invalid_field", "until"),
        ({"q": "x", "limit": "0"}, "invalid_field", "limit"),
        ({"q": "x", "limit": "101"}, "invalid_field", "limit"),
        ({"q": "x", "cursor": "bogus!"}, "invalid_field", "cursor"),
        ({"q": "x", "key": "agent:ghost:main"}, "invalid_key", None),
    ],
)
async def test_bad_search_parameters(client: Client, params: dict[str, str], code: str, field: str | None) -> None:
    resp = await client.get("/v1/history/search", params=params)
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == code and body["error"]["request_id"]
    if field:
        assert body["error"]["field"] == field


@pytest.mark.parametrize(
    ("raw", "says"),
    [("a%FFb", "not valid UTF-8"), ("%FF", "not valid UTF-8"), ("hello%00world", "NUL")],
)
async def test_a_query_that_is_not_text_is_refused(client: Client, raw: str, says: str) -> None:
    """Searched as U+FFFD before (or told 'q is required' for %FF alone), as the memory search was."""
    resp = await client.get(f"/v1/history/search?q={raw}")
    body = await resp.json()
    assert resp.status == 400 and body["error"]["field"] == "q" and says in body["error"]["message"], body


async def test_history_disabled_answers_503(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"history": {"enabled": False}}))
    await post(client, KEY, "hello")
    resp = await client.get("/v1/history/search", params={"q": "hello"})
    assert resp.status == 503 and (await resp.json())["error"]["code"] == "history_disabled"
    assert not (tmp_path / "contexts" / "history.db").exists()


async def test_index_is_rebuilt_at_start_when_missing(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    await post(client, KEY, "remember the lighthouse")
    assert (await client.post(f"/v1/sessions/{k(KEY)}/complete")).status == 200
    await post(client, KEY, "second run lighthouse too")
    await client.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / "contexts" / f"history.db{suffix}").unlink(missing_ok=True)
    again = await aiohttp_client(make_app(tmp_path, clock))
    results: list[dict[str, Any]] = []
    for _ in range(200):
        results = (await (await again.get("/v1/history/search", params={"q": "lighthouse"})).json())["results"]
        if len(results) == 2:
            break
        await asyncio.sleep(0.02)
    assert len({r["run_id"] for r in results}) == 2


async def test_export_jsonl_and_markdown(client: Client, clock: FakeClock) -> None:
    one = await post(client, KEY, "first message about apples")
    for i in range(16):
        await post(client, KEY, f"filler {i} " + "lorem ipsum dolor sit amet consectetur " * 40)
    clock.advance(seconds=1)
    compact = await client.post(f"/v1/sessions/{k(KEY)}/commands", json={"command": "/compact"})
    assert compact.status == 200 and compact_events(await compact.json())
    clock.advance(seconds=1)
    await post(client, KEY, "after the compaction")
    clock.advance(seconds=1)
    assert (await client.post(f"/v1/sessions/{k(KEY)}/complete")).status == 200
    two = await post(client, KEY, "second run, 日本語も")
    resp = await client.get(f"/v1/sessions/{k(KEY)}/export")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    types = [line["type"] for line in lines]
    assert types[0] == "run" and lines[0]["run_id"] == one["run_id"]
    assert types.count("run") == 2 and types.count("final_summary") == 1 and "compaction" in types
    compaction_at = types.index("compaction")
    after = [line for line in lines[compaction_at:] if line["type"] == "message"]
    assert after[0]["content"] == "after the compaction"
    messages = [line for line in lines if line["type"] == "message"]
    assert messages[0]["content"] == "first message about apples" and messages[-1]["content"] == "second run, 日本語も"
    assert any(m.get("command") for m in messages)  # an export keeps commands
    md = await client.get(f"/v1/runs/{two['run_id']}/export", params={"format": "md"})
    text = await md.text()
    assert md.status == 200 and md.headers["Content-Type"].startswith("text/markdown")
    assert text.startswith(f"# Run {two['run_id']}") and "second run, 日本語も" in text
    full = await (await client.get(f"/v1/sessions/{k(KEY)}/export", params={"format": "md"})).text()
    assert "> **Compaction 1**" in full and "### Final summary" in full
    bad = await client.get(f"/v1/sessions/{k(KEY)}/export", params={"format": "pdf"})
    assert bad.status == 400 and (await bad.json())["error"]["field"] == "format"
    missing = await client.get(f"/v1/sessions/{k('agent:main:dm:nobody')}/export")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "session_not_found"


async def test_purge_leaves_no_trace_in_the_home(client: Client, tmp_path: Path, clock: FakeClock) -> None:
    token = "zqxpurgetoken77"
    other = "agent:main:dm:keeper"
    await post(client, other, "this one stays")
    first = await post(client, KEY, f"secret {token} one", client_message_id="m1")
    for i in range(30):
        await post(client, KEY, f"message {i} with {token}")
    assert (await client.post(f"/v1/sessions/{k(KEY)}/complete")).status == 200
    clock.advance(days=40)
    await client.post("/v1/admin/cleanup", json={"dry_run": False})  # first run archived
    await post(client, KEY, f"second run {token}", client_message_id="m2")
    await flushed(client)
    assert (await (await client.get("/v1/history/search", params={"q": token})).json())["results"]
    before = tree_digest(tmp_path)
    for query in ("purge=maybe", "purge=", "purge"):  # an empty value is no "true": it erases for good
        bad = await client.delete(f"/v1/sessions/{k(KEY)}?{query}")
        assert bad.status == 400 and (await bad.json())["error"]["field"] == "purge", query
    assert tree_digest(tmp_path) == before
    resp = await client.delete(f"/v1/sessions/{k(KEY)}", params={"purge": "true"})
    body = await resp.json()
    assert resp.status == 200 and body["purged"] is True
    assert body["tombstone"]["runs"] == 2 and body["tombstone"]["messages"] == 32
    await client.app[HISTORY].flush()
    found = []
    for path in tmp_path.rglob("*"):
        if path.is_file() and token.encode() in path.read_bytes():
            found.append(str(path.relative_to(tmp_path)))
    assert found == []
    assert (await client.get(f"/v1/runs/{first['run_id']}")).status == 404
    assert (await client.get(f"/v1/sessions/{k(KEY)}")).status == 404
    assert (await (await client.get("/v1/history/search", params={"q": token})).json())["results"] == []
    assert (await (await client.get("/v1/history/search", params={"q": "stays"})).json())["results"]
    again = await client.delete(f"/v1/sessions/{k(KEY)}", params={"purge": "true"})
    assert again.status == 404 and (await again.json())["error"]["code"] == "session_not_found"
    import sqlite3

    db = sqlite3.connect(tmp_path / "contexts" / "tasks.db")
    assert db.execute("SELECT session_key, runs, messages FROM tombstones").fetchall() == [(KEY, 2, 32)]
    # the key can be used again afterwards, from scratch
    fresh = await post(client, KEY, "a new beginning")
    assert fresh["message_seq"] == 1


async def test_index_follows_cleanup_deleting_an_archive(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    config = {"cleanup": {"retention_days": 1, "archive_retention_days": 1}}
    client = await aiohttp_client(make_app(tmp_path, clock, config))
    old = await post(client, KEY, "an expiring albatross")
    assert (await client.post(f"/v1/sessions/{k(KEY)}/complete")).status == 200
    clock.advance(days=2)
    first = await (await client.post("/v1/admin/cleanup", json={"dry_run": False})).json()
    assert [a["action"] for a in first["actions"] if a["done"]] == ["archive"]
    await post(client, GROUP, "a lasting albatross")
    await flushed(client)
    hits = (await (await client.get("/v1/history/search", params={"q": "albatross"})).json())["results"]
    assert {r["run_id"] for r in hits} == {old["run_id"], hits[0]["run_id"], hits[-1]["run_id"]} and len(hits) == 2
    clock.advance(days=2)
    second = await (await client.post("/v1/admin/cleanup", json={"dry_run": False})).json()
    assert ("delete_archive", old["run_id"]) in [(a["action"], a["run_id"]) for a in second["actions"] if a["done"]]
    hits = (await (await client.get("/v1/history/search", params={"q": "albatross"})).json())["results"]
    assert [r["session_key"] for r in hits] == [GROUP]


async def test_posts_wait_for_an_index_max_backlog_behind_and_every_one_is_found(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"history": {"max_backlog": 2}}))
    keys = [f"agent:main:dm:u{n}" for n in range(24)]
    for wave in range(0, len(keys), 8):  # a wave's posts find the index the last wave's 8 behind
        batch = enumerate(keys[wave : wave + 8], start=wave)
        await asyncio.gather(*(post(client, key, f"backlogged lantern {n}") for n, key in batch))
    index = client.app[HISTORY]
    assert index.backlog.waits > 0 and index.backlog.late == 0
    metrics = await (await client.get("/metrics")).text()
    waits = next(line for line in metrics.splitlines() if line.startswith("neotask_history_waits_total"))
    assert float(waits.split()[-1]) == index.backlog.waits
    await flushed(client)
    found = await (await client.get("/v1/history/search", params={"q": "lantern", "limit": 100})).json()
    assert {hit["session_key"] for hit in found["results"]} == set(keys)
