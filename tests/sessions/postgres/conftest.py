"""Fixtures of the PostgreSQL backend's own tests: an empty database on the suite's server, and a
way to open stores on it (several at once stand for several gateway processes)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sessions.postgres.store import PgStore
from tests.conftest import FakeClock
from tests.sessions.helpers import settings_with
from tests.support.postgres import DATABASE, PgServer, empty_database

Opener = Callable[[], Awaitable[PgStore]]


@pytest.fixture
def pg_dsn(postgres_server: PgServer) -> str:
    return postgres_server.dsn(DATABASE)


@pytest.fixture
async def open_store(postgres_server: PgServer, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Opener]:
    """Opens a store on an emptied database (each call another store: another process); all are
    closed at the end."""
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    opened: list[PgStore] = []

    async def opener() -> PgStore:
        store = await PgStore.open(settings_with(), dsn=dsn, clock=clock, pool_size=2)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        with contextlib.suppress(Exception):  # a test that stopped the server closes what it can
            await store.close()
