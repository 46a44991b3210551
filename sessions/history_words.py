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
        """Each text as its tokens in order, joined by single spaces ("" when it has none)."""
        out = [""] * len(texts)
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany("INSERT INTO t (rowid, body) VALUES (?, ?)", enumerate(texts))
                tokens: dict[int, list[str]] = {}
                for doc, term in self._conn.execute("SELECT doc, term FROM v ORDER BY doc, \"offset\""):
                    tokens.setdefault(doc, []).append(term)
            finally:
                self._conn.execute("ROLLBACK")  # the table stays empty
        for doc, terms in tokens.items():
            out[doc] = " ".join(terms)
        return out


_WORDS: Words | None = None
_MAKING = threading.Lock()


def words() -> Words:
    """The process's one tokenizer."""
    global _WORDS
    with _MAKING:
        if _WORDS is None:
            _WORDS = Words()
        return _WORDS
