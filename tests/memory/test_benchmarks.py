"""The memory benchmarks stay runnable (quick sizes; the figures of a quick run mean nothing)."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench import memory_eval


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_retrieval_evaluation_runs_quick() -> None:
    # on a thread: the benchmark runs its own event loop, and this test's loop must stay free
    # (the Universal Sentence Encoder alone: the cheapest model to index, numpy only: 8 s of CPU against
    # MiniLM's 30 s for the same quick run)
    status = await asyncio.to_thread(memory_eval.main, ["--quick", "--embedder", "use"])
    assert status in (0, 1)
    result = json.loads(memory_eval.OUT.read_text())["use"]["sets"]
    assert set(result) == {"conversation-100", "notes", "japanese"}
    for name, data in result.items():
        methods = data["results"]
        assert {"vector", "text", "shipped", "bm25 (bm25s)", "bm25 (bm25s, indexed text)"} <= set(methods), name
        assert 0.0 <= methods["shipped"]["all"]["r@10"] <= 1.0
