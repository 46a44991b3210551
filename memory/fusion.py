"""Pure search decisions: score fusion or weighted RRF, abstention, recency decay.

Everything here is a function of the candidates and the settings, so it is tested with tables
and a fake embedder; the index only fetches the two candidate pools.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date

from config.settings import SearchSettings
from memory.candidates import Candidate
from memory.mmr import MMR_DEPTH, diversify
from memory.records import SearchHit
from memory.terms import words_of
from memory.topic import off_topic

RRF_K = 60
SNIPPET_CHARS = 700

_DAILY = re.compile(r"(?:^|/)memory/(?:.*/)?(\d{4})-(\d{2})-(\d{2})\.md$")


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

    @classmethod
    def of(cls, s: SearchSettings, *, use_vector: bool) -> FusionParams:
        """The parameters ``memory.search`` sets; ``use_vector`` as the query's side decides."""
        return cls(
            s.vector_weight,
            s.text_weight,
            s.min_score,
            s.min_text_score,
            s.recency_half_life_days,
            method=s.fusion,
            text_saturation=s.text_saturation,
            use_vector=use_vector,
            neighbour_weight=s.neighbour_weight,
            mmr=s.mmr,
            speaker_weight=s.speaker_weight,
            min_topic_cosine=s.min_topic_cosine,
            min_topic_score=s.min_topic_score,
        )


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
