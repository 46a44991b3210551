"""The in-memory BM25 index (``memory.bm25``): its terms as the full-text index's tokenizer makes
them, Okapi BM25 scores written out by hand, and postings kept through appends and deletes equal
to postings built at once."""

from __future__ import annotations

import math
import unicodedata

import numpy as np
import pytest

from memory.bm25 import Postings, Vocabulary, tokens


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("The dogs were running to the garden", ["dog", "run", "garden"]),  # stop words, Porter 2 stems
        ("I don't like Kate's café", ["like", "kate", "cafe"]),  # ICU keeps "don't" whole: a stop word
        ("I don\u2019t think so", ["think"]),  # the typographic apostrophe too
        ("[D2:4] Fahim: 30 December 2023", ["d2", "4", "fahim", "30", "decemb", "2023"]),
        (unicodedata.lookup("FULLWIDTH LATIN CAPITAL LETTER T") + "OKYO meeting", ["tokyo", "meet"]),  # NFKC
        ("東京の天気", ["東京", "京の", "の天", "天気"]),  # a Japanese run in character pairs
        ("猫", ["猫"]),  # a lone character is its own term
        ("ラーメン食べた cafe", ["ラー", "ーメ", "メン", "ン食", "食べ", "べた", "cafe"]),
        ("supercalifragilisticexpialidocious-and-then-some " + "x" * 41, ["supercalifragilisticexpialidoci"]),
    ],
)
def test_terms(text: str, terms: list[str]) -> None:
    assert tokens(text) == terms


def test_a_japanese_word_of_a_query_matches_the_texts_that_hold_it() -> None:
    vocabulary = Vocabulary()
    docs = ["昨日は東京で会議があった", "大阪の天気は晴れ", "東京タワーに行きたい", "the weather in Tokyo"]
    postings = Postings.of(docs, vocabulary)
    scores = postings.scores("東京の会議", vocabulary)
    assert scores[0] > scores[2] > 0 and scores[1] == scores[3] == 0


def test_scores_are_okapi_bm25() -> None:
    docs = ["apple banana apple", "banana cherry", "cherry cherry cherry date", "elderberry"]
    vocabulary = Vocabulary()
    postings = Postings.of(docs, vocabulary)
    words = [d.split() for d in docs]
    mean = sum(len(w) for w in words) / len(words)

    def bm25(term: str, doc: list[str]) -> float:
        df = sum(1 for w in stemmed if term in w)
        tf = doc.count(term)
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        return idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * len(doc) / mean))

    got = postings.scores("apples and cherries, cherries", vocabulary)  # a repeated term counts once
    apple, cherry = tokens("apples cherries")
    stemmed = [[tokens(t)[0] for t in w] for w in words]
    want = [bm25(apple, w) + bm25(cherry, w) for w in stemmed]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert got[3] == 0 and postings.scores("unknown words", vocabulary).tolist() == [0, 0, 0, 0]
    assert Postings.empty().scores("apple", vocabulary).tolist() == []


def test_postings_kept_through_appends_and_deletes_equal_postings_built_at_once() -> None:
    rng = np.random.default_rng(4)
    words = ["garden", "budget", "pottery", "violin", "harbour", "lantern", "東京", "天気"]
    docs = [" ".join(rng.choice(words, size=int(rng.integers(1, 9)))) for _ in range(60)]
    vocabulary = Vocabulary()
    kept = Postings.empty()
    held: list[str] = []
    for start in range(0, 60, 12):
        kept = kept.plus(Postings.of(docs[start : start + 12], vocabulary))
        held += docs[start : start + 12]
        drop = rng.random(len(held)) < 0.2
        kept = kept.kept(~drop)
        held = [d for d, gone in zip(held, drop, strict=True) if not gone]
    fresh_vocabulary = Vocabulary()
    fresh = Postings.of(held, fresh_vocabulary)
    assert kept.lengths.tolist() == fresh.lengths.tolist()
    for query in ["garden violin", "東京の天気", "lantern harbour budget", "pottery"]:
        assert kept.scores(query, vocabulary).tolist() == pytest.approx(
            fresh.scores(query, fresh_vocabulary).tolist(), rel=1e-6
        )
