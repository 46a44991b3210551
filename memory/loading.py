"""Loading an embedding model (or a heavy library) without holding up a shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def release_freed_memory() -> None:
    """Give the heap memory freed so far back to the system (glibc's ``malloc_trim``; elsewhere
    nothing). A model load frees most of what it allocated (the file parsed, weights dequantized
    in float32 before their bfloat16 copy, a model built and then replaced), which glibc keeps
    for later: about 200 MB of the default embedders' load (``python -m bench.memory_scale``)."""
    if (trim := _malloc_trim()) is not None:
        trim(0)


class ModelLoader:
    """Loads a model once, on a daemon thread of its own: a shutdown never waits for a load (it
    cannot be interrupted, takes seconds, and its result is not needed by a process that exits).
    ``load_sync`` may also be called from other threads (encode calls): they wait for the load."""

    def __init__(self, load: Callable[[], None], *, name: str) -> None:
        self._load = load
        self._name = name
        self._lock = threading.Lock()
        self._done = False
        self._thread: threading.Thread | None = None

    @property
    def loading(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def load_sync(self) -> None:
        if self._done:
            return
        with self._lock:
            if not self._done:
                log.info("%s: started", self._name)
                began = time.monotonic()
                self._load()
                self._done = True
                release_freed_memory()
                log.info("%s: finished in %.1f s", self._name, time.monotonic() - began)

    async def load(self) -> None:
        if self._done:
            return
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if finished.done():
                return
            if error is None:
                finished.set_result(None)
            else:
                finished.set_exception(error)

        def run() -> None:
            error: BaseException | None = None
            try:
                self.load_sync()
            except BaseException as exc:  # handed to the awaiting task, which raises it
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, error)

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        await finished


class ModelThread:
    """A local model's own inference thread (``memory-embed``: inference never runs on the event
    loop, and one model's calls run one at a time) and its ``ModelLoader``."""

    def __init__(self, load: Callable[[], None], *, name: str) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-embed")
        self.loader = ModelLoader(load, name=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the model's thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def close(self) -> None:
        """Stop the thread: not waiting for a load in progress (nor for an encode waiting for it);
        otherwise waiting for it off the event loop."""
        await asyncio.to_thread(self.executor.shutdown, wait=not self.loader.loading, cancel_futures=True)
