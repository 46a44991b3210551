"""Pure search decisions: score fusion or weighted RRF, abstention, recency decay.

Everything here is a function of the candidates and the settings, so it is tested with tables
and a fake embedder; the index only fetches the two candidate pools.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import snowballstemmer  # imported with the module: its import takes a second, never on the loop

from memory.mmr import MMR_DEPTH, diversify
from memory.records import SearchHit

RRF_K = 60
SNIPPET_CHARS = 700

_WORD = re.compile(r"[0-9a-z]+")
_CJK_CONTENT = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f々〆ヵヶー]+")
_HIRAGANA = re.compile(r"[\u3040-\u309f]+")
_DAILY = re.compile(r"(?:^|/)memory/(?:.*/)?(\d{4})-(\d{2})-(\d{2})\.md$")

# English stop words: NLTK's English list (nltk.corpus.stopwords, the short forms such as "don"
# left out: the word pattern splits them) plus words every question put to memory carries ("tell",
# "remember", "did", "said"). Kept rather than a list from an installed package: scikit-learn's
# (also the base of sentence-transformers') stops content words that memory questions are about
# ("name", "first", "last", "call", "move", "bill", "fire", "system"), which scikit-learn's own
# documentation warns of, and NLTK is not a dependency. LanceDB's full-text index uses its own
# (Lucene's) list; this one only decides the term share (``text_share``).
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
def _stem(word: str) -> str:
    """The Snowball (Porter 2) English stem of a lower-case word (cached: the pure-Python stemmer
    costs tens of microseconds a word, and memory reuses a small vocabulary)."""
    return str(_stemmer().stemWord(word))


def _normal(text: str) -> str:
    return text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).lower()


def query_terms(query: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The content terms of a query: (stemmed Latin words, CJK words matched as substrings)."""
    text = _normal(query)
    words = tuple(dict.fromkeys(_stem(w) for w in _WORD.findall(text) if w not in _STOP and len(w) > 1))
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


def _words_held(words: Sequence[str], text: str) -> int:
    """How many of the stemmed ``words`` the normalised ``text`` holds."""
    # cheap substring test first; stem only the document words that could match
    maybe = [w for w in words if w[:3] in text]
    if not maybe:
        return 0
    prefixes = tuple(w[:3] for w in maybe)
    have = {_stem(t) for t in set(_WORD.findall(text)) if t.startswith(prefixes)}
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
    text = _normal(content)
    matched = sum(1 for c in cjk if c in text)
    if words:
        if own is None or not names:
            matched += _words_held(words, text)
        else:
            matched += _words_held([w for w in words if w not in names], text)
            matched += _words_held([w for w in words if w in names], _normal(_below_headings(own)))
    return matched / total


# The speaker of a chat turn (``Ann: text``, ``[D3:1] Ann: text``, ``- **Ann**: text``,
# ``[10:42] Ann: text``): the turn pattern of memory.chunking, with the speaker captured. Only a
# name of one to three capitalised words (not all capitals) counts as a speaker, so that
# ``TODO: buy milk``, ``note: ...`` or ``Plan for today: ...`` in a list of notes are no one.
_SPEAKER = re.compile(
    r"^\s{0,3}(?:[-*+]\s+)?(?:\[[^\]\n]{1,32}\]\s*)?(?:\*\*)?"
    r"([^\s:：#>`|*\[][^:：\n*]{0,39}?)(?:\*\*)?[:：]\s*\S"
)


_HEADING_LINE = re.compile(r"^ {0,3}#{1,6}(?:[ \t].*)?$", re.MULTILINE)


def _below_headings(text: str) -> str:
    """A chunk's own text without its heading lines (a section's first chunk starts with them:
    ``# Ann and Bo, 8 May 2023`` names both people)."""
    return _HEADING_LINE.sub("", text).lstrip() if "#" in text else text


def turn_speaker(text: str) -> str:
    """The speaker of the chat turn a chunk's own text starts with, below its headings ('' when
    it is not a turn)."""
    m = _SPEAKER.match(_below_headings(text))
    if m is None:
        return ""
    name = m.group(1)
    words = name.split()
    if len(words) > 3 or not all(w[0].isupper() for w in words) or (len(name) > 1 and name.isupper()):
        return ""
    return name


@functools.lru_cache(maxsize=4_096)
def _name_words(speaker: str) -> frozenset[str]:
    return frozenset(query_terms(speaker)[0])


def named_speakers(terms: tuple[tuple[str, ...], tuple[str, ...]], texts: Iterable[str]) -> frozenset[str]:
    """The query's words that name the speaker of one of these chunks' turns ("What did Ravi
    bake?" over a chat where Ravi speaks: ``{"ravi"}``)."""
    words = frozenset(terms[0])
    if not words:
        return frozenset()
    out: set[str] = set()
    for text in texts:
        if speaker := turn_speaker(text):
            out |= words & _name_words(speaker)
    return frozenset(out)


def spoken_by(names: frozenset[str], text: str) -> bool:
    """Whether the chunk's own text is a turn spoken by one of ``names`` (:func:`named_speakers`)."""
    return bool(names) and bool(speaker := turn_speaker(text)) and bool(names & _name_words(speaker))


def daily_log_date(path: str) -> date | None:
    """The date of a dated daily log (``memory/YYYY-MM-DD.md``), else None."""
    m = _DAILY.search(path)
    if not m:
        return None
    try:
        return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return None


@dataclass(frozen=True)
class Candidate:
    """A chunk from either pool, with its similarity to the query already computed."""

    chunk_id: str
    path: str
    start_line: int
    end_line: int
    heading: str
    text: str
    cosine: float  # clamped to [0, 1]
    share: float  # text_share of its content
    vector_rank: int | None = None  # 1-based rank in the vector pool
    text_rank: int | None = None  # 1-based rank in the full-text pool
    bm25: float = 0.0  # the full-text index's BM25 score (0: not matched)
    named_speaker: bool = False  # a chat turn spoken by a person the query names (spoken_by)


@dataclass(frozen=True)
class FusionParams:
    vector_weight: float
    text_weight: float
    min_score: float
    min_text_score: float
    recency_half_life_days: float | None = None
    method: str = "rrf"  # rrf | score
    text_saturation: float = 40.0  # score fusion: the BM25 score that counts as a half match
    use_vector: bool = True  # False: the query is in a language the embedder does not know
    neighbour_weight: float = 0.0  # share of the best adjacent chunk's score a chunk gains
    mmr: float | None = None  # maximal marginal relevance's lambda (memory.mmr); None: off
    speaker_weight: float = 0.0  # a turn spoken by a person the query names ranks (1 + this) times higher
    min_topic_cosine: float = 0.0  # off_topic's cosine bar (0: off)
    min_topic_score: float = 0.2  # off_topic's bar on the best ranked score (0: off; score fusion only)


def _ranks(pool: Sequence[tuple[Candidate, float]]) -> list[tuple[Candidate, int]]:
    """Competition ranks ("1224"), best first: equal scores share a rank, so the order in which
    the database returned tied rows cannot change anyone's fused score."""
    ordered = sorted(pool, key=lambda cs: (-round(cs[1], 6), cs[0].chunk_id))
    out: list[tuple[Candidate, int]] = []
    for i, (c, score) in enumerate(ordered):
        tied = out and round(ordered[i - 1][1], 6) == round(score, 6)
        out.append((c, out[-1][1] if tied else i + 1))
    return out


def merge_pools(
    vector_pool: Sequence[tuple[Candidate, float]], text_pool: Sequence[tuple[Candidate, float]]
) -> list[Candidate]:
    """One candidate per chunk with both ranks set; each pool pairs a candidate with its score
    on that side (higher is better)."""
    text = {c.chunk_id: (c, rank) for c, rank in _ranks(text_pool)}
    merged: dict[str, Candidate] = {}
    for c, rank in _ranks(vector_pool):
        if c.chunk_id in merged:
            continue
        if (hit := text.get(c.chunk_id)) is None:
            merged[c.chunk_id] = _with(c, vector_rank=rank)
        else:  # in both pools: the cosine of the vector side, the BM25 score of the text side
            t, text_rank = hit
            merged[c.chunk_id] = Candidate(
                c.chunk_id, c.path, c.start_line, c.end_line, c.heading, c.text, c.cosine,
                max(c.share, t.share), rank, text_rank, t.bm25, c.named_speaker or t.named_speaker,
            )  # fmt: skip
    for chunk_id, (c, rank) in text.items():
        if chunk_id not in merged:
            merged[chunk_id] = _with(c, text_rank=rank)
    return list(merged.values())


def _with(c: Candidate, *, vector_rank: int | None = None, text_rank: int | None = None) -> Candidate:
    return Candidate(
        c.chunk_id, c.path, c.start_line, c.end_line, c.heading, c.text, c.cosine, c.share,
        vector_rank if vector_rank is not None else c.vector_rank,
        text_rank if text_rank is not None else c.text_rank, c.bm25, c.named_speaker,
    )  # fmt: skip


# Words of time are answered by a log's date (its heading, or the "30 November 2026 (Monday)" its
# chunks are indexed with), whatever their spelling: never a topic.
_DATE_WORDS = frozenset(
    _stem(m.lower())
    for m in (
        "January", "February", "March", "April", "May", "June", "July", "August", "September",
        "October", "November", "December", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep",
        "Sept", "Oct", "Nov", "Dec", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
        "Saturday", "Sunday", "Mon", "Tue", "Tues", "Wed", "Thu", "Thur", "Thurs", "Fri", "Sat", "Sun",
        "today", "tonight", "yesterday", "tomorrow", "day", "week", "month", "year", "ago", "last",
        "next", "recent", "recently", "morning", "evening", "night", "afternoon",
    )
)  # fmt: skip


def unheld_topic_words(query: str, candidates: Sequence[Candidate]) -> list[str]:
    """The query's topic words that no candidate holds (in its heading or own lines): its content
    words apart from the names of the chat's people (:func:`named_speakers`), words with a digit
    ("5pm", "1990s") and words of time (``_DATE_WORDS``). A word the memory holds anywhere is in
    its full-text pool, which ranks chunks by their rarest words, so a word no candidate holds is,
    in practice, one the memory never mentions.
    Latin-script words only: a CJK query's terms are character pairs, which a paraphrase rarely
    shares, so a Japanese question is left to ``min_score`` (ranked by a multilingual model)."""
    terms = query_terms(query)
    names = named_speakers(terms, (c.text for c in candidates if c.bm25 > 0))
    topic = [w for w in terms[0] if w not in names and w not in _DATE_WORDS and not any(ch.isdigit() for ch in w)]
    if not topic:
        return []
    held = _normal("\n".join(f"{c.heading}\n{c.text}" for c in candidates))  # words never span lines
    unheld = [w for w in topic if not _words_held([w], held)]
    if not unheld:
        return []
    speakers = frozenset().union(*(_name_words(s) for c in candidates if (s := turn_speaker(c.text))))
    written_as_names = _capitalised(query)
    return [w for w in unheld if not (w in written_as_names and any(spells_name(w, name) for name in speakers))]


_CAPITALISED = re.compile(r"\b[A-Z][0-9A-Za-z]*")


def _capitalised(query: str) -> frozenset[str]:
    """The stems of the query's words written with a capital, as names are: only such a word may
    be another spelling of a speaker's name (:func:`spells_name`). Without this, words that start
    like a name ("jacket" / "Jack", "car" / "Carol", "grapes" / "Grace") were taken for it and an
    unrelated question was kept."""
    return frozenset(_stem(w.lower()) for w in _CAPITALISED.findall(query))


def spells_name(word: str, name: str) -> bool:
    """Whether a query's (stemmed) word is another spelling of a speaker's name: the same first
    letter, both of 3 letters or more, and ``difflib``'s ratio at least ``NAME_SPELLING`` (REALTALK's
    questions ask about "Muhammad" and "Mohamed" in a chat where "Muhhamed" speaks: 0.71 and 0.73
    against its stem "muhham"; "emu" against "emi" is 0.67, "kevn" against "kevin" 0.89). People
    spell a name several ways; a question about one of them is not about something unmentioned.
    :func:`unheld_topic_words` asks it only of words written with a capital."""
    if word == name:
        return True
    if len(word) < 3 or len(name) < 3 or word[0] != name[0]:
        return False
    return difflib.SequenceMatcher(None, word, name).ratio() >= NAME_SPELLING


NAME_SPELLING = 0.7  # spells_name: difflib's ratio from which a word is another spelling of a name


def off_topic(
    query: str, candidates: Sequence[Candidate], min_cosine: float, best: float = 0.0, min_best: float = 1.0
) -> bool:
    """Whether a query asks about something the memory never mentions: one of its topic words is
    held by no candidate (:func:`unheld_topic_words`), no candidate's cosine reaches
    ``min_cosine`` (a close paraphrase), and ``best``, the best ranked score (the fused score with
    the named speaker's lift and the next turn's share, as the results are ranked), is below
    ``min_best`` (a result that matches the rest of the query well: score fusion only, see
    :func:`fuse`). Either bar at 0: never.

    "What is Ann's blood type?" over a chat between Ann and Bo matches half the chat on "Ann"
    (and its heading and context, every turn), and chit-chat embeds close to any question about
    a person, so no threshold on the fused score alone refuses it without refusing real questions
    (REALTALK: a ``min_score`` refusing 42 % of such questions costs 3.6 points @10). "blood" is
    nowhere: that, with no close paraphrase and no strong match of its other words, is the sign.
    Real questions hold unheld words too ("Is Elise vegan?" answered by what she eats), hence the
    two bars (docs/memory-tuning.md: what each setting refuses and costs)."""
    if min_cosine <= 0 or min_best <= 0 or not candidates or best >= min_best:
        return False
    if max(c.cosine for c in candidates) >= min_cosine:
        return False
    return bool(unheld_topic_words(query, candidates))


def passes(c: Candidate, p: FusionParams) -> bool:
    """Absolute abstention: a threshold of 0 takes no part; with both at 0 everything passes.

    Score fusion: the fused score must reach ``min_score`` (it is absolute, see
    :func:`fused_score`); when the vector side is out (``use_vector`` false: a CJK query with an
    English-only embedder, or no usable query vector) the chunk must instead hold ``min_text_score``
    of the query's content terms, a share that means the same in every language and corpus size.
    RRF: the cosine must reach ``min_score`` or the term share ``min_text_score``.
    """
    if p.min_score <= 0 and p.min_text_score <= 0:
        return True
    if p.method == "score":
        if not p.use_vector:
            return p.min_text_score <= 0 or c.share >= p.min_text_score
        return p.min_score <= 0 or fused_score(c, p) >= p.min_score
    first = c.cosine if p.use_vector else 0.0
    return (p.min_score > 0 and first >= p.min_score) or (p.min_text_score > 0 and c.share >= p.min_text_score)


# The share of the query's terms is raised to the fifth power, BM25 goes through a Hill curve of
# exponent 3: a weak match (one common word such as a name held by thousands of turns, or two of
# three words when one is as common as "job") must not reorder chunks the vector side finds
# equally close, while a match of all of the query, or a strong BM25 score, counts nearly fully
# (bench.memory_eval: with exponent 1 the text side's weak matches cost the hybrid 2-3 points @25
# on conversations; with 3, two-of-three matches of common words still cost conversation-20000
# 0.8 points @25 against the vector side alone; 5 loses to neither side at any k on any set).
SHARE_POWER = 5
BM25_HILL = 3


def text_strength(bm25: float, share: float, saturation: float) -> float:
    """How strongly a chunk matches the query's words, absolute, in [0, 1): the mean of

    - ``share ** 5``, the fifth power of the share of the query's content terms the chunk holds
      (it does not grow with the corpus: 1 of 3 terms gives 0.004, 2 of 3 gives 0.13, 3 of 4
      gives 0.24, all gives 1), and
    - ``bm25**3 / (bm25**3 + saturation**3)``, the BM25 score through a Hill curve whose midpoint
      is ``saturation`` (it rewards rare words, which the share cannot tell from common ones).

    A chunk the full-text index does not match (``bm25 <= 0``) has no text strength."""
    if bm25 <= 0:
        return 0.0
    hill = bm25**BM25_HILL / (bm25**BM25_HILL + saturation**BM25_HILL)
    return (min(1.0, max(0.0, share)) ** SHARE_POWER + hill) / 2


def fused_score(c: Candidate, p: FusionParams) -> float:
    """Score fusion: the weighted mean of the cosine (clamped to [0, 1]) and the text strength.

    Both sides are absolute, so the fused score means the same for every query: a lone weak
    result scores low, a close paraphrase or a match of most of the query's words scores high.
    When the query's language is one the embedder does not know (``use_vector`` false) the text
    side decides alone."""
    wv = p.vector_weight if p.use_vector else 0.0
    top = wv + p.text_weight
    if top <= 0:
        return 0.0
    return (wv * c.cosine + p.text_weight * text_strength(c.bm25, c.share, p.text_saturation)) / top


def rrf_score(c: Candidate, p: FusionParams) -> float:
    """Weighted reciprocal rank fusion, scaled so rank 1 in both pools scores 1.0."""
    wv = p.vector_weight if p.use_vector else 0.0
    top = wv + p.text_weight
    if top <= 0:
        return 0.0
    raw = 0.0
    if c.vector_rank is not None:
        raw += wv / (RRF_K + c.vector_rank)
    if c.text_rank is not None:
        raw += p.text_weight / (RRF_K + c.text_rank)
    return min(1.0, raw * (RRF_K + 1) / top)


def decay(score: float, path: str, today: date, half_life_days: float | None) -> float:
    """Halve a dated daily log's score every ``half_life_days``; other files never decay."""
    if not half_life_days:
        return score
    day = daily_log_date(path)
    if day is None:
        return score
    age = max(0, (today - day).days)
    return score * math.pow(0.5, age / half_life_days)


def with_neighbours(own: dict[str, float], candidates: Sequence[Candidate], weight: float) -> dict[str, float]:
    """Each chunk's score plus ``weight`` times the score of the chunk right after it in the same
    file (at most one blank line between them; when it is among the candidates), capped at 1.

    In a conversation a fact is spread over adjacent turns (a question and its answer, a story
    told in several messages): REALTALK's evidence is mostly runs of consecutive turns. The chunk
    before is already in a chunk's indexed text (a transcript's turn carries the turn before it),
    so only the one after adds something: the reply that confirms or completes it
    (bench.memory_eval --realtalk: +2.5 points @10; counting the chunk before as well, +0.4)."""
    if weight <= 0:
        return own
    starts = {(c.path, c.start_line): c.chunk_id for c in candidates}
    out: dict[str, float] = {}
    for c in candidates:
        after = starts.get((c.path, c.end_line + 1)) or starts.get((c.path, c.end_line + 2))
        out[c.chunk_id] = min(1.0, own[c.chunk_id] + weight * own[after]) if after else own[c.chunk_id]
    return out


def by_speaker(own: dict[str, float], candidates: Sequence[Candidate], weight: float) -> dict[str, float]:
    """Each chat turn spoken by a person the query names (``Candidate.named_speaker``) ranks
    ``1 + weight`` times its score, capped at 1.

    A question about a person ("What did Ravi bake?", "What are Ravi's hobbies?") is answered by
    what that person said: on REALTALK 91 % of the evidence turns of the multi-hop questions are
    spoken by the person the question names, against 62 % of the turns the search ranked in its
    top 10 without this (the other person's replies hold the same words: "Baking for others is
    the best!"). The name itself cannot tell them apart, since every turn of a chat names both
    people in its indexed heading and context (see :func:`text_share`)."""
    if weight <= 0:
        return own
    return {
        c.chunk_id: (min(1.0, own[c.chunk_id] * (1 + weight)) if c.named_speaker else own[c.chunk_id])
        for c in candidates
    }


def fuse(
    candidates: Iterable[Candidate], params: FusionParams, *, today: date, k: int, query: str | None = None
) -> list[SearchHit]:
    """Rank (the named speaker's turns lifted, with the neighbours' share), abstain (on a chunk's
    own score), decay, order (score,
    then chunk id), diversify (``params.mmr``: :mod:`memory.mmr`) and cut to ``k``. With the
    ``query`` and a vector side, an :func:`off_topic` query gets nothing."""
    pool = list(candidates)
    own = {c.chunk_id: fused_score(c, params) if params.method == "score" else rrf_score(c, params) for c in pool}
    ranked = with_neighbours(by_speaker(own, pool, params.speaker_weight), pool, params.neighbour_weight)
    if query is not None and params.use_vector:
        # an RRF score is a rank's, not a match's strength (the first of the vector pool always
        # scores its side's weight): there the rule decides on the words and the cosine alone
        best = max(ranked.values(), default=0.0) if params.method == "score" else 0.0
        if off_topic(query, pool, params.min_topic_cosine, best, params.min_topic_score):
            return []
    scored: list[tuple[float, str, Candidate]] = []
    for c in pool:
        if own[c.chunk_id] <= 0 or not passes(c, params):
            continue
        score = ranked[c.chunk_id]
        scored.append((-round(decay(score, c.path, today, params.recency_half_life_days), 6), c.chunk_id, c))
    scored.sort(key=lambda t: (t[0], t[1]))
    if params.mmr is not None:
        head = [(-t[0], words_of(t[2].text), t) for t in scored[:MMR_DEPTH]]
        scored = diversify(head, params.mmr) + scored[MMR_DEPTH:]
    return [
        SearchHit(
            path=c.path,
            start_line=c.start_line,
            end_line=c.end_line,
            heading=c.heading,
            score=-neg,
            snippet=snippet(c.text),
            citation=f"{c.path}#L{c.start_line}-L{c.end_line}",
            vector_score=round(c.cosine, 6),
            text_score=round(
                text_strength(c.bm25, c.share, params.text_saturation) if params.method == "score" else c.share, 6
            ),
            chunk_id=c.chunk_id,
        )
        for neg, _, c in scored[:k]
    ]


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
