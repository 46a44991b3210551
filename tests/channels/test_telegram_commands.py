"""Chat commands on Telegram. In-process: the gateway app, aiogram against the local Bot API server
(one module, so a pytest-xdist worker imports aiogram once for all of them).

``/start`` (what the Start button sends) answered "Unknown command /start" although the docs
promise the help, and the help listed ten commands while the bot's menu (``setMyCommands``) held
five. Now ``/start`` gets the help, and the menu and the help are one list."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.channels.harness import connected_in
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.telegram_server import TelegramServer

TOKEN, MENU_TOKEN = "4242:group-secret", "4343:menu-secret"


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
