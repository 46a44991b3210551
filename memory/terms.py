"""The words of a query and of a chunk: stemmed Latin words without stop words, CJK runs as
words or character pairs, and the share of a query's terms a chunk holds (the text side of fusion
and of abstention, the same in every language and corpus size)."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import snowballstemmer  # imported with the module: its import takes a second, never on the loop

_WORD = re.compile(r"[0-9a-z]+")
_CJK_CONTENT = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f々〆ヵヶー]+")
_HIRAGANA = re.compile(r"[\u3040-\u309f]+")
# every byte but the ``_WORD`` characters to a space: ASCII text splits into its words
_SPACE_BUT_WORD = bytes(c if chr(c) in "0123456789abcdefghijklmnopqrstuvwxyz" else 32 for c in range(256))


# English stop words: NLTK's English list (nltk.corpus.stopwords, the short forms such as "don"
# left out: the word pattern splits them) plus words every question put to memory carries ("tell",
# "remember", "did", "said"). Kept rather than a list from an installed package: scikit-learn's
# (also the base of sentence-transformers') stops content words that memory questions are about
# ("name", "first", "last", "call", "move", "bill", "fire", "system"), which scikit-learn's own
# documentation warns of, and NLTK is not a dependency. The full-text pool's BM25 index
# (``memory.bm25``) drops Snowball's list, as the full-text index's tokenizer does; this one only
# decides the term share (``text_share``).
_STOP = frozenset(
    [
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
        "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
        "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for",
        "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself",
        "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just",
        "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once",
        "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she",
        "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves",
        "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until",
        "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom",
        "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves", "ever",
        "anything", "something", "tell", "know", "remember", "please", "did", "does", "do", "says",
        "said", "s", "t", "d", "ll", "m", "re", "ve",
    ]
)
# Lone kanji that carry no topic (pronouns, "thing", "time"...). No installed package ships a
# Japanese stop-word list (ICU segments words, it does not filter them), and a run this short is a
# term only when it stands alone between kana, so these twelve are all a query needs.
_CJK_STOP = frozenset(["私", "僕", "俺", "何", "誰", "事", "時", "方", "所", "物", "今", "為"])


def is_cjk_query(query: str) -> bool:
    """Whether a query is Japanese or Chinese: it holds kana, or ideographs are at least half of
    its letters ("Tokyo の天気" is Japanese, "Tokyo weather 東" is not)."""
    letters = [ch for ch in query if ch.isalpha()]
    if not letters:
        return False
    if any(_HIRAGANA.match(ch) or "\u30a0" <= ch <= "\u30ff" for ch in letters):
        return True
    return sum(1 for ch in letters if _CJK_CONTENT.match(ch)) * 2 >= len(letters)


@functools.cache
def _stemmer() -> Any:
    return snowballstemmer.stemmer("english")


@functools.lru_cache(maxsize=65_536)
def stem(word: str) -> str:
    """The Snowball (Porter 2) English stem of a lower-case word (cached: the pure-Python stemmer
    costs tens of microseconds a word, and memory reuses a small vocabulary)."""
    return str(_stemmer().stemWord(word))


def normal(text: str) -> str:
    return text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).lower()


def query_terms(query: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The content terms of a query: (stemmed Latin words, CJK words matched as substrings)."""
    text = normal(query)
    words = tuple(dict.fromkeys(stem(w) for w in _WORD.findall(text) if w not in _STOP and len(w) > 1))
    cjk: list[str] = []
    for run in _CJK_CONTENT.findall(text):
        if run in _CJK_STOP:
            continue
        if len(run) <= 4:
            cjk.append(run)
        else:
            cjk.extend(run[i : i + 2] for i in range(len(run) - 1))
    if not words and not cjk:  # an all-hiragana query: its longer runs are the terms
        cjk.extend(run for run in _HIRAGANA.findall(text) if len(run) >= 3)
    return words, tuple(dict.fromkeys(cjk))


def words_of(text: str) -> frozenset[str]:
    """A chunk's content words as :func:`query_terms` finds a query's (MMR's similarity)."""
    latin, cjk = query_terms(text)
    return frozenset(latin) | frozenset(cjk)


def distinct_words(text: str) -> set[str]:
    """The distinct ``_WORD`` runs of ``text``: ASCII text by a byte translation and a split (a
    search's term shares read 100 chunks; this takes 0.6 of the regular expression's time)."""
    if text.isascii():
        return set(text.encode("ascii").translate(_SPACE_BUT_WORD).decode("ascii").split())
    return set(_WORD.findall(text))


def words_held(words: Sequence[str], text: str) -> int:
    """How many of the stemmed ``words`` the normalised ``text`` holds."""
    # cheap substring test first; stem only the document words that could match
    maybe = [w for w in words if w[:3] in text]
    if not maybe:
        return 0
    prefixes = tuple(w[:3] for w in maybe)
    have = {stem(t) for t in distinct_words(text) if t.startswith(prefixes)}
    return sum(1 for w in maybe if w in have)


def text_share(
    terms: tuple[tuple[str, ...], tuple[str, ...]],
    content: str,
    own: str | None = None,
    names: frozenset[str] = frozenset(),
) -> float:
    """The share of the query's terms that ``content`` holds, in [0, 1].

    Unlike a BM25 score it does not grow or shrink with the corpus, so one threshold
    (``min_text_score``) means the same thing for a small and a large memory.

    ``names`` (:func:`named_speakers`: the query's words that name a speaker of the chat) count
    only when ``own``, the chunk's own lines, holds them (as its turn's speaker or in its text):
    the indexed ``content`` adds the heading and the turn before, which in a chat name both
    people for every turn, so there a name says nothing about the chunk.
    """
    words, cjk = terms
    total = len(words) + len(cjk)
    if total == 0:
        return 0.0
    text = normal(content)
    matched = sum(1 for c in cjk if c in text)
    if words:
        if own is None or not names:
            matched += words_held(words, text)
        else:
            matched += words_held([w for w in words if w not in names], text)
            matched += words_held([w for w in words if w in names], normal(below_headings(own)))
    return matched / total


_HEADING_LINE = re.compile(r"^ {0,3}#{1,6}(?:[ \t].*)?$", re.MULTILINE)


def below_headings(text: str) -> str:
    """A chunk's own text without its heading lines (a section's first chunk starts with them:
    ``# Ann and Bo, 8 May 2023`` names both people)."""
    return _HEADING_LINE.sub("", text).lstrip() if "#" in text else text
