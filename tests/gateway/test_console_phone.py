"""The console at phone width and a cron job whose delivery failed, against an in-process gateway
(an aiohttp test server on a real port) and the local OpenAI-compatible server: every cell of the
Channels and Usage tables names its column once the header row is hidden (they showed bare values),
and the reason a cron job's delivery did not arrive reaches ``GET /v1/scheduler/jobs`` and the Cron
page (a firing showed a red "answered" badge and no reason)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config.clock import system_clock
from tests.conftest import FakeClock
from tests.gateway.conftest import Client
from tests.gateway.test_console import Console, browser, needs_chromium
from tests.support.openai_server import OpenAIServer

__all__ = ["browser"]  # the fixture, shared with the other console tests
pytestmark = pytest.mark.realtime  # the page reads the real clock (the usage page's days)

PHONE = {"width": 375, "height": 812}
REFUSED = "HTTP 400 Bad Request"

# For each cell of a table: its column's header, the text CSS puts before it, whether that is shown.
LABELS_JS = """(table) => {
  const headers = [...table.querySelectorAll("thead th")].map((th) => th.textContent);
  const headerShown = getComputedStyle(table.querySelector("thead")).display !== "none";
  const cells = [...table.querySelectorAll("tbody tr")].map((tr) => [...tr.cells].map((td, i) => {
    const before = getComputedStyle(td, "::before");
    return { header: headers[i], label: before.content, shown: before.display !== "none" && td.offsetWidth > 0 };
  }));
  return { headerShown, cells };
}"""


@pytest.fixture
async def inbox(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> str:
    """A ``deliver_to`` that refuses every POST with a 400 (not retried: one attempt)."""

    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=400)

    app = web.Application()
    app.router.add_post("/inbox", refuse)
    server = await aiohttp_server(app)
    return str(server.make_url("/inbox"))


@pytest.fixture
def gateway_base_url(openai_server: OpenAIServer) -> str:
    return openai_server.base_url


@pytest.fixture
def gateway_overrides(inbox: str, clock: FakeClock, openai_server: OpenAIServer) -> dict[str, Any]:
    clock.set(system_clock())  # today's usage row is in the page's days, which the browser counts
    digest = {"id": "digest", "schedule": "0 9 * * *", "message": "digest please", "deliver_to": inbox}
    return {
        "agents": {"helper": {"model": {"base_url": openai_server.base_url, "name": "test-model", "max_retries": 0}}},
        "cron": {"jobs": [digest]},
        "channels": {  # their variables are unset: listed, never started
            "telegram": {"accounts": {"tg": {"token_env": "PHONE_TG_TOKEN"}}},
            "slack": {"accounts": {"ops": {"bot_token_env": "PHONE_SLACK_BOT", "app_token_env": "PHONE_SLACK_APP"}}},
        },
    }


async def _run_digest(client: Client) -> dict[str, Any]:
    resp = await client.post("/v1/scheduler/jobs/digest/run")
    assert resp.status == 200
    body: dict[str, Any] = await resp.json()
    return body


async def test_a_failed_delivery_is_in_the_jobs_last_runs(client: Client, inbox: str) -> None:
    ran = await _run_digest(client)
    assert (ran["ok"], ran["status"], ran["error"]) == (False, "answered", None)
    resp = await client.get("/v1/scheduler/jobs")
    [job] = [j for j in (await resp.json())["jobs"] if j["id"] == "cron:digest"]
    [firing] = job["last_runs"]
    assert (firing["ok"], firing["status"], firing["error"]) == (False, "answered", None)
    assert firing["delivery"] == {"url": inbox, "delivered": False, "attempts": 1, "error": REFUSED}
    sweep = next(j for j in (await resp.json())["jobs"] if j["id"] == "sweep")
    assert sweep["last_runs"] == []


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(120)
@needs_chromium
async def test_phone_width_tables_name_their_columns_and_cron_says_why_not_delivered(
    client: Client, inbox: str, browser: Any
) -> None:
    from playwright.async_api import expect

    for key in ("agent:main:main", "agent:helper:main"):
        resp = await client.post(f"/v1/sessions/{key.replace(':', '%3A')}/messages", json={"content": "hello"})
        assert resp.status == 200
    await _run_digest(client)
    base = str(client.make_url("")).rstrip("/")
    console = Console(await browser.new_page(viewport=PHONE, is_mobile=True))
    page = console.page

    for view, table, rows in (("channels", ".channels-table", 2), ("usage", ".usage-table", 2)):
        await page.goto(f"{base}/ui#/{view}")
        await expect(page.locator(f"{table} tbody tr")).to_have_count(rows)
        found = await page.locator(table).evaluate(LABELS_JS)
        assert found["headerShown"] is False, view  # the cards' labels are all there is
        for cells in found["cells"]:
            assert [(c["label"], c["shown"]) for c in cells] == [(f'"{c["header"]}"', True) for c in cells], view
        assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], view
        await console.shot(f"phone-{view}")

    await page.goto(f"{base}/ui#/cron")
    firing = page.locator('tr[data-job="cron:digest"] .firings li').first
    await expect(firing).to_contain_text("answered")
    reason = firing.get_by_text(f"not delivered to {inbox} after 1 attempt(s): {REFUSED}", exact=True)
    await expect(reason).to_be_visible()
    await console.shot("phone-cron")
    assert console.errors == []
    await page.close()
