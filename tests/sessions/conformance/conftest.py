"""Fixtures of the conformance suite: ``harness`` (one per backend) and ``store`` (open on it).

Every case runs over every backend (``support.BACKENDS``) that has the capabilities the case
needs: by default the base and the record capabilities (``RunStore``, ``DeliveryRecords``,
``CompatRecords``); a case marked ``@pytest.mark.capability("X")`` runs only where X is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessions.protocol import ConversationStore
from tests.conftest import FakeClock
from tests.sessions.conformance.support import BACKENDS, BASE, COMPAT, DELIVERY, Harness

DEFAULT_NEEDS = frozenset({BASE, DELIVERY, COMPAT})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" not in metafunc.fixturenames:
        return
    needs = set(DEFAULT_NEEDS)
    for mark in metafunc.definition.iter_markers("capability"):
        needs.update(mark.args)
    names = sorted(name for name, backend in BACKENDS.items() if needs <= backend.capabilities)
    metafunc.parametrize("backend_name", names, indirect=False)


@pytest.fixture
async def harness(backend_name: str, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Harness]:
    harness = Harness(backend_name, BACKENDS[backend_name], tmp_path / "home", clock)
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
async def store(harness: Harness) -> ConversationStore:
    return await harness.open()
