"""The memory benchmarks stay runnable (quick sizes; the figures of a quick run mean nothing)."""

from __future__ import annotations

import asyncio

import pytest

from bench import memory_retrieval


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_retrieval_benchmark_runs_quick() -> None:
    # on a thread: the benchmark runs its own event loop, and this test's loop must stay free
    status = await asyncio.to_thread(memory_retrieval.main, ["--quick"])
    assert status in (0, 1)
