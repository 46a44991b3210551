"""The Telegram connector end to end: a real daemon process, the real aiogram client, the local
Bot API server (tests/support/telegram_server.py) and the local OpenAI-compatible model server."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from channels.telegram_format import to_plain, utf16_len
from tests.channels.harness import BOT, TOKEN, configure, daemon, env, session_lines, texts, wait_until
from tests.support.openai_server import Hang, OpenAIServer, Reply
from tests.support.telegram_server import Failure, TelegramServer, rate_limited

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
GROUP = -100123
FORUM = -100777


def mention(text: str) -> dict[str, Any]:
    start = text.index("@neo_bot")
    return {"text": text, "entities": [{"type": "mention", "offset": start, "length": len("@neo_bot")}]}


def account(bots: TelegramServer, **more: Any) -> dict[str, Any]:
    return {"token_env": "TG_MAIN", "api_base": bots.url, "agent": "main", "mode": "polling", "dm_policy": "allowlist",
            "allow_from": ["555"], "require_mention": True, "poll_timeout_s": 1, **more}  # fmt: skip


async def test_direct_group_topic_command_photo_and_a_long_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        config = configure(tmp_path, model, bots, {"main": account(bots, store_unmentioned=True)})
        async with daemon(home, "--config", str(config), env=env()) as gw:
            # a direct message: answered in the same chat, Markdown as Telegram HTML
            update = bots.message(TOKEN, chat_id=555, from_id=555, text="hello **there**")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1)
            sent = bots.sent(TOKEN)[0]
            assert (str(sent.params["chat_id"]), sent.params["parse_mode"]) == ("555", "HTML")
            assert sent.params["text"] == "echo: hello <b>there</b>"
            commands = bots.of("setMyCommands", TOKEN)[0].params["commands"]
            assert {c["command"] for c in commands} >= {"new", "reset", "compact", "status"}
            lines = await session_lines(gw.url, "agent:main:main")
            assert [(x["role"], x["content"]) for x in lines] == [
                ("user", "hello **there**"),
                ("assistant", "echo: hello **there**"),
            ]
            assert lines[0]["client_message_id"] == f"telegram:main:{update}"
            await wait_until(lambda: bots.bots[TOKEN].confirmed > update)

            # a group message without a mention: stored (store_unmentioned), not answered
            bots.message(TOKEN, chat_id=GROUP, chat_type="supergroup", from_id=777, first_name="Bo", text="chatting")
            group_key = f"agent:main:telegram:group:{GROUP}"
            await wait_until(lambda: session_lines(gw.url, group_key))
            # with a mention: answered in the group, as a reply to that message
            asked = bots.message(TOKEN, chat_id=GROUP, chat_type="supergroup", from_id=777, **mention("@neo_bot hi"))
            await bots.wait_for(lambda: len(bots.sent(TOKEN, GROUP)) == 1)
            reply = bots.sent(TOKEN, GROUP)[0]
            assert reply.params["text"] == "echo: @neo_bot hi"
            assert reply.params["reply_parameters"]["message_id"] == bots.message_ids[asked]
            lines = await session_lines(gw.url, group_key)
            assert [(x["role"], x["content"]) for x in lines] == [
                ("user", "chatting"),
                ("user", "@neo_bot hi"),
                ("assistant", "echo: @neo_bot hi"),
            ]

            # a forum topic: its own key (:topic:), the answer in the topic
            bots.message(
                TOKEN, chat_id=FORUM, chat_type="supergroup", thread_id=7, from_id=777, **mention("@neo_bot t")
            )
            await bots.wait_for(lambda: len(bots.sent(TOKEN, FORUM)) == 1)
            assert bots.sent(TOKEN, FORUM)[0].params["message_thread_id"] == 7
            topic = await session_lines(gw.url, f"agent:main:telegram:group:{FORUM}:topic:7")
            assert [x["content"] for x in topic] == ["@neo_bot t", "echo: @neo_bot t"]

            # /status@neo_bot in the group: answered in place, never sent to the model
            asked_model = len(model.chat_requests)
            bots.message(TOKEN, chat_id=GROUP, chat_type="supergroup", from_id=777, text="/status@neo_bot")
            await bots.wait_for(lambda: len(bots.sent(TOKEN, GROUP)) == 2)
            status_text = to_plain(bots.sent(TOKEN, GROUP)[1].params["text"])
            assert "Tokens:" in status_text and "Compactions:" in status_text
            assert len(model.chat_requests) == asked_model
            lines = await session_lines(gw.url, group_key)
            assert lines[-2]["content"] == "/status" and lines[-2]["command"] is True

            # a photo with a caption: stored as what arrived, answered; "typing" while the model works
            model.script(Hang(2.0))
            typing_before = len(bots.of("sendChatAction", TOKEN))
            photo = [{"file_id": "p", "file_unique_id": "p", "width": 800, "height": 600}]
            bots.message(TOKEN, chat_id=555, from_id=555, photo=photo, caption="look at this")
            await bots.wait_for(lambda: len(bots.sent(TOKEN, 555)) == 2)
            assert model.chat_requests[-1].last_user_text == "[photo 800x600]\nlook at this"
            typing = bots.of("sendChatAction", TOKEN)[typing_before:]
            assert typing and typing[0].params["action"] == "typing" and str(typing[0].params["chat_id"]) == "555"
            assert typing[0].at < bots.sent(TOKEN, 555)[1].at

            # a 10,000-character answer: split between paragraphs, each part under the limit
            long = "\n\n".join(f"Part {i}. " + "lorem ipsum " * 80 for i in range(11))
            assert len(long) > 10_000
            model.script(Reply(text=long))
            bots.message(TOKEN, chat_id=555, from_id=555, text="write a lot")
            await wait_until(lambda: sum(c.params["text"].startswith("Part ") for c in bots.sent(TOKEN, 555)) >= 3)
            parts = [c.params["text"] for c in bots.sent(TOKEN, 555)[2:]]
            assert len(parts) == 3 and all(utf16_len(p) <= 4096 for p in parts)
            assert "\n\n".join(parts) == long  # nothing lost, cut only at blank lines
            assert all(p.startswith("Part ") for p in parts)


async def test_a_429_storm_is_waited_out_and_the_answer_sent_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        bots.fail("sendMessage", *[rate_limited(1) for _ in range(4)], Failure(502, "Bad Gateway"))
        config = configure(tmp_path, model, bots, {"main": account(bots)})
        # the 502's wait is the backoff, doubled by each failure before it (16 s after 4): capped at 2 s
        data = yaml.safe_load(config.read_text())
        data["channels"]["outbox"] = {"max_backoff_s": 2}
        config.write_text(yaml.safe_dump(data))
        async with daemon(home, "--config", str(config), env=env()) as gw:
            bots.message(TOKEN, chat_id=555, from_id=555, text="busy?")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=60)
            attempts = bots.of("sendMessage", TOKEN)
            assert len(attempts) == 6
            waits = [b.at - a.at for a, b in itertools.pairwise(attempts[:4])]
            assert all(w >= 0.9 for w in waits), waits  # retry_after honoured
            assert len(model.chat_requests) == 1
            assert bots.sent(TOKEN)[0].params["text"] == "echo: busy?"

            # HTML the platform refuses to parse is sent again as plain text, never lost
            bots.fail("sendMessage", Failure(400, "Bad Request: can't parse entities: unsupported start tag"))
            bots.message(TOKEN, chat_id=555, from_id=555, text="**bold** <tag>")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 2)
            plain = bots.sent(TOKEN)[1].params
            assert plain["text"] == "echo: bold <tag>" and "parse_mode" not in plain

            # /reset: answered in place; the next message starts a new run
            bots.message(TOKEN, chat_id=555, from_id=555, text="/reset")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 3)
            bots.message(TOKEN, chat_id=555, from_id=555, text="fresh start")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 4)
            lines = await session_lines(gw.url, "agent:main:main")
            assert [x["content"] for x in lines if x["role"] == "user"] == ["fresh start"]


async def test_messages_that_waited_for_one_turn_get_its_answer_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        model.script(Hang(3.0))
        config = configure(tmp_path, model, bots, {"main": account(bots)})
        async with daemon(home, "--config", str(config), env=env()) as gw:
            bots.message(TOKEN, chat_id=555, from_id=555, text="first")
            await model.wait_for_requests(1, timeout=30)
            second = bots.message(TOKEN, chat_id=555, from_id=555, text="second")
            bots.message(TOKEN, chat_id=555, from_id=555, text="third")
            await wait_until(lambda: bots.bots[TOKEN].confirmed > second + 1)  # both stored while "first" runs
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 2, timeout=60)
            await asyncio.sleep(1.5)
            assert texts(bots.sent(TOKEN)) == ["echo: first", "echo: third"]  # one turn answered both waiting
            assert len(model.chat_requests) == 2
            lines = await session_lines(gw.url, "agent:main:main")
            assert [x["content"] for x in lines if x["role"] == "user"] == ["first", "second", "third"]
