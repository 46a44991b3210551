"""The event loop the daemon runs on (``gateway.event_loop``): ``auto`` takes uvloop when it is
installed and the stdlib loop otherwise; ``uvloop`` requires it; ``asyncio`` is the stdlib loop.
Everything in the gateway works on either; uvloop only makes the socket and callback machinery
cheaper."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from config.errors import ConfigError

T = TypeVar("T")
LoopChoice = Literal["auto", "asyncio", "uvloop"]


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: LoopChoice) -> Literal["asyncio", "uvloop"]:
    """The loop ``choice`` means on this machine."""
    if choice == "asyncio":
        return "asyncio"
    if uvloop_available():
        return "uvloop"
    if choice == "uvloop":
        raise ConfigError(
            "gateway.event_loop is uvloop but uvloop is not installed: pip install uvloop, or set it to auto"
        )
    return "asyncio"


def loop_factory(choice: LoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for ``asyncio.Runner`` (None: the stdlib default)."""
    if resolve(choice) == "asyncio":
        return None
    import uvloop

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: LoopChoice) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
