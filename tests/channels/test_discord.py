"""The Discord connector in-process: the gateway app, the real discord.py client against the local
Discord (tests/support/discord_server.py: gateway over a WebSocket, REST) and the local model
server. One module, so a pytest-xdist worker imports discord.py once for all of them."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.keys import CHANNELS
from tests.channels.harness import connected_in, wait_until
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.discord_server import DiscordServer
from tests.support.openai_server import OpenAIServer, Reply

pytestmark = pytest.mark.realtime
TOKEN, BROKEN = "MTE.main.secret", "MTE.refused.secret"
OWNER, MEMBER, STRANGER = "300000000000000001", "300000000000000002", "300000000000000003"
DM, DM_STRANGER = "400000000000000001", "400000000000000003"


def settings(discord: DiscordServer, **more: Any) -> dict[str, Any]:
    account = {"token_env": "DISCORD_MAIN", "api_base": discord.url, "allow_from": [OWNER], **more}
    return {"channels": {"discord": {"accounts": {"main": account}}}, "session": {"dm_scope": "per-channel-peer"}}


async def messages(client: TestClient[Any, Any], key: str) -> list[dict[str, Any]]:
    """The messages of the key's current run, through the API."""
    resp = await client.get(f"/v1/sessions/{key.replace(':', '%3A')}")
    if resp.status == 404:
        return []
    run = await client.get(f"/v1/runs/{(await resp.json())['run_id']}/messages")
    found: list[dict[str, Any]] = (await run.json()).get("messages", []) if run.status == 200 else []
    return found


async def lines(client: TestClient[Any, Any], key: str) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in await messages(client, key)]


async def status(client: TestClient[Any, Any], account: str = "main") -> dict[str, Any]:
    accounts = (await (await client.get("/v1/channels")).json())["accounts"]
    found: dict[str, Any] = next(a for a in accounts if a["channel"] == "discord" and a["account"] == account)
    return found


async def test_direct_channel_thread_guilds_mentions_commands_and_a_refused_token(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with OpenAIServer() as model, DiscordServer() as discord:
        bot = discord.add_bot(TOKEN)
        general, thread = discord.snowflake(), discord.snowflake()
        guild = discord.add_guild([general], {thread: general})
        other_channel = discord.snowflake()
        other = discord.add_guild([other_channel])
        broken = {"token_env": "DISCORD_BROKEN", "api_base": discord.url}
        config = settings(discord, guilds=[guild])
        config["channels"]["discord"]["accounts"]["broken"] = broken
        app = make_app(tmp_path, clock, config, base_url=model.base_url,
                       env={"DISCORD_MAIN": TOKEN, "DISCORD_BROKEN": BROKEN})  # fmt: skip
        with caplog.at_level(logging.INFO, logger="channels.discord"):
            client = await aiohttp_client(app)
            await connected_in(client, "main")
            assert discord.of("gateway/bot")  # the gateway's URL was asked for, as Discord documents
            assert bot.identifies[0]["intents"] & (1 << 15)  # the message content intent asked for

            # a direct message from the owner: answered in the DM, stored under the DM key
            asked = await discord.message(TOKEN, channel=DM, author=OWNER, text="hello **there**")
            await discord.wait_for(lambda: len(discord.sent(DM)) == 1)
            assert discord.sent(DM)[0].body["content"] == "echo: hello **there**"
            assert discord.sent(DM)[0].body["allowed_mentions"]["parse"] == []  # a model's @everyone pings nobody
            key = f"agent:main:discord:dm:{OWNER}"
            assert await lines(client, key) == [("user", "hello **there**"), ("assistant", "echo: hello **there**")]
            assert (await messages(client, key))[0]["client_message_id"] == f"discord:main:{asked}"
            assert discord.of(f"channels/{DM}/typing")  # the typing indicator while the model wrote

            # a long answer: messages of at most 2,000 characters, the code block closed and reopened
            long = "intro " * 200 + "\n\n```python\n" + "\n".join(f"x_{i} = {i}" for i in range(300)) + "\n```"
            model.script(Reply(text=long))
            await discord.message(TOKEN, channel=DM, author=OWNER, text="a long one")
            await discord.wait_for(lambda: len(discord.sent(DM)) > 2)
            await client.app[CHANNELS].idle()
            parts = [str(c.body["content"]) for c in discord.sent(DM)[1:]]
            assert len(parts) >= 3 and all(len(p) <= 2000 for p in parts), [len(p) for p in parts]
            assert all(p.count("```") % 2 == 0 for p in parts) and parts[2].startswith("```python")

            # a stranger's DM under allowlist: not stored, not answered
            await discord.message(TOKEN, channel=DM_STRANGER, author=STRANGER, text="let me in")

            # a guild channel: without a mention skipped, with one answered as a reply
            await discord.message(TOKEN, channel=general, guild=guild, author=MEMBER, text="just chatting")
            mention = await discord.message(TOKEN, channel=general, guild=guild, author=MEMBER,
                                            text=f"<@{bot.id}> hi", mentions=(bot.id,))  # fmt: skip
            await discord.wait_for(lambda: len(discord.sent(general)) == 1)
            reply = discord.sent(general)[0].body
            assert reply["content"] == f"echo: <@{bot.id}> hi"
            assert str(reply["message_reference"]["message_id"]) == mention
            assert await lines(client, f"agent:main:discord:channel:{general}") == [
                ("user", f"<@{bot.id}> hi"),
                ("assistant", f"echo: <@{bot.id}> hi"),
            ]

            # a reply to the bot's answer, without a ping: addressed to the bot
            answer = str(discord.of(f"channels/{general}/messages")[-1].body["content"])
            bot_message = next(i for i, m in discord.messages.items() if m["content"] == answer)
            await discord.message(TOKEN, channel=general, guild=guild, author=MEMBER, text="and then?",
                                  reply_to=bot_message)  # fmt: skip
            await discord.wait_for(lambda: len(discord.sent(general)) == 2)
            assert discord.sent(general)[1].body["content"] == "echo: and then?"

            # a thread: its own key under the parent channel, answered in the thread
            await discord.message(TOKEN, channel=thread, guild=guild, author=MEMBER, text=f"<@{bot.id}> in a thread",
                                  mentions=(bot.id,))  # fmt: skip
            await discord.wait_for(lambda: len(discord.sent(thread)) == 1)
            thread_key = f"agent:main:discord:channel:{general}:thread:{thread}"
            assert [r for r, _ in await lines(client, thread_key)] == ["user", "assistant"]
            late = discord.add_thread(guild, general)  # not in discord.py's cache: asked over REST
            await discord.message(TOKEN, channel=late, guild=guild, author=MEMBER, text=f"<@{bot.id}> late",
                                  mentions=(bot.id,))  # fmt: skip
            await discord.wait_for(lambda: len(discord.sent(late)) == 1)
            assert discord.of(f"channels/{late}")[0].method == "GET"
            late_key = f"agent:main:discord:channel:{general}:thread:{late}"
            assert [r for r, _ in await lines(client, late_key)] == ["user", "assistant"]

            # a server not in guilds: not answered even when mentioned
            await discord.message(TOKEN, channel=other_channel, guild=other, author=MEMBER, text=f"<@{bot.id}> hey",
                                  mentions=(bot.id,))  # fmt: skip

            # chat commands answered in place, without a model call; after a leading mention too
            asked_model = len(model.chat_requests)
            before = len(discord.sent(DM))
            await discord.message(TOKEN, channel=DM, author=OWNER, text="/status")
            await discord.wait_for(lambda: len(discord.sent(DM)) == before + 1)
            assert "Tokens:" in discord.sent(DM)[-1].body["content"] and len(model.chat_requests) == asked_model
            await discord.message(TOKEN, channel=general, guild=guild, author=MEMBER, text=f"<@{bot.id}> /new",
                                  mentions=(bot.id,))  # fmt: skip
            await discord.wait_for(lambda: len(discord.sent(general)) == 3)
            assert "new session" in discord.sent(general)[2].body["content"].lower(), discord.sent(general)[2].body
            assert await lines(client, f"agent:main:discord:channel:{general}") == []  # a new session

            await client.app[CHANNELS].idle()
            assert discord.sent(DM_STRANGER) == [] and discord.sent(other_channel) == []
            shown = await status(client)
            assert shown["connected"] and shown["messages_in"] == 8 and shown["username"] == "neo"
            refused = await status(client, "broken")
            assert not refused["connected"] and "DISCORD_BROKEN" in refused["last_error"]
        logged = [r.getMessage() for r in caplog.records if "discord account broken" in r.getMessage()]
        assert len(logged) == 1 and "refused the token in DISCORD_BROKEN" in logged[0], logged
        assert BROKEN not in caplog.text
        await client.close()  # before the local Discord: no reconnect attempts logged at teardown


async def test_a_dropped_gateway_is_resumed_with_nothing_lost_or_answered_twice(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    """The socket dropped (4000) after one message: discord.py RESUMEs the session; the message
    sent while it was down is replayed and answered, and the one before it, which the gateway
    replays too (``replay_overlap``), is stored and answered once."""
    async with OpenAIServer() as model, DiscordServer(replay_overlap=1, heartbeat_interval_ms=200) as discord:
        bot = discord.add_bot(TOKEN)
        app = make_app(tmp_path, clock, settings(discord), base_url=model.base_url, env={"DISCORD_MAIN": TOKEN})
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        before = await discord.message(TOKEN, channel=DM, author=OWNER, text="before the drop")
        await discord.wait_for(lambda: len(discord.sent(DM)) == 1)
        await wait_until(lambda: bot.heartbeats >= 2)  # heartbeats go on, acknowledged
        await discord.drop(TOKEN, hold=True)
        meanwhile = await discord.message(TOKEN, channel=DM, author=OWNER, text="while it was down")
        await wait_until(lambda: not discord.connected(TOKEN))
        discord.release()
        await discord.wait_for(lambda: len(discord.sent(DM)) == 2)
        assert len(bot.resumes) == 1 and len(bot.identifies) == 1  # resumed, not a new session
        assert bot.replayed == [before, meanwhile]  # the first one dispatched twice
        await client.app[CHANNELS].idle()
        assert [c.body["content"] for c in discord.sent(DM)] == ["echo: before the drop", "echo: while it was down"]
        assert [c for _, c in await lines(client, f"agent:main:discord:dm:{OWNER}")] == [
            "before the drop", "echo: before the drop", "while it was down", "echo: while it was down"]  # fmt: skip
        assert len(model.chat_requests) == 2
        shown = await status(client)
        assert shown["connected"] and shown["resumes"] == 1
        await client.close()


async def test_429_retry_after_is_honoured_and_a_missing_content_intent_is_said_clearly(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with OpenAIServer() as model, DiscordServer() as discord:
        discord.add_bot(TOKEN)
        discord.add_bot(BROKEN, "nointent", content_intent=False)
        discord.fail("users/@me", 503)  # Discord down at the first login: tried again, not a refused token
        config = settings(discord)
        config["channels"]["discord"]["accounts"]["plain"] = {"token_env": "DISCORD_PLAIN", "api_base": discord.url}
        app = make_app(tmp_path, clock, config, base_url=model.base_url,
                       env={"DISCORD_MAIN": TOKEN, "DISCORD_PLAIN": BROKEN})  # fmt: skip
        with caplog.at_level(logging.INFO, logger="channels.discord"):
            client = await aiohttp_client(app)
            await connected_in(client, "main")
            discord.rate_limit(0.4, 0.4)
            await discord.message(TOKEN, channel=DM, author=OWNER, text="busy?")
            await discord.wait_for(lambda: len(discord.sent(DM)) == 1)
            tries = [c for c in discord.calls if c.path == f"channels/{DM}/messages"]
            assert [c.status for c in tries] == [429, 429, 200]
            assert all(b.at - a.at >= 0.35 for a, b in itertools.pairwise(tries))  # retry_after honoured
            # past discord.py's five tries, the outbox waits the retry_after and sends it (once)
            discord.rate_limit(*[0.1] * 6)
            await discord.message(TOKEN, channel=DM, author=OWNER, text="still busy?")
            await discord.wait_for(lambda: len(discord.sent(DM)) == 2)
            tries = [c for c in discord.calls if c.path == f"channels/{DM}/messages"][3:]
            assert [c.status for c in tries] == [429] * 6 + [200]
            assert discord.sent(DM)[1].body["content"] == "echo: still busy?"
            await wait_until(lambda: _refused(client, "plain"))
        shown = await status(client, "plain")
        assert "4014" in shown["last_error"] and "Message Content Intent" in shown["last_error"]
        logged = [r.getMessage() for r in caplog.records if "discord account plain" in r.getMessage()
                  and r.levelno == logging.ERROR]  # fmt: skip
        assert len(logged) == 1, logged
        assert (await status(client))["connected"]  # the other account runs on
        assert len(discord.of("users/@me")) == 3 and (await status(client))["restarts"] == 0
        await client.close()


async def _refused(client: TestClient[Any, Any], account: str) -> bool:
    return "4014" in str((await status(client, account)).get("last_error"))


async def test_pairing_a_stranger_gets_a_code_and_once_approved_is_answered(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, DiscordServer() as discord:
        discord.add_bot(TOKEN)
        app = make_app(tmp_path, clock, settings(discord, dm_policy="pairing"), base_url=model.base_url,
                       env={"DISCORD_MAIN": TOKEN})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        await discord.message(TOKEN, channel=DM_STRANGER, author=STRANGER, text="let me in")
        await discord.wait_for(lambda: len(discord.sent(DM_STRANGER)) == 1)
        notice = discord.sent(DM_STRANGER)[0].body["content"]
        code = re.search(r"Pairing code: (\w+)", notice)
        assert code is not None and f"neotask channels approve {code[1]}" in notice and not model.chat_requests
        approved = await (await client.post("/v1/channels/approve", json={"code": code[1]})).json()
        assert (approved["state"], approved["notified"]) == ("approved", True)
        assert discord.sent(DM_STRANGER)[1].body["content"] == "You are approved: this bot takes your messages now."
        await discord.message(TOKEN, channel=DM_STRANGER, author=STRANGER, text="now?")
        await discord.wait_for(lambda: len(discord.sent(DM_STRANGER)) == 3)
        assert discord.sent(DM_STRANGER)[2].body["content"] == "echo: now?"
        assert [c for _, c in await lines(client, f"agent:main:discord:dm:{STRANGER}")] == ["now?", "echo: now?"]
        await client.close()


async def test_edits_and_deletions_are_stored_where_their_message_was(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, DiscordServer() as discord:
        bot = discord.add_bot(TOKEN)
        general = discord.snowflake()
        guild = discord.add_guild([general])
        app = make_app(tmp_path, clock, settings(discord), base_url=model.base_url, env={"DISCORD_MAIN": TOKEN})
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        first = await discord.message(TOKEN, channel=DM, author=OWNER, text="meet at 5")
        await discord.wait_for(lambda: len(discord.sent(DM)) == 1)
        await discord.edit(TOKEN, first, "meet at 6")
        await discord.edit(TOKEN, first, "", preview=True)  # a link preview loaded: not an edit
        await discord.delete(TOKEN, first)
        key = f"agent:main:discord:dm:{OWNER}"
        await wait_until(lambda: _count(client, key, 4))
        assert [c for _, c in await lines(client, key)] == ["meet at 5", "echo: meet at 5",
            f"[edited message {first}] meet at 6", f"[deleted message {first}]"]  # fmt: skip

        # a channel message never stored (no mention): its edit is not stored, unless it now mentions the bot
        quiet = await discord.message(TOKEN, channel=general, guild=guild, author=MEMBER, text="hello all")
        await discord.edit(TOKEN, quiet, "hello everyone")
        await discord.edit(TOKEN, quiet, f"hello <@{bot.id}>", mentions=(bot.id,))
        await discord.wait_for(lambda: len(discord.sent(general)) == 1)
        assert await lines(client, f"agent:main:discord:channel:{general}") == [
            ("user", f"hello <@{bot.id}>"), ("assistant", f"echo: hello <@{bot.id}>")]  # fmt: skip
        await client.app[CHANNELS].idle()
        assert len(model.chat_requests) == 2  # neither the edit nor the deletion asked the model
        await client.close()


async def _count(client: TestClient[Any, Any], key: str, n: int) -> bool:
    return len(await lines(client, key)) >= n
