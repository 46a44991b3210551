"""Slack end to end, the rest of issue 27: ``pairing`` and ``open`` under a real daemon, slash
commands over Socket Mode (slack_bolt's listener and ack, slack_sdk's client, the local Slack
server), a deleted message recorded as such, a file, and a 10,000-character answer split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.channels.harness import daemon, session_lines, wait_until
from tests.channels.test_slack_daemon import APP_TOKEN, BOT_TOKEN, configure, env
from tests.gateway.daemons import child_env, run_cli
from tests.support.openai_server import OpenAIServer, Reply
from tests.support.slack_server import SlackServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
OPEN_BOT, OPEN_APP = "xoxb-2-open", "xapp-2-open"


async def test_pairing_open_slash_commands_a_deletion_a_file_and_a_long_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT_TOKEN, APP_TOKEN)
        other = slack.add_app(OPEN_BOT, OPEN_APP, bot_user="UOPEN")
        opened = {"open": {"bot_token_env": "OPEN_BOT", "app_token_env": "OPEN_APP", "api_base": slack.url,
                           "dm_policy": "open"}}  # fmt: skip
        config = configure(tmp_path, model, slack, **opened)
        data = yaml.safe_load(config.read_text())
        data["channels"]["slack"]["accounts"]["work"]["dm_policy"] = "pairing"
        data["session"] = {"dm_scope": "per-peer"}
        config.write_text(yaml.safe_dump(data))
        cli = ("--home", str(home), "--config", str(config))
        async with daemon(home, "--config", str(config), env=env(OPEN_BOT=OPEN_BOT, OPEN_APP=OPEN_APP)) as gw:
            # pairing: an unknown sender gets a code (nothing stored), the same code again; approved, answered
            slack.message(app, channel="D5", user="U555", text="hello?")
            await slack.wait_for(lambda: len(slack.posted("D5")) == 1)
            notice = slack.posted("D5")[0].params["text"]
            assert notice.startswith("This app does not know you yet. Pairing code: ")
            code = notice.split("Pairing code: ")[1].split()[0]
            again = slack.message(app, channel="D5", user="U555", text="still me")
            await wait_until(lambda: f"env-{int(again[2:])}" in app.acks)
            assert len(slack.posted("D5")) == 1  # the code is not sent again while it is good
            assert await session_lines(gw.url, "agent:main:dm:U555") == []
            approved = await run_cli("channels", "approve", code, *cli, env=child_env())
            assert approved.returncode == 0, approved.stderr
            assert "slack account work now takes messages from U555" in approved.stdout
            assert slack.posted("D5")[1].params["text"].startswith("You are approved")  # told in their DM
            slack.message(app, channel="D5", user="U555", text="now?")
            await slack.wait_for(lambda: len(slack.posted("D5")) == 3)
            assert slack.posted("D5")[2].params["text"] == "echo: now?"
            assert [x["content"] for x in await session_lines(gw.url, "agent:main:dm:U555")] == ["now?", "echo: now?"]

            # open: anyone is answered
            slack.message(other, channel="D7", user="U777", text="hi open")
            await slack.wait_for(lambda: len(slack.posted("D7")) == 1)
            assert slack.posted("D7")[0].params["text"] == "echo: hi open"
            assert slack.posted("D7")[0].token == OPEN_BOT

            # a slash command: acknowledged, answered in place, the model not asked
            asked = len(model.chat_requests)
            envelope = slack.slash(app, command="/status", user="U555", channel="D5")
            await slack.wait_for(lambda: len(slack.posted("D5")) == 4)
            await wait_until(lambda: envelope in app.acks)
            assert "Tokens:" in slack.posted("D5")[3].params["text"] and len(model.chat_requests) == asked
            run_before = await run_of(gw.url, "agent:main:dm:U555")
            slack.slash(app, command="/new", user="U555", channel="D5")
            await slack.wait_for(lambda: len(slack.posted("D5")) == 5)
            assert "Started a new session" in slack.posted("D5")[4].params["text"]

            # a deleted message: recorded as such, not answered
            typo = slack.message(app, channel="D5", user="U555", text="a typo")
            await slack.wait_for(lambda: len(slack.posted("D5")) == 6)  # seq 2 again, of a new run: sent
            deleted_ts = slack.ts[typo]  # the stored message (a deletion of one never stored is not stored)
            slack.deletion(app, channel="D5", user="U555", deleted_ts=deleted_ts, text="a typo")
            lines = await wait_until(
                lambda: _last_is(gw.url, "agent:main:dm:U555", f"[deleted message {deleted_ts}]"), timeout=30
            )
            assert [x["content"] for x in lines] == ["a typo", "echo: a typo", f"[deleted message {deleted_ts}]"]
            assert await run_of(gw.url, "agent:main:dm:U555") != run_before
            assert len(slack.posted("D5")) == 6  # the deletion is not answered

            # a file with a comment: stored as a line saying what arrived
            files = [{"name": "report.pdf", "mimetype": "application/pdf"}]
            slack.message(app, channel="D5", user="U555", text="see this", subtype="file_share", files=files)
            await slack.wait_for(lambda: len(slack.posted("D5")) == 7)
            assert slack.posted("D5")[6].params["text"] == "echo: see this\n[file report.pdf (application/pdf)]"

            # a 10,000-character answer: split between paragraphs under Slack's limit, nothing lost
            long = "\n\n".join(f"Part {i}. " + "lorem ipsum " * 80 for i in range(11))
            assert len(long) > 10_000
            model.script(Reply(text=long))
            slack.message(app, channel="D5", user="U555", text="write a lot")
            await slack.wait_for(lambda: len(slack.posted("D5")) == 10)
            parts = [str(c.params["text"]) for c in slack.posted("D5")[7:]]
            assert all(len(p) <= 4000 and p.startswith("Part ") for p in parts)
            assert "\n\n".join(parts) == long


async def run_of(url: str, key: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/sessions/{key.replace(':', '%3A')}") as resp:
        entry: dict[str, Any] = await resp.json()
    return str(entry["run_id"])


async def _last_is(url: str, key: str, content: str) -> list[dict[str, Any]] | None:
    lines = await session_lines(url, key)
    return lines if lines and lines[-1]["content"] == content else None
