"""The default embedder: several models in one vector, the query routed by its script.

English models (MiniLM, and multilingual-e5-small where its engine runs) and the Universal Sentence
Encoder (16 languages, the better of the packaged models at Japanese paraphrases: 10 of 10 where
E5 finds 8 and MiniLM 1, and its cosines tell an unrelated Japanese question from a related one,
which E5's do not). :class:`RoutedEmbedder` stores every chunk as ``[m_1, ..., m_n, use] /
sqrt(n + 1)``, each model's unit vector side by side (a unit vector), and asks with the English
part or USE's part only:

- a Japanese or Chinese query (:func:`memory.terms.is_cjk_query`) as ``[0, ..., 0, use(q)]``: its
  dot product with a chunk is USE's cosine divided by ``sqrt(n + 1)``;
- an English query as ``[a_1 m_1(q), ..., a_n m_n(q), 0]``, where the ``a_i`` weigh each model's
  cosine mapped from its own floor (E5's cosines sit in [0.7, 1]) so that, once the service has
  multiplied the dot product by :meth:`RoutedEmbedder.query_scale_of` and mapped it from
  :meth:`RoutedEmbedder.cosine_floor_of` to [0, 1], a chunk's cosine is the weighted mean
  ``sum_i w_i (cos_i - f_i) / (1 - f_i)`` of the English models' own mapped cosines.

So every query gets the cosine it was tuned for from one column, one scan and one ANN index; the
English blend is a property of the query vector alone (the weights can change without re-indexing).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Sequence

import numpy as np

from memory.embedders import (
    E5Embedder,
    EmbedderIdentity,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
    Vectors,
    cosine_floor_of,
    query_vector,
)
from memory.terms import is_cjk_query

ROUTED_PROVIDER = "auto"

EnglishModel = E5Embedder | SentenceTransformerEmbedder


class RoutedEmbedder:
    """English models for English, the Universal Sentence Encoder for Japanese and Chinese (see
    the module docstring). A chunk costs every model (USE is the cheapest)."""

    def __init__(
        self,
        *,
        english: Sequence[EnglishModel] | None = None,
        weights: Sequence[float] | None = None,
        provider: str = ROUTED_PROVIDER,
        batch_size: int = 32,
        multilingual: UniversalSentenceEncoderEmbedder | None = None,
    ) -> None:
        self._english = list(english or [SentenceTransformerEmbedder(batch_size=min(batch_size, 32))])
        weights = list(weights) if weights is not None else [1.0] * len(self._english)
        if len(weights) != len(self._english) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError("one non-negative weight per English model, not all 0")
        self.weights = tuple(w / sum(weights) for w in weights)
        self._multilingual = multilingual or UniversalSentenceEncoderEmbedder(batch_size=batch_size)
        self.provider = provider  # the setting named in errors; the identity names the models (see identity)
        self._views: dict[EmbedderIdentity, RoutedEmbedder | None] = {}
        self._root = math.sqrt(len(self._english) + 1)  # the chunk vector's scale
        # the English query: coefficient r_i = w_i / (1 - f_i) on cos_i, offset k = sum r_i f_i;
        # the unit query vector holds r_i / |r| on model i, so cos = (|r| root dot - k) clamped,
        # which the service's (scale dot - floor) / (1 - floor) is with floor = k / (1 + k) and
        # scale = (1 - floor) |r| root
        floors = [cosine_floor_of(e, "") for e in self._english]
        r = np.array([w / (1.0 - f) for w, f in zip(self.weights, floors, strict=True)])
        k = float(sum(ri * f for ri, f in zip(r, floors, strict=True)))
        norm = float(np.linalg.norm(r))
        self._coefficients = (r / norm).astype(np.float32)
        self._english_floor = k / (1.0 + k)
        self._english_scale = (1.0 - self._english_floor) * norm * self._root

    @property
    def identity(self) -> EmbedderIdentity:
        """Named after the models the vectors hold, not after the setting that chose them: ``auto``
        and ``minilm+use`` (or ``auto`` where E5 runs and ``minilm+e5+use``) store the same vectors,
        so switching between them re-embeds nothing. MiniLM with USE keeps the name ``auto``, the
        identity the default had before E5 (an index built then is kept)."""
        models = [e.identity for e in (*self._english, self._multilingual)]
        english = ["e5" if isinstance(e, E5Embedder) else "minilm" for e in self._english]
        name = ROUTED_PROVIDER if english == ["minilm"] else "+".join([*english, "use"])
        return EmbedderIdentity(name, "+".join(m.model for m in models), sum(m.dimensions for m in models))

    def view_for(self, identity: EmbedderIdentity) -> RoutedEmbedder | None:
        """A query embedder for an index built by another routed choice whose models this one
        loads (the default's index before E5, MiniLM and USE, while this one's is being built): the
        same loaded models, their cosines weighed equally; None when no subset of them made it."""
        if identity == self.identity:
            return self
        if identity not in self._views:
            self._views[identity] = None
            for n in range(len(self._english) - 1, 0, -1):
                for models in itertools.combinations(self._english, n):
                    view = RoutedEmbedder(english=models, provider=self.provider, multilingual=self._multilingual)
                    if view.identity == identity:
                        self._views[identity] = view
        return self._views[identity]

    @property
    def max_input_tokens(self) -> int | None:
        # the tightest English model (USE has no input limit)
        limits = [e.max_input_tokens for e in self._english if e.max_input_tokens is not None]
        return min(limits) if limits else None

    def count_tokens(self, text: str) -> int:
        tightest = min(self._english, key=lambda e: e.max_input_tokens or 1 << 30)
        return tightest.count_tokens(text)

    def query_scale_of(self, query: str) -> float:
        """What the dot product of ``query``'s vector with a chunk is multiplied by before it is
        mapped from :meth:`cosine_floor_of` (see the module docstring)."""
        return self._root if is_cjk_query(query) else self._english_scale

    def cosine_floor_of(self, query: str) -> float:
        """Where the (scaled) cosines of the models that answer ``query`` start (mapped from there to [0, 1])."""
        return 0.0 if is_cjk_query(query) else self._english_floor

    def load_sync(self) -> None:
        for e in self._english:
            e.load_sync()
        self._multilingual.load_sync()

    async def start(self) -> None:
        await asyncio.gather(*(e.start() for e in self._english), self._multilingual.start())

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Chunk vectors: every model's unit vector side by side, scaled to a unit vector."""
        if not texts:
            return np.zeros((0, self.identity.dimensions), dtype=np.float32)
        # one model after the other: on a busy machine two inference threads side by side cost
        # more than the sum (bench.memory_eval --embed-cost)
        parts = [await e.embed(texts) for e in self._english]
        parts.append(await self._multilingual.embed(texts))
        return np.concatenate(parts, axis=1).astype(np.float32) * np.float32(1 / self._root)

    async def embed_query(self, text: str) -> Vectors:
        """A unit query vector: USE's part for a CJK query, the English models' weighted parts otherwise."""
        out = np.zeros(self.identity.dimensions, dtype=np.float32)
        if is_cjk_query(text):
            out[-self._multilingual.identity.dimensions :] = (await self._multilingual.embed([text]))[0]
            return out
        # each model on its own thread at once: a query is one short text
        vectors = await asyncio.gather(*(query_vector(e, text) for e in self._english))
        start = 0
        for e, a, v in zip(self._english, self._coefficients, vectors, strict=True):
            size = e.identity.dimensions
            out[start : start + size] = a * v
            start += size
        return out

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self._english), self._multilingual.close())
