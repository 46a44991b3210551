"""The chat provider: one OpenAI-compatible model behind ``openai.AsyncOpenAI``.

Model turns and the summarizer call ``ChatProvider.complete``. Every failure comes out as a
``ProviderError`` whose ``kind`` says what went wrong (``overflow`` makes the caller compact and
retry, SPEC section 5). Answers are parsed from the raw JSON rather than the SDK's models so that a
server that is only roughly OpenAI-compatible (vLLM, Ollama, llama.cpp) still works, and a body
that is not a completion is reported as ``malformed`` instead of surfacing as an ``AttributeError``.

Per call the gateway pays the SDK's request path on top of its own work, so the hot path is kept
lean (what it costs is added to every turn, and to every call of the OpenAI-compatible front door):
one client for the provider's life, the body encoded once as bytes and sent with the SDK's ``request`` (what its
``post`` calls, with options built once per provider; not the typed ``create``), a stream read to
its end so its connection is reused, and ``AiohttpTransport`` under
the SDK (in ``LeanAsyncClient``, which parses each URL once) instead of httpx's default stack.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, cast

import httpx2
import openai
import orjson
from openai._models import FinalRequestOptions

from config.errors import ConfigError
from config.settings import ModelSettings
from conversations.completions import (
    Completion,
    DeltaCallback,
    ProviderError,
    ProviderErrorKind,
    ToolCall,
    Usage,
    _arguments,
    _list,
    _load,
    _Malformed,
    _mapping,
    _text,
    _ToolCallAssembler,
    is_context_overflow,
)
from conversations.provider_transport import AiohttpTransport, LeanAsyncClient, byte_lines, sse_data

__all__ = [  # what a call answers is completions.py's, importable from here as before
    "ChatProvider", "Completion", "DeltaCallback", "ProviderError", "ProviderErrorKind", "ToolCall", "Usage",
    "is_context_overflow",
]  # fmt: skip


class _SDKClient(openai.AsyncOpenAI):
    """The SDK's client, with the URL of each path memoized: the SDK parses ``base_url`` plus the
    path into a URL on every request (about 0.1 ms of the gateway's CPU per model call here), and
    both stay the same for the client's life (a changed ``base_url`` starts a new memo). The
    request path is otherwise the SDK's own."""

    _url_memo: tuple[object, dict[str, httpx2.URL]] | None = None

    def _prepare_url(self, url: str) -> httpx2.URL:
        base = self.base_url
        if self._url_memo is None or self._url_memo[0] is not base:
            self._url_memo = (base, {})
        memo = self._url_memo[1]
        prepared = memo.get(url)
        if prepared is None:
            prepared = memo[url] = super()._prepare_url(url)
        return prepared


class ChatProvider:
    """Chat completions against ``settings.base_url``.

    ``api_key`` is the value of the variable named by ``settings.api_key_env``, read once by the
    caller at start (``None``: the server needs none). ``timeout_s`` bounds each connect and read
    (for a stream: the wait for each chunk); ``max_retries`` retries connection errors, timeouts,
    429 and 5xx with the SDK's backoff (``sdk_retries`` replaces it: 0 when ``conversations.fallbacks``
    retries and records each attempt itself).
    """

    def __init__(self, settings: ModelSettings, *, api_key: str | None, sdk_retries: int | None = None) -> None:
        if settings.base_url is None:
            raise ConfigError("model.base_url is not set: without a model the gateway runs store-only")
        self.settings = settings
        self._token_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
        self._client = _SDKClient(
            base_url=settings.base_url,
            api_key=api_key or "not-needed",
            timeout=settings.timeout_s,
            max_retries=settings.max_retries if sdk_retries is None else sdk_retries,
            http_client=LeanAsyncClient(
                transport=AiohttpTransport(), timeout=settings.timeout_s, follow_redirects=True
            ),
        )
        # What the SDK's ``post`` builds on every call (a pydantic model whose defaults are deep
        # copied field by field); each call sends a copy of it with its body (the SDK copies its
        # options again before it changes anything).
        self._options = FinalRequestOptions.construct(method="post", url=_PATH)

    async def close(self) -> None:
        await self._client.close()

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        model: str | None = None,
        on_delta: DeltaCallback | None = None,
        max_tokens: int | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> Completion:
        """One chat completion. With ``on_delta`` the answer streams and each text delta is awaited
        in order; tool-call fragments are assembled; ``tool_choice`` is sent as given (with tools).
        Raises ``ProviderError``."""
        name = model or self.settings.name
        limit = max_tokens or self.settings.max_output_tokens
        choice = tool_choice if tools and tool_choice else None
        for attempt in range(2):
            try:
                if on_delta is None:
                    return await self._complete(messages, tools, name, limit, choice)
                return await self._stream(messages, tools, name, limit, on_delta, choice)
            except openai.BadRequestError as exc:
                # Newer OpenAI models refuse max_tokens; switch once and remember.
                wants_new = "max_completion_tokens" in str(exc.message)
                if attempt == 0 and self._token_param == "max_tokens" and wants_new:
                    self._token_param = "max_completion_tokens"
                    continue
                raise self._status_error(exc, name) from exc
            except openai.APIStatusError as exc:
                raise self._status_error(exc, name) from exc
            except (openai.APITimeoutError, httpx2.TimeoutException) as exc:
                raise self._timeout_error() from exc
            except (openai.APIConnectionError, httpx2.TransportError) as exc:
                raise self._connection_error(exc) from exc
            except (openai.APIResponseValidationError, _Malformed) as exc:
                raise self._malformed_error(str(exc)) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        name: str,
        limit: int,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> Completion:
        body = self._body(messages, tools, name, limit, tool_choice, stream=False)
        response = await self._client.request(httpx2.Response, self._request_options(body))
        data = _load(response.content, "the response body")
        self._raise_inline_error(data, name)
        choices = _list(data.get("choices"), "choices")
        if not choices:
            raise _Malformed("the response has no choices")
        choice = _mapping(choices[0], "choices[0]")
        message = _mapping(choice.get("message"), "choices[0].message")
        calls = []
        for i, item in enumerate(_list(message.get("tool_calls"), "message.tool_calls")):
            call = _mapping(item, f"message.tool_calls[{i}]")
            function = _mapping(call.get("function"), f"message.tool_calls[{i}].function")
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{i}"
            arguments = _arguments(function.get("arguments"), "tool call arguments")
            calls.append(ToolCall(str(call_id), _text(function.get("name"), "tool call name"), arguments))
        return Completion(
            content=_text(message.get("content"), "message.content"),
            tool_calls=tuple(calls),
            usage=Usage.from_openai(data.get("usage")),
            finish_reason=_finish(choice.get("finish_reason")),
            model=data["model"] if isinstance(data.get("model"), str) else name,
        )

    async def _stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        name: str,
        limit: int,
        on_delta: DeltaCallback,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> Completion:
        parts: list[str] = []
        calls = _ToolCallAssembler()
        usage, finish, answered_model, chunks = Usage(), None, name, 0
        body = self._body(messages, tools, name, limit, tool_choice, stream=True)
        response = cast(
            httpx2.Response,
            await self._client.request(httpx2.Response, self._request_options(body), stream=True, stream_cls=None),
        )
        try:
            events, done = sse_data(byte_lines(response.aiter_bytes())), False
            async for payload in events:
                if payload.strip() == "[DONE]":
                    done = True
                    break
                chunk = _load(payload, "a stream event")
                chunks += 1
                self._raise_inline_error(chunk, name)
                if isinstance(chunk.get("model"), str) and chunk["model"]:
                    answered_model = chunk["model"]
                if chunk.get("usage"):
                    usage = Usage.from_openai(chunk["usage"])
                for item in _list(chunk.get("choices"), "chunk choices"):
                    choice = _mapping(item, "chunk choice")
                    delta = _mapping(choice.get("delta") or {}, "chunk delta")
                    if text := _text(delta.get("content"), "delta.content"):
                        parts.append(text)
                        await on_delta(text)
                    for fragment in _list(delta.get("tool_calls"), "delta.tool_calls"):
                        calls.add(_mapping(fragment, "delta.tool_calls[]"))
                    finish = _finish(choice.get("finish_reason")) or finish
            if done:
                await _drain(events)
        finally:
            await response.aclose()
        if chunks == 0:
            raise _Malformed("the stream ended without a single chunk")
        return Completion("".join(parts), calls.result(), usage, finish, answered_model)

    def _request_options(self, body: bytes) -> FinalRequestOptions:
        """The SDK's ``post(_PATH, content=body)`` options, copied from the provider's template."""
        return self._options.model_copy(update={"content": body})

    def _body(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        name: str,
        limit: int,
        tool_choice: str | dict[str, Any] | None,
        *,
        stream: bool,
    ) -> bytes:
        """The request body, encoded once here. The SDK's typed ``create`` walks every parameter
        key by key (about 15 ms for 17 messages and 4 tools on this machine) and then encodes it;
        ``messages`` and ``tools`` are plain JSON already, so the body goes to the SDK's own
        ``post`` as bytes (same client, auth, retries and status errors)."""
        body: dict[str, Any] = {"model": name, "messages": messages}
        if tools:
            body["tools"] = tools
            if tool_choice:
                body["tool_choice"] = tool_choice
        body[self._token_param] = limit
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        try:
            # Compact UTF-8 like the encoder below, ~25x faster (0.12 ms -> 5 us for 16 messages
            # and a tool here). Floats may be spelled differently (same values); a NaN, which json
            # refuses here, is sent as null.
            return orjson.dumps(body)
        except TypeError:  # what orjson refuses (an integer past 64 bits, a lone surrogate): json's word
            return _BODY_ENCODER.encode(body).encode()

    def _raise_inline_error(self, data: Mapping[str, Any], name: str) -> None:
        """Some servers report errors in a 200 body or inside the stream."""
        error = data.get("error")
        if error is None:
            return
        detail = error if isinstance(error, Mapping) else {"message": str(error)}
        code = detail.get("code")
        status = code if isinstance(code, int) else None
        message = str(detail.get("message") or error)
        if is_context_overflow(None, str(code) if code is not None else None, message):
            raise self._overflow_error(status, message, name)
        raise ProviderError(
            f"the model server at {self.settings.base_url} reported an error for model {name!r}: {message}",
            kind="http",
            upstream_status=status,
        )

    def _status_error(self, exc: openai.APIStatusError, name: str) -> ProviderError:
        status, body = exc.status_code, exc.body
        detail = str(body.get("message") or body) if isinstance(body, Mapping) else str(body or exc.message)
        if is_context_overflow(status, exc.code, detail):
            return self._overflow_error(status, detail, name)
        where = f"the model server at {self.settings.base_url}"
        if status in (401, 403):
            hint = f"set the environment variable {self.settings.api_key_env} to a valid API key"
        elif status == 404:
            hint = f"check that base_url ends in /v1 and that the server serves model {name!r}"
        elif status == 429:
            hint = f"rate limited after {self.settings.max_retries} retries; lower the load or raise max_retries"
        elif status >= 500:
            hint = f"the server failed after {self.settings.max_retries} retries; check its logs"
        else:
            hint = "the server refused the request; check the model name and the server's limits"
        return ProviderError(f"{where} answered HTTP {status}: {detail} ({hint})", kind="http", upstream_status=status)

    def _overflow_error(self, status: int | None, detail: str, name: str) -> ProviderError:
        return ProviderError(
            f"the prompt does not fit the context window of model {name!r} ({detail}); compact the session, "
            "or set the model's context_window to what the server really allows",
            kind="overflow",
            upstream_status=status,
        )

    def _timeout_error(self) -> ProviderError:
        return ProviderError(
            f"the model server at {self.settings.base_url} did not answer within {self.settings.timeout_s:g} s "
            f"({self.settings.max_retries} retries); check that it is up, or raise the model's timeout_s",
            kind="timeout",
        )

    def _connection_error(self, exc: Exception) -> ProviderError:
        cause = exc.__cause__ or exc
        return ProviderError(
            f"could not reach the model server at {self.settings.base_url} ({type(cause).__name__}: {cause}); "
            "check the model's base_url and that the server is running",
            kind="connection",
        )

    def _malformed_error(self, detail: str) -> ProviderError:
        return ProviderError(
            f"the model server at {self.settings.base_url} sent something that is not an OpenAI chat "
            f"completion: {detail}; check that base_url points at an OpenAI-compatible /v1 endpoint",
            kind="malformed",
        )


_PATH = "/chat/completions"
_BODY_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_DRAIN_S = 1.0


async def _drain(events: AsyncIterator[str]) -> None:
    """Read a stream to its end after ``[DONE]`` (normally nothing is left but the end of the
    chunked body): a response closed before its end closes its connection, and the next call would
    open a new one. A server that keeps the stream open past ``[DONE]`` gets ``_DRAIN_S``."""
    try:
        async with asyncio.timeout(_DRAIN_S):
            async for _ in events:
                pass
    except (TimeoutError, httpx2.HTTPError, openai.APIError):
        pass  # the answer is complete; the connection is closed instead of reused


def _finish(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
