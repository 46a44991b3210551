"""The operator's console pages (issue 29 item 6) in headless Chromium against a real daemon and
the local OpenAI-compatible server: cron jobs (next run, last runs with their outcome, run now),
usage (tokens per day per agent as an SVG chart), the live log tail and the effective config with
its secrets masked."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.daemons import Daemon, daemon
from tests.gateway.test_console import Console, browser, needs_chromium, post_message, wait_ready
from tests.support.openai_server import Fail, OpenAIServer, RecordedRequest, Reply

__all__ = ["browser"]  # the fixture, shared with the other console tests
pytestmark = pytest.mark.realtime

SECRET_URL = "https://bot:hunter2@hooks.example.com/notify?api_key=SEKRIT&team=ops"


@contextlib.asynccontextmanager
async def start(home: Path, config: dict[str, Any]) -> AsyncIterator[Daemon]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(json.dumps(config))
    async with daemon(home, timeout=120) as started:  # a loaded machine may take a minute only to import
        try:
            yield started
        finally:
            await started.stop()


def cron_rule(failing: list[bool]) -> Any:
    """The cron job's turns: answered, unless the test set ``failing`` (then a refused request)."""

    def rule(request: RecordedRequest) -> Any:
        if "nightly digest" in request.last_user_text:
            if failing and failing[0]:
                return Fail(400, "the model refuses this request", type="invalid_request_error")
            return Reply(text="digest done", usage={"prompt_tokens": 300, "completion_tokens": 40})
        return None

    return rule


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(180)
@needs_chromium
async def test_cron_usage_log_and_config_pages(tmp_path: Path, openai_server: OpenAIServer, browser: Any) -> None:
    from playwright.async_api import expect

    failing: list[bool] = [False]
    openai_server.add_rule(cron_rule(failing))
    model = {"base_url": openai_server.base_url, "name": "test-model", "timeout_s": 5, "max_retries": 0}
    config = {
        "agents": {
            "main": {"model": model, "limits": {"tokens_per_day": 1000000}},
            "helper": {"model": model},
        },
        "cron": {"jobs": [{"id": "nightly", "schedule": "0 3 * * *", "message": "nightly digest"}]},
        "hooks": {"notify": {"secret_env": "NOTIFY_SECRET", "deliver_to": SECRET_URL}},
        "logging": {"repeat_window_s": 0},  # the second failure's line is written, not counted
    }
    home = tmp_path / "home"
    async with start(home, config) as server:
        base = server.url
        await wait_ready(base)
        for text in ("hello there", "and again"):
            await post_message(base, "agent:main:main", {"content": text})
        await post_message(base, "agent:helper:main", {"content": "a helper's question"})
        console = Console(await browser.new_page(viewport={"width": 1280, "height": 900}))
        page = console.page

        # cron: next run, run now, the outcome in the last runs; then a failing run
        await page.goto(f"{base}/ui#/cron")
        row = page.locator('tr[data-job="cron:nightly"]')
        await expect(row).to_contain_text("cron 0 3 * * *")
        await expect(row).to_contain_text("not yet")
        assert await row.locator('td[data-label="Next run"] span[title]').count() == 1
        await row.locator("button", has_text="Run now").click()
        await expect(row.locator(".firings li")).to_have_count(1)
        await expect(row.locator(".firings li").first).to_contain_text("answered")
        failing[0] = True
        await row.locator("button", has_text="Run now").click()
        await expect(row.locator(".firings li")).to_have_count(2)
        newest = row.locator(".firings li").first
        await expect(newest).to_contain_text("failed")
        await expect(newest).to_contain_text("provider_error")
        await console.shot("cron")

        # usage: one bar segment per agent today, the figures of GET /v1/usage
        async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/usage?by=agent") as resp:
            usage = {r["agent"]: r["total_tokens"] for r in (await resp.json())["usage"]}
        assert set(usage) == {"main", "helper"} and usage["main"] > 340  # the cron turn's 340 among them
        await page.goto(f"{base}/ui#/usage")
        chart = page.locator("svg.usage-chart")
        await expect(chart).to_be_visible()
        for agent, tokens in usage.items():
            segment = chart.locator(f'rect[data-agent="{agent}"]')
            await expect(segment).to_have_count(1)
            assert await segment.get_attribute("data-tokens") == str(tokens)
        await expect(page.locator(".legend")).to_contain_text("budget 1,000,000/day")
        await expect(page.locator('.usage-table tbody tr[data-agent="main"] td').last).to_have_text(
            f"{usage['main']:,}"
        )
        await console.shot("usage")

        # the log: what is there, then a line written while the page is open
        await page.goto(f"{base}/ui#/logs")
        tail = page.locator("pre.log-tail")
        await expect(tail).to_contain_text("listening on")
        await expect(page.locator('#view [role="status"]')).to_contain_text("gateway.log · live")
        async with aiohttp.ClientSession() as http, http.post(f"{base}/v1/scheduler/jobs/nightly/run") as resp:
            assert resp.status == 200 and (await resp.json())["ok"] is False
        await page.fill('input[name="filter"]', "cron job nightly failed")
        failures = page.locator("pre.log-tail", has_text="(seq 4)")  # the run after the page opened
        await expect(failures).to_have_count(1, timeout=10000)
        lines = (await tail.inner_text()).splitlines()
        assert len(lines) == 2 and all("cron job nightly failed" in line for line in lines)  # the two failed runs
        await console.shot("logs")

        # the effective config: sections, the source, secrets masked
        await page.goto(f"{base}/ui#/config")
        agents = page.locator('details[data-section="agents"]')
        await expect(agents).to_contain_text('"tokens_per_day": 1000000')
        hooks = page.locator('details[data-section="hooks"]')
        await hooks.locator("summary").click()
        await expect(hooks).to_contain_text("https://bot:***@hooks.example.com/notify?api_key=***&team=ops")
        text = await page.locator("#view").inner_text()
        assert "hunter2" not in text and "SEKRIT" not in text
        await expect(page.locator(".config-source")).to_contain_text(str(home))
        await console.shot("config")
        await asyncio.sleep(0)
        assert console.errors == []
        await page.close()
