"""Models that fail over: an agent's model and its ``model.fallbacks``, tried
in order.

``ModelChain`` stands where a ``ChatProvider`` stood (same ``complete``): it makes the retries
itself (its providers' SDK clients retry nothing), so that each attempt is seen, waited for as the
server asked and recorded. A timeout, a lost connection, HTTP 408, 409, 429 and 5xx are retried
``max_retries`` times per model (after ``Retry-After`` when the server sends one, up to
``retry_after_max_s``, else after ``backoff_s`` doubled per retry, at most 8 s); then the next model
is tried. A longer ``Retry-After`` moves on at once. Any other failure (a refused request, an
overflow that compaction must answer, a malformed answer) is raised as it is, and so is a failure
after a streamed answer began (its deltas reached the caller: another model would repeat them).

Attempts go to the list :func:`collect_attempts` opens in the caller's context; the model turn
records them in tools.jsonl when any failed (a call that answered at once writes nothing more).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from config.clock import Clock
from config.settings import ModelSettings
from conversations.completions import Completion, DeltaCallback, ProviderError
from sessions.protocol import RunStore
from sessions.records import RunState, ToolUse

if TYPE_CHECKING:
    from conversations.provider import ChatProvider

RETRIED_STATUSES = frozenset({408, 409, 429})
MAX_BACKOFF_S = 8.0
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Attempt:
    """One model call of a chain: which model, how it ended, how long it took and was waited after."""

    model: str
    base_url: str | None
    fallback: int  # 0: the agent's model; n: its n-th fallback
    attempt: int  # 1-based, per model
    duration_ms: float
    error: str | None = None
    error_kind: str | None = None
    status: int | None = None
    retry_after_s: float | None = None
    waited_ms: float = 0.0  # the pause after this attempt, before the next
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


_ATTEMPTS: contextvars.ContextVar[list[Attempt] | None] = contextvars.ContextVar("model_attempts", default=None)


@contextlib.contextmanager
def collect_attempts() -> Iterator[list[Attempt]]:
    """The attempts of the chain calls made inside the block (in this task's context)."""
    attempts: list[Attempt] = []
    token = _ATTEMPTS.set(attempts)
    try:
        yield attempts
    finally:
        _ATTEMPTS.reset(token)


def _note(attempt: Attempt) -> None:
    attempts = _ATTEMPTS.get()
    if attempts is not None:
        attempts.append(attempt)


def retryable(exc: ProviderError) -> bool:
    """A failure another attempt (or model) may not meet: timeouts, lost connections, 408/409/429/5xx."""
    if exc.kind in ("timeout", "connection"):
        return True
    status = exc.upstream_status
    return exc.kind == "http" and status is not None and (status in RETRIED_STATUSES or status >= 500)


def retry_after(exc: ProviderError, now: datetime) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, ``Retry-After`` in seconds or as an
    HTTP date), from the status error the provider error was raised from; None when it sent none."""
    import openai  # loaded already: a provider error comes from a provider (the SDK is imported with it)

    cause = exc.__cause__
    if not isinstance(cause, openai.APIStatusError):
        return None
    headers = cause.response.headers
    millis = headers.get("retry-after-ms")
    if millis:
        with contextlib.suppress(ValueError):
            return max(0.0, float(millis) / 1000)
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True)
class Link:
    provider: ChatProvider
    name: str | None  # None: the caller's model (a session's override) or the agent's
    retries: int


def fallback_settings(primary: ModelSettings) -> list[ModelSettings]:
    """Each fallback as whole model settings: its fields over the primary's (its API key is the
    primary's only on the primary's server: ``ModelChain``)."""
    chain = []
    for fallback in primary.fallbacks:
        given = {k: v for k, v in fallback.model_dump().items() if v is not None}
        chain.append(primary.model_copy(update={**given, "fallbacks": ()}))
    return chain


async def load_provider_sdk() -> None:
    """Import the openai SDK (``conversations/provider.py``, about 0.4 s of CPU) in a thread, so a
    ``ModelChain`` built on a running loop (the start-up of a daemon, a config reload adding the
    first model) does not hold the loop for it. Idempotent: a second call finds it imported."""
    if "conversations.provider" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "conversations.provider")


class ModelChain:
    """An agent's model and its fallbacks behind ``ChatProvider.complete``."""

    def __init__(
        self,
        settings: ModelSettings,
        *,
        env: Mapping[str, str],
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        from conversations.provider import ChatProvider  # the openai SDK: loaded only with a model configured

        self.settings = settings
        self._clock = clock
        self._sleep = sleep
        self.links = [
            Link(
                ChatProvider(settings, api_key=env.get(settings.api_key_env), sdk_retries=0), None, settings.max_retries
            )
        ]
        for given, one in zip(settings.fallbacks, fallback_settings(settings), strict=True):
            # the agent's key goes to the agent's server only: a fallback elsewhere names its own
            same_server = given.base_url is None or given.base_url == settings.base_url
            key = env.get(one.api_key_env) if given.api_key_env is not None or same_server else None
            self.links.append(Link(ChatProvider(one, api_key=key, sdk_retries=0), one.name, one.max_retries))

    async def close(self) -> None:
        for link in self.links:
            await link.provider.close()

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
        """``ChatProvider.complete`` over the chain; raises the last ``ProviderError`` (with every
        model's failure named when there are fallbacks)."""
        failures: list[tuple[str, ProviderError]] = []
        for index, link in enumerate(self.links):
            name = link.name or model or self.settings.name
            for number in range(1, link.retries + 2):
                streamed = False

                async def delta(text: str) -> None:
                    nonlocal streamed
                    streamed = True
                    assert on_delta is not None
                    await on_delta(text)

                started = time.perf_counter()
                try:
                    completion = await link.provider.complete(
                        messages,
                        tools=tools,
                        model=name,
                        on_delta=None if on_delta is None else delta,
                        max_tokens=max_tokens,
                        tool_choice=tool_choice,
                    )
                except ProviderError as exc:
                    elapsed = (time.perf_counter() - started) * 1000
                    again = retryable(exc) and not streamed
                    asked = retry_after(exc, self._clock()) if again else None
                    wait: float | None = None
                    if again and number <= link.retries and (asked is None or asked <= self.settings.retry_after_max_s):
                        wait = (
                            asked
                            if asked is not None
                            else min(MAX_BACKOFF_S, self.settings.backoff_s * 2 ** (number - 1))
                        )
                    _note(
                        Attempt(
                            name, link.provider.settings.base_url, index, number, elapsed, exc.message, exc.kind,
                            exc.upstream_status, asked, (wait or 0.0) * 1000,
                        )
                    )  # fmt: skip
                    if not again:
                        raise
                    if wait is None:  # this model's retries are spent, or it asked for too long
                        failures.append((name, exc))
                        break
                    await self._sleep(wait)
                    continue
                _note(
                    Attempt(
                        name, link.provider.settings.base_url, index, number, (time.perf_counter() - started) * 1000,
                        output_tokens=completion.usage.output_tokens,
                    )
                )  # fmt: skip
                return completion
        name, last = failures[-1]
        if len(self.links) == 1:
            raise last
        tried = "; ".join(f"{model_name!r}: {exc.message}" for model_name, exc in failures)
        raise ProviderError(
            f"every model failed (the agent's and {len(self.links) - 1} fallback(s)): {tried}",
            kind=last.kind,
            upstream_status=last.upstream_status,
        ) from last


async def record_attempts(store: RunStore, run: RunState, attempts: list[Attempt]) -> None:
    """Every attempt of a model call in the run's tools.jsonl (``tool_name: "model"``), when any
    failed; a call answered at once by the first model writes nothing."""
    if all(a.ok for a in attempts):
        return
    for a in attempts:
        await store.record_tool(
            run,
            ToolUse(
                tool_name="model",
                arguments={"model": a.model, "base_url": a.base_url, "fallback": a.fallback, "attempt": a.attempt},
                result={"output_tokens": a.output_tokens} if a.ok else None,
                error=a.error,
                duration_ms=a.duration_ms,
                extra={
                    "kind": "model_attempt",
                    "status": a.status,
                    "error_kind": a.error_kind,
                    "retry_after_s": a.retry_after_s,
                    "waited_ms": round(a.waited_ms, 3),
                },
            ),
        )
