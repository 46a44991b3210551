"""An in-memory BM25 index of a chunk table's ``content``, kept in the mirror's snapshots
(:mod:`memory.mirror`): the search's full-text pool without a LanceDB query.

At 20,000 chunks LanceDB's full-text query cost 13 ms (p95, the bench's worst-case queries) of a
search; this index answers in 3.5 ms (0.25 ms p50 on REALTALK's 9,000 chunks, whose postings are
short; docs/memory-tuning.md, twelfth round). The tokens are those of the table's FTS index
(``ChunkStore.ensure_fts``) as closely as Python gets them: words (letters and digits, joined by
an apostrophe as ICU joins ``don't``), lower case, accents folded, Snowball's English stems, and
Snowball's English stop words dropped (LanceDB's filter also drops hundreds of English content
words: "dog", "city", "want"). Japanese and Chinese
runs, which ICU segments by its dictionary, are cut into overlapping character pairs instead (a
lone character is its own term), the usual choice without a dictionary: a query's word of two or
more characters then matches every text that holds it. The scores are Okapi BM25 with LanceDB's
(and tantivy's) ``k1`` 1.2 and ``b`` 0.75 and idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``, over
every row of the table (as LanceDB's index counts them), before the agent and scope filter.

The postings are a term x row sparse matrix of term frequencies (CSR: a term's rows are one
slice). A write builds the matrix of its new rows and appends it to a copy of the old one (a
delete keeps the remaining rows' columns): readers only ever see a finished :class:`Postings`.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp  # type: ignore[import-untyped]

from memory.terms import normal, stem

K1 = 1.2
B = 0.75
_LONGEST = 40  # tantivy's RemoveLongFilter in LanceDB's tokenizer drops longer tokens

_CJK_RUN = re.compile(
    r"[\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f々〆ヵヶー]+"
)
_ASCII_WORD = re.compile(r"[0-9a-z]+(?:'[0-9a-z]+)*")
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")

# Snowball's English stop-word list (snowballstem.org). LanceDB's index (``remove_stop_words``)
# drops more: asked every word that occurs 3 times or more in REALTALK's chunks, it finds none of
# 290, among them English words ("cat", "dog", "city", "door", "war", "sea", "face", "minutes",
# "want", "also", "come") that other languages' lists hold or that stem to such a word, and lone
# digits. Those are kept here: a question about a dog must find the dog.
_SNOWBALL_ENGLISH = """i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom this
    that these those am is are was were be been being have has had having do does did doing would
    should could ought i'm you're he's she's it's we're they're i've you've we've they've i'd
    you'd he'd she'd we'd they'd i'll you'll he'll she'll we'll they'll isn't aren't wasn't
    weren't hasn't haven't hadn't doesn't don't didn't won't wouldn't shan't shouldn't can't
    cannot couldn't mustn't let's that's who's what's here's there's when's where's why's how's a
    an the and but if or because as until while of at by for with about against between into
    through during before after above below to from up down in out on off over under again
    further then once here there when where why how all any both each few more most other some
    such no nor not only own same so than too very"""
STOP_WORDS = frozenset(_SNOWBALL_ENGLISH.split())


def _fold(word: str) -> str:
    """``word`` without its accents (tantivy's ``AsciiFoldingFilter`` for Latin letters)."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", word) if not unicodedata.combining(ch))


def _latin(words: Iterable[str], out: list[str]) -> None:
    for w in words:
        if len(w) > _LONGEST or w in STOP_WORDS:
            continue
        if not w.isascii():
            w = _fold(w)
        out.append(stem(w))


def tokens(text: str) -> list[str]:
    """The terms of ``text`` in order, repeats kept (a chunk's term frequencies, a query's terms)."""
    text = normal(text).replace("\u2019", "'")
    out: list[str] = []
    if text.isascii():
        _latin(_ASCII_WORD.findall(text), out)
        return out
    for run in _CJK_RUN.findall(text):
        if len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
    _latin(_WORD.findall(_CJK_RUN.sub(" ", text)), out)
    return out


class Vocabulary:
    """Term -> column id, shared by every snapshot of one mirror. It only grows (under the
    mirror's write lock); a reader that meets a term added after its snapshot finds no postings."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def encode(self, terms: Iterable[str]) -> list[int]:
        ids = self.ids
        out = []
        for t in terms:
            i = ids.get(t)
            if i is None:
                i = ids[t] = len(ids)
            out.append(i)
        return out


@dataclass(frozen=True)
class Postings:
    """Term frequencies of every row, ``matrix[term, row]``, and each row's length in terms."""

    matrix: Any  # scipy.sparse.csr_matrix (terms x rows)
    lengths: np.ndarray[Any, Any]  # (rows,) float32

    @property
    def nbytes(self) -> int:
        m = self.matrix
        return int(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes + self.lengths.nbytes)

    @classmethod
    def empty(cls) -> Postings:
        return cls(sp.csr_matrix((0, 0), dtype=np.float32), np.zeros(0, np.float32))

    @classmethod
    def of(cls, texts: Sequence[str], vocabulary: Vocabulary) -> Postings:
        """The postings of ``texts`` (new rows) as columns 0..len-1."""
        rows: list[int] = []
        cols: list[int] = []
        freqs: list[int] = []
        lengths = np.zeros(len(texts), np.float32)
        for j, text in enumerate(texts):
            terms = tokens(text)
            lengths[j] = len(terms)
            counted = Counter(terms)
            ids = vocabulary.encode(counted)
            rows.extend(ids)
            cols.extend([j] * len(ids))
            freqs.extend(counted.values())
        matrix = sp.csr_matrix(
            (np.asarray(freqs, np.float32), (np.asarray(rows, np.int32), np.asarray(cols, np.int32))),
            shape=(len(vocabulary.ids), len(texts)),
        )
        return cls(matrix, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def plus(self, new: Postings) -> Postings:
        """These rows, then ``new``'s."""
        if len(self) == 0:
            return new
        terms = max(self.matrix.shape[0], new.matrix.shape[0])
        old = self.matrix if self.matrix.shape[0] == terms else _grown(self.matrix, terms)
        added = new.matrix if new.matrix.shape[0] == terms else _grown(new.matrix, terms)
        return Postings(sp.hstack([old, added], format="csr"), np.concatenate([self.lengths, new.lengths]))

    def kept(self, keep: np.ndarray[Any, Any]) -> Postings:
        """Only the rows where ``keep`` (a bool mask) is true, renumbered in order."""
        return Postings(self.matrix[:, np.flatnonzero(keep)].tocsr(), self.lengths[keep])

    def scores(self, query: str, vocabulary: Vocabulary) -> np.ndarray[Any, Any]:
        """Every row's BM25 score for ``query`` (0 where it holds none of its terms)."""
        n = len(self)
        out = np.zeros(n, np.float32)
        if n == 0:
            return out
        ids = [vocabulary.ids.get(t) for t in dict.fromkeys(tokens(query))]
        mean = float(self.lengths.mean()) or 1.0
        norm: np.ndarray[Any, Any] | None = None
        indptr, indices, data = self.matrix.indptr, self.matrix.indices, self.matrix.data
        for i in ids:
            if i is None or i >= len(indptr) - 1:
                continue
            start, end = int(indptr[i]), int(indptr[i + 1])
            if start == end:
                continue
            if norm is None:
                norm = K1 * (1.0 - B + B * self.lengths / mean)
            at, tf = indices[start:end], data[start:end]
            df = end - start
            idf = np.float32(np.log1p((n - df + 0.5) / (df + 0.5)))
            out[at] += idf * tf * (K1 + 1.0) / (tf + norm[at])
        return out


def _grown(matrix: Any, terms: int) -> Any:
    """``matrix`` (CSR, terms x rows) with empty rows added up to ``terms``."""
    indptr = np.concatenate([matrix.indptr, np.full(terms - matrix.shape[0], matrix.indptr[-1], matrix.indptr.dtype)])
    return sp.csr_matrix((matrix.data, matrix.indices, indptr), shape=(terms, matrix.shape[1]))
