"""ChatProvider against the real local OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import openai
import pytest
from openai.types import CompletionUsage

from config.errors import ConfigError, ProviderFailure
from config.settings import ModelSettings
from conversations.provider import (
    ChatProvider,
    Completion,
    ProviderError,
    ToolCall,
    Usage,
    _SDKClient,
    is_context_overflow,
)
from conversations.provider_transport import LeanAsyncClient
from tests.support.openai_server import (
    Fail,
    Hang,
    Malformed,
    OpenAIServer,
    RecordedRequest,
    Reply,
    ToolCallSpec,
    context_length_error,
    estimate_tokens,
    rate_limited,
    reply,
    server_error,
)

MakeProvider = Callable[..., ChatProvider]
USER = [{"role": "user", "content": "what is in the plan?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "update_plan",
            "description": "Replace the plan.",
            "parameters": {"type": "object", "properties": {"plan": {"type": "string"}}},
        },
    }
]


@pytest.fixture
async def make_provider(openai_server: OpenAIServer) -> AsyncIterator[MakeProvider]:
    providers: list[ChatProvider] = []

    def make(api_key: str | None = None, **overrides: Any) -> ChatProvider:
        fields: dict[str, Any] = {"base_url": openai_server.base_url, "timeout_s": 5, "max_retries": 0}
        provider = ChatProvider(ModelSettings(**(fields | overrides)), api_key=api_key)
        providers.append(provider)
        return provider

    yield make
    for provider in providers:
        await provider.close()


async def stream(provider: ChatProvider, **kwargs: Any) -> tuple[Completion, list[str]]:
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    completion = await provider.complete(USER, on_delta=on_delta, **kwargs)
    return completion, deltas


async def complete(provider: ChatProvider, streaming: bool, **kwargs: Any) -> Completion:
    if streaming:
        return (await stream(provider, **kwargs))[0]
    return await provider.complete(USER, **kwargs)


async def test_reply_and_usage(openai_server: OpenAIServer, make_provider: MakeProvider) -> None:
    provider = make_provider()
    completion = await provider.complete(USER, tools=TOOLS)

    assert completion.content == "echo: what is in the plan?"
    assert completion.tool_calls == ()
    assert completion.finish_reason == "stop"
    assert completion.model == "gpt-4o-mini"
    expected_input = openai_server.requests[-1].prompt_tokens
    assert expected_input == estimate_tokens(USER[0]["content"]) + estimate_tokens(json.dumps(TOOLS))
    assert completion.usage == Usage(expected_input, estimate_tokens(completion.content), 0, 0)

    again = await provider.complete(USER, tools=TOOLS)
    assert again.usage.cache_read_tokens == expected_input


async def test_the_request_carries_model_tools_and_output_limit(
    openai_server: OpenAIServer, make_provider: MakeProvider
) -> None:
    provider = make_provider(max_output_tokens=300)
    await provider.complete(USER, tools=TOOLS)
    await provider.complete(USER, model="summarizer", max_tokens=50)
    first, second = (r.body for r in openai_server.chat_requests)
    assert (first["model"], first["max_tokens"], first["tools"], first["messages"]) == ("gpt-4o-mini", 300, TOOLS, USER)
    assert (second["model"], second["max_tokens"], "tools" in second) == ("summarizer", 50, False)
    assert "stream" not in first


async def test_api_key_is_sent_and_a_wrong_one_is_explained(
    openai_server: OpenAIServer, make_provider: MakeProvider
) -> None:
    openai_server.api_key = "sk-right"
    assert (await make_provider(api_key="sk-right").complete(USER)).content
    with pytest.raises(ProviderError) as caught:
        await make_provider(api_key=None, api_key_env="MY_MODEL_KEY").complete(USER)
    assert openai_server.requests[-1].headers["Authorization"] == "Bearer not-needed"
    assert (caught.value.kind, caught.value.upstream_status) == ("http", 401)
    assert "MY_MODEL_KEY" in caught.value.message


async def test_streaming_forwards_deltas_and_reports_usage(
    openai_server: OpenAIServer, make_provider: MakeProvider
) -> None:
    completion, deltas = await stream(make_provider())

    assert len(deltas) > 1
    assert "".join(deltas) == completion.content == "echo: what is in the plan?"
    assert completion.finish_reason == "stop"
    assert completion.usage.input_tokens == openai_server.requests[-1].prompt_tokens
    assert completion.usage.output_tokens == estimate_tokens(completion.content)
    body = openai_server.requests[-1].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("streaming", [False, True])
async def test_tool_calls(openai_server: OpenAIServer, make_provider: MakeProvider, streaming: bool) -> None:
    openai_server.script(
        Reply(
            text="Let me note that." if streaming else None,
            tool_calls=(
                ToolCallSpec("update_plan", {"plan": "1. ship\n2. celebrate"}, id="call_plan"),
                ToolCallSpec("memory_search", {"query": "deploy key", "k": 3}),
            ),
        )
    )
    completion = await complete(make_provider(), streaming, tools=TOOLS)

    assert completion.finish_reason == "tool_calls"
    assert completion.content == ("Let me note that." if streaming else "")
    first, second = completion.tool_calls
    assert first == ToolCall("call_plan", "update_plan", json.dumps({"plan": "1. ship\n2. celebrate"}))
    assert (second.name, json.loads(second.arguments)) == ("memory_search", {"query": "deploy key", "k": 3})
    assert second.id


@pytest.mark.parametrize("streaming", [False, True])
async def test_server_error_after_retries(
    openai_server: OpenAIServer, make_provider: MakeProvider, streaming: bool
) -> None:
    openai_server.script(server_error(), server_error())
    with pytest.raises(ProviderError) as caught:
        await complete(make_provider(max_retries=1), streaming)
    assert (caught.value.kind, caught.value.upstream_status) == ("http", 500)
    assert isinstance(caught.value, ProviderFailure) and caught.value.status == 502
    assert caught.value.code == "provider_error"
    assert "HTTP 500" in caught.value.message and openai_server.base_url in caught.value.message
    assert len(openai_server.chat_requests) == 2


async def test_a_retry_recovers_from_one_failure(openai_server: OpenAIServer, make_provider: MakeProvider) -> None:
    openai_server.script(rate_limited(), reply("second time lucky"))
    completion = await make_provider(max_retries=1).complete(USER)
    assert completion.content == "second time lucky"


async def test_rate_limit(openai_server: OpenAIServer, make_provider: MakeProvider) -> None:
    openai_server.script(rate_limited())
    with pytest.raises(ProviderError) as caught:
        await make_provider().complete(USER)
    assert (caught.value.kind, caught.value.upstream_status) == ("http", 429)


@pytest.mark.parametrize("streaming", [False, True])
async def test_timeout(openai_server: OpenAIServer, make_provider: MakeProvider, streaming: bool) -> None:
    openai_server.script(Hang(2))
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        await complete(make_provider(timeout_s=0.5), streaming)
    assert caught.value.kind == "timeout"
    assert "0.5 s" in caught.value.message
    assert time.monotonic() - started < 1.5


async def test_a_stalled_stream_times_out(openai_server: OpenAIServer, make_provider: MakeProvider) -> None:
    openai_server.script(Reply("one two three", chunk_delay_s=2))
    with pytest.raises(ProviderError) as caught:
        await stream(make_provider(timeout_s=0.5))
    assert caught.value.kind == "timeout"


async def test_connection_refused(make_provider: MakeProvider) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(ProviderError) as caught:
        await make_provider(base_url=base_url).complete(USER)
    assert caught.value.kind == "connection"
    assert base_url in caught.value.message and "base_url" in caught.value.message


@pytest.mark.parametrize(
    "behaviour",
    [
        Malformed(),
        Malformed(body="<html>Bad gateway</html>", content_type="text/html"),
        Malformed(body='{"choices": "nope"}'),
        Malformed(body='{"choices": []}'),
        Malformed(body='{"choices": [{"message": {"content": 42}}]}'),
        Malformed(body="[1, 2]"),
    ],
)
async def test_malformed_body(openai_server: OpenAIServer, make_provider: MakeProvider, behaviour: Malformed) -> None:
    openai_server.script(behaviour)
    with pytest.raises(ProviderError) as caught:
        await make_provider().complete(USER)
    assert caught.value.kind == "malformed"
    assert "OpenAI-compatible" in caught.value.message


@pytest.mark.parametrize("body", [Malformed().body, '{"choices": [{"delta": "text"}]}', '"just a string"'])
async def test_malformed_stream(openai_server: OpenAIServer, make_provider: MakeProvider, body: str) -> None:
    openai_server.script(Malformed(body=body))
    with pytest.raises(ProviderError) as caught:
        await stream(make_provider())
    assert caught.value.kind == "malformed"


@pytest.mark.parametrize("streaming", [False, True])
async def test_context_length_error_is_overflow(
    openai_server: OpenAIServer, make_provider: MakeProvider, streaming: bool
) -> None:
    openai_server.script(context_length_error(8192, 9000))
    with pytest.raises(ProviderError) as caught:
        await complete(make_provider(max_retries=2), streaming)
    assert (caught.value.kind, caught.value.upstream_status) == ("overflow", 400)
    assert "maximum context length is 8192 tokens" in caught.value.message
    assert len(openai_server.chat_requests) == 1  # a 400 is not retried


async def test_the_server_window_is_enforced(openai_server: OpenAIServer, make_provider: MakeProvider) -> None:
    openai_server.max_context_tokens = 20
    provider = make_provider()
    assert (await provider.complete(USER)).content
    with pytest.raises(ProviderError) as caught:
        await provider.complete([{"role": "user", "content": "x" * 100}])
    assert caught.value.kind == "overflow"


async def test_an_error_inside_the_stream(openai_server: OpenAIServer, make_provider: MakeProvider) -> None:
    too_long = {"error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000"}}
    other = {"error": {"type": "server_error", "message": "model crashed"}}
    openai_server.script(Malformed(body=json.dumps(too_long)), Malformed(body=json.dumps(other)))
    provider = make_provider()
    with pytest.raises(ProviderError) as overflow:
        await stream(provider)
    with pytest.raises(ProviderError) as failure:
        await stream(provider)
    assert overflow.value.kind == "overflow"
    assert failure.value.kind == "http" and "model crashed" in failure.value.message


async def test_switches_to_max_completion_tokens_when_refused(
    openai_server: OpenAIServer, make_provider: MakeProvider
) -> None:
    refusal = Fail(
        400,
        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        code="unsupported_parameter",
        type="invalid_request_error",
    )

    def reasoning_model(request: RecordedRequest) -> Fail | None:
        return refusal if "max_tokens" in request.body else None

    openai_server.add_rule(reasoning_model)
    provider = make_provider()
    assert (await provider.complete(USER)).content
    assert (await provider.complete(USER)).content
    limits = [("max_tokens" in r.body, r.body.get("max_completion_tokens")) for r in openai_server.chat_requests]
    assert limits == [(True, None), (False, 4096), (False, 4096)]


def test_store_only_settings_have_no_provider() -> None:
    with pytest.raises(ConfigError, match="base_url"):
        ChatProvider(ModelSettings(), api_key=None)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (None, Usage()),
        ("garbage", Usage()),
        ({"prompt_tokens": 10, "completion_tokens": 3}, Usage(10, 3, 0, 0)),
        (
            {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}},
            Usage(10, 3, 8, 0),
        ),
        (
            {
                "prompt_tokens": 10,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 6},
            },
            Usage(10, 3, 4, 6),
        ),
        (  # Anthropic-compatible field names
            {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 9},
            Usage(5, 2, 7, 9),
        ),
        ({"prompt_tokens": 10, "completion_tokens": None, "prompt_tokens_details": None}, Usage(10, 0, 0, 0)),
        ({"prompt_tokens": True, "completion_tokens": -3}, Usage()),
        (CompletionUsage(prompt_tokens=12, completion_tokens=4, total_tokens=16), Usage(12, 4, 0, 0)),
    ],
)
def test_usage_from_openai(usage: object, expected: Usage) -> None:
    assert Usage.from_openai(usage) == expected


def test_usage_adds_up() -> None:
    total = Usage(1, 2, 3, 4).add(Usage(10, 20, 30, 40)) + Usage(100, 0, 0, 0)
    assert total == Usage(111, 22, 33, 44)
    assert total.as_dict() == {
        "input_tokens": 111,
        "output_tokens": 22,
        "cache_read_tokens": 33,
        "cache_write_tokens": 44,
    }


OVERFLOWS = [
    (400, "context_length_exceeded", "anything"),
    (  # OpenAI, Azure, DeepSeek
        400,
        None,
        "This model's maximum context length is 128000 tokens. However, your messages resulted in "
        "130000 tokens. Please reduce the length of the messages.",
    ),
    (  # vLLM
        400,
        None,
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
        "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
    ),
    (  # vLLM v1
        400,
        None,
        "The decoder prompt (length 9000) is longer than the maximum model length of 8192. "
        "Make sure that `max_model_len` is no smaller than the number of text tokens.",
    ),
    # llama.cpp
    (400, "exceed_context_size_error", "the request exceeds the available context size, try increasing it"),
    (400, None, "input is too large to process. increase the physical batch size"),
    # Ollama
    (400, None, "prompt too long; exceeded max context length by 1200 tokens"),
    (400, None, "input length exceeds maximum context length"),
    # Anthropic-compatible, Bedrock
    (400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
    (400, None, "Input is too long for requested model."),
    (413, None, "Request too large: the input is too long for this model"),
    (413, "context_length_exceeded", "payload"),
    (  # Mistral
        400,
        None,
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
    ),
    (400, None, "This endpoint's maximum context length is 8192 tokens. However, you requested about 9000 tokens."),
    (400, None, "The input token count (1100000) exceeds the maximum number of tokens allowed (1048576)."),
    (  # text-generation-inference
        400,
        None,
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4097. "
        "Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
    ),
    # LM Studio
    (400, None, "Context size has been exceeded."),
    (
        400,
        None,
        "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded "
        "with context length of only 4096 tokens, which is not enough.",
    ),
    # errors inside a stream or a 200 body carry no HTTP status
    (None, "context_length_exceeded", "in-stream error"),
    (None, None, "prompt is too long"),
]

NOT_OVERFLOWS = [
    (500, "context_length_exceeded", "This model's maximum context length is 4096 tokens."),
    (429, "rate_limit_exceeded", "Request too large for gpt-4o on tokens per min (TPM): Limit 30000."),
    (503, None, "the prompt is too long to fit, try later"),
    (400, "invalid_api_key", "Incorrect API key provided."),
    (400, None, "max_tokens is too large: 100000. This model supports at most 16384 completion tokens."),
    (
        400,
        "string_above_max_length",
        "Invalid 'messages[0].content': string too long. Expected a string with maximum length 10485760.",
    ),
    (400, None, "Invalid value for 'temperature': expected a number between 0 and 2."),
    (413, None, "Request Entity Too Large"),
    (None, None, "model crashed"),
]


@pytest.mark.parametrize(("status", "code", "message"), OVERFLOWS)
def test_is_context_overflow(status: int | None, code: str | None, message: str) -> None:
    assert is_context_overflow(status, code, message)


@pytest.mark.parametrize(("status", "code", "message"), NOT_OVERFLOWS)
def test_is_not_context_overflow(status: int | None, code: str | None, message: str) -> None:
    assert not is_context_overflow(status, code, message)


def test_the_sdk_client_memoizes_the_url_of_a_path_and_follows_a_new_base_url() -> None:
    memo = _SDKClient(base_url="http://127.0.0.1:9/v1", api_key="x")
    plain = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")
    first = memo._prepare_url("/chat/completions")
    assert first == plain._prepare_url("/chat/completions") and memo._prepare_url("/chat/completions") is first
    assert memo._prepare_url("/models") == plain._prepare_url("/models")
    memo.base_url = "http://127.0.0.1:8/v2"
    assert str(memo._prepare_url("/chat/completions")) == "http://127.0.0.1:8/v2/chat/completions"


async def test_the_lean_client_parses_an_absolute_url_once_and_merges_relative_ones_as_httpx_does() -> None:
    async with (
        LeanAsyncClient(base_url="http://127.0.0.1:9/v1/") as lean,
        httpx2.AsyncClient(base_url="http://127.0.0.1:9/v1/") as plain,
    ):
        url = "http://127.0.0.1:8/v1/chat/completions?x=1"
        first = lean._merge_url(url)
        assert first == plain._merge_url(url) and lean._merge_url(url) is first
        assert lean._merge_url("models") == plain._merge_url("models") == httpx2.URL("http://127.0.0.1:9/v1/models")
        assert lean._merged is not None and "models" not in lean._merged
        lean.base_url = "http://127.0.0.1:7/v2/"
        assert lean._merge_url("models") == httpx2.URL("http://127.0.0.1:7/v2/models")


async def test_each_call_sends_its_own_body_and_the_template_stays_empty(
    openai_server: OpenAIServer, make_provider: MakeProvider
) -> None:
    provider = make_provider()
    await provider.complete(USER)
    await provider.complete([{"role": "user", "content": "second"}])
    first, second = (r.body["messages"] for r in openai_server.chat_requests)
    assert (first, second) == (USER, [{"role": "user", "content": "second"}])
    assert provider._options.content is None and provider._options.idempotency_key is None
