"""How a memory search result is shown to whoever reads it (API, CLI, the model's tool, recall).

There is one score: memory's own (``SearchHit.score``, ``memory/fusion.py``). With score fusion
(``memory.search.fusion: score``, the default) it is absolute relevance in [0, 1], comparable
across queries: the weighted mean of ``vector_score`` (cosine, clamped to [0, 1]) and
``text_score`` (``memory.fusion.text_strength``: the mean of the fifth power of the query's term
share the chunk holds and the Hill curve ``BM25³ / (BM25³ + text_saturation³)``), after recency
decay, so a lone weak match scores low even when it is the only result, and results are ordered
by it. With
``fusion: rrf`` it is the reciprocal rank fusion's value (1.0 = first on both sides): it orders
the results but is not comparable across queries. The gateway adds nothing to it.
"""

from __future__ import annotations

from typing import Any

from memory.records import SearchHit


def present(hit: SearchHit) -> dict[str, Any]:
    """The result as the API and the CLI answer it (SPEC section 8 fields, then the two sides)."""
    return hit.as_dict()


def tool_result(hit: SearchHit, citation: str) -> dict[str, Any]:
    """The result as the model's ``memory_search`` tool shows it: citation, score, snippet."""
    return {"citation": citation, "score": round(hit.score, 3), "snippet": hit.snippet}
