"""The Telegram connector end to end: a real daemon process, the real aiogram client, the local
Bot API server (tests/support/telegram_server.py) and the local OpenAI-compatible model server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.channels.harness import BOT, TOKEN, configure, daemon, env, session_lines, wait_until
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

pytestmark = [pytest.mark.slow]


async def test_a_direct_message_is_answered_in_the_same_chat(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        config = configure(tmp_path, model, bots)
        async with daemon(home, "--config", str(config), env=env()) as gw:
            update = bots.message(TOKEN, chat_id=555, from_id=555, text="hello **there**")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1)
            sent = bots.sent(TOKEN)[0]
            assert str(sent.params["chat_id"]) == "555"
            assert sent.params["text"] == "echo: hello <b>there</b>"
            assert sent.params["parse_mode"] == "HTML"
            assert bots.of("setMyCommands", TOKEN)
            assert bots.of("sendChatAction", TOKEN)
            lines = await session_lines(gw.url, "agent:main:main")
            assert [(x["role"], x["content"]) for x in lines] == [("user", "hello **there**"), ("assistant", "echo: hello **there**")]
            assert lines[0]["client_message_id"] == f"telegram:main:{update}"
            await wait_until(lambda: bots.bots[TOKEN].confirmed > update)
