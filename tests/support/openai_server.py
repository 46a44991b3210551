"""A real OpenAI-compatible HTTP server for the test suite and the benchmarks.

It speaks enough of the OpenAI protocol for the official ``openai`` package: chat completions
(plain and ``stream: true`` server-sent events, with the usage chunk when
``stream_options.include_usage`` is set), embeddings (float or base64) and the model list.

By default every answer is deterministic: the reply is ``echo: <last user message>``, usage is
estimated from the request (SPEC section 4: ``len // 4`` per message, tool schemas as JSON text) and
``cached_tokens`` is the part of the prompt that repeats an earlier request's prefix. Tests change
the behaviour of the next chat requests in three ways, checked in this order:

1. ``max_context_tokens``: any request whose estimated prompt is larger gets the OpenAI
   ``context_length_exceeded`` error, as a real model would;
2. rules (``add_rule``): callables ``RecordedRequest -> Behaviour | None`` for dynamic cases such as
   "when the system prompt asks for a summary, answer with a summary";
3. the script (``script``): a FIFO of behaviours, one consumed per request that no rule answered.

Every request is recorded in ``requests`` for assertions. Standalone (benchmarks, manual use)::

    python -m tests.support.openai_server --port 8900
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import re
import signal
import struct
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

CREATED = 1_700_000_000
DEFAULT_MALFORMED_BODY = '{"id": "chatcmpl-broken", "object": "chat.completion", "choices": ['


@dataclass(frozen=True)
class ToolCallSpec:
    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """A successful completion. ``text=None`` means the default echo, or null content with tool calls."""

    text: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None  # merged over the estimated usage
    chunk_delay_s: float = 0.0  # pause between streamed chunks


@dataclass(frozen=True)
class Fail:
    """An HTTP error with an OpenAI error body."""

    status: int = 500
    message: str = "The server had an error while processing your request."
    code: str | None = None
    type: str = "server_error"
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hang:
    """Wait ``seconds`` before answering (with ``then``, or the default); ended early by ``close``,
    or by ``until`` being set (the test releases the request)."""

    seconds: float
    then: Behaviour | None = None
    until: asyncio.Event | None = None


@dataclass(frozen=True)
class Malformed:
    """A body that is not a valid completion (in a stream: one broken ``data:`` event)."""

    body: str = DEFAULT_MALFORMED_BODY
    status: int = 200
    content_type: str = "application/json"


Behaviour = Reply | Fail | Hang | Malformed
Rule = Callable[["RecordedRequest"], Behaviour | None]


def reply(text: str) -> Reply:
    return Reply(text=text)


def tool_call(name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None) -> Reply:
    return Reply(tool_calls=(ToolCallSpec(name, {} if arguments is None else arguments, id),))


def server_error(status: int = 500) -> Fail:
    return Fail(status=status)


def rate_limited(retry_after_s: float = 0.01) -> Fail:
    return Fail(
        status=429,
        message="Rate limit reached for requests. Please try again later.",
        code="rate_limit_exceeded",
        type="requests",
        headers={"retry-after-ms": str(int(retry_after_s * 1000))},
    )


def context_length_error(max_tokens: int = 4096, prompt_tokens: int | None = None) -> Fail:
    used = max_tokens + 1 if prompt_tokens is None else prompt_tokens
    return Fail(
        status=400,
        message=(
            f"This model's maximum context length is {max_tokens} tokens. However, your messages "
            f"resulted in {used} tokens. Please reduce the length of the messages."
        ),
        code="context_length_exceeded",
        type="invalid_request_error",
    )


_CJK = re.compile(r"[\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f\u3400-\u4dbf\u4e00-\u9fff]")


def estimate_tokens(text: str) -> int:
    """SPEC section 4: ``len // 4`` (``// 2`` when at least half is kana/CJK), at least 1 if non-empty."""
    if not text:
        return 0
    divisor = 2 if 2 * len(_CJK.findall(text)) >= len(text) else 4
    return max(1, len(text) // divisor)


def content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def message_tokens(message: Mapping[str, Any]) -> int:
    tokens = estimate_tokens(content_text(message.get("content")))
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        tokens += estimate_tokens(str(function.get("arguments", "")))
    return tokens


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    body: Any
    headers: Mapping[str, str]
    prompt_tokens: int = 0  # the estimate, for chat completions

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages") if isinstance(self.body, dict) else None
        return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []

    @property
    def system_text(self) -> str:
        return "\n".join(content_text(m.get("content")) for m in self.messages if m.get("role") == "system")

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return content_text(users[-1].get("content")) if users else ""

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def tool_names(self) -> list[str]:
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        return [t.get("function", {}).get("name", "") for t in tools or () if isinstance(t, dict)]


def prompt_estimate(body: Mapping[str, Any]) -> int:
    messages = body.get("messages") or []
    tokens = sum(message_tokens(m) for m in messages if isinstance(m, dict))
    if body.get("tools"):
        tokens += estimate_tokens(json.dumps(body["tools"]))
    return tokens


def embed(text: str, dimensions: int) -> list[float]:
    """Feature hashing of words (and CJK bigrams): deterministic, and overlapping texts are close."""
    vector = [0.0] * dimensions
    features = re.findall(r"\w+", text.lower())
    features += [w[i : i + 2] for w in list(features) if not w.isascii() for i in range(len(w) - 1)]
    for feature in features or [""]:
        digest = hashlib.sha256(feature.encode()).digest()
        index = int.from_bytes(digest[:4], "little") % dimensions
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class OpenAIServer:
    """A started-on-demand aiohttp server; use ``async with OpenAIServer() as server``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "test-model",
        max_context_tokens: int | None = None,
        latency_s: float = 0.0,
        api_key: str | None = None,
        embedding_dimensions: int = 256,
    ) -> None:
        self.host = host
        self.port = port
        self.model = model
        self.max_context_tokens = max_context_tokens
        self.latency_s = latency_s
        self.api_key = api_key
        self.embedding_dimensions = embedding_dimensions
        self.requests: list[RecordedRequest] = []
        self._script: deque[Behaviour] = deque()
        self._rules: list[Rule] = []
        self._prefixes: set[bytes] = set()
        self._counter = 0
        self._closing = asyncio.Event()
        self._recorded = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    # -- scripting ---------------------------------------------------------------------------
    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next chat requests that no rule answers, in order."""
        self._script.extend(behaviours)

    def add_rule(self, rule: Rule) -> None:
        self._rules.append(rule)

    def clear(self) -> None:
        """Forget the script, the rules, the recorded requests and the prefix cache."""
        self._script.clear()
        self._rules.clear()
        self.requests.clear()
        self._prefixes.clear()

    @property
    def pending(self) -> int:
        return len(self._script)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    async def wait_for_requests(
        self, count: int, *, path: str = "/v1/chat/completions", timeout: float = 30.0
    ) -> list[RecordedRequest]:
        """Wait until ``count`` requests to ``path`` were received (for turns run in the background).
        30 s: a wait, not a timing claim (5 s ran out once in a loaded make test, while the other
        worker converted an embedding model)."""

        def matching() -> list[RecordedRequest]:
            return [r for r in self.requests if r.path == path]

        async with asyncio.timeout(timeout), self._recorded:
            await self._recorded.wait_for(lambda: len(matching()) >= count)
        return matching()

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        self._closing.clear()
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> OpenAIServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- handlers ----------------------------------------------------------------------------
    async def _record(self, request: web.Request, body: Any, prompt_tokens: int = 0) -> RecordedRequest:
        recorded = RecordedRequest(request.method, request.path, body, dict(request.headers), prompt_tokens)
        async with self._recorded:
            self.requests.append(recorded)
            self._recorded.notify_all()
        return recorded

    async def _read_json(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except (ValueError, UnicodeDecodeError):
            return None

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        body = _error_body("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        return web.json_response(body, status=401)

    async def _sleep(self, seconds: float, until: asyncio.Event | None = None) -> bool:
        """Sleep unless the server is closing (False) or ``until`` is set (True)."""
        if seconds <= 0:
            return not self._closing.is_set()
        waits = [asyncio.ensure_future(self._closing.wait())]
        if until is not None:
            waits.append(asyncio.ensure_future(until.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        return not self._closing.is_set()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        valid = isinstance(body, dict) and isinstance(body.get("messages"), list)
        prompt_tokens = prompt_estimate(body) if valid else 0
        recorded = await self._record(request, body, prompt_tokens)
        if (denied := self._unauthorized(request)) is not None:
            return denied
        if not valid:
            message = "The request body must be a JSON object with a 'messages' array."
            return web.json_response(_error_body(message, "invalid_request_error", None, "messages"), status=400)
        if not await self._sleep(self.latency_s):
            return web.Response(status=503)
        behaviour = self._choose(recorded)
        while isinstance(behaviour, Hang):
            if not await self._sleep(behaviour.seconds, behaviour.until):
                return web.Response(status=503)
            behaviour = behaviour.then or Reply()
        if isinstance(behaviour, Fail):
            return web.json_response(
                _error_body(behaviour.message, behaviour.type, behaviour.code),
                status=behaviour.status,
                headers=dict(behaviour.headers),
            )
        if isinstance(behaviour, Malformed) and not (body.get("stream") and behaviour.status == 200):
            return web.Response(text=behaviour.body, status=behaviour.status, content_type=behaviour.content_type)
        return await self._answer(request, body, behaviour, prompt_tokens)

    def _choose(self, recorded: RecordedRequest) -> Behaviour:
        if self.max_context_tokens is not None and recorded.prompt_tokens > self.max_context_tokens:
            return context_length_error(self.max_context_tokens, recorded.prompt_tokens)
        for rule in self._rules:
            if (behaviour := rule(recorded)) is not None:
                return behaviour
        return self._script.popleft() if self._script else Reply()

    def _cached_tokens(self, body: Mapping[str, Any]) -> int:
        """Tokens of the longest whole-message prefix (tools first) that an earlier request sent."""
        digest = hashlib.sha256(json.dumps(body.get("tools"), sort_keys=True).encode()).digest()
        tools_tokens = estimate_tokens(json.dumps(body["tools"])) if body.get("tools") else 0
        cached, running = 0, tools_tokens
        if len(self._prefixes) > 1_000_000:
            self._prefixes.clear()
        for message in body.get("messages") or ():
            digest = hashlib.sha256(digest + json.dumps(message, sort_keys=True).encode()).digest()
            running += message_tokens(message) if isinstance(message, dict) else 0
            if digest in self._prefixes:
                cached = running
            self._prefixes.add(digest)
        return cached

    async def _answer(
        self, request: web.Request, body: dict[str, Any], behaviour: Reply | Malformed, prompt_tokens: int
    ) -> web.StreamResponse:
        self._counter += 1
        ident = f"chatcmpl-{self._counter}"
        model = str(body.get("model") or self.model)
        cached = self._cached_tokens(body)
        if isinstance(behaviour, Malformed):
            return await self._stream(request, ident, model, [], behaviour.body, None)
        text = behaviour.text
        if text is None and not behaviour.tool_calls:
            text = f"echo: {RecordedRequest('', '', body, {}).last_user_text}"
        calls: list[dict[str, Any]] = [
            {
                "id": spec.id or f"call_{self._counter}_{i}",
                "type": "function",
                "function": {"name": spec.name, "arguments": spec.arguments_json()},
            }
            for i, spec in enumerate(behaviour.tool_calls)
        ]
        finish = behaviour.finish_reason or ("tool_calls" if calls else "stop")
        completion_tokens = estimate_tokens(text or "") + sum(
            estimate_tokens(c["function"]["arguments"]) for c in calls
        )
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        usage.update(behaviour.usage or {})
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            chunks = _stream_chunks(text, calls, finish)
            return await self._stream(
                request, ident, model, chunks, None, usage if include_usage else None, behaviour.chunk_delay_s
            )
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return web.json_response(
            {
                "id": ident,
                "object": "chat.completion",
                "created": CREATED,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": usage,
            }
        )

    async def _stream(
        self,
        request: web.Request,
        ident: str,
        model: str,
        chunks: Sequence[dict[str, Any]],
        broken: str | None,
        usage: dict[str, Any] | None,
        delay_s: float = 0.0,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        envelope = {"id": ident, "object": "chat.completion.chunk", "created": CREATED, "model": model}
        if broken is not None:
            await response.write(f"data: {broken}\n\n".encode())
        for i, chunk in enumerate(chunks):
            if i and not await self._sleep(delay_s):
                return response
            event = {**envelope, "choices": [{"index": 0, **chunk}]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        if usage is not None:
            await response.write(f"data: {json.dumps({**envelope, 'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        await self._record(request, body)
        if (denied := self._unauthorized(request)) is not None:
            return denied
        raw = body.get("input") if isinstance(body, dict) else None
        if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)):
            raw = [raw]
        if not isinstance(raw, list) or not raw:
            message = "'input' must be a string or a non-empty array of strings."
            return web.json_response(_error_body(message, "invalid_request_error", None, "input"), status=400)
        assert isinstance(body, dict)
        dimensions = body.get("dimensions") or self.embedding_dimensions
        if not isinstance(dimensions, int) or dimensions < 1:
            message = "'dimensions' must be a positive integer."
            return web.json_response(_error_body(message, "invalid_request_error", None, "dimensions"), status=400)
        if not await self._sleep(self.latency_s):
            return web.Response(status=503)
        texts = [t if isinstance(t, str) else " ".join(map(str, t)) for t in raw]
        data = []
        for i, text in enumerate(texts):
            vector = embed(text, dimensions)
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(estimate_tokens(t) for t in texts)
        model = str(body.get("model") or self.model)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "data": data, "model": model, "usage": usage})

    def _model_entry(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": CREATED, "owned_by": "neotask-tests"}

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request, None)
        return web.json_response({"object": "list", "data": [self._model_entry(self.model)]})

    async def _model(self, request: web.Request) -> web.Response:
        await self._record(request, None)
        return web.json_response(self._model_entry(request.match_info["model"]))


def _stream_chunks(text: str | None, calls: list[dict[str, Any]], finish: str) -> list[dict[str, Any]]:
    """The deltas of one answer: role, text word by word, each tool call in fragments, finish."""
    chunks: list[dict[str, Any]] = [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    for piece in re.findall(r"\s*\S+\s*|\s+", text or ""):
        chunks.append({"delta": {"content": piece}, "finish_reason": None})
    for index, call in enumerate(calls):
        arguments = call["function"]["arguments"]
        function = {"name": call["function"]["name"], "arguments": ""}
        head = {"index": index, "id": call["id"], "type": "function", "function": function}
        chunks.append({"delta": {"tool_calls": [head]}, "finish_reason": None})
        step = max(1, math.ceil(len(arguments) / 3))
        for start in range(0, len(arguments), step):
            fragment = {"index": index, "function": {"arguments": arguments[start : start + step]}}
            chunks.append({"delta": {"tool_calls": [fragment]}, "finish_reason": None})
    chunks.append({"delta": {}, "finish_reason": finish})
    return chunks


async def _serve(args: argparse.Namespace) -> None:
    server = OpenAIServer(
        host=args.host,
        port=args.port,
        model=args.model,
        max_context_tokens=args.max_context_tokens,
        latency_s=args.latency_ms / 1000,
        api_key=args.api_key,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"OpenAI-compatible test server listening on {server.base_url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A local OpenAI-compatible server with deterministic answers.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900, help="0 picks a free port (printed at start)")
    parser.add_argument("--model", default="test-model")
    parser.add_argument("--max-context-tokens", type=int, default=None)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added before every answer")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
