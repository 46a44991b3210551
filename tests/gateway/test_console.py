"""The web console (SPEC section 11) end to end: a real daemon process talking to the local
OpenAI-compatible server, driven in headless Chromium (Debian's ``chromium``) with Playwright.

Screenshots of every page go to ``test-artifacts/console/``; any console error or uncaught
exception in the page fails the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.conftest import FakeClock
from tests.gateway.daemons import REPO, Daemon, daemon
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "console"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MAIN = "agent:main:main"
GROUP = "agent:main:telegram:group:-100123"
HOOK = "hook:github:owner/repo:issue:7"
TOKEN = "s3cret-console"
MEMORY_MD = """# About the user

## Preferences
The user's favourite tea is genmaicha, brewed at 80 degrees.
They prefer short answers without emoji.

## Work
The user maintains the billing service in repository acme/billing.
"""

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's chromium at /usr/bin/chromium (make test installs it with apt-get as root)",
)


def summary_rule(request: RecordedRequest) -> Any:
    if "compress a conversation" in request.system_text or "final summary" in request.system_text:
        return reply("MODEL SUMMARY: project Bluebird, ticket NT-42")
    return None


def session_url(base: str, key: str, tail: str = "") -> str:
    return f"{base}/v1/sessions/{quote(key, safe='')}{tail}"


async def post_message(base: str, key: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(session_url(base, key, "/messages"), json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def wait_ready(base: str, headers: dict[str, str] | None = None) -> None:
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(900):  # the memory models load first: up to a minute on a busy machine
            async with http.get(f"{base}/readyz") as resp:
                if resp.status == 200:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError("the daemon never became ready")


@contextlib.asynccontextmanager
async def start(home: Path, config: dict[str, Any]) -> AsyncIterator[Daemon]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(json.dumps(config))
    async with daemon(home, timeout=120) as started:  # a loaded machine may take a minute only to import
        try:
            yield started
        finally:
            await started.stop()


class Console:
    """A page of the console that records console errors and saves screenshots."""

    def __init__(self, page: Any, allowed: tuple[str, ...] = ()) -> None:
        self.page = page
        self.errors: list[str] = []
        self.allowed = allowed
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _console(self, message: Any) -> None:
        if message.type == "error" and not any(a in message.text for a in self.allowed):
            self.errors.append(f"console: {message.text}")

    async def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await self.page.evaluate("document.querySelectorAll('.notice').forEach((n) => n.remove())")
        await self.page.evaluate("window.scrollTo(0, 0)")  # the sticky top bar at the top of a full-page shot
        await self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


async def seed(base: str, headers: dict[str, str] | None = None) -> str:
    """Sessions of three families; on the main one 16 messages, a tool call and a plan."""
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in range(16):
            text = f"note {i}: the Bluebird rollout, ticket NT-42, step {i} " + "details " * 12
            async with http.post(session_url(base, MAIN, "/messages"), json={"content": text, "reply": False}) as r:
                assert r.status == 200, await r.text()
                run_id: str = (await r.json())["run_id"]
        for key in (GROUP, HOOK):
            async with http.post(session_url(base, key, "/messages"), json={"content": "hi", "reply": False}) as r:
                assert r.status == 200, await r.text()
        tool = {"tool_name": "grep", "arguments": {"pattern": "NT-42"}, "result": {"matches": 3}}
        async with http.post(f"{base}/v1/runs/{run_id}/tools", json=tool) as r:
            assert r.status == 201
        plan = {"plan_type": "task", "plan_content": "1. ship Bluebird\n2. close NT-42"}
        async with http.post(f"{base}/v1/runs/{run_id}/planning", json=plan) as r:
            assert r.status == 201
    return run_id


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(120)
@needs_chromium
async def test_sessions_session_live_compact_reset_memory(
    tmp_path: Path, openai_server: OpenAIServer, browser: Any
) -> None:
    openai_server.add_rule(summary_rule)
    home = tmp_path / "home"
    workspace = home / "workspaces" / "main"
    workspace.mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(MEMORY_MD)
    model = {"base_url": openai_server.base_url, "name": "test-model", "timeout_s": 5, "max_retries": 0}
    # the console shows whichever embedder's index: the one quickest to load (numpy only; the default's
    # E5 imports torch and transformers, which made up most of this test's time)
    memory = {"embedding": {"provider": "universal-sentence-encoder"}}
    async with start(home, {"agents": {"main": {"model": model}}, "memory": memory}) as server:
        await wait_ready(server.url)
        first_run = await seed(server.url)
        console = Console(await browser.new_page(viewport={"width": 1280, "height": 900}))
        page = console.page
        await scenario_list(console, server.url)
        await scenario_session(console)
        await scenario_live(console, server.url)
        await scenario_compact(console)
        await scenario_reset(console, first_run)
        await scenario_buttons(console, server.url)
        await scenario_memory(console, server.url, workspace)
        await scenario_phone(browser, server.url)
        assert console.errors == []
        await page.close()


async def scenario_list(console: Console, base: str) -> None:
    from playwright.async_api import expect

    page = console.page
    await page.goto(f"{base}/ui")
    await page.wait_for_selector(f'tr[data-key="{MAIN}"]')
    assert await page.locator("tbody tr").count() == 3
    row = page.locator(f'tr[data-key="{MAIN}"]')
    assert "running" in await row.locator('td[data-label="Status"]').inner_text()
    assert re.search(r"\d+ / 102,400", await row.locator('td[data-label="Tokens"]').inner_text())
    await page.wait_for_selector('#live[data-state="live"]')
    await console.shot("sessions")
    await page.select_option('select[name="type"]', "group")
    await page.click('form.filters button[type="submit"]')
    await expect(page.locator("tbody tr")).to_have_count(1)
    assert await page.locator(f'tr[data-key="{GROUP}"]').count() == 1
    await page.click("text=Clear")
    await expect(page.locator("tbody tr")).to_have_count(3)


async def scenario_session(console: Console) -> None:
    page = console.page
    await page.click(f'tr[data-key="{HOOK}"] a.key-link')  # a key with "/" and ":" in one path segment
    await page.wait_for_selector('.messages li[data-seq="1"]')
    assert await page.locator(".key-title").inner_text() == HOOK
    await page.go_back()
    await page.click(f'tr[data-key="{MAIN}"] a.key-link')
    await page.wait_for_selector('.messages li[data-seq="16"]')
    assert await page.locator(".key-title").inner_text() == MAIN
    await console.shot("session")
    await page.click('.tab[data-tab="tools"]')
    await page.wait_for_selector("text=NT-42")
    assert "grep" in await page.locator(".panel").inner_text()
    await console.shot("session-tools")
    await page.click('.tab[data-tab="plans"]')
    await page.wait_for_selector("text=ship Bluebird")
    await page.click('.tab[data-tab="transcript"]')
    await page.wait_for_selector('.messages li[data-seq="16"]')


async def scenario_live(console: Console, base: str) -> None:
    page = console.page
    await page.fill('textarea[name="message"]', "hello from the console")
    await page.press('textarea[name="message"]', "Enter")
    await page.wait_for_selector('.msg-assistant:has-text("echo: hello from the console")')
    # a message posted by someone else appears without a reload (GET /v1/events)
    await post_message(base, MAIN, {"content": "posted elsewhere"})
    await page.wait_for_selector('.msg-assistant:has-text("echo: posted elsewhere")')
    await console.shot("session-live")


async def scenario_compact(console: Console) -> None:
    page = console.page
    await page.click('button[data-action="compact"]')
    dialog = page.locator("dialog.dialog")
    await dialog.locator("input").fill("focus on decisions")
    await dialog.locator('button[value="ok"]').click()
    await page.wait_for_selector(".notice:has-text('Compacted messages')")
    marker = page.locator(".marker").first
    await marker.wait_for()
    assert "Compaction 1" in await marker.inner_text()
    await marker.locator("summary").click()
    from playwright.async_api import expect

    await expect(marker).to_contain_text("MODEL SUMMARY")  # the page may render the opened marker a frame later
    await console.shot("session-compacted")
    await page.click('.tab[data-tab="context"]')
    card = page.locator('.panel .summary-card[data-kind="summary"]')
    await card.wait_for()
    assert "MODEL SUMMARY" in await card.inner_text()
    # the summary is the first thing in the context
    first = await page.locator(".panel .tab-body > *").nth(1).get_attribute("data-kind")
    assert first == "summary"
    await console.shot("session-context")


async def scenario_reset(console: Console, first_run: str) -> None:
    page = console.page
    await page.click('.tab[data-tab="transcript"]')
    await page.click('button[data-action="reset"]')
    await page.locator('dialog.dialog button[value="cancel"]').click()  # cancelled: nothing happens
    assert "running" in await page.locator(".session-head").inner_text()
    await page.click('button[data-action="reset"]')
    await page.locator('dialog.dialog button[value="ok"]').click()
    await page.wait_for_selector(".session-head .badge-idle")
    await page.fill('textarea[name="message"]', "what was my project?")
    await page.click('.composer button[type="submit"]')
    await page.wait_for_selector(".notice:has-text('Continuing from the previous session')")
    await page.wait_for_selector('.msg-assistant:has-text("echo: what was my project?")')
    inherited = page.locator('.messages .summary-card[data-kind="inheritance"]')
    assert "MODEL SUMMARY" in await inherited.inner_text()
    await page.click('.tab[data-tab="context"]')
    await page.wait_for_selector('.panel .summary-card[data-kind="inheritance"]')
    await page.click('.tab[data-tab="history"]')
    await page.wait_for_selector(f'.run-card[data-run="{first_run}"] .final-summary')
    cards = page.locator(".run-card")
    assert await cards.count() == 2
    assert "MODEL SUMMARY" in await page.locator(f'.run-card[data-run="{first_run}"]').inner_text()
    await console.shot("session-history")
    await page.click(f'.run-card[data-run="{first_run}"] .card-head a')
    await page.wait_for_selector(".marker")
    assert "completed" in await page.locator(".run-card").inner_text()
    await console.shot("run")


async def scenario_buttons(console: Console, base: str) -> None:
    from playwright.async_api import expect

    page = console.page
    await page.goto(f"{base}/ui#/session/{quote(MAIN, safe='')}")
    head = page.locator(".session-head")
    await head.locator(".badge-running").wait_for()
    await page.click('button[data-action="pin"]')
    await head.locator(".badge-pin").wait_for()
    await expect(page.locator('button[data-action="pin"]')).to_have_text("Unpin")
    await page.click('button[data-action="pause"]')
    await head.locator(".badge-paused").wait_for()
    await expect(page.locator('button[data-action="pause"]')).to_be_disabled()
    await page.click('button[data-action="resume"]')
    await head.locator(".badge-running").wait_for()
    await page.click('button[data-action="uncompact"]')
    await page.wait_for_selector(".notice:has-text('Nothing to undo')")
    await page.goto(f"{base}/ui#/session/{quote(GROUP, safe='')}")
    await page.click('button[data-action="delete"]')
    await page.locator('dialog.dialog button[value="ok"]').click()
    await page.wait_for_selector(f'tr[data-key="{MAIN}"]')
    await expect(page.locator(f'tr[data-key="{GROUP}"]')).to_have_count(0)
    await expect(page.locator(f'tr[data-key="{MAIN}"] .badge-pin')).to_have_count(1)


async def scenario_memory(console: Console, base: str, workspace: Path) -> None:
    from playwright.async_api import expect

    # enough chunks that a forced rebuild lasts long enough to be watched: about 600, a second or
    # more with this embedder, with progress after each embedding call of 32 (written now: the
    # daemon's start-up pass stays small)
    notes = [f"## Shelf {i}\n\nBox {i} of the archive holds the letters of year {1900 + i}." for i in range(600)]
    (workspace / "memory").mkdir()
    (workspace / "memory" / "archive.md").write_text("# Archive\n\n" + "\n\n".join(notes) + "\n")
    page = console.page
    await page.click('.nav a[data-section="memory"]')
    await page.wait_for_selector(".files button:has-text('MEMORY.md')")
    await page.wait_for_selector(".box .badge-running")
    await page.fill('input[name="q"]', "what tea does the user like?")
    await page.click('.search button[type="submit"]')
    hit = page.locator(".hit").first
    await hit.wait_for()
    citation = await hit.locator(".citation").inner_text()
    assert re.fullmatch(r"MEMORY\.md#L\d+-L\d+", citation)
    assert re.search(r"score \d\.\d{3}", await hit.inner_text())
    assert "genmaicha" in await hit.locator(".snippet").inner_text()
    await hit.locator(".citation").click()
    await page.wait_for_selector(".viewer .line.hl:has-text('genmaicha')")
    await page.check('input[name="force"]')
    # the status box shows the rebuild's progress from /v1/memory/status (chunks, rate, time left)
    # while it runs: recorded as it appears, since the rebuild may end before a check could look
    await page.evaluate("""() => {
      window.seenIndexing = [];
      new MutationObserver(() => {
        const text = document.querySelector(".box .indexing")?.textContent;
        if (text) window.seenIndexing.push(text);
      }).observe(document.body, { subtree: true, childList: true, characterData: true });
    }""")
    await page.click("text=Reindex")
    await page.wait_for_selector(".notice:has-text('Reindexed')")
    await page.wait_for_selector(".progress:has-text('Done')")
    seen = await page.evaluate("window.seenIndexing")
    assert any(re.fullmatch(r"\d+ / \d+ chunks · [\d.]+ chunks/s · \d+ (s|min) left", t) for t in seen), seen
    await expect(page.locator(".box .indexing")).to_have_count(0)  # the pass is over: gone
    await console.shot("memory")


async def scenario_phone(browser: Any, base: str) -> None:
    console = Console(await browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True))
    page = console.page
    await page.goto(f"{base}/ui")
    await page.wait_for_selector(f'tr[data-key="{MAIN}"]')
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, "nothing overflows at phone width"
    await console.shot("phone-sessions")
    await page.click(f'tr[data-key="{MAIN}"] a.key-link')
    await page.wait_for_selector(".messages li")
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    await console.shot("phone-session")
    await page.goto(f"{base}/ui#/memory")
    await page.wait_for_selector(".files button")
    await console.shot("phone-memory")
    assert console.errors == []
    await page.close()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(60)
@needs_chromium
async def test_token_prompt_then_the_token_for_the_tab(tmp_path: Path, browser: Any) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with start(tmp_path / "home", {"gateway": {"tokens": [TOKEN]}}) as server:
        await wait_ready(server.url, auth)
        await post_message(server.url, MAIN, {"content": "hi"}, auth)
        # the refused token's 401 is the one error the browser is expected to log
        console = Console(await browser.new_page(), allowed=("status of 401",))
        page = console.page
        await page.goto(f"{server.url}/ui")
        dialog = page.locator("#token-dialog")
        await dialog.wait_for()
        await console.shot("token-prompt")
        await dialog.locator("input").fill("wrong")
        await dialog.locator('button[type="submit"]').click()
        await page.wait_for_selector("#token-dialog .dialog-error:has-text('refused')")
        await dialog.locator("input").fill(TOKEN)
        await dialog.locator('button[type="submit"]').click()
        await page.wait_for_selector(f'tr[data-key="{MAIN}"]')
        await page.wait_for_selector('#live[data-state="live"]')  # the event stream took ?access_token=
        assert await page.evaluate("sessionStorage.getItem('neotask.token')") == TOKEN
        await post_message(server.url, GROUP, {"content": "new"}, auth)
        await page.wait_for_selector(f'tr[data-key="{GROUP}"]')  # arrived live
        await page.reload()
        await page.wait_for_selector(f'tr[data-key="{GROUP}"]')  # kept for the tab: no prompt
        assert await page.locator("#token-dialog").count() == 0
        await console.shot("token-accepted")
        assert console.errors == []
        await page.close()


async def test_ui_routes_need_no_token_and_serve_only_the_console(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"gateway": {"tokens": [TOKEN]}}))
    page = await client.get("/ui")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert '<html lang="en" data-auth="required">' in html and 'src="/ui/app.js"' in html
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert (await client.get("/ui/")).status == 200
    for name, content_type in [("app.js", "text/javascript"), ("app.css", "text/css"), ("dom.js", "text/javascript")]:
        resp = await client.get(f"/ui/{name}")
        assert resp.status == 200 and resp.content_type == content_type, name
    for bad in ["/ui/missing.js", "/ui/..%2Fapi%2Fui.py", "/ui/.hidden.js", "/ui/sub/app.js", "/ui/app.py"]:
        resp = await client.get(bad)
        assert resp.status == 404, bad
        assert (await resp.json())["error"]["code"] == "not_found"
    assert (await client.get("/v1/sessions")).status == 401
    open_app = await aiohttp_client(make_app(tmp_path / "open", clock))
    assert 'data-auth="none"' in await (await open_app.get("/ui")).text()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(120)
@needs_chromium
async def test_history_search_box_jumps_to_the_message_in_an_archived_run(tmp_path: Path, browser: Any) -> None:
    from playwright.async_api import expect

    async with start(tmp_path / "home", {"cleanup": {"retention_days": 0}}) as server:
        base = server.url
        async with aiohttp.ClientSession() as http:
            for i in range(1, 151):
                text = "the lighthouse keeper <b>Ōshima</b> 灯台守 decided" if i == 130 else f"routine note {i}"
                async with http.post(session_url(base, MAIN, "/messages"), json={"content": text}) as r:
                    run_id = (await r.json())["run_id"]
            async with http.post(session_url(base, MAIN, "/complete")) as r:
                assert r.status == 200
            async with http.post(f"{base}/v1/admin/cleanup", json={"dry_run": False}) as r:
                assert any(a["action"] == "archive" and a["done"] for a in (await r.json())["actions"])
        console = Console(await browser.new_page(viewport={"width": 1280, "height": 900}))
        page = console.page
        await page.goto(f"{base}/ui#/search")
        await page.get_by_label("Search history").fill("灯台守")
        await page.get_by_role("button", name="Search").click()
        hit = page.locator(".history-hit")
        await expect(hit).to_have_count(1)
        await expect(hit.locator("mark")).to_have_text("灯台守")
        await expect(hit.locator(".snippet")).to_contain_text("<b>Ōshima</b>")  # text, never parsed as HTML
        await console.shot("history-search")
        await hit.locator(".hit-link").click()
        await expect(page).to_have_url(re.compile(f"#/run/{run_id}\\?seq=130$"))
        target = page.locator("li.msg-target")
        await expect(target).to_have_attribute("data-seq", "130")
        await expect(target).to_be_in_viewport()
        await console.shot("history-jump")
        assert console.errors == []
        await page.close()
