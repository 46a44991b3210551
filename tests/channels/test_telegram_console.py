"""The console's Channels page (headless Chromium) against a real daemon with a connected Telegram
account, one whose token is refused, and a Matrix account whose homeserver does not answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.channels.harness import BOT, TOKEN, configure, daemon, env
from tests.gateway.test_console import Console, browser, needs_chromium
from tests.support.telegram_server import TelegramServer

pytestmark = [pytest.mark.slow, pytest.mark.browser, needs_chromium, pytest.mark.realtime]
__all__ = ["browser"]  # the fixture, shared with the console tests


@pytest.mark.timeout(180)
async def test_the_channels_page_shows_each_account(tmp_path: Path, browser: Any) -> None:
    home = tmp_path / "home"
    async with TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        accounts = {
            "main": {"token_env": "TG_MAIN", "api_base": bots.url, "allow_from": ["555"], "poll_timeout_s": 1},
            "broken": {"token_env": "TG_BROKEN", "api_base": bots.url, "poll_timeout_s": 1},
        }
        config = configure(tmp_path, None, bots, accounts)
        data = yaml.safe_load(config.read_text())  # a Matrix account whose homeserver does not answer
        mx = {"homeserver": "http://127.0.0.1:9", "user_id": "@neo:example.org", "access_token_env": "MX_TOKEN"}
        data["channels"]["matrix"] = {"accounts": {"mx": mx}}
        config.write_text(yaml.safe_dump(data))
        async with daemon(home, "--config", str(config), env=env(TG_BROKEN="9:refused", MX_TOKEN="syt_x")) as gw:
            bots.message(TOKEN, chat_id=555, from_id=555, text="hello")
            await bots.wait_for(lambda: bots.bots[TOKEN].confirmed > 0)
            page = await browser.new_page()
            console = Console(page)
            await page.goto(f"{gw.url}/ui#/channels")
            main = page.locator('tr[data-account="telegram:main"]')
            await main.wait_for(timeout=20_000)
            text = await main.inner_text()
            assert "connected" in text and "not connected" not in text and f"@{BOT}" in text
            assert "\t1\t" in text  # one message in
            broken = await page.locator('tr[data-account="telegram:broken"]').inner_text()
            assert "not connected" in broken and "401" in broken
            matrix = await page.locator('tr[data-account="matrix:mx"]').inner_text()
            assert "not connected" in matrix and "whoami" in matrix
            assert await page.locator('.nav a[data-section="channels"]').get_attribute("aria-current") == "true"
            await console.shot("channels")
            assert console.errors == []
