"""The conversation engine over the in-memory backend (``sessions.inmemory``): no files, no
tasks.db, the real local OpenAI-compatible server. What the engine needs of storage is the
Protocol's ``ConversationStore``, so its fast tests can run on this backend."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conversations.events import EventHub
from conversations.metrics import Metrics
from conversations.posts import Post, to_openai
from conversations.provider import ChatProvider
from conversations.run_end import RunEnd, end_run
from conversations.turns import Conversations
from sessions.inmemory import MemoryData, MemoryStore
from sessions.keys import parse_key
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.gateway.helpers import gateway_config
from tests.support.openai_server import OpenAIServer

KEY = "agent:main:main"


@pytest.fixture
async def engine(openai_server: OpenAIServer, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Conversations]:
    settings = gateway_config(tmp_path, base_url=openai_server.base_url).settings
    store = await MemoryStore.open(MemoryData(), clock=clock)
    provider = ChatProvider(settings.agents["main"].model, api_key="test")
    conversations = Conversations(
        store, settings, providers={"main": provider}, hub=EventHub(), metrics=Metrics(), clock=clock
    )
    try:
        yield conversations
    finally:
        await provider.close()
        await store.close()


def post(content: str, **fields: object) -> Post:
    return Post(key=parse_key(KEY, agents={"main"}), message=NewMessage(role="user", content=content, **fields))  # type: ignore[arg-type]


async def test_a_turn_stores_the_message_and_the_reply_in_memory(engine: Conversations) -> None:
    outcome = await engine.post(post("hello there"))
    assert outcome.reply is not None and outcome.reply["content"] == "echo: hello there"
    assert outcome.run_id is not None and outcome.message_seq == 1
    stored = await engine.store.read_messages(outcome.run_id, after_seq=0, limit=10)
    assert [(m["role"], m["content"]) for m in stored] == [("user", "hello there"), ("assistant", "echo: hello there")]
    entry = engine.store.require_entry(KEY)
    assert entry.message_count == 2 and entry.input_tokens == outcome.usage["input_tokens"] > 0


async def test_a_redelivery_is_answered_once(engine: Conversations, openai_server: OpenAIServer) -> None:
    first = await engine.post(post("only once", client_message_id="c-1"))
    again = await engine.post(post("only once", client_message_id="c-1"))
    assert again.body() == first.body() and len(openai_server.chat_requests) == 1
    assert first.run_id is not None
    assert len(await engine.store.read_messages(first.run_id, after_seq=0, limit=10)) == 2


async def test_the_next_run_inherits_the_final_summary(engine: Conversations) -> None:
    first = await engine.post(post("remember the code word tangerine"))
    assert first.run_id is not None
    async with engine.exclusive(KEY):
        await end_run(engine, KEY, RunEnd("command", store_reason="reset", command="/reset"))
    summary = await engine.store.read_final_summary(first.run_id)
    assert summary is not None and "tangerine" in summary
    second = await engine.post(post("what was the code word?"))
    assert second.run_id not in (None, first.run_id)
    assert any(event.get("type") == "inheritance" for event in second.events)
    run = engine.store.active_run(KEY)
    assert run is not None
    context = await engine.store.read_context(run)
    assert first.run_id in str(context[0]["content"]) and "tangerine" in str(context[0]["content"])


def test_a_post_carries_the_stores_message_and_repeats_none_of_its_fields() -> None:
    """One message type: ``Post`` is a ``NewMessage`` plus routing (issue 25)."""
    post_fields = {f.name for f in dataclasses.fields(Post)}
    assert post_fields & {f.name for f in dataclasses.fields(NewMessage)} == set()
    assert post_fields == {"key", "message", "reply", "task_key", "options", "id_scope"}


async def test_the_posted_message_is_stored_as_given_with_an_openai_safe_speaker(engine: Conversations) -> None:
    message = NewMessage(role="user", content="hi", name="Ann Lee!", sender_id="u-1", client_message_id="c-9")
    outcome = await engine.post(Post(key=parse_key(KEY, agents={"main"}), message=message, reply=False))
    assert outcome.run_id is not None and outcome.reply is None
    [stored] = await engine.store.read_messages(outcome.run_id, after_seq=0, limit=10)
    # "!" has no place in OpenAI's name: the speaker is stored as named, and the model reads them in the text
    assert (stored["name"], stored["sender_id"], stored["client_message_id"]) == ("Ann Lee!", "u-1", "c-9")
    assert to_openai(stored) == {"role": "user", "content": "Ann Lee!: hi", "name": "Ann_Lee"}
