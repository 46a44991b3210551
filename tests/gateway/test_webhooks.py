"""Webhooks: the template engine and signatures as tables, then ``POST /hooks/{name}`` end to end
against the real local OpenAI-compatible server, with replies delivered to a test HTTP server."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from channels.delivery import Deliverer
from channels.webhooks import MissingPath, TemplateError, lookup, placeholders, plan, render, sign, text_of, verify
from config.errors import BadRequest, ConfigError, InvalidKey
from config.settings import HookMapping
from gateway.keys import WEBHOOKS
from tests.conftest import FakeClock
from tests.gateway.conftest import settled
from tests.gateway.helpers import make_app, tree_digest
from tests.support.openai_server import Hang, OpenAIServer, server_error

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

Client = TestClient[Any, Any]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"
SECRET = "It's a Secret to Everybody"
ENV = {"GITHUB_WEBHOOK_SECRET": SECRET}
UUID_KEY = re.compile(r"^hook:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
PAYLOAD = {"a": {"b": [{"c": 1}, {"c": "two", "d": None}], "t": True, "f": 1.5}, "s": "x:y", "e": ""}


# -- the template engine ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("s", "x:y"),
        ("a.b.0.c", 1),
        ("a.b.1.c", "two"),
        ("a.b.1.d", None),
        ("a.t", True),
        ("a.b", [{"c": 1}, {"c": "two", "d": None}]),
    ],
)
def test_lookup_walks_dicts_and_list_indices(path: str, expected: Any) -> None:
    assert lookup(PAYLOAD, path) == expected


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("nope", "the payload has no key 'nope'"),
        ("a.b.2.c", "a.b has 2 items; index 2 is out of range"),
        ("a.b.first", "a.b is a list; 'first' is not an index"),
        ("s.x", "s is a string, not an object or a list"),
        ("a.b.1.d.e", "a.b.1.d is null, not an object or a list"),
        ("a.b.-1", "a.b is a list; '-1' is not an index"),
    ],
)
def test_lookup_names_where_a_missing_path_stops(path: str, reason: str) -> None:
    with pytest.raises(MissingPath) as caught:
        lookup(PAYLOAD, path)
    assert caught.value.path == path and caught.value.reason == reason


@pytest.mark.parametrize(
    ("value", "text"),
    [("plain", "plain"), (None, ""), (3, "3"), (1.5, "1.5"), (True, "true"), ({"k": [1, "é"]}, '{"k":[1,"é"]}')],
)
def test_values_become_text(value: Any, text: str) -> None:
    assert text_of(value) == text


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("no placeholders", "no placeholders"),
        ("${s}", "x:y"),
        ("#${a.b.0.c}: ${a.b.1.c}", "#1: two"),
        ("[${a.b.1.d}]", "[]"),
        ("${a.t}/${a.f}", "true/1.5"),
        ("${a.b.0}", '{"c":1}'),
        ("cost $5, $${s} is literal", "cost $5, ${s} is literal"),
        ("$$${s}", "$x:y"),
        ("$$ and $", "$ and $"),
        ("${e}!", "!"),
    ],
)
def test_render(template: str, expected: str) -> None:
    assert render(template, PAYLOAD) == expected


@pytest.mark.parametrize(
    ("template", "problem"),
    [("${a.b", "no closing"), ("${}", "not a dotted path"), ("${a..b}", "not a dotted path"), ("${a b}", "dotted")],
)
def test_a_template_with_wrong_syntax_is_refused(template: str, problem: str) -> None:
    with pytest.raises(TemplateError, match=problem):
        placeholders(template)


def test_render_can_escape_each_value() -> None:
    assert render("k:${s}:${a.b.0.c}", PAYLOAD, escape=lambda v: v.replace(":", "%3A")) == "k:x%3Ay:1"


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (sign(b"k", b"{}"), True),
        (sign(b"k", b"{}").upper().replace("SHA256=", "sha256="), True),
        (sign(b"other", b"{}"), False),
        (sign(b"k", b"{} "), False),
        (sign(b"k", b"{}")[len("sha256=") :], False),
        ("sha1=" + "0" * 40, False),
        ("sha256=zz\u00e9", False),
        ("", False),
        (None, False),
    ],
)
def test_verify(header: str | None, ok: bool) -> None:
    assert verify(b"k", b"{}", header) is ok


def test_sign_matches_githubs_documented_example() -> None:
    # https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    assert sign(b"It's a Secret to Everybody", b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def _plan(payload: Any, **mapping: Any) -> Any:
    return plan("gh", HookMapping(**mapping), payload, agents={"main": None, "ops": None}, new_id=lambda: "u-1")


def test_plan_defaults() -> None:
    result = _plan({"x": 1})
    assert result.key.raw == "hook:u-1" and result.key.agent_id == "main"
    assert result.message == '{"x":1}'
    assert result.task_key.as_dict() == {"task_type": "hook", "task_identifier": "hook:u-1", "repository": None,
                                         "user": None}  # fmt: skip


def test_plan_with_every_template() -> None:
    payload = {"repo": {"name": "o/r"}, "n": 7, "who": "ann", "ref": "feat:x", "empty": ""}
    result = _plan(payload, key_template="hook:gh:${repo.name}:${ref}:${n}", message_template="${who} ${n}",
                   task_type="t_${n}", task_identifier="${n}", repository="${repo.name}", user="${empty}",
                   agent="ops")  # fmt: skip
    assert result.key.raw == "hook:gh:o/r:feat%3Ax:7" and result.key.hook_parts == ("gh", "o/r", "feat:x", "7")
    assert result.key.agent_id == "ops" and result.message == "ann 7"
    assert result.task_key.as_dict() == {"task_type": "t_7", "task_identifier": "7", "repository": "o/r",
                                         "user": None}  # fmt: skip


@pytest.mark.parametrize(
    ("mapping", "error", "code"),
    [
        ({"key_template": "hook:${missing.path}"}, BadRequest, "invalid_field"),
        ({"message_template": "${x.y}"}, BadRequest, "invalid_field"),
        ({"key_template": "hook:${title}"}, InvalidKey, "invalid_key"),
        ({"key_template": "hook:${empty}"}, InvalidKey, "invalid_key"),
        ({"key_template": "agent:main:main"}, BadRequest, "invalid_key"),
        ({"key_template": "hook:a::b"}, InvalidKey, "invalid_key"),
    ],
)
def test_plan_refuses(mapping: dict[str, Any], error: type[Exception], code: str) -> None:
    with pytest.raises(error) as caught:
        _plan({"x": 1, "title": "two words", "empty": ""}, **mapping)
    assert getattr(caught.value, "code", None) == code


def test_a_missing_path_names_the_path_and_the_template() -> None:
    with pytest.raises(BadRequest) as caught:
        _plan({"issue": {}}, key_template="hook:${issue.number}")
    assert caught.value.extra == {"field": "issue.number"}
    assert "hooks.gh.key_template" in caught.value.message and "'number'" in caught.value.message


# -- the documented example ---------------------------------------------------------------------


def doc_block(language: str, index: int = 0) -> str:
    return str(re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), re.S)[index])


def docs_hooks() -> dict[str, Any]:
    hooks: dict[str, Any] = yaml.safe_load(doc_block("yaml"))["hooks"]
    return hooks


def docs_payload() -> bytes:
    return doc_block("json").encode()


def docs_variant(tag: str) -> bytes:
    """The documented payload with one more field: another event, with another signature (the same
    signed body again is a replay, answered duplicate)."""
    return json.dumps({**json.loads(docs_payload()), "test_event": tag}).encode()


async def test_the_documented_openssl_command_makes_our_signature(tmp_path: Path) -> None:
    (tmp_path / "issue.json").write_bytes(docs_payload())
    command = next(line for line in doc_block("sh", 1).splitlines() if line.startswith("sig="))
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", f'{command}; printf %s "$sig"', cwd=tmp_path, env={"GITHUB_WEBHOOK_SECRET": SECRET,
        "PATH": "/usr/bin:/bin"}, stdout=asyncio.subprocess.PIPE)  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert "sha256=" + out.decode() == sign(SECRET.encode(), docs_payload())


# -- the route ----------------------------------------------------------------------------------


class Recorder:
    """A tiny ``deliver_to`` receiver: records every JSON body; ``fail_first`` answers 500 first."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.hits = 0
        self.fail_first = fail_first

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.hits <= self.fail_first:
            return web.Response(status=500)
        await self.bodies.put(await request.json())
        return web.Response(status=204)

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(5):
            return await self.bodies.get()


@pytest.fixture
async def recorder(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> tuple[Recorder, str]:
    rec = Recorder()
    app = web.Application()
    app.router.add_post("/replies", rec.handle)
    server = await aiohttp_server(app)
    return rec, str(server.make_url("/replies"))


def github_hooks(deliver_to: str | None = None, **changes: Any) -> dict[str, Any]:
    mapping = {**docs_hooks()["github"], "deliver_to": deliver_to, **changes}
    return {"hooks": {"github": mapping}}


def signed(body: bytes, *, delivery: str | None = "d-1", content_type: str = "application/json") -> dict[str, Any]:
    headers = {"Content-Type": content_type, "X-Hub-Signature-256": sign(SECRET.encode(), body)}
    if delivery is not None:
        headers["X-GitHub-Delivery"] = delivery
    return {"data": body, "headers": headers}


def messages(home: Path, run_id: str) -> list[dict[str, Any]]:
    lines = (home / "contexts/running" / run_id / "messages.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def idle(client: Client) -> None:
    await client.app[WEBHOOKS].idle()


async def test_a_github_issue_event_end_to_end(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    app = make_app(tmp_path, clock, github_hooks(url), base_url=openai_server.base_url, env=ENV)
    client = await aiohttp_client(app)
    resp = await client.post("/hooks/github", **signed(docs_payload()))
    assert resp.status == 202, await resp.text()
    body = await resp.json()
    assert body["status"] == "accepted" and body["message_seq"] == 1
    assert body["session_key"] == "hook:github:octo-org/hello-world:issue:42"
    text = "octocat opened issue #42: Crash on start\n\nIt exits with code 3."
    stored = messages(tmp_path, body["run_id"])[0]
    assert stored["content"] == text and stored["sender_id"] == "octocat" and stored["seq"] == 1
    run = await (await client.get(f"/v1/runs/{body['run_id']}")).json()
    assert (run["task_type"], run["task_identifier"], run["repository"], run["user"]) == (
        "github_issue", "42", "octo-org/hello-world", "octocat")  # fmt: skip
    assert run["session_key"] == body["session_key"] and run["chat_type"] == "hook" and run["agent_id"] == "main"

    delivered = await rec.next()
    assert delivered["reply"]["content"] == f"echo: {text}" and delivered["reply"]["seq"] == 2
    assert {k: delivered[k] for k in ("session_key", "run_id", "message_seq")} == {
        k: body[k] for k in ("session_key", "run_id", "message_seq")
    }
    assert delivered["usage"]["input_tokens"] > 0 and delivered["events"] == []
    assert [m["role"] for m in messages(tmp_path, body["run_id"])] == ["user", "assistant"]
    assert openai_server.chat_requests[0].last_user_text == text

    again = await client.post("/hooks/github", **signed(docs_variant("2"), delivery="d-2"))
    assert again.status == 202 and (await again.json())["run_id"] == body["run_id"]
    assert (await rec.next())["message_seq"] == 3


async def test_the_202_comes_before_the_turn_ends(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    openai_server.script(Hang(30))
    app = make_app(tmp_path, clock, github_hooks(url), base_url=openai_server.base_url, env=ENV)
    client = await aiohttp_client(app)
    async with asyncio.timeout(3):
        resp = await client.post("/hooks/github", **signed(docs_payload()))
    assert resp.status == 202
    await openai_server.wait_for_requests(1)
    assert rec.bodies.empty() and len(messages(tmp_path, (await resp.json())["run_id"])) == 1


async def test_shutdown_cancels_a_running_turn_and_keeps_the_message(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    openai_server.script(Hang(30))
    app = make_app(tmp_path, clock, github_hooks(url), base_url=openai_server.base_url, env=ENV)
    client = await aiohttp_client(app)
    body = await (await client.post("/hooks/github", **signed(docs_payload()))).json()
    await openai_server.wait_for_requests(1)
    async with asyncio.timeout(5):
        await client.close()
    assert not app[WEBHOOKS].turns._tasks and rec.bodies.empty() and rec.hits == 0
    assert body["message_seq"] == 1 and [m["role"] for m in messages(tmp_path, body["run_id"])] == ["user"]


async def test_a_failed_turn_is_delivered_with_its_error(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    openai_server.script(server_error(500))
    app = make_app(tmp_path, clock, github_hooks(url), base_url=openai_server.base_url, env=ENV)
    client = await aiohttp_client(app)
    resp = await client.post("/hooks/github", **signed(docs_payload()))
    assert resp.status == 202
    delivered = await rec.next()
    assert delivered["reply"] is None and delivered["error"]["code"] == "provider_error"
    assert delivered["message_seq"] == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Hub-Signature-256": sign(b"wrong secret", docs_payload())},
        {"X-Hub-Signature-256": "sha256=" + "0" * 64},
        {"X-Hub-Signature-256": "sha1=" + "0" * 40},
        {},
    ],
)
async def test_a_bad_signature_is_refused_and_writes_nothing(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, headers: dict[str, str]
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), env=ENV))
    before = tree_digest(tmp_path)
    headers = {"Content-Type": "application/json", "X-GitHub-Delivery": "d-1", **headers}
    resp = await client.post("/hooks/github", data=docs_payload(), headers=headers)
    assert resp.status == 401
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_signature" and "GITHUB_WEBHOOK_SECRET" in error["message"]
    await idle(client)
    assert tree_digest(tmp_path) == before


async def test_a_missing_secret_variable_is_503_naming_it(aiohttp_client: Any, tmp_path: Path,
                                                          clock: FakeClock) -> None:  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), env={}))
    before = tree_digest(tmp_path)
    resp = await client.post("/hooks/github", **signed(docs_payload()))
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert error["code"] == "hook_secret_missing"
    assert "set the environment variable GITHUB_WEBHOOK_SECRET" in error["message"]
    assert tree_digest(tmp_path) == before


async def test_a_repeated_delivery_id_is_a_duplicate(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(url), env=ENV))
    first = await client.post("/hooks/github", **signed(docs_payload(), delivery="abc"))
    assert first.status == 202
    accepted = await first.json()
    await idle(client)
    await settled(client)  # the run's .opening marker is removed on the writer's thread after the append
    before = tree_digest(tmp_path)
    resp = await client.post("/hooks/github", **signed(docs_payload(), delivery="abc"))
    assert resp.status == 200
    assert await resp.json() == {"status": "duplicate", "delivery_id": "abc",
                                 "session_key": accepted["session_key"], "message_seq": 1}  # fmt: skip
    await idle(client)
    await settled(client)
    assert tree_digest(tmp_path) == before
    assert len(messages(tmp_path, accepted["run_id"])) == 1
    assert rec.hits == 0  # store-only: nothing to deliver


async def test_concurrent_copies_of_one_delivery_store_it_once(aiohttp_client: Any, tmp_path: Path,
                                                               clock: FakeClock) -> None:  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), env=ENV))
    answers = await asyncio.gather(*(client.post("/hooks/github", **signed(docs_payload(), delivery="same"))
                                     for _ in range(5)))  # fmt: skip
    assert sorted(r.status for r in answers) == [200, 200, 200, 200, 202]
    bodies = [await r.json() for r in answers]
    run_id = next(b["run_id"] for b in bodies if b["status"] == "accepted")
    assert len(messages(tmp_path, run_id)) == 1
    assert {b["message_seq"] for b in bodies} == {1}


async def test_without_a_delivery_id_every_new_body_is_stored(aiohttp_client: Any, tmp_path: Path,
                                                               clock: FakeClock) -> None:  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), env=ENV))
    for seq in (1, 2):
        resp = await client.post("/hooks/github", **signed(docs_variant(str(seq)), delivery=None))
        assert resp.status == 202 and (await resp.json())["message_seq"] == seq


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "code"),
    [
        ("/hooks/gitlab", signed(b"{}"), 404, "hook_not_found"),
        ("/hooks/github", signed(b"{not json"), 400, "invalid_body"),
        ("/hooks/github", signed(b'{"a": "\xff"}'), 400, "invalid_body"),
        (
            "/hooks/github",
            signed(b"payload=%7B%7D", content_type="application/x-www-form-urlencoded"),
            400,
            "invalid_body",
        ),
        ("/hooks/github", signed(json.dumps({"issue": {"number": 1}}).encode()), 400, "invalid_field"),
        ("/hooks/github", signed(b"x" * 2048), 413, "payload_too_large"),
    ],
)
async def test_refusals_write_nothing(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, path: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    overrides = {**github_hooks(), "gateway": {"max_body_bytes": 1024}}
    client = await aiohttp_client(make_app(tmp_path, clock, overrides, env=ENV))
    before = tree_digest(tmp_path)
    resp = await client.post(path, **kwargs)
    assert resp.status == status, await resp.text()
    assert (await resp.json())["error"]["code"] == code
    assert tree_digest(tmp_path) == before


async def test_a_missing_template_path_is_named(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), env=ENV))
    payload = json.loads(docs_payload())
    del payload["repository"]
    resp = await client.post("/hooks/github", **signed(json.dumps(payload).encode()))
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_field" and error["field"] == "repository.full_name"
    assert "hooks.github.key_template" in error["message"]
    retry = await client.post("/hooks/github", **signed(docs_payload()))
    assert retry.status == 202  # the refused delivery id was not remembered


async def test_no_key_template_makes_a_fresh_hook_uuid_key(aiohttp_client: Any, tmp_path: Path,
                                                           clock: FakeClock) -> None:  # fmt: skip
    client = await aiohttp_client(make_app(tmp_path, clock, {"hooks": {"plain": {}}}))
    keys = []
    for n in (1, 2):
        resp = await client.post("/hooks/plain", json={"n": n, "note": "/reset"})  # unsigned hook
        assert resp.status == 202
        body = await resp.json()
        assert UUID_KEY.match(body["session_key"]) and body["message_seq"] == 1
        keys.append(body["session_key"])
        assert messages(tmp_path, body["run_id"])[0]["content"] == json.dumps({"n": n, "note": "/reset"},
                                                                              separators=(",", ":"))  # fmt: skip
        run = await (await client.get(f"/v1/runs/{body['run_id']}")).json()
        assert (run["task_type"], run["task_identifier"], run["repository"], run["user"]) == (
            "hook", body["session_key"], None, None)  # fmt: skip
    assert keys[0] != keys[1]


async def test_store_only_mode_answers_202_and_runs_no_turn(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, recorder: tuple[Recorder, str]
) -> None:
    rec, url = recorder
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(url), env=ENV))
    resp = await client.post("/hooks/github", **signed(docs_payload()))
    assert resp.status == 202
    body = await resp.json()
    await idle(client)
    assert [m["role"] for m in messages(tmp_path, body["run_id"])] == ["user"]
    assert rec.hits == 0


async def test_a_message_to_a_paused_session_is_refused_and_not_remembered(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), env=ENV))
    assert (await client.post("/hooks/github", **signed(docs_payload(), delivery="d-1"))).status == 202
    key = "hook%3Agithub%3Aocto-org%2Fhello-world%3Aissue%3A42"
    assert (await client.post(f"/v1/sessions/{key}/pause")).status == 200
    refused = await client.post("/hooks/github", **signed(docs_variant("2"), delivery="d-2"))
    assert refused.status == 409, await refused.text()
    assert (await client.post(f"/v1/sessions/{key}/resume")).status == 200
    retry = await client.post("/hooks/github", **signed(docs_variant("2"), delivery="d-2"))
    assert retry.status == 202 and (await retry.json())["message_seq"] == 2


async def test_a_bad_template_stops_the_gateway_at_start(tmp_path: Path, clock: FakeClock) -> None:
    runner = web.AppRunner(make_app(tmp_path, clock, {"hooks": {"x": {"message_template": "${oops"}}}))
    try:
        with pytest.raises(ConfigError, match=r"hooks\.x\.message_template: '\$\{' at position 0 has no closing"):
            await runner.setup()
    finally:
        await runner.cleanup()


# -- delivery -----------------------------------------------------------------------------------


async def test_delivery_retries_a_5xx_then_succeeds(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> None:
    rec = Recorder(fail_first=2)
    app = web.Application()
    app.router.add_post("/r", rec.handle)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        ok = await Deliverer(session, backoff_s=0).deliver(str(server.make_url("/r")), {"a": 1}, timeout=2)
    assert ok and rec.hits == 3 and await rec.next() == {"a": 1}


@pytest.mark.parametrize(("status", "hits"), [(400, 1), (404, 1), (503, 3), (429, 3)])
async def test_delivery_gives_up(
    aiohttp_server: Callable[..., Awaitable[TestServer]], status: int, hits: int, caplog: pytest.LogCaptureFixture
) -> None:
    count = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal count
        count += 1
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/r", handle)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        ok = await Deliverer(session, backoff_s=0).deliver(str(server.make_url("/r")), {"a": 1}, timeout=2)
    assert not ok and count == hits
    assert "could not deliver" in caplog.text and f"HTTP {status}" in caplog.text


async def test_delivery_to_a_closed_port_fails_after_retries(unused_tcp_port: int) -> None:
    async with aiohttp.ClientSession() as session:
        ok = await Deliverer(session, backoff_s=0).deliver(f"http://127.0.0.1:{unused_tcp_port}/", {}, timeout=2)
    assert not ok
