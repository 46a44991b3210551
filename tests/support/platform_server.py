"""What the local chat platforms of the test suite (``telegram_server.py``, ``slack_server.py``,
``discord_server.py``) share: an aiohttp app on a free port of 127.0.0.1, every call recorded in
``calls`` with the tests waiting on them (:meth:`PlatformServer.wait_for`), and failures scripted
for the next calls of a method (:class:`Script`), an HTML page among them (:func:`proxy_page`)."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, Self, TypeVar

from aiohttp import web

C = TypeVar("C")
F = TypeVar("F")


class Script(Generic[F]):
    """Failures scripted per method (or path): the next calls of it answer them, one each, in order."""

    def __init__(self) -> None:
        self._queued: dict[str, deque[F]] = {}

    def add(self, key: str, *failures: F) -> None:
        self._queued.setdefault(key, deque()).extend(failures)

    def take(self, key: str) -> F | None:
        """The next failure scripted for ``key``, taken off the script; None when there is none."""
        queued = self._queued.get(key)
        return queued.popleft() if queued else None


def proxy_page(status: int, title: str) -> web.Response:
    """What a reverse proxy answers when the platform behind it is down: an HTML page."""
    html = (f"<html><head><title>{status} {title}</title></head><body><center><h1>{status} {title}</h1>"
            "</center><hr><center>nginx</center></body></html>")  # fmt: skip
    return web.Response(status=status, text=html, content_type="text/html")


class PlatformServer(ABC, Generic[C]):
    """A platform's stand-in: ``url`` once it listens (``port``), ``calls`` the calls it took."""

    def __init__(self) -> None:
        self.calls: list[C] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._changed = asyncio.Condition()

    @abstractmethod
    def app(self) -> web.Application:
        """The platform's routes."""

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_for(self, predicate: Callable[[], object], timeout: float = 30.0) -> None:
        """Return once ``predicate()`` holds, checked after each call or change (TimeoutError after ``timeout``)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def _recording(self, call: C) -> AsyncIterator[None]:
        """``call`` logged; whoever waits is woken once it is answered (or failed)."""
        self.calls.append(call)
        try:
            yield
        finally:
            await self._notify()
