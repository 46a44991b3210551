"""The console's backups page in headless Chromium against a real daemon: the archives kept in
<home>/backups (``GET /v1/admin/backups``), and a backup taken with the button
(``POST /v1/admin/backup``) that appears in the list with the last backup's summary."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.test_console import Console, browser, needs_chromium, post_message, wait_ready
from tests.gateway.test_console_ops import start
from tests.support.openai_server import OpenAIServer

__all__ = ["browser"]  # the fixture, shared with the other console tests
pytestmark = pytest.mark.realtime


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(180)
@needs_chromium
async def test_the_backups_page_lists_backups_and_takes_one(
    tmp_path: Path, openai_server: OpenAIServer, browser: Any
) -> None:
    from playwright.async_api import expect

    model = {"base_url": openai_server.base_url, "name": "test-model", "timeout_s": 5, "max_retries": 0}
    home = tmp_path / "home"
    async with start(home, {"agents": {"main": {"model": model}}, "backup": {"keep": 3}}) as server:
        base = server.url
        await wait_ready(base)
        await post_message(base, "agent:main:main", {"content": "something to back up"})
        console = Console(await browser.new_page(viewport={"width": 1280, "height": 900}))
        page = console.page

        await page.goto(f"{base}/ui#/backups")
        await expect(page.locator(".last-backup")).to_contain_text("No backup taken since the gateway started")
        await expect(page.locator("#view")).to_contain_text("No backups in <home>/backups yet.")
        await expect(page.locator("#view")).to_contain_text("the newest 3 kept")
        await expect(page.locator('.nav a[data-section="backups"]')).to_have_attribute("aria-current", "true")

        await page.locator("button", has_text="Back up now").click()
        rows = page.locator(".backups-table tbody tr")
        await expect(rows).to_have_count(1, timeout=60000)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/admin/backups") as resp:
            listed = await resp.json()
        [backup] = listed["backups"]
        assert listed["last"]["path"] == backup["path"]
        archive = Path(backup["path"])
        assert archive.parent == home / "backups" and archive.stat().st_size == backup["size"]
        assert await rows.first.get_attribute("data-name") == archive.name
        await expect(rows.first).to_contain_text(archive.name)
        last = page.locator(".last-backup")
        await expect(last).to_contain_text(str(archive))
        await expect(last).to_contain_text("1 runs (1 active)")
        await expect(last).to_contain_text("(online)")
        await console.shot("backups")
        await asyncio.sleep(0)
        assert console.errors == []
        await page.close()
