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
from tests.sessions.conformance.support import BACKENDS, BASE, COMPAT, DELIVERY, SERVER_BACKENDS, Backend, Harness

DEFAULT_NEEDS = frozenset({BASE, DELIVERY, COMPAT})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" not in metafunc.fixturenames:
        return
    needs = set(DEFAULT_NEEDS)
    for mark in metafunc.definition.iter_markers("capability"):
        needs.update(mark.args)
    names = sorted(name for name, backend in BACKENDS.items() if needs <= backend.capabilities)
    names += sorted(name for name, (_, _, capabilities) in SERVER_BACKENDS.items() if needs <= capabilities)
    metafunc.parametrize("backend_name", names, indirect=False)


@pytest.fixture
def backend(backend_name: str, request: pytest.FixtureRequest) -> Backend:
    """The backend (a sync fixture: a server starts outside any test's event loop; skipped, with
    the reason, where the server cannot run)."""
    if backend_name in SERVER_BACKENDS:
        fixture, on_server, capabilities = SERVER_BACKENDS[backend_name]
        return Backend(on_server(request.getfixturevalue(fixture)), capabilities)
    return BACKENDS[backend_name]


@pytest.fixture
async def harness(backend_name: str, backend: Backend, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Harness]:
    harness = Harness(backend_name, backend, tmp_path / "home", clock)
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
async def store(harness: Harness) -> ConversationStore:
    return await harness.open()
