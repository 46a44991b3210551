"""Matrix without a homeserver: ``config check`` on the issue's example and bad values, the pure
event decisions (channels/matrix_events.py), the message format, how a refused send is read, and
a 429 on ``/sync`` from a small homeserver stand-in (Synapse does not rate-limit ``/sync``)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from nio import RoomSendError

from channels.matrix import MatrixConnector
from channels.matrix_events import DIRECT, GROUP, Bot, Encrypted, Skip, inbound, invite_of, mentions
from channels.matrix_format import content, split
from channels.protocol import Inbound, Rejected, RetryLater
from channels.store import ChannelStore
from config.channels import MatrixAccount
from config.clock import system_clock
from sessions.keys import Ingress, parse_key, route
from tests.channels.harness import wait_until
from tests.gateway.daemons import child_env, run_cli

ISSUE_EXAMPLE = """
channels:
  matrix:
    accounts:
      main: {homeserver: "https://matrix.example.org", user_id: "@bot:example.org",
             access_token_env: MATRIX_TOKEN, agent: main, dm_policy: allowlist,
             allow_from: ["@alice:example.org"], require_mention: true}
"""
ACCOUNT = MatrixAccount(
    homeserver="https://m.example.org", user_id="@bot:example.org", allow_from=("@alice:example.org",)
)
BOT = Bot("@bot:example.org", "NeoBot")
ROOM = "!abc:example.org"


async def _check(tmp_path: Path, text: str, **env: str) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    result = await run_cli("config", "check", "--home", str(tmp_path / "home"), "--config", str(path),
                           env=child_env(**env))  # fmt: skip
    return result.returncode, result.stdout + result.stderr


@pytest.mark.realtime
async def test_config_check_takes_the_issue_example_and_names_a_bad_value(tmp_path: Path) -> None:
    code, out = await _check(tmp_path, ISSUE_EXAMPLE, MATRIX_TOKEN="syt_x")
    assert code == 0 and out.startswith("OK") and "warning" not in out, out
    code, out = await _check(tmp_path, ISSUE_EXAMPLE)
    assert code == 0 and "channels.matrix.accounts.main: MATRIX_TOKEN is not set; this account will not start" in out
    code, out = await _check(tmp_path, ISSUE_EXAMPLE.replace('"@bot:example.org"', '"bot"'), MATRIX_TOKEN="syt_x")
    assert code != 0 and "channels.matrix.accounts.main.user_id" in out and "@bot:example.org" in out, out
    code, out = await _check(tmp_path, ISSUE_EXAMPLE.replace("https://matrix.example.org", "matrix.example.org"))
    assert code != 0 and "homeserver" in out and "https://" in out, out


def _message(body: str, sender: str = "@alice:example.org", **content_more: Any) -> dict[str, Any]:
    return {"type": "m.room.message", "event_id": "$ev1", "sender": sender,
            "content": {"msgtype": "m.text", "body": body, **content_more}}  # fmt: skip


def test_a_direct_room_is_the_senders_session_and_the_key_round_trips() -> None:
    message = inbound(_message("hi"), ROOM, DIRECT, "main", ACCOUNT, BOT)
    assert isinstance(message, Inbound) and message.chat_type == "direct" and message.reply
    assert message.client_message_id == "matrix:main:$ev1" and message.sender_name == "alice"
    key = route(Ingress("matrix", "direct", ROOM, message.sender_id), dm_scope="per-channel-peer", bindings=[],
                agents=["main"])  # fmt: skip
    assert key.raw == "agent:main:matrix:dm:@alice%3Aexample.org"
    assert parse_key(key.raw, agents=["main"]).peer_id == "@alice:example.org"


def test_a_group_answers_a_mention_a_command_and_keeps_a_thread() -> None:
    plain = inbound(_message("just chatting"), ROOM, GROUP, "main", ACCOUNT, BOT)
    assert isinstance(plain, Skip)
    pill = {"m.mentions": {"user_ids": [BOT.user_id]}}
    for text, more in [("hey NeoBot", {}), ("hey @bot:example.org", {}), ("hey", pill), ("/status", {})]:
        message = inbound(_message(text, **more), ROOM, GROUP, "main", ACCOUNT, BOT)
        assert isinstance(message, Inbound) and message.reply and message.chat_type == "channel", text
    assert not mentions({"body": "NeoBotics is a word"}, BOT)
    threaded = inbound(_message("NeoBot?", **{"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}),
                       ROOM, GROUP, "main", ACCOUNT, BOT)  # fmt: skip
    assert isinstance(threaded, Inbound) and threaded.thread_id == "$root" and threaded.target.thread_id == "$root"
    key = route(Ingress("matrix", "channel", ROOM, "@alice:example.org", "$root"), dm_scope="main", bindings=[],
                agents=["main"])  # fmt: skip
    assert key.raw == "agent:main:matrix:channel:%21abc%3Aexample.org:thread:%24root"
    parsed = parse_key(key.raw, agents=["main"])
    assert (parsed.channel_id, parsed.thread_id) == (ROOM, "$root")


def test_what_is_not_read() -> None:
    assert isinstance(inbound(_message("mine", sender=BOT.user_id), ROOM, DIRECT, "main", ACCOUNT, BOT), Skip)
    notice = _message("a bot")
    notice["content"]["msgtype"] = "m.notice"
    assert isinstance(inbound(notice, ROOM, DIRECT, "main", ACCOUNT, BOT), Skip)
    new = {"msgtype": "m.text", "body": "fixed"}
    edit = _message("* fixed", **{"m.relates_to": {"rel_type": "m.replace", "event_id": "$ev0"}, "m.new_content": new})
    revised = inbound(edit, ROOM, DIRECT, "main", ACCOUNT, BOT)
    assert isinstance(revised, Inbound) and (revised.revision, revised.message_id, revised.text) == (
        "edit",
        "$ev0",
        "fixed",
    )
    assert revised.content == "[edited message $ev0] fixed" and revised.client_message_id == "matrix:main:$ev1"
    redaction = {
        "type": "m.room.redaction",
        "event_id": "$r",
        "sender": "@alice:example.org",
        "redacts": "$ev0",
        "content": {},
    }
    deleted = inbound(redaction, ROOM, GROUP, "main", ACCOUNT, BOT)
    assert isinstance(deleted, Inbound) and (deleted.revision, deleted.message_id, deleted.reply) == (
        "delete",
        "$ev0",
        False,
    )
    encrypted = {"type": "m.room.encrypted", "event_id": "$e", "sender": "@alice:example.org", "content": {}}
    assert inbound(encrypted, ROOM, DIRECT, "main", ACCOUNT, BOT) == Encrypted(ROOM, "$e")


def test_an_invite_names_its_inviter_and_whether_it_is_direct() -> None:
    state = [{"type": "m.room.name", "state_key": "", "sender": "@x:e.org", "content": {"name": "n"}},
             {"type": "m.room.member", "state_key": BOT.user_id, "sender": "@alice:example.org",
              "content": {"membership": "invite", "is_direct": True}}]  # fmt: skip
    assert invite_of(ROOM, state, BOT.user_id) == ("@alice:example.org", True)
    assert invite_of(ROOM, state[:1], BOT.user_id) is None


def test_a_reply_is_html_with_the_markdown_beside_it_split_under_the_limit() -> None:
    [part] = split("**bold** <b>\nnext")
    assert content(part) == {"msgtype": "m.text", "body": "**bold** <b>\nnext", "format": "org.matrix.custom.html",
                             "formatted_body": "<b>bold</b> &lt;b&gt;<br>next"}  # fmt: skip
    text = "\n\n".join([" ".join(["word"] * 50)] * 10)
    parts = split(text, 600)
    assert len(parts) > 1 and all(len(p) <= 600 for p in parts)
    assert "\n\n".join(content(p)["body"] for p in parts) == text


async def test_a_refused_send_is_read_as_the_homeserver_meant_it(tmp_path: Path) -> None:
    connector = MatrixConnector("main", ACCOUNT, "syt_x", ChannelStore(tmp_path / "c.db"), clock=system_clock)
    try:
        with pytest.raises(RetryLater) as later:
            connector._raise_for(RoomSendError("Too Many Requests", "M_LIMIT_EXCEEDED", retry_after_ms=2500))
        assert later.value.retry_after == 2.5
        with pytest.raises(Rejected):
            connector._raise_for(RoomSendError("not in room", "M_FORBIDDEN"))
        with pytest.raises(RetryLater):
            connector._raise_for(RoomSendError("boom", "M_UNKNOWN_ERROR"))
    finally:
        await connector.client.close()


async def test_a_429_on_sync_is_waited_out_for_its_retry_after_ms(
    aiohttp_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first ``/sync`` answers 429 ``M_LIMIT_EXCEEDED`` with ``retry_after_ms: 1300``: the next
    comes no sooner (the connector's own backoff would be 1 s), and the account is connected after."""
    syncs: list[float] = []

    async def whoami(request: web.Request) -> web.Response:
        return web.json_response({"user_id": "@bot:example.org", "device_id": "DEV"})

    async def displayname(request: web.Request) -> web.Response:
        return web.json_response({"displayname": "NeoBot"})

    async def sync(request: web.Request) -> web.Response:
        syncs.append(time.monotonic())
        if len(syncs) == 1:
            limited = {"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": 1300}
            return web.json_response(limited, status=429)
        if len(syncs) > 2:
            await asyncio.sleep(float(request.query["timeout"]) / 1000)
        return web.json_response({"next_batch": f"s{len(syncs)}"})

    app = web.Application()
    app.router.add_get("/_matrix/client/v3/account/whoami", whoami)
    app.router.add_get("/_matrix/client/v3/profile/{user}/displayname", displayname)
    app.router.add_get("/_matrix/client/v3/sync", sync)
    server = await aiohttp_server(app)
    account = MatrixAccount(homeserver=str(server.make_url("")).rstrip("/"), user_id="@bot:example.org",
                            encryption=False, sync_timeout_s=1)  # fmt: skip
    connector = MatrixConnector("main", account, "syt_x", ChannelStore(tmp_path / "c.db"), clock=system_clock)

    async def post(message: Inbound) -> Any:
        raise AssertionError(f"nothing was sent to the bot: {message}")

    with caplog.at_level(logging.WARNING, logger="channels.matrix"):
        await connector.start(post)
        try:
            await wait_until(lambda: len(syncs) >= 2 and connector.status.connected, 10)
        finally:
            await connector.stop()
    assert syncs[1] - syncs[0] >= 1.25, syncs  # the hint, not the 1 s backoff
    [waited] = [r.getMessage() for r in caplog.records if "M_LIMIT_EXCEEDED" in r.getMessage()]
    assert "/sync answered 429" in waited and "trying again in 1.3 s" in waited, waited
    assert connector.status.last_error is None  # cleared by the sync that worked
    assert connector.status.extra["encryption"] == "off" and not (tmp_path / "matrix").exists()  # encryption: false
