"""Pytest fixtures shared by the suite; load with ``pytest_plugins = ["tests.support.fixtures"]``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.openai_server import OpenAIServer


@pytest.fixture
async def openai_server() -> AsyncIterator[OpenAIServer]:
    """A started OpenAI-compatible server on 127.0.0.1; ``base_url`` is ``http://127.0.0.1:<port>/v1``."""
    async with OpenAIServer() as server:
        yield server
