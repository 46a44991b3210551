"""What the CLI does when no daemon runs: take the home lock and open the same object graph the
daemon opens (``gateway/services.py``, without its timers: no APScheduler, no background
rebuilds), so a reset writes its final summary, a compaction runs the memory flush and a cron job
delivers to ``deliver_to`` exactly as the daemon would. Answers use the HTTP API's JSON shapes,
through the same operations (``gateway/operations.py``).

Each function is one short-lived session: open the services (recovery runs), do one thing, close
them (sessions.json flushed). The doctor is the exception: ``sessions.backends.open_doctor`` gives
the storage's ``Doctor`` (the files backend's works on the files without opening the store, whose
recovery would change what it is meant to report).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from config.clock import system_clock
from config.loader import LoadedConfig
from home.layout import Home
from home.lock import HomeLock, clear_lock_dir
from sessions.backends import open_doctor, open_store
from sessions.keys import parse_key
from sessions.protocol import StoreProtocol

if TYPE_CHECKING:
    from conversations.posts import ReplyBody
    from gateway.services import Services

T = TypeVar("T")
PROGRESS_AFTER_S = 1.0  # work that takes longer says what it is doing (on stderr)


@contextlib.contextmanager
def progress(label: str | None, *, out: TextIO | None = None, after_s: float = PROGRESS_AFTER_S) -> Iterator[None]:
    """Say ``<label>...`` on stderr once the work has taken ``after_s``, and how long it took at
    the end; quick work prints nothing."""
    if label is None:
        yield
        return
    stream = out or sys.stderr
    started = time.monotonic()
    shown = threading.Event()

    def show() -> None:
        shown.set()
        print(f"{label}...", file=stream, flush=True)

    timer = threading.Timer(after_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if shown.is_set():
            print(f"{label}: done in {time.monotonic() - started:.1f} s", file=stream, flush=True)


def locked(config: LoadedConfig, work: Callable[[], T]) -> T:
    """Run ``work`` holding the home lock (``HomeLocked`` when a daemon or another CLI has it)."""
    with HomeLock(Home(config.home).lock_file):
        return work()


def with_store(config: LoadedConfig, work: Callable[[StoreProtocol], Awaitable[T]]) -> T:
    """Only the store (export, purge, history search: nothing of a conversation happens)."""

    async def run() -> T:
        store = await open_store(config.home, config.settings, clock=system_clock)
        try:
            return await work(store)
        finally:
            await store.close()

    return locked(config, lambda: asyncio.run(run()))


def with_services(
    config: LoadedConfig,
    env: Mapping[str, str],
    work: Callable[[Services], Awaitable[T]],
    *,
    label: str | None = None,
) -> T:
    """The daemon's object graph under the home lock, without timers. The memory index is opened
    when a model is configured (the memory flush and the memory tools need it; without a model
    nothing can call them), as it stands: the embedding model loads only if a search needs a
    vector. ``label``: what the work is, shown if it takes over a second."""
    with progress(label):  # from here: the imports take seconds too
        # Imported here: the model client (openai) takes seconds to import, and the lighter
        # commands (gateway status, config, doctor) never need it.
        from gateway.services import Parts, open_services

        has_model = any(agent.model.base_url for agent in config.settings.agents.values())

        async def run() -> T:
            parts = Parts(memory=has_model, timers=False)
            async with open_services(config, env=env, clock=system_clock, parts=parts) as services:
                return await work(services)

        return locked(config, lambda: asyncio.run(run()))


def list_sessions(
    config: LoadedConfig,
    env: Mapping[str, str],
    *,
    agent: str | None,
    chat_type: str | None,
    status: str | None,
    limit: int | None,
    cursor: str | None = None,
) -> dict[str, Any]:
    """As ``GET /v1/sessions`` (one page after ``cursor``); ``limit`` None: every session."""
    from gateway import operations

    async def work(services: Services) -> dict[str, Any]:
        entries = operations.matching_sessions(services.store, agent=agent, chat_type=chat_type, status=status)
        page, next_cursor = operations.page_of(entries, limit=limit or max(len(entries), 1), cursor=cursor)
        return {"sessions": operations.describe_sessions(services.commands, page), "next_cursor": next_cursor}

    return with_services(config, env, work)


def show_session(config: LoadedConfig, env: Mapping[str, str], key: str) -> dict[str, Any]:
    from gateway import operations

    raw = _check_key(config, key)

    async def work(services: Services) -> dict[str, Any]:
        return operations.describe_session(services.commands, raw)

    return with_services(config, env, work)


def run_command(config: LoadedConfig, key: str, command: str, env: Mapping[str, str]) -> ReplyBody:
    """A chat command (``/reset``, ``/compact``) through the daemon's ``Commands``: its body."""
    from gateway import operations

    parsed = parse_key(key, agents=config.settings.agents)

    async def work(services: Services) -> ReplyBody:
        return (await operations.run_command(services.commands, parsed, command)).body()

    return with_services(config, env, work, label=f"{command.split(maxsplit=1)[0]} on {key}")


def delete_session(config: LoadedConfig, env: Mapping[str, str], key: str) -> dict[str, Any]:
    from gateway import operations

    raw = _check_key(config, key)

    async def work(services: Services) -> dict[str, Any]:
        return await operations.delete_session(services.conversations, raw)

    return with_services(config, env, work)


def run_doctor(config: LoadedConfig, *, fix: bool) -> dict[str, Any]:
    """The doctor of the configured storage (``Doctor``: the files and the history index, or the
    database and its index); with ``fix`` on the files backend, an empty directory in place of
    gateway.lock (which stops the lock from being taken at all) is removed first."""
    files = config.settings.storage.backend != "postgres"
    cleared = clear_lock_dir(Home(config.home).lock_file) if fix and files else None

    async def work() -> list[dict[str, Any]]:
        async with open_doctor(config.home, config.settings, clock=system_clock) as doctor:
            return await doctor.check(fix=fix)

    findings = locked(config, lambda: asyncio.run(work()))
    return {"actions": ([cleared] if cleared else []) + findings}


def _check_key(config: LoadedConfig, key: str) -> str:
    return parse_key(key, agents=config.settings.agents).raw
