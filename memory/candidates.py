"""The candidates of a query: a chunk from either pool (vector or full text) with its cosine,
BM25 score and term share, and the two pools merged into one candidate per chunk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
