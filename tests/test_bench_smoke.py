"""Keep the benchmarks runnable: a quick pass of each, with no assertion on timings (machines are
noisy; the figures are read by people from a full ``make bench`` run)."""

from __future__ import annotations

import asyncio

import pytest

from bench import sessions_engine


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_sessions_engine_bench_runs_quick() -> None:
    # On a thread: the benchmark runs its own event loop, and this test's loop must stay free.
    status = await asyncio.to_thread(sessions_engine.main, ["--quick"])
    assert status in (0, 1)  # 1 only says a target was missed on this machine, which is not a test failure


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_compaction_bench_runs_quick() -> None:
    from bench import compaction

    status = await asyncio.to_thread(compaction.main, ["--quick"])
    assert status in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_session_creation_bench_runs_quick() -> None:
    from bench import session_creation

    status = await asyncio.to_thread(session_creation.main, ["--quick"])
    assert status in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_history_bench_runs_quick() -> None:
    from bench import history

    status = await asyncio.to_thread(history.main, ["--quick"])
    assert status in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_openai_compat_bench_runs_quick() -> None:
    from bench import openai_compat

    status = await asyncio.to_thread(openai_compat.main, ["--quick"])
    assert status in (0, 1)
