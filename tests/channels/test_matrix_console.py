"""Matrix session keys in the console (headless Chromium): a user id's ``:``, a room id's ``!`` and
an event id's ``$`` are escaped inside the key (``%3A``, ``%21``, ``%24``), and the key is escaped
once more as a URL segment. The sessions list, a session's page and its history open the session
the message was posted to (the app in-process, store-only: the keys are what is tested here; the
connector that makes them is tested against Synapse)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from sessions.keys import encode_id, parse_key
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.gateway.test_console import Console, browser, needs_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser, needs_chromium, pytest.mark.realtime]
__all__ = ["browser"]  # the fixture, shared with the console tests

DM = f"agent:main:matrix:dm:{encode_id('@alice:localhost')}"
THREAD = f"agent:main:matrix:channel:{encode_id('!room:localhost')}:thread:{encode_id('$root/ev+1')}"


@pytest.mark.timeout(120)
async def test_matrix_keys_round_trip_through_the_console(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, browser: Any
) -> None:
    assert DM == "agent:main:matrix:dm:@alice%3Alocalhost"
    assert THREAD == "agent:main:matrix:channel:%21room%3Alocalhost:thread:%24root/ev+1"
    assert parse_key(THREAD, agents={"main"}).thread_id == "$root/ev+1"  # the ids come back as the platform wrote them
    client = await aiohttp_client(make_app(tmp_path, clock))
    for key, text in ((DM, "hello from alice"), (THREAD, "a reply in the thread")):
        posted = await client.post(f"/v1/sessions/{quote(key, safe='')}/messages", json={"content": text})
        assert posted.status in (200, 201, 202), await posted.text()
    page = await browser.new_page()
    console = Console(page)
    await page.goto(str(client.make_url("/ui")))
    for key, text in ((DM, "hello from alice"), (THREAD, "a reply in the thread")):
        row = page.locator(f'tr[data-key="{key}"]')
        await row.wait_for(timeout=20_000)
        await row.locator("a").first.click()  # the list's link to the session's page
        await page.get_by_text(key, exact=True).first.wait_for(timeout=20_000)  # the page is the key's
        await page.locator(f"text={text} >> visible=true").first.wait_for(timeout=20_000)
        assert page.url.endswith(f"#/session/{quote(key, safe='')}"), page.url
        await page.goto(str(client.make_url("/ui")))
    # the session's link opened in a new tab, as a tool that unescapes %2F and %3A wrote it (yarl does)
    pasted = Console(await browser.new_page())
    await pasted.page.goto(str(client.make_url(f"/ui#/session/{quote(THREAD, safe='')}")))
    await pasted.page.get_by_text(THREAD, exact=True).first.wait_for(timeout=20_000)
    await pasted.page.locator("text=a reply in the thread >> visible=true").first.wait_for(timeout=20_000)
    assert console.errors == [] and pasted.errors == []
    await client.close()
