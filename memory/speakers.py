"""Who speaks a chat turn (``Ann: text``) and which of a query's words name a speaker: a question
about a person is answered by what that person said."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from memory.terms import below_headings, query_terms

# The speaker of a chat turn (``Ann: text``, ``[D3:1] Ann: text``, ``- **Ann**: text``,
# ``[10:42] Ann: text``): the turn pattern of memory.chunking, with the speaker captured. Only a
# name of one to three capitalised words (not all capitals) counts as a speaker, so that
# ``TODO: buy milk``, ``note: ...`` or ``Plan for today: ...`` in a list of notes are no one.
_SPEAKER = re.compile(
    r"^\s{0,3}(?:[-*+]\s+)?(?:\[[^\]\n]{1,32}\]\s*)?(?:\*\*)?"
    r"([^\s:：#>`|*\[][^:：\n*]{0,39}?)(?:\*\*)?[:：]\s*\S"
)


def turn_speaker(text: str) -> str:
    """The speaker of the chat turn a chunk's own text starts with, below its headings ('' when
    it is not a turn)."""
    m = _SPEAKER.match(below_headings(text))
    if m is None:
        return ""
    name = m.group(1)
    words = name.split()
    if len(words) > 3 or not all(w[0].isupper() for w in words) or (len(name) > 1 and name.isupper()):
        return ""
    return name


@functools.lru_cache(maxsize=4_096)
def name_words(speaker: str) -> frozenset[str]:
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
            out |= words & name_words(speaker)
    return frozenset(out)


def spoken_by(names: frozenset[str], text: str) -> bool:
    """Whether the chunk's own text is a turn spoken by one of ``names`` (:func:`named_speakers`)."""
    return bool(names) and bool(speaker := turn_speaker(text)) and bool(names & name_words(speaker))
