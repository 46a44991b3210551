"""The off-topic rule: a query about something the memory never mentions (a topic word no
candidate holds, no close paraphrase, no strong match of its other words) gets nothing."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from memory.candidates import Candidate
from memory.speakers import name_words, named_speakers, turn_speaker
from memory.terms import normal, query_terms, stem, words_held

# Words of time are answered by a log's date (its heading, or the "30 November 2026 (Monday)" its
# chunks are indexed with), whatever their spelling: never a topic.
_DATE_WORDS = frozenset(
    stem(m.lower())
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
    held = normal("\n".join(f"{c.heading}\n{c.text}" for c in candidates))  # words never span lines
    unheld = [w for w in topic if not words_held([w], held)]
    if not unheld:
        return []
    speakers = frozenset().union(*(name_words(s) for c in candidates if (s := turn_speaker(c.text))))
    written_as_names = _capitalised(query)
    return [w for w in unheld if not (w in written_as_names and any(spells_name(w, name) for name in speakers))]


_CAPITALISED = re.compile(r"\b[A-Z][0-9A-Za-z]*")


def _capitalised(query: str) -> frozenset[str]:
    """The stems of the query's words written with a capital, as names are: only such a word may
    be another spelling of a speaker's name (:func:`spells_name`). Without this, words that start
    like a name ("jacket" / "Jack", "car" / "Carol", "grapes" / "Grace") were taken for it and an
    unrelated question was kept."""
    return frozenset(stem(w.lower()) for w in _CAPITALISED.findall(query))


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
