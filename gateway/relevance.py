"""What a memory search result's ``score`` means to whoever reads it (API, CLI, the model).

The index orders results by weighted reciprocal rank fusion (``memory/fusion.py``). A rank-based
value is not comparable across queries: a lone weak match is rank 1 on its side and scores 1.0.
So the gateway presents ``score`` as absolute relevance: the weighted mean of the vector
similarity (cosine, clamped to [0, 1]) and the text share (the share of the query's term weight
the chunk holds), with the fusion's weights and the same recency decay. A chunk with similarity
0.14 and no query term scores 0.1 in any query; 1.0 means an exact match on both sides. The
fusion's own value is kept as ``rank_score``, and results keep the fusion's order (best first by
``rank_score``), so ``score`` may rise down the list.

This lives on the gateway side so the fusion itself stays the memory package's concern.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from config.settings import SearchSettings
from memory.fusion import decay
from memory.records import SearchHit


def relevance(hit: SearchHit, search: SearchSettings, today: date) -> float:
    """Absolute relevance in [0, 1]: comparable across queries (see the module docstring)."""
    weights = search.vector_weight + search.text_weight
    if weights <= 0:
        return 0.0
    mean = (search.vector_weight * hit.vector_score + search.text_weight * hit.text_score) / weights
    return round(min(1.0, max(0.0, decay(mean, hit.path, today, search.recency_half_life_days))), 6)


def present(hit: SearchHit, search: SearchSettings, today: date) -> dict[str, Any]:
    """The result as the API answers it: ``score`` is the relevance, ``rank_score`` the fusion's."""
    return {**hit.as_dict(), "score": relevance(hit, search, today), "rank_score": hit.score}
