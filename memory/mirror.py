"""An in-memory copy of a chunk table's vectors and text columns, with a BM25 index of its
``content`` (:mod:`memory.bm25`), for the search's vector and full-text pools.

At 20,000 chunks a LanceDB vector query costs 10-25 ms even through the IVF-HNSW-SQ index (reading
the re-ranked candidates' vectors and the results' text columns is most of it), and LanceDB's
full-text query 9-14 ms; an exact scan of a float32 matrix in memory takes 1-3 ms, and the BM25
index here answers in 0.3-3.5 ms. The daemon is the only writer of the table
(``ChunkStore.write``), so the copy is kept in step with every delete and add, and it is loaded
from the table when the store opens.

Readers never lock: every write publishes a new immutable :class:`Snapshot` (one reference
assignment). Adds fill spare rows of the vector buffer past the published count, which no snapshot
reads; a delete copies the remaining rows into a new buffer. Cost: the vectors (4 bytes a dimension:
15.4 MB per 10,000 chunks of 384 dimensions), the text columns (about their size in UTF-8) and the
postings (8 bytes per distinct term of a chunk, and the vocabulary's dict).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory import scopes
from memory.bm25 import Postings, Vocabulary
from memory.sources import MEMORY_MD

# the columns a candidate needs, in the table's names (``content`` is what was embedded and indexed)
COLUMNS = ["chunk_id", "agent", "path", "start_line", "end_line", "heading", "text", "content"]
# merge the text columns' arrow chunks once adds have made more than this many: a read takes its
# rows chunk by chunk (``_take``), 0.26 ms for 100 of 20,000 rows in 2 chunks, 0.5 ms in 8, 1.3 in 20
_COMBINE_CHUNKS = 8


@functools.cache
def _blas() -> Any:
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    return ThreadpoolController()


def _scores(vectors: np.ndarray[Any, Any], query: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``vectors @ query`` on one BLAS thread: numpy's OpenBLAS would use both cores, and on a
    machine whose other core is busy the second thread waits for it (at 20,000 x 384: 1.4 ms on
    one thread, 3-10 ms on two under load). Only the columns where the query is not 0 are read:
    a routed query (``memory.embedders.routed``) fills one model's part of the vector, so an English query
    of the default reads 384 of 896 columns."""
    nonzero = np.flatnonzero(query)
    if len(nonzero) and nonzero[-1] + 1 - nonzero[0] <= len(query) * 3 // 4:
        start, end = int(nonzero[0]), int(nonzero[-1]) + 1
        vectors, query = vectors[:, start:end], query[start:end]
    with _blas().limit(limits=1, user_api="blas"):
        out: np.ndarray[Any, Any] = vectors @ query
    return out


@dataclass(frozen=True)
class Snapshot:
    """The table's rows at one moment: row ``i`` of ``vectors`` is row ``i`` of ``rows``."""

    vectors: np.ndarray[Any, Any]  # (n, dims) float32, a view of the mirror's buffer
    inv_norms: np.ndarray[Any, Any]  # (n,) 1 / |vector| (0 for a zero vector)
    rows: pa.Table  # COLUMNS
    agents: frozenset[str] = frozenset()
    agent_codes: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, np.int32), repr=False)
    agent_ids: dict[str, int] = field(default_factory=dict, repr=False)
    memory_md: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, bool), repr=False)
    postings: Postings = field(default_factory=Postings.empty, repr=False)  # BM25 of ``content``
    vocabulary: Vocabulary = field(default_factory=Vocabulary, repr=False)  # the mirror's, shared

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held: vectors, norms, text columns and postings (not the term dict)."""
        return int(self.vectors.nbytes + self.inv_norms.nbytes + self.rows.nbytes + self.postings.nbytes)

    def allowed(
        self, agent: str, include_memory_md: bool, scope: scopes.Scope = scopes.EVERY
    ) -> np.ndarray[Any, Any] | None:
        """A row mask for ``agent``'s chunks in ``scope`` (and without MEMORY.md); None: every row."""
        mask: np.ndarray[Any, Any] | None = None
        if not self.agents <= {agent}:
            code = self.agent_ids.get(agent, -1)
            mask = self.agent_codes == code
        if not include_memory_md and self.memory_md.any():
            mask = ~self.memory_md if mask is None else mask & ~self.memory_md
        if scope != scopes.EVERY and len(self):
            prefix = scopes.SCOPES_DIR + "/" if scope is None else scopes.folder(scope) + "/"
            under = np.asarray(pc.starts_with(self.rows.column("path"), prefix).to_numpy(), dtype=bool)
            inside = ~under if scope is None else under
            mask = inside if mask is None else mask & inside
        return mask

    def nearest(
        self,
        query: np.ndarray[Any, Any],
        agent: str,
        limit: int,
        include_memory_md: bool,
        scope: scopes.Scope = scopes.EVERY,
    ) -> list[dict[str, Any]]:
        """The ``limit`` rows of ``agent`` in ``scope`` nearest to ``query`` by cosine distance,
        nearest first, each a dict of :data:`COLUMNS` (without ``agent``) and ``_distance`` (1 -
        cosine), exact."""
        n = len(self)
        if n == 0 or limit <= 0:
            return []
        q = np.asarray(query, dtype=np.float32)
        norm = float(np.linalg.norm(q))
        sims = _scores(self.vectors, q)
        sims *= self.inv_norms
        if norm > 0:
            sims /= norm
        mask = self.allowed(agent, include_memory_md, scope)
        if mask is not None:
            sims = np.where(mask, sims, -np.inf)
            n = int(mask.sum())
        k = min(limit, n)
        if k == 0:
            return []
        top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
        top = top[np.lexsort((top, -sims[top]))]  # nearest first, then table order
        rows = _take(self.rows, top)
        for row, s in zip(rows, sims[top].tolist(), strict=True):
            row["_distance"] = 1.0 - s
        return rows

    def matches(
        self,
        query: str,
        agent: str,
        limit: int,
        include_memory_md: bool,
        scope: scopes.Scope = scopes.EVERY,
    ) -> tuple[list[dict[str, Any]], np.ndarray[Any, Any]]:
        """The ``limit`` best BM25 matches of ``query`` (:mod:`memory.bm25`) among ``agent``'s rows
        in ``scope``, best first (equal scores in table order), each a dict of :data:`COLUMNS`
        (without ``agent``) and ``_score``; and their vectors."""
        scores = self.postings.scores(query, self.vocabulary)
        if (mask := self.allowed(agent, include_memory_md, scope)) is not None and len(scores):
            scores[~mask] = 0.0
        hits = np.flatnonzero(scores > 0)
        if limit <= 0:
            hits = hits[:0]
        elif limit < len(hits):  # the best ``limit``; of those tied at the cut, the first in table order
            held = scores[hits]
            cut = -np.partition(-held, limit - 1)[limit - 1]
            above = hits[held > cut]
            hits = np.concatenate([above, hits[held == cut][: limit - len(above)]])
        hits = hits[np.lexsort((hits, -scores[hits]))]
        rows = _take(self.rows, hits) if len(hits) else []
        for row, s in zip(rows, scores[hits].tolist(), strict=True):
            row["_score"] = s
        return rows, self.vectors[hits]


def _take(rows: pa.Table, indices: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
    """The rows at ``indices`` (``COLUMNS`` without ``agent``), taken chunk by chunk: pyarrow's
    ``take`` on columns of several chunks concatenates them all first (100 of 20,000 rows: 1.8 ms
    in 2 chunks, 2.0-2.4 ms in 8-21), and a combined copy kept for reads would double the text
    columns."""
    rows = rows.drop_columns(["agent"])
    if rows.column(0).num_chunks <= 1:
        return list(rows.take(pa.array(indices, pa.int64())).to_pylist())
    batches = rows.to_batches()
    starts = np.cumsum([0] + [b.num_rows for b in batches])
    which = np.searchsorted(starts, indices, side="right") - 1
    out: list[dict[str, Any]] = [{}] * len(indices)
    for b in np.unique(which).tolist():
        at = np.flatnonzero(which == b)
        taken = batches[b].take(pa.array(indices[at] - starts[b], pa.int64())).to_pylist()
        for i, row in zip(at.tolist(), taken, strict=True):
            out[i] = row
    return out


def _empty_rows() -> pa.Table:
    return pa.table(
        {
            "chunk_id": pa.array([], pa.string()),
            "agent": pa.array([], pa.string()),
            "path": pa.array([], pa.string()),
            "start_line": pa.array([], pa.int32()),
            "end_line": pa.array([], pa.int32()),
            "heading": pa.array([], pa.string()),
            "text": pa.array([], pa.string()),
            "content": pa.array([], pa.string()),
        }
    )


def _vectors(table: pa.Table, dims: int) -> np.ndarray[Any, Any]:
    if table.num_rows == 0:
        return np.zeros((0, dims), np.float32)
    flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(-1, dims)


def _inv_norms(vectors: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    norms = np.linalg.norm(vectors, axis=1)
    out = np.zeros_like(norms, dtype=np.float32)
    np.divide(1.0, norms, out=out, where=norms > 0)
    return out


class Mirror:
    """The in-memory copy of one table. ``add`` and ``delete`` are called by the table's only
    writer, after the same change succeeded in LanceDB; ``snapshot`` may be read from any thread."""

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self._lock = threading.Lock()  # writers only (one in practice)
        self._buffer = np.zeros((0, dims), np.float32)
        self._norms = np.zeros(0, np.float32)
        self._vocabulary = Vocabulary()
        self.snapshot = self._publish(0, _empty_rows(), Postings.empty())

    @classmethod
    def load(cls, table: Any, dims: int) -> Mirror:
        """A mirror of every row ``table`` (a LanceDB table) holds now."""
        mirror = cls(dims)
        count = int(table.count_rows())
        if count:
            data = table.search().select([*COLUMNS, "vector"]).limit(count).to_arrow()
            mirror.add(data)
        return mirror

    def _publish(self, n: int, rows: pa.Table, postings: Postings) -> Snapshot:
        agents_col = rows.column("agent")
        if rows.num_rows:
            encoded = pc.dictionary_encode(agents_col).combine_chunks()
            names = [str(a) for a in encoded.dictionary.to_pylist()]
            codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
            md = pc.equal(rows.column("path"), MEMORY_MD).to_numpy(zero_copy_only=False).astype(bool)
        else:
            names, codes, md = [], np.zeros(0, np.int32), np.zeros(0, bool)
        snap = Snapshot(
            vectors=self._buffer[:n],
            inv_norms=self._norms[:n],
            rows=rows,
            agents=frozenset(names),
            agent_codes=codes,
            agent_ids={a: i for i, a in enumerate(names)},
            memory_md=md,
            postings=postings,
            vocabulary=self._vocabulary,
        )
        self.snapshot = snap
        return snap

    def add(self, table: pa.Table) -> None:
        """Rows just added to the table (its schema: at least ``COLUMNS`` and ``vector``)."""
        if table.num_rows == 0:
            return
        vectors = _vectors(table, self.dims)
        with self._lock:
            old = self.snapshot
            n, m = len(old), len(vectors)
            if n + m > len(self._buffer):  # grow by half: adds stay amortized O(rows)
                capacity = max(n + m, int(len(self._buffer) * 1.5) + 256)
                buffer = np.zeros((capacity, self.dims), np.float32)
                norms = np.zeros(capacity, np.float32)
                buffer[:n] = self._buffer[:n]
                norms[:n] = self._norms[:n]
                self._buffer, self._norms = buffer, norms
            self._buffer[n : n + m] = vectors  # past every published snapshot's rows
            self._norms[n : n + m] = _inv_norms(vectors)
            rows = pa.concat_tables([old.rows, table.select(COLUMNS).cast(old.rows.schema)])
            if n == 0 or rows.column("chunk_id").num_chunks > _COMBINE_CHUNKS:  # (a load: one chunk)
                rows = rows.combine_chunks()
            added = Postings.of(table.column("content").to_pylist(), self._vocabulary)
            self._publish(n + m, rows, old.postings.plus(added))

    def delete(self, agent: str, paths: list[str]) -> None:
        """The rows of ``agent``'s files ``paths`` were deleted from the table."""
        with self._lock:
            old = self.snapshot
            if len(old) == 0 or agent not in old.agents:
                return
            gone = pc.and_(
                pc.equal(old.rows.column("agent"), agent), pc.is_in(old.rows.column("path"), pa.array(paths))
            )
            drop = gone.to_numpy(zero_copy_only=False).astype(bool)
            if not drop.any():
                return
            keep = ~drop
            vectors, norms = old.vectors[keep], old.inv_norms[keep]
            n = len(vectors)
            capacity = n + max(256, n // 2)
            self._buffer = np.zeros((capacity, self.dims), np.float32)
            self._norms = np.zeros(capacity, np.float32)
            self._buffer[:n] = vectors
            self._norms[:n] = norms
            rows = old.rows.filter(pa.array(keep)).combine_chunks()
            self._publish(n, rows, old.postings.kept(keep))
