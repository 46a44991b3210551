"""The HTTP API in store-only mode: messages, errors, commands, listing, lifecycle."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import FakeClock
from tests.gateway.helpers import make_app, tree_digest

Client = TestClient[Any, Any]


def url_key(key: str) -> str:
    return quote(key, safe="")


async def test_health_and_store_only_message(client: Client, tmp_path: Path) -> None:
    assert (await client.get("/healthz")).status == 200
    for _ in range(100):  # the memory index finishes its first pass in the background
        ready = await client.get("/readyz")
        if ready.status == 200:
            break
        await asyncio.sleep(0.05)
    body = await ready.json()
    assert ready.status == 200 and body["ready"] is True
    checks = {"store": True, "disk_budget": True, "store_writable": True, "scheduler": True, "memory": True}
    assert body["checks"] == checks
    resp = await client.post(f"/v1/sessions/{url_key('agent:main:main')}/messages", json={"content": "hello"})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["session_key"] == "agent:main:main" and body["message_seq"] == 1 and body["reply"] is None
    run_id = body["run_id"]
    stored = (tmp_path / "contexts/running" / run_id / "messages.jsonl").read_text().splitlines()
    assert json.loads(stored[0])["content"] == "hello"


async def test_ingress_routes_by_dm_scope_and_keeps_the_speaker(aiohttp_client: Any, tmp_path: Path,
                                                                clock: FakeClock) -> None:  # fmt: skip
    app = make_app(tmp_path, clock, {"session": {"dm_scope": "per-channel-peer"}})
    client = await aiohttp_client(app)
    direct = {"channel": "telegram", "chat_type": "direct", "chat_id": "c1", "sender_id": "42", "text": "hi"}
    body = await (await client.post("/v1/messages", json=direct)).json()
    assert body["session_key"] == "agent:main:telegram:dm:42"
    group = {"channel": "slack", "chat_type": "group", "chat_id": "G1", "sender_id": "u9", "sender_name": "Ann Lee",
             "text": "hello all", "thread_id": "t5"}  # fmt: skip
    body = await (await client.post("/v1/messages", json=group)).json()
    assert body["session_key"] == "agent:main:slack:group:G1:topic:t5"
    messages = await (await client.get(f"/v1/runs/{body['run_id']}/messages")).json()
    assert messages["messages"][0]["name"] == "Ann_Lee" and messages["messages"][0]["sender_id"] == "u9"


async def test_a_key_with_a_slash_travels_as_one_segment(client: Client) -> None:
    key = "hook:github:owner/repo:issue:7"
    resp = await client.post(f"/v1/sessions/{url_key(key)}/messages", json={"content": "opened"})
    assert resp.status == 200, await resp.text()
    detail = await (await client.get(f"/v1/sessions/{url_key(key)}")).json()
    assert detail["key"] == key and detail["chat_type"] == "hook"


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        (
            "post",
            "/v1/sessions/agent%3Amain%3Amain/messages",
            {"data": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "invalid_body",
        ),
        (
            "post",
            "/v1/sessions/agent%3Amain%3Amain/messages",
            {"data": b'{"content": "\xff"}', "headers": {"Content-Type": "application/json"}},
            400,
            "invalid_body",
        ),
        (
            "post",
            "/v1/sessions/agent%3Amain%3Amain/messages",
            {"data": b'{"content": "x"}', "headers": {"Content-Type": "text/plain"}},
            400,
            "invalid_body",
        ),
        (
            "post",
            "/v1/sessions/agent%3Amain%3Amain/messages",
            {"json": {"content": "x", "colour": 1}},
            400,
            "invalid_field",
        ),
        (
            "post",
            "/v1/sessions/agent%3Amain%3Amain/messages",
            {"json": {"role": "robot", "content": "x"}},
            400,
            "invalid_field",
        ),
        ("post", "/v1/sessions/agent%3Amain%3Amain/messages", {"json": {}}, 400, "invalid_field"),
        ("post", "/v1/sessions/agent%3Aghost%3Amain/messages", {"json": {"content": "x"}}, 400, "invalid_key"),
        ("post", "/v1/sessions/agent%3Amain%3Agroup%3Amain/messages", {"json": {"content": "x"}}, 400, "invalid_key"),
        (
            "post",
            "/v1/messages",
            {"json": {"channel": "x", "chat_type": "dm", "chat_id": "1", "sender_id": "2", "text": "t"}},
            400,
            "invalid_field",
        ),
        ("get", "/v1/sessions/agent%3Amain%3Adm%3Anobody", {}, 404, "session_not_found"),
        ("get", "/v1/runs/00000000-0000-0000-0000-000000000000", {}, 404, "run_not_found"),
        ("get", "/v1/nowhere", {}, 404, "not_found"),
        ("delete", "/v1/messages", {}, 405, "method_not_allowed"),
        ("get", "/v1/sessions?limit=0", {}, 400, "invalid_field"),
        ("get", "/v1/sessions?status=sleeping", {}, 400, "invalid_field"),
        ("post", "/v1/sessions/agent%3Amain%3Amain/pause", {}, 404, "session_not_found"),
    ],
)
async def test_bad_input_gets_a_clear_error_and_changes_nothing(
    client: Client, tmp_path: Path, method: str, path: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    before = tree_digest(tmp_path)
    resp = await getattr(client, method)(path, **kwargs)
    assert resp.status == status, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == code and error["message"] and error["request_id"]
    assert tree_digest(tmp_path) == before


async def test_oversized_body_is_drained_and_refused(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"gateway": {"max_body_bytes": 2048}}))
    before = tree_digest(tmp_path)
    big = json.dumps({"content": "x" * 100_000}).encode()
    resp = await client.post("/v1/sessions/agent%3Amain%3Amain/messages", data=big,
                             headers={"Content-Type": "application/json"})  # fmt: skip
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "payload_too_large"
    assert tree_digest(tmp_path) == before


async def test_idempotent_redelivery_stores_once(client: Client, tmp_path: Path) -> None:
    path = "/v1/sessions/agent%3Amain%3Amain/messages"
    first = await (await client.post(path, json={"content": "once", "client_message_id": "m-1"})).json()
    again = await (await client.post(path, json={"content": "once"}, headers={"Idempotency-Key": "m-1"})).json()
    assert again == first
    concurrent = await asyncio.gather(
        *(client.post(path, json={"content": "twice", "client_message_id": "m-2"}) for _ in range(5))
    )
    bodies = [await r.json() for r in concurrent]
    assert len({b["message_seq"] for b in bodies}) == 1
    stored = (tmp_path / "contexts/running" / first["run_id"] / "messages.jsonl").read_text().splitlines()
    assert [json.loads(x)["content"] for x in stored] == ["once", "twice"]


async def test_commands_answer_and_stay_out_of_the_context(client: Client) -> None:
    path = "/v1/sessions/agent%3Amain%3Amain"
    await client.post(f"{path}/messages", json={"content": "hello"})
    status = await (await client.post(f"{path}/messages", json={"content": "/status"})).json()
    text = status["reply"]["content"]
    assert "Run:" in text and "Tokens:" in text and "Compactions: 0" in text and "Next reset:" in text
    unknown = await client.post(f"{path}/commands", json={"command": "/frobnicate"})
    assert unknown.status == 200 and "Unknown command /frobnicate" in (await unknown.json())["reply"]["content"]
    context = await (await client.get(f"{path}/context")).json()
    assert [m["content"] for m in context["messages"][1:]] == ["hello"]
    assert context["threshold"] == 102400


async def test_a_command_with_stream_true_answers_with_server_sent_events(client: Client) -> None:
    """SPEC section 8: message and command calls with ``stream: true`` answer with server-sent events
    (the command route took the field and answered JSON)."""
    path = "/v1/sessions/agent%3Amain%3Amain"
    await client.post(f"{path}/messages", json={"content": "hello"})
    for command in ("/status", "/2"):  # a command, and a word the help answers
        resp = await client.post(f"{path}/commands", json={"command": command, "stream": True})
        assert resp.status == 200 and resp.content_type == "text/event-stream", command
        events = [block for block in (await resp.text()).split("\n\n") if block.strip()]
        assert events[-1].startswith("event: final"), events
        final = json.loads(events[-1].split("data: ", 1)[1])
        assert final["session_key"] == "agent:main:main" and final["reply"]["content"], final
    plain = await client.post(f"{path}/commands", json={"command": "/status"})
    assert plain.content_type == "application/json"


async def test_pause_refuses_messages_but_not_commands(client: Client, tmp_path: Path) -> None:
    path = "/v1/sessions/agent%3Amain%3Amain"
    await client.post(f"{path}/messages", json={"content": "hello"})
    paused = await client.post(f"{path}/commands", json={"command": "/pause"})
    assert paused.status == 200
    before = tree_digest(tmp_path)
    refused = await client.post(f"{path}/messages", json={"content": "anyone?"})
    assert refused.status == 409 and (await refused.json())["error"]["code"] == "session_paused"
    assert tree_digest(tmp_path) == before
    resumed = await client.post(f"{path}/messages", json={"content": "/resume"})
    assert "Resumed" in (await resumed.json())["reply"]["content"]
    assert (await client.post(f"{path}/messages", json={"content": "back"})).status == 200


async def test_new_and_reset_end_the_run_and_the_text_opens_the_next(client: Client) -> None:
    path = "/v1/sessions/agent%3Amain%3Amain"
    first = await (await client.post(f"{path}/messages", json={"content": "hello"})).json()
    reset = await (await client.post(f"{path}/messages", json={"content": "/reset"})).json()
    assert reset["run_id"] == first["run_id"] and reset["events"][0]["type"] == "reset"
    entry = await (await client.get(path)).json()
    assert entry["run_id"] is None and entry["status"] == "idle"
    new = await (await client.post(f"{path}/messages", json={"content": "/new start over"})).json()
    assert new["run_id"] not in (None, first["run_id"]) and new["message_seq"] == 1
    old = await (await client.get(f"/v1/runs/{first['run_id']}/messages")).json()
    assert [m["content"] for m in old["messages"]][-2:] == ["/reset", reset["reply"]["content"]]


async def test_listing_paginates_and_filters(client: Client) -> None:
    for i in range(7):
        await client.post(f"/v1/sessions/{url_key(f'agent:main:dm:p{i}')}/messages", json={"content": "x"})
    await client.post(f"/v1/sessions/{url_key('cron:daily')}/messages", json={"content": "tick"})
    seen, cursor = [], None
    while True:
        query = "?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = await (await client.get(f"/v1/sessions{query}")).json()
        seen += [s["key"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 8 and len(set(seen)) == 8
    crons = await (await client.get("/v1/sessions?type=cron")).json()
    assert [s["key"] for s in crons["sessions"]] == ["cron:daily"]


async def test_patch_delete_and_runs(client: Client) -> None:
    path = "/v1/sessions/agent%3Amain%3Amain"
    run_id = (await (await client.post(f"{path}/messages", json={"content": "hi"})).json())["run_id"]
    patched = await client.patch(path, json={"pinned": True, "label": "vip", "settings": {"model": "big"}})
    body = await patched.json()
    assert body["pinned"] is True and body["label"] == "vip" and body["settings"] == {"model": "big"}
    bad = await client.patch(path, json={"settings": {"colour": "red"}})
    assert bad.status == 400
    tool = await client.post(f"/v1/runs/{run_id}/tools", json={"tool_name": "grep", "arguments": {"q": "x"}})
    assert tool.status == 201
    plan = await client.post(f"/v1/runs/{run_id}/planning", json={"plan_type": "initial", "plan_content": "do"})
    assert plan.status == 201
    tools = await (await client.get(f"/v1/runs/{run_id}/tools")).json()
    assert tools["tools"][0]["tool_name"] == "grep"
    deleted = await (await client.delete(path)).json()
    assert deleted["completed_run_id"] == run_id
    assert (await client.get(path)).status == 404
    run = await (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "completed" and run["pinned"] is True
    runs = await (await client.get("/v1/runs?key=agent%3Amain%3Amain")).json()
    assert [r["uuid"] for r in runs["runs"]] == [run_id]


async def test_auth_tokens(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"gateway": {"tokens": ["s3cret"]}}))
    assert (await client.get("/healthz")).status == 200
    denied = await client.get("/v1/sessions")
    assert denied.status == 401 and (await denied.json())["error"]["code"] == "unauthorized"
    assert (await client.get("/metrics")).status == 401
    ok = await client.get("/v1/sessions", headers={"Authorization": "Bearer s3cret"})
    assert ok.status == 200
    assert (await client.get("/v1/sessions", headers={"Authorization": "Bearer wrong"})).status == 401


async def test_metrics_count_messages(client: Client) -> None:
    await client.post("/v1/sessions/agent%3Amain%3Amain/messages", json={"content": "hi"})
    text = await (await client.get("/metrics")).text()
    assert 'neotask_messages_total{role="user"} 1.0' in text


async def test_a_blank_first_message_is_stored_like_any_other(client: Client, tmp_path: Path) -> None:
    body = await (await client.post("/v1/sessions/agent%3Amain%3Adm%3Ablank/messages", json={"content": "  "})).json()
    assert body["message_seq"] == 1
    long_model = await client.post(f"/v1/sessions/{url_key('agent:main:dm:blank')}/commands",
                                   json={"command": "/model " + "m" * 300})  # fmt: skip
    assert "at most 200 characters" in (await long_model.json())["reply"]["content"]
    nul_model = await client.post(f"/v1/sessions/{url_key('agent:main:dm:blank')}/commands",
                                  json={"command": "/model gpt\x00x"})  # fmt: skip
    assert "control characters" in (await nul_model.json())["reply"]["content"]
    entry = await (await client.get(f"/v1/sessions/{url_key('agent:main:dm:blank')}")).json()
    assert entry["model"] is None


async def test_every_answer_carries_a_sane_request_id(client: Client) -> None:
    """Issue 29 item 4: the caller's X-Request-Id when sane, else a fresh one; errors and streams too."""
    resp = await client.get("/healthz", headers={"X-Request-Id": "abc-123:x/y"})
    assert resp.headers["X-Request-Id"] == "abc-123:x/y"
    for insane in ("a b", "x" * 129, "evil\u00e9", "a\tb"):
        resp = await client.get("/healthz", headers={"X-Request-Id": insane})
        assert resp.headers["X-Request-Id"] not in ("", insane)
    resp = await client.get(f"/v1/sessions/{url_key('nope:')}", headers={"X-Request-Id": "err-1"})
    assert resp.status == 400 and resp.headers["X-Request-Id"] == "err-1"
    assert (await resp.json())["error"]["request_id"] == "err-1"
    resp = await client.get("/no/such/path", headers={"X-Request-Id": "err-2"})
    assert resp.status == 404 and resp.headers["X-Request-Id"] == "err-2"
    async with client.get("/v1/events", headers={"X-Request-Id": "stream-1"}) as stream:
        assert stream.status == 200 and stream.headers["X-Request-Id"] == "stream-1"
