"""The words the history index is made of, the same on every backend.

The files index hands its text to SQLite FTS5 with the tokenizer :data:`TOKENIZER` (Unicode words,
accents folded, Porter stems). PostgreSQL's ``simple`` parser is another tokenizer: it keeps a URL,
an e-mail address, a host name, a path or a version as one lexeme, and neither stems nor folds
accents, so "runbook" inside a URL, "decide" against "decided" and "cafe" against "café" were
found by one backend and not the other. A backend with another parser indexes and searches
:meth:`Words.of` instead: the tokens SQLite's own tokenizer makes of the text (read back through
``fts5vocab`` from an in-memory table), joined by spaces, which ``simple`` takes word for word.
Both backends then index the same words by construction, not by a second implementation of the
rules.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence

TOKENIZER = "porter unicode61 remove_diacritics 2"


class Words:
    """SQLite's FTS5 tokenizer on an in-memory table (thread-safe; a few microseconds a text)."""

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize='{TOKENIZER}')")
        self._conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        self._lock = threading.Lock()

    def of(self, texts: Sequence[str]) -> list[str]:
        """Each text as its tokens in order, joined by single spaces ("" when it has none).

        The texts go in as one JSON array and the tokens come back as one, two SQLite steps a
        batch: the sqlite3 module gives up the interpreter lock at every step and row, and in a
        busy process (the event loop holding it) each time back costs a wait. Row by row (an
        ``executemany`` in and a row per token out) a batch of 2,000 took 0.3 s of wall time for
        22 ms of CPU under a saturated gateway."""
        out = [""] * len(texts)
        for first, part in _parts(texts):
            for doc, terms in self._tokens(part).items():
                out[first + doc] = " ".join(terms)
        return out

    def _tokens(self, texts: Sequence[str]) -> dict[int, list[str]]:
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                # NUL separates words as any other non-word character, but would end a JSON string
                self._conn.execute(_PUT, (json.dumps([text.replace("\0", " ") for text in texts]),))
                (pairs,) = self._conn.execute(_TOKENS).fetchone()
            finally:
                self._conn.execute("ROLLBACK")  # the table stays empty
        tokens: dict[int, list[str]] = {}
        for doc, term in json.loads(pairs or "[]"):
            tokens.setdefault(doc, []).append(term)
        return tokens


PART_CHARS = 8_000_000  # texts tokenized together at most: their tokens come back as one string,
# which SQLite caps at 1,000,000,000 bytes (SQLITE_LIMIT_LENGTH)


def _parts(texts: Sequence[str]) -> list[tuple[int, Sequence[str]]]:
    """``texts`` cut into runs of at most ``PART_CHARS`` characters (a longer text alone), each
    with the index of its first text."""
    parts: list[tuple[int, Sequence[str]]] = []
    first, size = 0, 0
    for i, text in enumerate(texts):
        if size and size + len(text) > PART_CHARS:
            parts.append((first, texts[first:i]))
            first, size = i, 0
        size += len(text)
    if first < len(texts):
        parts.append((first, texts[first:]))
    return parts


_PUT = "INSERT INTO t (rowid, body) SELECT key, value FROM json_each(?)"
# one aggregate over the instances in order (no GROUP BY: its sorter need not keep that order)
_TOKENS = "SELECT json_group_array(json_array(doc, term)) FROM (SELECT doc, term FROM v ORDER BY doc, \"offset\")"


_WORDS: Words | None = None
_MAKING = threading.Lock()


def words() -> Words:
    """The process's one tokenizer."""
    global _WORDS
    with _MAKING:
        if _WORDS is None:
            _WORDS = Words()
        return _WORDS
