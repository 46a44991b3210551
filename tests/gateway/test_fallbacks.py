"""Models that fail over (issue 29 item 5): ``ModelChain`` against the real local
OpenAI-compatible server scripted to fail (timeouts, 500, 429 with Retry-After), with a fallback
that answers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from config.settings import ModelSettings
from conversations.fallbacks import Attempt, ModelChain, collect_attempts
from conversations.provider import ProviderError
from tests.conftest import FakeClock
from tests.support.openai_server import Behaviour, Fail, Hang, OpenAIServer, RecordedRequest, Reply

USER = [{"role": "user", "content": "hello"}]
MakeChain = Callable[..., ModelChain]


def by_model(failures: dict[str, list[Behaviour]]) -> Callable[[RecordedRequest], Behaviour | None]:
    """A rule answering each model's requests with its list of behaviours, in order (then the default)."""

    def rule(request: RecordedRequest) -> Behaviour | None:
        queue = failures.get(str(request.body.get("model")))
        return queue.pop(0) if queue else None

    return rule


@pytest.fixture
async def make_chain(openai_server: OpenAIServer, clock: FakeClock) -> AsyncIterator[tuple[MakeChain, list[float]]]:
    chains: list[ModelChain] = []
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    def make(**fields: Any) -> ModelChain:
        settings = {"base_url": openai_server.base_url, "name": "primary", "timeout_s": 5, "max_retries": 2} | fields
        chain = ModelChain(ModelSettings(**settings), env={}, clock=clock, sleep=sleep)
        chains.append(chain)
        return chain

    yield make, slept
    for chain in chains:
        await chain.close()


def outline(attempts: list[Attempt]) -> list[tuple[str, int | None, bool]]:
    return [(a.model, a.status, a.ok) for a in attempts]


async def test_500s_spend_the_retries_with_backoff_then_the_fallback_answers(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, slept = make_chain
    openai_server.add_rule(by_model({"primary": [Fail(500)] * 3}))
    chain = make(fallbacks=["backup"], backoff_s=0.25)
    with collect_attempts() as attempts:
        completion = await chain.complete(USER)
    assert completion.content == "echo: hello"
    assert [r.body["model"] for r in openai_server.chat_requests] == ["primary"] * 3 + ["backup"]
    assert outline(attempts) == [("primary", 500, False)] * 3 + [("backup", None, True)]
    assert [a.fallback for a in attempts] == [0, 0, 0, 1]
    assert slept == [0.25, 0.5]  # doubled per retry; none after the last, the fallback follows at once


async def test_429_waits_what_retry_after_asks_then_answers(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, slept = make_chain
    limited = Fail(429, "Rate limit reached", code="rate_limit_exceeded", headers={"Retry-After": "3"})
    openai_server.script(limited)
    with collect_attempts() as attempts:
        completion = await make(fallbacks=["backup"]).complete(USER)
    assert completion.content == "echo: hello"
    assert slept == [3.0]
    assert outline(attempts) == [("primary", 429, False), ("primary", None, True)]
    assert attempts[0].retry_after_s == 3.0 and attempts[0].waited_ms == 3000


async def test_retry_after_as_an_http_date_and_in_milliseconds(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]], clock: FakeClock
) -> None:
    make, slept = make_chain
    in_ten = (clock().replace(microsecond=0)).timestamp() + 10
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(in_ten))
    openai_server.script(Fail(429, headers={"Retry-After": date}), Fail(503, headers={"retry-after-ms": "1500"}))
    await make().complete(USER)
    assert slept == [pytest.approx(10, abs=1), 1.5]


async def test_a_retry_after_longer_than_the_cap_moves_on_to_the_fallback_at_once(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, slept = make_chain
    openai_server.add_rule(by_model({"primary": [Fail(429, headers={"Retry-After": "3600"})]}))
    with collect_attempts() as attempts:
        completion = await make(fallbacks=["backup"], retry_after_max_s=30).complete(USER)
    assert completion.content == "echo: hello"
    assert slept == []
    assert outline(attempts) == [("primary", 429, False), ("backup", None, True)]


async def test_a_timeout_fails_over_to_a_fallback_on_another_server(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, _ = make_chain
    async with OpenAIServer() as other:
        openai_server.add_rule(lambda request: Hang(30))
        chain = make(timeout_s=0.3, max_retries=1, fallbacks=[{"name": "elsewhere", "base_url": other.base_url}])
        started = time.perf_counter()
        with collect_attempts() as attempts:
            completion = await chain.complete(USER)
        assert time.perf_counter() - started < 5
        assert completion.content == "echo: hello"
        assert [r.body["model"] for r in other.chat_requests] == ["elsewhere"]
    assert [(a.model, a.error_kind, a.base_url) for a in attempts] == [
        ("primary", "timeout", openai_server.base_url),
        ("primary", "timeout", openai_server.base_url),
        ("elsewhere", None, other.base_url),
    ]


async def test_when_every_model_fails_the_error_names_each(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, _ = make_chain
    openai_server.add_rule(lambda request: Fail(502))
    with collect_attempts() as attempts, pytest.raises(ProviderError) as caught:
        await make(max_retries=0, fallbacks=["backup", {"name": "third", "max_retries": 1}]).complete(USER)
    assert "every model failed" in caught.value.message
    assert all(f"'{name}'" in caught.value.message for name in ("primary", "backup", "third"))
    assert caught.value.upstream_status == 502
    assert [a.model for a in attempts] == ["primary", "backup", "third", "third"]


async def test_a_refused_request_is_not_retried_nor_sent_to_a_fallback(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, slept = make_chain
    openai_server.script(Fail(401, "bad key", type="invalid_request_error"))
    with pytest.raises(ProviderError) as caught:
        await make(fallbacks=["backup"]).complete(USER)
    assert caught.value.upstream_status == 401
    assert len(openai_server.chat_requests) == 1 and slept == []


async def test_without_fallbacks_the_last_error_is_the_models_own(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, slept = make_chain
    openai_server.script(*[Fail(500)] * 3)
    with pytest.raises(ProviderError) as caught:
        await make().complete(USER)
    assert "answered HTTP 500" in caught.value.message and "after 2 retries" in caught.value.message
    assert len(openai_server.chat_requests) == 3 and slept == [0.5, 1.0]


async def test_a_session_model_override_applies_to_the_agents_model_only(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, _ = make_chain
    openai_server.add_rule(by_model({"chosen": [Fail(500)]}))
    await make(max_retries=0, fallbacks=["backup"]).complete(USER, model="chosen")
    assert [r.body["model"] for r in openai_server.chat_requests] == ["chosen", "backup"]


async def test_a_stream_that_times_out_before_its_first_text_is_retried_and_streams_once(
    openai_server: OpenAIServer, make_chain: tuple[MakeChain, list[float]]
) -> None:
    make, slept = make_chain
    openai_server.script(Reply(text="slow words", chunk_delay_s=2.0))
    seen: list[str] = []

    async def on_delta(text: str) -> None:
        seen.append(text)

    with collect_attempts() as attempts:
        completion = await make(timeout_s=0.5, fallbacks=["backup"]).complete(USER, on_delta=on_delta)
    assert "".join(seen) == completion.content == "echo: hello"
    assert [(a.model, a.error_kind) for a in attempts] == [("primary", "timeout"), ("primary", None)]
    assert slept == [0.5]


async def test_the_agents_api_key_goes_to_a_fallback_on_another_server_only_when_it_names_one(
    clock: FakeClock,
) -> None:
    async def no_wait(seconds: float) -> None:
        pass

    async with OpenAIServer(api_key="primary-secret") as primary, OpenAIServer() as other:
        primary.add_rule(lambda request: Fail(503))
        env = {"OPENAI_API_KEY": "primary-secret", "OTHER_KEY": "other-secret"}
        fallbacks: list[Any] = [
            {"name": "same-server"},
            {"name": "elsewhere", "base_url": other.base_url},
            {"name": "elsewhere-keyed", "base_url": other.base_url, "api_key_env": "OTHER_KEY"},
        ]
        settings = ModelSettings(base_url=primary.base_url, name="primary", max_retries=0, fallbacks=fallbacks)
        chain = ModelChain(settings, env=env, clock=clock, sleep=no_wait)
        try:
            other.add_rule(by_model({"elsewhere": [Fail(500)]}))
            await chain.complete(USER)
        finally:
            await chain.close()
        assert [r.headers.get("Authorization") for r in primary.chat_requests] == ["Bearer primary-secret"] * 2
        sent = {r.body["model"]: r.headers.get("Authorization", "") for r in other.chat_requests}
        assert "primary-secret" not in sent["elsewhere"]
        assert sent["elsewhere-keyed"] == "Bearer other-secret"
