"""``sessions.history_words.Words``: SQLite's FTS5 tokens of each text of a batch, in order, the
batch in and out as one JSON array each."""

from __future__ import annotations

import sqlite3

import pytest

from sessions import history_words
from sessions.history_words import TOKENIZER, Words


def fts5_instances(texts: list[str]) -> list[str]:
    """The same tokens read row by row from ``fts5vocab`` (what the batch replaced)."""
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize='{TOKENIZER}')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    conn.executemany("INSERT INTO t (rowid, body) VALUES (?, ?)", enumerate(texts))
    out = [""] * len(texts)
    tokens: dict[int, list[str]] = {}
    for doc, term in conn.execute('SELECT doc, term FROM v ORDER BY doc, "offset"'):
        tokens.setdefault(doc, []).append(term)
    for doc, terms in tokens.items():
        out[doc] = " ".join(terms)
    return out


def test_a_batch_gives_each_text_its_tokens_in_order_as_fts5_makes_them() -> None:
    texts = [
        "We decided to ship the runbook at https://ops.example.com/runbook?v=1.2.3",
        "",
        "   ",
        'naïve "quotes" \\ back\tslash\nnew line café',
        "a\x00b",  # NUL separates words like any other non-word character (it would end a JSON string)
        "Don't stop; it's 5 o'clock 🎉",
        "decides deciding decided",
    ]
    got = Words().of(texts)
    assert got == fts5_instances([text.replace("\x00", " ") for text in texts])
    assert got[0].startswith("we decid to ship the runbook at http op exampl com runbook v 1 2 3")
    assert got[1:3] == ["", ""]
    assert got[4] == "a b"
    assert got[6] == "decid decid decid"


def test_an_empty_batch_is_empty() -> None:
    assert Words().of([]) == []


def test_a_batch_longer_than_one_part_is_cut_and_keeps_every_text_in_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [f"part {n} words {'x' * (n % 7)}" for n in range(50)] + ["", "last one"]
    whole = Words().of(texts)
    monkeypatch.setattr(history_words, "PART_CHARS", 40)  # a few texts a part; one longer than a part alone
    assert Words().of(texts) == whole == fts5_instances(texts)
    assert len(history_words._parts(texts)) > 10
