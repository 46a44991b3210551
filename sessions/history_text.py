"""The history index's text rules (pure): what is indexed, how CJK text becomes tokens, how a
query becomes an FTS5 expression, and the snippet with the match marked.

SQLite's ``unicode61`` tokenizer (with Porter stemming) splits Latin text into words, but a run of
kana and kanji has no spaces and would be one giant token. Each such run is indexed as its
overlapping character bigrams (plus its last character alone), the classic CJK analyzer: a query
of two characters (会議, 予算: most Japanese words) is one bigram, a longer one is the phrase of its
bigrams, a single character is a prefix match. FTS5's ``trigram`` tokenizer was measured and
rejected: it cannot match a query shorter than three characters at all (tests/sessions/
test_history.py shows it), and it triples the index of Latin text.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Mapping
from typing import Any

# Hiragana, katakana (and phonetic extensions, halfwidth), CJK ideographs (ext. A, unified,
# compatibility), Hangul syllables.
_CJK = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\uac00-\ud7af"
CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_NOT_INDEXED_KINDS = ("recall", "inheritance")  # copies of memory and of an earlier run's summary


def indexable(record: Mapping[str, Any]) -> bool:
    """Commands and their answers are not conversation; recall and inheritance messages repeat
    text that lives elsewhere (memory files, the earlier run)."""
    if record.get("command") or record.get("kind") in _NOT_INDEXED_KINDS:
        return False
    return bool(message_text(record).strip())


def message_text(record: Mapping[str, Any]) -> str:
    """The searchable text of a message: its content, or for a tool-calling assistant message with
    no text, the calls (``name(arguments)``)."""
    content = record.get("content")
    text = content if isinstance(content, str) else ""
    if not text.strip() and record.get("tool_calls"):
        parts = []
        for call in record.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts.append(f"{function.get('name', '')}({function.get('arguments', '')})")
        text = " ".join(parts)
    return text


def _bigrams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)] + [run[-1]]


def index_text(text: str) -> str:
    """The text handed to the tokenizer: CJK runs replaced by their bigrams."""
    if not CJK_RUN.search(text):
        return text
    return CJK_RUN.sub(lambda m: " " + " ".join(_bigrams(m.group(0))) + " ", text)


def query_terms(query: str) -> tuple[list[str], list[str]]:
    """(Latin words, CJK runs) of a query, in order, without duplicates."""
    words: list[str] = []
    runs: list[str] = []
    for piece in _WORD.findall(query):
        position = 0
        for match in CJK_RUN.finditer(piece):
            words.extend(w for w in _WORD.findall(piece[position : match.start()]) if w)
            runs.append(match.group(0))
            position = match.end()
        rest = piece[position:]
        if rest:
            words.append(rest)
    return list(dict.fromkeys(w.lower() for w in words)), list(dict.fromkeys(runs))


def match_expression(query: str) -> str | None:
    """The FTS5 MATCH expression (every term must match), or None when the query has no term.
    Terms are quoted, so FTS5 operators typed by a user are searched as words."""
    words, runs = query_terms(query)
    parts = [f'"{w}"' for w in words]
    for run in runs:
        if len(run) == 1:
            parts.append(f'"{run}"*')
        else:
            grams = [run[i : i + 2] for i in range(len(run) - 1)]
            parts.append('"' + " ".join(grams) + '"')
    return " AND ".join(parts) if parts else None


def _word_pattern(word: str) -> str:
    stem = word if len(word) <= 4 else word[: max(4, len(word) - 3)]
    return rf"\b{re.escape(stem)}\w*"


@functools.lru_cache(maxsize=256)
def _patterns(query: str) -> re.Pattern[str] | None:
    words, runs = query_terms(query)
    alternatives = [re.escape(r) for r in runs]
    alternatives.extend(_word_pattern(word) for word in words)
    if not alternatives:
        return None
    alternatives.sort(key=len, reverse=True)
    return re.compile("|".join(alternatives), re.IGNORECASE)


def snippet(text: str, query: str, *, width: int = 160) -> str:
    """About ``width`` characters around the first match, HTML-escaped, each match wrapped in
    ``<mark>``…``</mark>`` (safe to insert as HTML)."""
    pattern = _patterns(query)
    first = pattern.search(text) if pattern else None
    start = 0
    if first is not None and first.start() > width // 3:
        start = first.start() - width // 3
        space = text.rfind(" ", start - 15, start)
        start = space + 1 if space > 0 else start
    end = min(len(text), start + width)
    window = text[start:end]
    out: list[str] = ["…" if start > 0 else ""]
    position = 0
    for match in pattern.finditer(window) if pattern else ():
        out.append(html.escape(window[position : match.start()]))
        out.append(f"<mark>{html.escape(match.group(0))}</mark>")
        position = match.end()
    out.append(html.escape(window[position:]))
    if end < len(text):
        out.append("…")
    return "".join(out).replace("\n", " ")
