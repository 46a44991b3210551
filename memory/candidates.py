"""The candidates of a query: a chunk from either pool (vector or full text) with its cosine,
BM25 score and term share, the full-text pool read with its term shares, and the two pools merged
into one candidate per chunk."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from memory import scopes
from memory.embedders import Embedder, cosine_floor_of, is_multilingual, query_scale_of
from memory.query_embedding import QueryVectors
from memory.speakers import named_speakers, spoken_by
from memory.terms import is_cjk_query, query_terms, text_share

if TYPE_CHECKING:
    from memory.store import ChunkStore


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


TextSide = tuple[list[dict[str, Any]], np.ndarray[Any, Any], list[float], frozenset[str]]


@dataclass(frozen=True)
class PoolQuery:
    """What one search reads of the ``table`` it was given (``ChunkStore.serving``): ``n`` rows of
    each pool for ``query`` among the chunks of ``agent`` in ``scope`` (MEMORY.md's only with
    ``include_memory_md``); ``with_share`` false leaves the term shares at 0 (they cost stemming)."""

    store: ChunkStore
    table: Any
    query: str
    agent: str
    n: int
    include_memory_md: bool
    with_share: bool
    scope: scopes.Scope


def text_side(q: PoolQuery) -> TextSide:
    """The full-text pool: its rows, their vectors, the share of the query's terms each holds, and
    the query's words that name a speaker of the chat (``named_speakers``: a turn by every person
    the query names is in this pool, since the turn's own text holds the name)."""
    rows, vectors = q.store.text_pool(q.table, q.query, q.agent, q.n, q.include_memory_md, q.scope)
    terms = query_terms(q.query) if q.with_share else ((), ())
    names = named_speakers(terms, (r["text"] for r in rows)) if q.with_share else frozenset()
    shares = [text_share(terms, r["content"], r["text"], names) if q.with_share else 0.0 for r in rows]
    return rows, vectors, shares, names


def merge_candidates(
    query: str,
    vector: np.ndarray[Any, Any] | None,
    vec_rows: list[dict[str, Any]],
    text_side: TextSide,
    n: int,
    with_share: bool,
    scale: float = 1.0,
    floor: float = 0.0,
) -> list[Candidate]:
    """The two pools' rows as candidates, each with its cosine, BM25 score and term share.
    ``scale``: the embedder's ``query_scale_of(query)`` (a routed chunk vector holds several models'
    parts, so a query's dot product is its models' cosine divided by it). ``floor``: the embedder's ``cosine_floor``
    (E5's cosines sit in [0.7, 1]: mapped from there to [0, 1], below it 0)."""
    text_rows, text_vectors, text_shares, names = text_side
    terms = query_terms(query) if with_share else ((), ())
    in_text = {r["chunk_id"] for r in text_rows}
    full_pool = len(text_rows) >= n  # the text pool may have cut off matching chunks

    def cand(row: dict[str, Any], cosine: float, share: float | None, bm25: float = 0.0) -> Candidate:
        """``share`` None: computed here when needed."""
        needed = share is None and with_share and not full_pool and row["chunk_id"] not in in_text
        return Candidate(
            chunk_id=row["chunk_id"],
            path=row["path"],
            start_line=int(row["start_line"]),
            end_line=int(row["end_line"]),
            heading=row["heading"],
            text=row["text"],  # the chunk's own lines: its context is indexed, not shown
            cosine=min(1.0, max(0.0, (cosine * scale - floor) / (1.0 - floor))),
            share=text_share(terms, row["content"], row["text"], names) if needed else share or 0.0,
            bm25=bm25,
            named_speaker=spoken_by(names, row["text"]),
        )

    text_cos = text_vectors @ vector if vector is not None and len(text_rows) else np.zeros(len(text_rows))
    return merge_pools(
        # a chunk the full-text index does not match holds none of the query's terms; one in the
        # text pool gets its share there
        [(cand(r, 1.0 - r["_distance"], None), -float(r["_distance"])) for r in vec_rows],
        [
            (cand(r, float(c), share, float(r["_score"])), float(r["_score"]))
            for r, c, share in zip(text_rows, text_cos, text_shares, strict=True)
        ],
    )


async def read_candidates(
    reads: ThreadPoolExecutor,
    q: PoolQuery,
    *,
    embedder: Embedder | None,
    configured: Embedder | None,
    vectors: QueryVectors,
) -> tuple[list[Candidate], bool]:
    """Both pools of ``q`` read on the ``reads`` threads and merged, and whether the query's
    cosines may rank and abstain: false without a query vector, or when the query is CJK and the
    embedder English-only (its cosines then say nothing: unrelated Japanese scores 0.5-0.7).
    ``embedder`` makes the query's vector (None: the text side alone); when it is not the
    ``configured`` one and fails (closed as the new index replaced the old), the text side
    answers alone."""
    loop = asyncio.get_running_loop()
    # the full-text query (and the term shares of what it found) runs while the query is
    # embedded; then one job takes the vector pool and merges it with the text side (one
    # hand-over between threads fewer than a job each: under load each costs a wake-up)
    text_job = reads.submit(text_side, q)
    query = q.query
    vector = None
    scale = query_scale_of(embedder, query) if embedder is not None else 1.0
    floor = cosine_floor_of(embedder, query) if embedder is not None else 0.0
    try:
        if embedder is not None:
            vector = await vectors.get(embedder, query)
    except RuntimeError:
        if embedder is configured:
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(text_job)
            raise
        vector = None  # the previous embedder closed as the new index replaced the old: text side
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wrap_future(text_job)
        raise
    knows = vector is not None and embedder is not None
    knows = knows and (not is_cjk_query(query) or is_multilingual(embedder.identity))  # type: ignore[union-attr]

    def vector_side_and_merge() -> list[Candidate]:
        # (the text job was queued first, so it runs or has run: waiting here cannot deadlock
        # the two read threads)
        vec_rows = []
        if vector is not None:
            vec_rows = q.store.vector_pool(q.table, vector, q.agent, q.n, q.include_memory_md, q.scope)
        return merge_candidates(query, vector, vec_rows, text_job.result(), q.n, q.with_share, scale, floor)

    return await loop.run_in_executor(reads, vector_side_and_merge), knows
