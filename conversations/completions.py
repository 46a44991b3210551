"""What a model call answers, read from its raw JSON: ``Usage`` (the counts every server names
its own way), ``ToolCall``, ``Completion``, ``ProviderError`` (``kind`` says what went wrong) and
the checks that turn a body that is not a completion into a ``malformed`` error; streamed tool
calls joined by their index. ``conversations/provider.py`` makes the calls."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from config.errors import ProviderFailure

ProviderErrorKind = Literal["overflow", "timeout", "http", "connection", "malformed"]
DeltaCallback = Callable[[str], Awaitable[None]]  # a streamed answer's text deltas, awaited in order


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _first_count(*values: object) -> int:
    return next((_count(v) for v in values if _count(v)), 0)


@dataclass(frozen=True)
class Usage:
    """Token usage of one call (or a sum of calls)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def add(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    __add__ = add

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }

    @classmethod
    def from_openai(cls, usage: object) -> Usage:
        """Read an OpenAI ``usage`` object (a mapping or the SDK model); missing fields count 0.

        Cache reads come from ``prompt_tokens_details.cached_tokens`` (or the Anthropic-compatible
        ``cache_read_input_tokens``); cache writes from whichever ``cache_write``/``cache_creation``
        field the server reports, if any.
        """
        if isinstance(usage, BaseModel):
            usage = usage.model_dump()
        if not isinstance(usage, Mapping):
            return cls()
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, Mapping) else {}
        return cls(
            input_tokens=_first_count(usage.get("prompt_tokens"), usage.get("input_tokens")),
            output_tokens=_first_count(usage.get("completion_tokens"), usage.get("output_tokens")),
            cache_read_tokens=_first_count(
                details.get("cached_tokens"),
                details.get("cache_read_tokens"),
                usage.get("cache_read_input_tokens"),
                usage.get("cache_read_tokens"),
            ),
            cache_write_tokens=_first_count(
                details.get("cache_write_tokens"),
                details.get("cache_creation_tokens"),
                details.get("cache_creation_input_tokens"),
                usage.get("cache_creation_input_tokens"),
                usage.get("cache_write_tokens"),
                usage.get("cache_creation_tokens"),
            ),
        )


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON text, as the model wrote it


@dataclass(frozen=True)
class Completion:
    content: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    finish_reason: str | None
    model: str


class ProviderError(ProviderFailure):
    """The model call failed. Answers 502 ``provider_error``; ``upstream_status`` is the model
    server's HTTP status (``status`` stays the class's 502, which the error middleware renders)."""

    def __init__(self, message: str, *, kind: ProviderErrorKind, upstream_status: int | None = None) -> None:
        super().__init__(message, kind=kind, upstream_status=upstream_status)
        self.kind: ProviderErrorKind = kind
        self.upstream_status = upstream_status


_OVERFLOW_CODES = frozenset({"context_length_exceeded", "context_window_exceeded"})
_OVERFLOW_MESSAGE = re.compile(
    r"context[ _-]length[ _-]exceeded"
    r"|maximum context length"  # OpenAI, vLLM, Mistral, OpenRouter, DeepSeek
    r"|max(imum)? context (length|size|window)"  # Ollama
    r"|context (window|size|length) (has been |was |is )?(exceeded|overflow)"  # LM Studio
    r"|context (the )?overflows"  # LM Studio
    r"|exceeds? the (available |maximum )?context (size|window|length)"  # llama.cpp
    r"|(prompt|input|context) (is |was )?too long"  # Anthropic-compatible, Bedrock
    r"|input is too large to process"  # llama.cpp, batch size
    r"|longer than the maximum model length"  # vLLM v1
    r"|exceeds the maximum number of tokens allowed"  # Gemini
    r"|inputs.? tokens \+ .?max_new_tokens.? must be <="  # TGI
)


def is_context_overflow(status: int | None, code: str | None, message: str) -> bool:
    """SPEC section 5: HTTP 400 or 413 whose code is ``context_length_exceeded`` or whose message
    says the context or input is too long. ``status=None`` (an error inside a stream or a 200 body)
    is judged on the code and message alone."""
    if status not in (None, 400, 413):
        return False
    return (code or "").lower() in _OVERFLOW_CODES or bool(_OVERFLOW_MESSAGE.search(message.lower()))


class _Malformed(Exception):
    """The answer is not an OpenAI chat completion; the text says where."""


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Malformed(f"{where} is {type(value).__name__}, not an object")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Malformed(f"{where} is {type(value).__name__}, not an array")
    return value


def _text(value: object, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, Mapping))
    raise _Malformed(f"{where} is {type(value).__name__}, not text")


def _arguments(value: object, where: str) -> str:
    if isinstance(value, Mapping):  # some servers send the arguments as an object
        return json.dumps(value)
    return _text(value, where)


def _load(payload: str | bytes, where: str) -> Mapping[str, Any]:
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Malformed(f"{where} is not JSON ({exc})") from exc
    return _mapping(data, where)


class _ToolCallAssembler:
    """Joins streamed tool-call fragments by their ``index`` (or ``id`` when a server omits it)."""

    def __init__(self) -> None:
        self._calls: list[dict[str, str]] = []
        self._by_index: dict[int, dict[str, str]] = {}

    def add(self, fragment: Mapping[str, Any]) -> None:
        index, ident = fragment.get("index"), fragment.get("id")
        call: dict[str, str] | None = None
        if isinstance(index, int):
            call = self._by_index.get(index)
        elif ident:
            call = next((c for c in self._calls if c["id"] == ident), None)
        elif self._calls:
            call = self._calls[-1]
        if call is None:
            call = {"id": "", "name": "", "arguments": ""}
            self._calls.append(call)
            if isinstance(index, int):
                self._by_index[index] = call
        if isinstance(ident, str) and ident:
            call["id"] = ident
        function = _mapping(fragment.get("function") or {}, "delta.tool_calls[].function")
        name = _text(function.get("name"), "tool call name")
        if name and name != call["name"]:
            call["name"] += name
        call["arguments"] += _arguments(function.get("arguments"), "tool call arguments")

    def result(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"]) for i, c in enumerate(self._calls) if c["name"]
        )
