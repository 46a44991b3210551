"""The embeddings endpoint of OpenAI or any OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from config.errors import EmbeddingError, MemoryNotReady
from memory.chunking import estimate_tokens

if TYPE_CHECKING:
    from openai import AsyncOpenAI

from memory.embedders.protocol import EmbedderIdentity, Vectors, normalise


class OpenAIEmbedder:
    """The embeddings endpoint of OpenAI or any OpenAI-compatible server (vLLM, Ollama, ...).

    ``api_key`` is given by the caller (``build_embedder`` takes it from the environment it is
    passed, under the name ``api_key_env``; a local server may need none). ``dimensions`` is sent
    when set; otherwise the size is learned from a probe request in :meth:`start`.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None,
        api_key: str | None,
        dimensions: int | None = None,
        batch_size: int = 64,
        timeout_s: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        from openai import AsyncOpenAI

        self._model = model
        self._requested_dims = dimensions
        self._dims = dimensions or 0
        self._batch_size = batch_size
        self._base_url = base_url
        self._client: AsyncOpenAI = AsyncOpenAI(
            base_url=base_url, api_key=api_key or "unused", timeout=timeout_s, max_retries=max_retries
        )
        self._started = False

    @property
    def identity(self) -> EmbedderIdentity:
        if not self._started:
            raise MemoryNotReady("the embeddings endpoint was not probed yet")
        return EmbedderIdentity("openai", self._model, self._dims)

    @property
    def max_input_tokens(self) -> int | None:
        return 8000  # counted with the SPEC estimate; OpenAI's models take 8191

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    async def start(self) -> None:
        if self._started:
            return
        probe = await self._request(["dimension probe"])
        self._dims = int(probe.shape[1])
        self._started = True

    async def _request(self, texts: Sequence[str]) -> Vectors:
        from openai import OpenAIError

        kwargs: dict[str, Any] = {"model": self._model, "input": list(texts)}
        if self._requested_dims is not None:
            kwargs["dimensions"] = self._requested_dims
        try:
            response = await self._client.embeddings.create(**kwargs)
        except OpenAIError as exc:
            raise EmbeddingError(f"embeddings request to {self._base_url or 'OpenAI'} failed: {exc}") from exc
        rows = sorted(response.data, key=lambda d: d.index)
        return normalise(np.asarray([row.embedding for row in rows], dtype=np.float32))

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        parts = [await self._request(texts[i : i + self._batch_size]) for i in range(0, len(texts), self._batch_size)]
        out = np.concatenate(parts, axis=0)
        if self._dims and out.shape[1] != self._dims:
            raise EmbeddingError(
                f"embeddings endpoint returned {out.shape[1]} dimensions, expected {self._dims}",
            )
        return out

    async def close(self) -> None:
        await self._client.close()
