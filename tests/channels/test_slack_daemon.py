"""The Slack connector end to end: a real daemon, slack_sdk's Socket Mode and Web API clients, the
local Slack server (tests/support/slack_server.py) and the local OpenAI-compatible model server."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
import yaml
from slack_sdk.signature import SignatureVerifier

from tests.channels.harness import connected, daemon, outbox_settled, session_lines, stored, wait_until
from tests.gateway.daemons import child_env
from tests.support.openai_server import OpenAIServer
from tests.support.slack_server import SlackServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
BOT_TOKEN, APP_TOKEN = "xoxb-1-main", "xapp-1-main"
THREAD = "1699999999.000100"


def configure(tmp_path: Path, model: OpenAIServer, slack: SlackServer, **more: Any) -> Path:
    accounts = {"work": {"bot_token_env": "SLACK_BOT_TOKEN", "app_token_env": "SLACK_APP_TOKEN", "api_base": slack.url,
                         "agent": "main", "mode": "socket", "dm_policy": "allowlist", "allow_from": ["U012AB3CD"]},
                **more}  # fmt: skip
    data = {"agents": {"main": {"model": {"base_url": model.base_url, "name": "m", "max_retries": 0}}},
            "channels": {"slack": {"accounts": accounts}}}  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def env(**extra: str) -> dict[str, str]:
    return child_env(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_APP_TOKEN=APP_TOKEN, **extra)


async def test_direct_channel_thread_command_and_a_refused_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT_TOKEN, APP_TOKEN)
        broken = {"broken": {"bot_token_env": "BROKEN_BOT", "app_token_env": "BROKEN_APP", "api_base": slack.url}}
        config = configure(tmp_path, model, slack, **broken)
        async with daemon(home, "--config", str(config), env=env(BROKEN_BOT="xoxb-no", BROKEN_APP="xapp-no")) as gw:
            # a direct message: answered in the same conversation, Markdown as mrkdwn, acked once durable
            event = slack.message(app, channel="D1", user="U012AB3CD", text="hello **there** & <you>")
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1)
            assert slack.posted("D1")[0].params["text"] == "echo: hello *there* &amp; &lt;you&gt;"
            assert app.acks == ["env-1"]
            lines = await session_lines(gw.url, "agent:main:main")
            assert [x["content"] for x in lines] == ["hello **there** & <you>", "echo: hello **there** & <you>"]
            assert lines[0]["client_message_id"] == f"slack:work:{event}"

            # a channel message without a mention: acknowledged, not stored; in a thread with one: answered there
            slack.message(app, channel="C1", channel_type="channel", user="U777", text="just chatting")
            slack.message(app, channel="C1", channel_type="channel", user="U777", text="<@UBOT> in thread",
                          thread_ts=THREAD)  # fmt: skip
            await slack.wait_for(lambda: len(slack.posted("C1")) == 1)
            reply = slack.posted("C1")[0].params
            assert reply["thread_ts"] == THREAD and reply["text"] == "echo: &lt;@UBOT&gt; in thread"
            assert len(app.acks) == 3
            thread = await session_lines(gw.url, f"agent:main:slack:channel:C1:thread:{THREAD}")
            assert [x["content"] for x in thread] == ["<@UBOT> in thread", "echo: <@UBOT> in thread"]
            assert await session_lines(gw.url, "agent:main:slack:channel:C1") == []

            # an unknown sender in a direct message (allowlist): acknowledged, not stored, not answered
            slack.message(app, channel="D9", user="U999", text="let me in")
            await wait_until(lambda: len(app.acks) == 4)
            assert slack.posted("D9") == []

            # a command in the message text: answered in place, not sent to the model
            asked = len(model.chat_requests)
            slack.message(app, channel="D1", user="U012AB3CD", text="/status")
            await slack.wait_for(lambda: len(slack.posted("D1")) == 2)
            assert "Tokens:" in slack.posted("D1")[1].params["text"] and len(model.chat_requests) == asked

            refused = [line for line in gw.stderr().splitlines() if "slack account broken" in line]
            assert len(refused) == 1 and "invalid_auth" in refused[0] and "BROKEN_BOT" in refused[0], refused
            assert "xoxb-no" not in gw.stderr()


async def test_killed_between_storing_an_event_and_its_ack_it_is_stored_and_answered_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT_TOKEN, APP_TOKEN)
        config = configure(tmp_path, model, slack)
        async with daemon(home, "--config", str(config), env=env(_NEOTASK_CRASH_AT="channels.stored")) as gw:
            event = slack.message(app, channel="D1", user="U012AB3CD", text="keep me once")
            assert await gw.wait(timeout=60) == -9
        assert app.acks == []  # never acknowledged: Slack delivers it again
        async with daemon(home, "--config", str(config), env=env()):
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1, timeout=60)
            await wait_until(lambda: app.acks == ["env-1"])
        lines = stored(home, "agent:main:main")
        assert [(x["role"], x["content"]) for x in lines] == [
            ("user", "keep me once"),
            ("assistant", "echo: keep me once"),
        ]
        assert lines[0]["client_message_id"] == f"slack:work:{event}"
        assert len(slack.posted("D1")) == 1


@pytest.mark.timeout(240)  # three daemon starts: over 100 s at a load of 12 on the shared machine
async def test_a_429_storm_then_a_kill_between_the_answer_and_the_send(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT_TOKEN, APP_TOKEN)
        slack.fail("chat.postMessage", 429, "ratelimited", retry_after=1, times=3)
        slack.fail("chat.postMessage", 503, "service_unavailable")
        config = configure(tmp_path, model, slack)
        # the 503's wait is the backoff, doubled by each failure before it (8 s after 3): capped at 2 s
        data = yaml.safe_load(config.read_text())
        data["channels"]["outbox"] = {"max_backoff_s": 2}
        config.write_text(yaml.safe_dump(data))
        async with daemon(home, "--config", str(config), env=env()):
            slack.message(app, channel="D1", user="U012AB3CD", text="busy?")
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1, timeout=60)
            attempts = [c for c in slack.calls if c.method == "chat.postMessage"]
            assert len(attempts) == 5
            assert all(b.at - a.at >= 0.9 for a, b in itertools.pairwise(attempts[:4]))  # Retry-After honoured
            await outbox_settled(home)
        assert len(model.chat_requests) == 1
        async with daemon(home, "--config", str(config), env=env(_NEOTASK_CRASH_AT="channels.answered")) as gw:
            slack.message(app, channel="D1", user="U012AB3CD", text="answer me")
            assert await gw.wait(timeout=60) == -9
        assert len(slack.posted("D1")) == 1 and len(model.chat_requests) == 2
        async with daemon(home, "--config", str(config), env=env()):
            await slack.wait_for(lambda: len(slack.posted("D1")) == 2, timeout=60)
            assert slack.posted("D1")[1].params["text"] == "echo: answer me"
        assert len(model.chat_requests) == 2 and len(slack.posted("D1")) == 2


def signed(body: bytes, secret: str, at: int | None = None) -> dict[str, str]:
    timestamp = str(at if at is not None else int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature, "Content-Type": "application/json"}


async def test_events_api_calls_are_verified_stored_once_and_answered(tmp_path: Path) -> None:
    home = tmp_path / "home"
    secret = "8f742231b10e8888abcd99yyyzzz85a5"
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT_TOKEN, APP_TOKEN)
        events = {"bot_token_env": "SLACK_BOT_TOKEN", "api_base": slack.url, "mode": "events",
                  "signing_secret_env": "SLACK_SIGNING_SECRET", "allow_from": ["U012AB3CD"]}  # fmt: skip
        config = configure(tmp_path, model, slack)
        data = yaml.safe_load(config.read_text())
        data["channels"]["slack"]["accounts"] = {"http": events}
        config.write_text(yaml.safe_dump(data))
        async with daemon(home, "--config", str(config), env=child_env(SLACK_BOT_TOKEN=BOT_TOKEN,
                          SLACK_SIGNING_SECRET=secret)) as gw, aiohttp.ClientSession() as http:  # fmt: skip
            hook = f"{gw.url}/hooks/slack/http"
            challenge = json.dumps({"type": "url_verification", "challenge": "c-123", "token": "x"}).encode()
            async with http.post(hook, data=challenge, headers=signed(challenge, secret)) as resp:
                assert resp.status == 200 and (await resp.json()) == {"challenge": "c-123"}
            await wait_until(lambda: connected(gw.url, "http"), what="the account connected")  # else 503, retried
            slack.message(app, channel="D1", user="U012AB3CD", text="over http")
            envelope = app.envelopes.popitem()[1]
            body = json.dumps(envelope["payload"]).encode()
            for headers in (signed(body, "wrong-secret"), signed(body, secret, int(time.time()) - 600), {}):
                async with http.post(hook, data=body, headers=headers) as resp:
                    assert resp.status == 401, await resp.text()
            assert await session_lines(gw.url, "agent:main:main") == []
            for _ in range(2):  # Slack's retry of the same event is stored once
                async with http.post(hook, data=body, headers=signed(body, secret)) as resp:
                    assert resp.status == 200, await resp.text()
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1)
            assert slack.posted("D1")[0].params["text"] == "echo: over http"
            lines = await session_lines(gw.url, "agent:main:main")
            assert [x["content"] for x in lines] == ["over http", "echo: over http"]
            assert not [c for c in slack.calls if c.method == "apps.connections.open"]  # no socket in events mode


async def test_slash_commands_over_http_are_acknowledged_empty_and_answered_in_place(tmp_path: Path) -> None:
    """Events API mode: Slack POSTs a slash command form-encoded to the same Request URL; the call is
    checked by its signature, acknowledged with an empty 200, and the command's answer is posted in
    the conversation it was typed in (the model not asked)."""
    home = tmp_path / "home"
    secret = "8f742231b10e8888abcd99yyyzzz85a5"
    async with OpenAIServer() as model, SlackServer() as slack:
        slack.add_app(BOT_TOKEN, APP_TOKEN)
        events = {"bot_token_env": "SLACK_BOT_TOKEN", "api_base": slack.url, "mode": "events",
                  "signing_secret_env": "SLACK_SIGNING_SECRET", "allow_from": ["U012AB3CD"]}  # fmt: skip
        config = configure(tmp_path, model, slack)
        data = yaml.safe_load(config.read_text())
        data["channels"]["slack"]["accounts"] = {"http": events}
        config.write_text(yaml.safe_dump(data))
        async with daemon(home, "--config", str(config), env=child_env(SLACK_BOT_TOKEN=BOT_TOKEN,
                          SLACK_SIGNING_SECRET=secret)) as gw, aiohttp.ClientSession() as http:  # fmt: skip
            hook = f"{gw.url}/hooks/slack/http"
            await wait_until(lambda: connected(gw.url, "http"), what="the account connected")  # else 503, retried
            form = {"token": "x", "team_id": "T1", "channel_id": "D1", "user_id": "U012AB3CD", "user_name": "ann",
                    "command": "/status", "text": "", "trigger_id": "13345224609.738474920.8088930838d88f008e0",
                    "response_url": f"{slack.url}/respond/1"}  # fmt: skip
            body = urlencode(form).encode()
            form_headers = {**signed(body, secret), "Content-Type": "application/x-www-form-urlencoded"}
            async with http.post(hook, data=body, headers={**form_headers, **signed(body, "wrong")}) as resp:
                assert resp.status == 401  # signed like every call
            async with http.post(hook, data=body, headers=form_headers) as resp:
                assert resp.status == 200 and await resp.read() == b"", await resp.text()
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1)
            assert "Tokens:" in slack.posted("D1")[0].params["text"] and not model.chat_requests
            junk = urlencode({"text": "no command"}).encode()
            async with http.post(hook, data=junk, headers={**signed(junk, secret),
                                 "Content-Type": "application/x-www-form-urlencoded"}) as resp:  # fmt: skip
                assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_body", await resp.text()
