"""Chat commands on Telegram. In-process: the gateway app, aiogram against the local Bot API server
(one module, so a pytest-xdist worker imports aiogram once for both), the local model server.

Who may change a chat session's settings: any member of a group could ``/model <expensive>`` or
``/pause`` the group's session, and a paused group then dropped mentions without a word. Now
``/model <name>``, ``/pause``, ``/resume``, ``/stop`` and ``/uncompact`` (``commands.restricted``)
are for the owners (``allow_from``) and the admins (``commands.allow_from``), and, in a direct
chat, for a sender whose session is their own; others get a short refusal and nothing runs. A
paused session tells the sender so, once per sender and session every 10 minutes.

``/start`` (what the Start button sends) answered "Unknown command /start" although the docs
promise the help, and the help listed ten commands while the bot's menu (``setMyCommands``) held
five. Now ``/start`` gets the help, and the menu and the help are one list."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from gateway import keys as K
from tests.channels.harness import connected_in
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

TOKEN, MENU_TOKEN = "4242:group-secret", "4343:menu-secret"
GROUP, OWNER, ADMIN, MEMBER, STRANGER = -100123, 555, 777, 901, 903
KEY = f"agent:main:telegram:group:{GROUP}"
REFUSED = "Sorry, only the owner or an admin can use /{} here."
PAUSED_NOTICE = "This session is paused: your message was not read. /resume continues it."
PAUSED_NOTICE_EVERY = timedelta(minutes=10)


async def test_a_group_member_cannot_change_the_session_and_a_paused_group_says_so(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, "neo_bot")
        account = {"token_env": "TG_GROUP", "api_base": bots.url, "dm_policy": "open", "allow_from": [OWNER],
                   "commands": {"allow_from": [ADMIN]}, "poll_timeout_s": 1}  # fmt: skip
        overrides = {"channels": {"telegram": {"accounts": {"main": account}}}}
        app = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"TG_GROUP": TOKEN})
        client = await aiohttp_client(app)
        await connected_in(client, "main")

        async def say(sender: int, text: str, *, chat: int = GROUP) -> str:
            kind = "private" if chat > 0 else "supergroup"
            before = len(bots.sent(TOKEN, chat))
            bots.message(TOKEN, chat_id=chat, chat_type=kind, from_id=sender, text=text, reply_to_bot=chat < 0)
            await bots.wait_for(lambda: len(bots.sent(TOKEN, chat)) > before)
            return str(bots.sent(TOKEN, chat)[-1].params["text"])

        async def unanswered(sender: int, text: str) -> None:
            before = len(bots.sent(TOKEN, GROUP))
            update = bots.message(TOKEN, chat_id=GROUP, chat_type="supergroup", from_id=sender, text=text,
                                  reply_to_bot=True)  # fmt: skip
            await bots.wait_for(lambda: bots.bots[TOKEN].confirmed > update)
            await app[K.CHANNELS].idle()
            assert len(bots.sent(TOKEN, GROUP)) == before, bots.sent(TOKEN, GROUP)[before:]

        async def model_setting() -> Any:
            entry = await (await client.get(f"/v1/sessions/{KEY.replace(':', '%3A')}")).json()
            return entry["settings"].get("model")

        assert await say(MEMBER, "hello") == "echo: hello"
        assert await say(MEMBER, "/model gpt-5-expensive") == REFUSED.format("model")
        assert await model_setting() is None
        assert await say(MEMBER, "/pause") == REFUSED.format("pause")
        assert await say(MEMBER, "/new /pause") == REFUSED.format("pause")
        assert await say(MEMBER, "/model") == "Model: test-model"  # showing is for everyone
        asked = len(model.chat_requests)
        assert await say(ADMIN, "/pause") == "Paused. Messages are refused until /resume."

        # paused: the sender is told, once in the window; later again
        assert await say(MEMBER, "anyone there?") == PAUSED_NOTICE
        await unanswered(MEMBER, "hello??")
        assert await say(ADMIN, "and me?") == PAUSED_NOTICE  # each sender is told once
        clock.advance(seconds=PAUSED_NOTICE_EVERY.total_seconds() + 1)
        assert await say(MEMBER, "still paused?") == PAUSED_NOTICE
        assert len(model.chat_requests) == asked

        assert await say(MEMBER, "/resume") == REFUSED.format("resume")
        assert await say(OWNER, "/resume") == "Resumed."
        assert await say(MEMBER, "back?") == "echo: back?"

        # a direct chat in a session of the sender's own: theirs to pause
        assert await say(STRANGER, "hi", chat=STRANGER) == "echo: hi"
        assert await say(STRANGER, "/pause", chat=STRANGER) == "Paused. Messages are refused until /resume."


async def test_start_gets_the_help_and_the_menu_lists_every_command_of_the_help(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with TelegramServer() as bots:
        bots.add_bot(MENU_TOKEN, "neo_bot")
        account = {"token_env": "TG_MENU", "api_base": bots.url, "allow_from": [555], "poll_timeout_s": 1}
        app = make_app(tmp_path, clock, {"channels": {"telegram": {"accounts": {"main": account}}}},
                       env={"TG_MENU": MENU_TOKEN})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")

        answers = []
        for text in ("/help", "/start", "/start deep-link-payload"):
            bots.message(MENU_TOKEN, chat_id=555, from_id=555, text=text)
            await bots.wait_for(lambda: len(bots.sent(MENU_TOKEN)) == len(answers) + 1)
            answers.append(str(bots.sent(MENU_TOKEN)[-1].params["text"]))
        help_text = answers[0]
        assert help_text.startswith("Commands:\n") and answers[1:] == [help_text, help_text]

        [menu] = bots.of("setMyCommands", MENU_TOKEN)
        listed = [(c["command"], c["description"]) for c in menu.params["commands"]]
        lines = [re.fullmatch(r"/(\w+)[^-]* - (.+)", line) for line in help_text.splitlines()[1:]]
        in_help = [(m.group(1), m.group(2)) for m in lines if m is not None]
        assert len(in_help) == len(lines) == 10
        assert listed == in_help, (listed, in_help)
        assert {"model", "pause", "resume", "stop", "uncompact", "new", "status", "help"} <= {c for c, _ in listed}
