"""The default embedder: two models in one vector, the query routed by its script.

An English model and the Universal Sentence Encoder (16 languages, the better of the packaged
models at Japanese paraphrases: 10 of 10 where E5 finds 8 and MiniLM 1, and its cosines tell an
unrelated Japanese question from a related one, which E5's do not). The English side is MiniLM
(provider ``auto``) or multilingual-e5-small (:class:`memory.embedders.E5Embedder`, a
question-to-passage model; provider ``e5+use``). :class:`RoutedEmbedder` stores every chunk as
``[english, use] / sqrt(2)`` (a unit vector of 384 + 512 dimensions) and asks with one half only:
an English query as ``[english(q), 0]``, a Japanese or Chinese one
(:func:`memory.fusion.is_cjk_query`) as ``[0, use(q)]``. The dot product of a unit query of one half
with a chunk is that model's cosine divided by ``sqrt(2)``, so the service multiplies the
similarities by :attr:`RoutedEmbedder.query_scale` and maps them from the model's own
:meth:`RoutedEmbedder.cosine_floor_of` to [0, 1]: every query gets exactly the cosine of the model
that knows its language, from one column, one scan and one ANN index.
"""

from __future__ import annotations

import asyncio
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
from memory.fusion import is_cjk_query

ROUTED_PROVIDER = "auto"
_HALF = 1 / math.sqrt(2)


class RoutedEmbedder:
    """An English model for English, the Universal Sentence Encoder for Japanese and Chinese (see
    the module docstring). Chunks cost both models (USE is the cheaper of the two)."""

    query_scale = math.sqrt(2)

    def __init__(
        self, *, english: E5Embedder | SentenceTransformerEmbedder | None = None, batch_size: int = 32
    ) -> None:
        self._english = english or SentenceTransformerEmbedder(batch_size=min(batch_size, 32))
        self._multilingual = UniversalSentenceEncoderEmbedder(batch_size=batch_size)

    @property
    def identity(self) -> EmbedderIdentity:
        e, m = self._english.identity, self._multilingual.identity
        provider = "e5+use" if isinstance(self._english, E5Embedder) else ROUTED_PROVIDER
        return EmbedderIdentity(provider, f"{e.model}+{m.model}", e.dimensions + m.dimensions)

    @property
    def max_input_tokens(self) -> int | None:
        return self._english.max_input_tokens  # USE has no input limit

    def count_tokens(self, text: str) -> int:
        return self._english.count_tokens(text)

    def cosine_floor_of(self, query: str) -> float:
        """Where the cosines of the model that answers ``query`` start (mapped from there to [0, 1])."""
        return 0.0 if is_cjk_query(query) else cosine_floor_of(self._english, query)

    def load_sync(self) -> None:
        self._english.load_sync()
        self._multilingual.load_sync()

    async def start(self) -> None:
        await asyncio.gather(self._english.start(), self._multilingual.start())

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Chunk vectors: both models' unit vectors side by side, scaled to a unit vector."""
        if not texts:
            return np.zeros((0, self.identity.dimensions), dtype=np.float32)
        # one model after the other: on a busy machine two inference threads side by side cost
        # more than the sum (bench.memory_eval --embed-cost)
        english = await self._english.embed(texts)
        other = await self._multilingual.embed(texts)
        return np.concatenate([english, other], axis=1).astype(np.float32) * np.float32(_HALF)

    async def embed_query(self, text: str) -> Vectors:
        """A unit query vector with one half set: USE's for a CJK query, the English model's otherwise."""
        dims_e = self._english.identity.dimensions
        out = np.zeros(self.identity.dimensions, dtype=np.float32)
        if is_cjk_query(text):
            out[dims_e:] = (await self._multilingual.embed([text]))[0]
        else:
            out[:dims_e] = await query_vector(self._english, text)
        return out

    async def close(self) -> None:
        await asyncio.gather(self._english.close(), self._multilingual.close())

