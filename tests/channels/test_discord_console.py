"""The console's Channels page (headless Chromium) lists a Discord account with its state: the
app in-process (its test server has a real port), discord.py against the local Discord, one
account connected and one whose token is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.channels.harness import connected_in
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.gateway.test_console import Console, browser, needs_chromium
from tests.support.discord_server import DiscordServer

pytestmark = [pytest.mark.slow, pytest.mark.browser, needs_chromium, pytest.mark.realtime]
__all__ = ["browser"]  # the fixture, shared with the console tests
TOKEN = "MTE.console.secret"
OWNER = "300000000000000001"


@pytest.mark.timeout(120)
async def test_the_channels_page_shows_the_discord_accounts(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, browser: Any
) -> None:
    async with DiscordServer() as discord:
        discord.add_bot(TOKEN)
        accounts = {"main": {"token_env": "DISCORD_MAIN", "api_base": discord.url, "allow_from": [OWNER]},
                    "broken": {"token_env": "DISCORD_BROKEN", "api_base": discord.url}}  # fmt: skip
        app = make_app(tmp_path, clock, {"channels": {"discord": {"accounts": accounts}}},
                       env={"DISCORD_MAIN": TOKEN, "DISCORD_BROKEN": "MTE.refused"})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        await discord.message(TOKEN, channel="400000000000000001", author=OWNER, text="hello")
        page = await browser.new_page()
        console = Console(page)
        await page.goto(str(client.make_url("/ui#/channels")))
        main = page.locator('tr[data-account="discord:main"]')
        await main.wait_for(timeout=20_000)
        text = await main.inner_text()
        assert "connected" in text and "not connected" not in text and "@neo" in text, text
        broken = await page.locator('tr[data-account="discord:broken"]').inner_text()
        assert "not connected" in broken and "DISCORD_BROKEN" in broken, broken
        assert console.errors == []
        await client.close()
