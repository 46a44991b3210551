"""Self-tests of the local OpenAI-compatible server, through the official client and raw HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.openai_server import (
    Fail,
    Hang,
    Malformed,
    OpenAIServer,
    RecordedRequest,
    Reply,
    ToolCallSpec,
    estimate_tokens,
    rate_limited,
    reply,
    server_error,
    tool_call,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def client(openai_server: OpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="test", max_retries=0, timeout=5)
    yield client
    await client.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("a", 1),
        ("abcd" * 10, 10),
        ("こんにちは世界", 3),
        ("日本語 text", 2),
        ("日本語テキストab", 4),
        ("abc日", 1),
    ],
)
def test_estimate_tokens_follows_spec_section_4(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


async def test_base_url_is_loopback_with_the_real_port(openai_server: OpenAIServer) -> None:
    assert openai_server.port > 0
    assert openai_server.base_url == f"http://127.0.0.1:{openai_server.port}/v1"


async def test_models_are_listed(client: openai.AsyncOpenAI) -> None:
    page = await client.models.list()
    assert [m.id for m in page.data] == ["test-model"]
    assert (await client.models.retrieve("other")).id == "other"


async def test_default_reply_echoes_the_last_user_message_with_estimated_usage(
    openai_server: OpenAIServer, client: openai.AsyncOpenAI
) -> None:
    tools: list[Any] = [{"type": "function", "function": {"name": "update_plan", "parameters": {"type": "object"}}}]
    messages: list[Any] = [
        {"role": "system", "content": "s" * 40},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "a" * 20},
        {"role": "user", "content": "second question"},
    ]
    completion = await client.chat.completions.create(model="m", messages=messages, tools=tools)

    assert completion.choices[0].message.content == "echo: second question"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "m"
    expected = 10 + 3 + 5 + 3 + estimate_tokens(json.dumps(tools))
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == expected == openai_server.requests[-1].prompt_tokens
    assert completion.usage.completion_tokens == estimate_tokens("echo: second question")
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 0


async def test_cached_tokens_count_a_repeated_prefix(client: openai.AsyncOpenAI) -> None:
    first: list[Any] = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "one"}]
    await client.chat.completions.create(model="m", messages=first)
    second: list[Any] = [*first, {"role": "assistant", "content": "echo: one"}, {"role": "user", "content": "two"}]
    completion = await client.chat.completions.create(model="m", messages=second)
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 100 + 1  # the system prompt and "one"


async def test_stream_sends_chunks_usage_and_done(openai_server: OpenAIServer, http: aiohttp.ClientSession) -> None:
    body = {"model": "m", "messages": user("hello big world"), "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with http.post(f"{openai_server.base_url}/chat/completions", json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = await response.text()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "echo: hello big world"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == estimate_tokens("hello big world")


async def test_stream_without_include_usage_has_no_usage_chunk(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model="m", messages=user("hi"), stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hi"


async def test_streamed_tool_calls_arrive_in_fragments(openai_server: OpenAIServer, client: openai.AsyncOpenAI) -> None:
    openai_server.script(tool_call("memory_search", {"query": "where is the deploy key?", "k": 3}))
    stream = await client.chat.completions.create(model="m", messages=user("x"), stream=True)
    fragments = [
        call for chunk in [c async for c in stream] if chunk.choices for call in chunk.choices[0].delta.tool_calls or []
    ]
    assert len(fragments) > 2
    assert fragments[0].function is not None and fragments[0].function.name == "memory_search"
    arguments = "".join((f.function.arguments or "") if f.function else "" for f in fragments)
    assert json.loads(arguments) == {"query": "where is the deploy key?", "k": 3}


async def test_script_is_a_fifo_then_the_default(openai_server: OpenAIServer, client: openai.AsyncOpenAI) -> None:
    openai_server.script(
        reply("first"),
        Reply(tool_calls=(ToolCallSpec("update_plan", {"plan": "a"}, id="call_x"), ToolCallSpec("memory_get", "{}"))),
    )
    assert openai_server.pending == 2
    answers = [await client.chat.completions.create(model="m", messages=user("q")) for _ in range(3)]

    assert answers[0].choices[0].message.content == "first"
    calls = answers[1].choices[0].message.tool_calls or []
    assert answers[1].choices[0].finish_reason == "tool_calls"
    assert answers[1].choices[0].message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("call_x", "update_plan", '{"plan": "a"}'),
        ("call_2_1", "memory_get", "{}"),
    ]
    assert answers[2].choices[0].message.content == "echo: q"
    assert openai_server.pending == 0


async def test_rules_answer_before_the_script(openai_server: OpenAIServer, client: openai.AsyncOpenAI) -> None:
    def summarize(request: RecordedRequest) -> Reply | None:
        return reply("SUMMARY") if "summar" in request.system_text else None

    openai_server.add_rule(summarize)
    openai_server.script(reply("scripted"))
    summary_request: list[Any] = [{"role": "system", "content": "Please summarize."}, *user("long transcript")]
    summary = await client.chat.completions.create(model="m", messages=summary_request)
    normal = await client.chat.completions.create(model="m", messages=user("hi"))
    assert summary.choices[0].message.content == "SUMMARY"
    assert normal.choices[0].message.content == "scripted"


async def test_max_context_tokens_answers_the_openai_overflow_error(
    openai_server: OpenAIServer, client: openai.AsyncOpenAI
) -> None:
    openai_server.max_context_tokens = 50
    openai_server.script(reply("kept for the next request that fits"))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=user("x" * 204))
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.type == "invalid_request_error"
    assert "maximum context length is 50 tokens" in caught.value.message
    fits = await client.chat.completions.create(model="m", messages=user("x" * 200))
    assert fits.choices[0].message.content == "kept for the next request that fits"
    assert max(r.prompt_tokens for r in openai_server.chat_requests) == 51


@pytest.mark.parametrize(
    ("behaviour", "status"),
    [(server_error(), 500), (server_error(503), 503), (rate_limited(), 429), (Fail(404, "no such model"), 404)],
)
async def test_scripted_http_errors(
    openai_server: OpenAIServer, http: aiohttp.ClientSession, behaviour: Fail, status: int
) -> None:
    openai_server.script(behaviour)
    async with http.post(f"{openai_server.base_url}/chat/completions", json={"messages": user("x")}) as response:
        assert response.status == status
        body = await response.json()
        for name, value in behaviour.headers.items():
            assert response.headers[name] == value
    assert body["error"]["message"] == behaviour.message


@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_body(openai_server: OpenAIServer, http: aiohttp.ClientSession, stream: bool) -> None:
    openai_server.script(Malformed())
    body = {"messages": user("x"), "stream": stream}
    async with http.post(f"{openai_server.base_url}/chat/completions", json=body) as response:
        assert response.status == 200
        text = await response.text()
    assert '"choices": [' in text
    with pytest.raises(ValueError):
        json.loads(text.removeprefix("data: ").split("\n\n")[0])


async def test_hang_delays_the_answer(openai_server: OpenAIServer, client: openai.AsyncOpenAI) -> None:
    openai_server.script(Hang(0.3, then=reply("late")))
    started = time.monotonic()
    completion = await client.chat.completions.create(model="m", messages=user("x"))
    assert time.monotonic() - started >= 0.3
    assert completion.choices[0].message.content == "late"


async def test_a_client_timeout_during_a_hang(openai_server: OpenAIServer) -> None:
    openai_server.script(Hang(30))
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=user("x"))
    await client.close()


async def test_close_ends_hanging_requests_at_once(http: aiohttp.ClientSession) -> None:
    server = OpenAIServer()
    await server.start()
    server.script(Hang(30))
    request = asyncio.create_task(http.post(f"{server.base_url}/chat/completions", json={"messages": user("x")}))
    await server.wait_for_requests(1)
    started = time.monotonic()
    await server.close()
    try:
        response = await request
        assert response.status == 503
        response.release()
    except aiohttp.ClientError:
        pass
    assert time.monotonic() - started < 5


async def test_requests_are_recorded_and_can_be_awaited(
    openai_server: OpenAIServer, client: openai.AsyncOpenAI
) -> None:
    task = asyncio.create_task(openai_server.wait_for_requests(2, timeout=5))
    await client.chat.completions.create(model="a", messages=user("one"))
    await client.chat.completions.create(model="b", messages=user("two"), max_tokens=7)
    recorded = await task
    assert [r.body["model"] for r in recorded] == ["a", "b"]
    assert recorded[1].body["max_tokens"] == 7
    assert recorded[1].last_user_text == "two"
    assert recorded[0].headers["Authorization"] == "Bearer test"
    with pytest.raises(TimeoutError):
        await openai_server.wait_for_requests(3, timeout=0.05)


async def test_an_invalid_request_gets_400(openai_server: OpenAIServer, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{openai_server.base_url}/chat/completions", data=b"{not json") as response:
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "messages"


async def test_api_key_is_enforced_when_set(openai_server: OpenAIServer) -> None:
    openai_server.api_key = "secret"
    wrong = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="wrong", max_retries=0)
    right = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="secret", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.chat.completions.create(model="m", messages=user("x"))
    assert (await right.chat.completions.create(model="m", messages=user("x"))).choices
    await wrong.close()
    await right.close()


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_embeddings_are_deterministic_normalized_and_sized(client: openai.AsyncOpenAI) -> None:
    texts = ["the deploy key lives in vault", "where is the deploy key", "bananas are yellow"]
    first = await client.embeddings.create(model="e", input=texts, dimensions=32)  # base64 on the wire
    again = await client.embeddings.create(model="e", input=texts, dimensions=32, encoding_format="float")
    vectors = [d.embedding for d in first.data]
    for vector, floats in zip(vectors, again.data, strict=True):
        assert vector == pytest.approx(floats.embedding, abs=1e-6)
    assert all(len(v) == 32 for v in vectors)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5) for v in vectors)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert first.usage.prompt_tokens > 0
    default = await client.embeddings.create(model="e", input="one text")
    assert len(default.data[0].embedding) == 256


async def test_standalone_process_prints_its_url_and_serves() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.openai_server", "--port", "0", "--model", "bench-model",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        base_url = line.rsplit(" ", 1)[-1].strip()
        assert base_url.startswith("http://127.0.0.1:")
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        assert [m.id for m in (await client.models.list()).data] == ["bench-model"]
        await client.close()
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0
