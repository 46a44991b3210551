"""Fixtures of the conformance suite: ``harness`` (one per backend) and ``store`` (open on it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessions.protocol import StoreProtocol
from tests.conftest import FakeClock
from tests.sessions.conformance.support import BACKENDS, SERVER_BACKENDS, Factory, Harness


@pytest.fixture(params=sorted([*BACKENDS, *SERVER_BACKENDS]))
def backend(request: pytest.FixtureRequest) -> Factory:
    """The backend's factory (a sync fixture: a server starts outside any test's event loop)."""
    if request.param in SERVER_BACKENDS:  # skipped, with the reason, where the server cannot run
        fixture, on_server = SERVER_BACKENDS[request.param]
        return on_server(request.getfixturevalue(fixture))
    return BACKENDS[request.param]


@pytest.fixture
async def harness(backend: Factory, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Harness]:
    harness = Harness(backend, tmp_path / "home", clock)
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
async def store(harness: Harness) -> StoreProtocol:
    return await harness.open()
