"""Fixtures of the conformance suite: ``harness`` (one per backend) and ``store`` (open on it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessions.protocol import StoreProtocol
from tests.conftest import FakeClock
from tests.sessions.conformance.support import BACKENDS, Harness


@pytest.fixture(params=sorted(BACKENDS))
async def harness(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Harness]:
    harness = Harness(BACKENDS[request.param], tmp_path / "home", clock)
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
async def store(harness: Harness) -> StoreProtocol:
    return await harness.open()
