"""Maximal marginal relevance: results diversified (``memory.search.mmr``, off by default).

A pure function of the fused, ranked results: the first :data:`MMR_DEPTH` are re-ordered greedily,
each pick maximising ``lambda x relevance - (1 - lambda) x its largest similarity to a result
already picked``; the rest keep the fused order after them. Relevance is the fused score divided by
the best one (so both terms are in [0, 1] whatever the query's scores are); similarity is the
Jaccard index of the two chunks' own words (``memory.terms.words_of``, the query-term rule:
Snowball stems without stop words, CJK words; the indexed context is left out, or every transcript
turn would look like the turn before it). ``lambda`` 1 is the fused order; lower values push a chunk that repeats one
already shown down the list.

Measured on REALTALK (``python -m bench.memory_eval --realtalk``, docs/memory-tuning.md): it costs recall
at every lambda tried there, so it is off by default; it is for memories full of near-duplicates
(the same fact noted day after day) where the repeats crowd the top ``k``.

The depth does not depend on ``k``, so the first ``k`` results never change as ``k`` grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

MMR_DEPTH = 50  # fused results re-ordered; the rest follow in fused order

T = TypeVar("T")


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)


def diversify(ranked: Sequence[tuple[float, frozenset[str], T]], lam: float, *, depth: int = MMR_DEPTH) -> list[T]:
    """Re-order ``ranked`` (``(score, words, item)``, best first) by maximal marginal relevance.

    Ties go to the earlier item of ``ranked`` (so ``lam`` 1 returns the fused order). Word sets
    are compared as bit sets (one bit per distinct word: a Jaccard index is two popcounts), which
    keeps the 1,225 comparisons of 50 results within a millisecond or two."""
    head, tail = list(ranked[:depth]), [item for _, _, item in ranked[depth:]]
    if lam >= 1 or len(head) < 2:
        return [item for _, _, item in head] + tail
    best = max(score for score, _, _ in head)
    gain = [lam * (score / best if best > 0 else 0.0) for score, _, _ in head]
    bit: dict[str, int] = {}
    bits = [sum(1 << bit.setdefault(w, len(bit)) for w in words) for _, words, _ in head]
    sizes = [b.bit_count() for b in bits]
    penalty = [0.0] * len(head)  # (1 - lam) x each left item's largest similarity to a picked one
    left = list(range(len(head)))
    order: list[int] = []
    while left:
        pick = left[0]
        for i in left[1:]:
            if gain[i] - penalty[i] > gain[pick] - penalty[pick]:
                pick = i
        left.remove(pick)
        order.append(pick)
        b, n = bits[pick], sizes[pick]
        for i in left:
            common = (bits[i] & b).bit_count()
            if common:
                penalty[i] = max(penalty[i], (1 - lam) * common / (sizes[i] + n - common))
    return [head[i][2] for i in order] + tail
