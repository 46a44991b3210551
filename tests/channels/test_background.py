"""The one "stored → background turn → deliver" path (``channels/background.py``) and the webhook
intake on it (``channels/hooks.py``), which answers typed outcomes that the route renders: real
app, real store, the local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from channels.background import BackgroundTurns, Outcome, Post, StoredFn, TurnFailure
from channels.hooks import Accepted, Duplicate
from config.errors import BadRequest, ShuttingDown
from gateway.keys import CONVERSATIONS, WEBHOOKS
from sessions.keys import parse_key
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.gateway.test_webhooks import ENV, docs_payload, docs_variant, github_hooks
from tests.support.openai_server import OpenAIServer, server_error

pytestmark = pytest.mark.realtime


async def test_a_webhook_delivery_is_a_typed_outcome_the_route_renders(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, github_hooks(), base_url=openai_server.base_url, env=ENV))
    hooks = client.app[WEBHOOKS]
    mapping = hooks.mapping("github")
    first = await hooks.receive("github", mapping, json.loads(docs_payload()), "d-1")
    assert not isinstance(first, web.StreamResponse)
    assert isinstance(first, Accepted) and first.message_seq == 1 and first.run_id is not None
    again = await hooks.receive("github", mapping, json.loads(docs_variant("x")), "d-1")
    assert again == Duplicate("d-1", first.session_key, 1)
    await hooks.idle()
    replayed = await hooks.receive("github", mapping, json.loads(docs_variant("y")), None, signature="sig-a")
    assert isinstance(replayed, Accepted) and replayed.message_seq == 3  # after the first answer (seq 2)
    assert await hooks.receive("github", mapping, json.loads(docs_variant("z")), None, signature="sig-a") == Duplicate(
        None, first.session_key, 3
    )
    await hooks.idle()


def _post(text: str) -> Post:
    return Post(key=parse_key("agent:main:main", agents=["main"]), message=NewMessage(role="user", content=text))


async def test_post_and_deliver_returns_once_stored_and_delivers_the_answer_or_the_failure(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    turns = BackgroundTurns(client.app[CONVERSATIONS])
    delivered: list[tuple[Outcome, TurnFailure | None]] = []

    async def deliver(outcome: Outcome, failure: TurnFailure | None) -> None:
        delivered.append((outcome, failure))

    stored = await turns.post_and_deliver(_post("first"), deliver, name="test")
    assert stored.message_seq == 1 and stored.reply is None  # durable; the turn goes on
    await turns.idle()
    [(answer, failure)] = delivered
    assert failure is None and answer.reply is not None and answer.reply["content"] == "echo: first"

    openai_server.script(server_error(500))
    stored = await turns.post_and_deliver(_post("second"), deliver, name="test")
    assert stored.message_seq == 3
    await turns.idle()
    outcome, failure = delivered[1]
    assert outcome.message_seq == 3 and failure is not None and failure.code == "provider_error"


async def test_an_error_before_the_store_is_the_callers_and_shutdown_fails_what_is_not_stored(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, base_url=openai_server.base_url))
    turns = BackgroundTurns(client.app[CONVERSATIONS])

    async def refused(stored: StoredFn) -> None:
        raise BadRequest("no such thing")

    with pytest.raises(BadRequest, match="no such thing"):
        await turns.launch("refused", refused)

    release = asyncio.Event()

    async def slow(stored: StoredFn) -> None:
        await release.wait()

    waiting = turns.launch("slow", slow)
    await asyncio.sleep(0)
    await turns.close()
    with pytest.raises(ShuttingDown):
        await waiting

    async def finishes_without_storing(stored: StoredFn) -> None:
        return None

    with pytest.raises(ShuttingDown):  # a turn that never said "stored" is not taken for one
        await turns.launch("quiet", finishes_without_storing)
