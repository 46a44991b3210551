"""What embeds a search's query: the configured embedder when it made the active index, a view of
the routed models for another routed choice, or the embedder an index being replaced was built
with (``PreviousEmbedder``); and the query vectors already made (``QueryVectors``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from config.settings import MemorySettings
from memory.embedders import Embedder, EmbedderIdentity, query_vector
from memory.embedders.choice import embedder_of
from memory.embedders.routed import RoutedEmbedder

log = logging.getLogger("neotask.memory")
# query vectors kept by (embedder identity, query): an agent asks its memory the same question again
# (each turn's recall, a retried tool call), and a query's embedding is most of a search's CPU
QUERY_VECTORS_KEPT = 256


class QueryVectors:
    """A query's vector from an embedder, the last ``QUERY_VECTORS_KEPT`` kept (an identity names
    the model that makes the vector, so one identity's vector of a text is always the same;
    read-only: every search shares it)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[EmbedderIdentity, str], np.ndarray[Any, Any]] = OrderedDict()

    async def get(self, embedder: Embedder, query: str) -> np.ndarray[Any, Any]:
        key = (embedder.identity, query)
        if (found := self._kept.get(key)) is not None:
            self._kept.move_to_end(key)
            return found
        vector = await query_vector(embedder, query)
        vector.setflags(write=False)
        self._kept[key] = vector
        while len(self._kept) > QUERY_VECTORS_KEPT:
            self._kept.popitem(last=False)
        return vector

    def clear(self) -> None:
        """Forget every vector kept (a benchmark that embeds each query as the first time)."""
        self._kept.clear()


class PreviousEmbedder:
    """While the index is rebuilt for another embedder, the old index keeps answering, its query
    vectors made by the embedder it was built with: loaded for the rebuild (once per index) and
    closed once the new index replaces the old. ``note`` says why the old index answers by its
    text side alone when that embedder cannot be loaded."""

    def __init__(self, settings: MemorySettings, env: Mapping[str, str]) -> None:
        self._settings = settings
        self._env = env
        self._embedder: Embedder | None = None
        self._for: EmbedderIdentity | None = None
        self.note: str | None = None
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> bool:
        """Whether an index's own embedder is loaded."""
        return self._embedder is not None

    def of(self, identity: EmbedderIdentity) -> Embedder | None:
        """The loaded embedder of ``identity``, if that is the one loaded."""
        embedder = self._embedder
        return embedder if embedder is not None and embedder.identity == identity else None

    async def ensure(self, wanted: EmbedderIdentity) -> None:
        """Load the embedder of ``wanted`` (once: loaded, or tried and failed)."""
        async with self._lock:
            if self._for == wanted:
                return
            await self.release()
            self._for = wanted
            embedder: Embedder | None = None
            try:
                embedder = embedder_of(wanted, self._settings.embedding, self._env)
                await embedder.start()
                if embedder.identity != wanted:
                    raise ValueError(
                        f"it now makes {embedder.identity.model} ({embedder.identity.dimensions} dimensions)"
                    )
            except Exception as exc:  # any failure leaves the text side answering, as before
                if embedder is not None:
                    with contextlib.suppress(Exception):
                        await embedder.close()
                self.note = (
                    f"the index's embedder ({wanted.provider} {wanted.model}) cannot be loaded ({exc}): it is "
                    "searched by its text side until the rebuild for the configured embedder replaces it"
                )
                log.warning("memory: %s", self.note)
                return
            self._embedder = embedder
            log.info("memory: the index of %s answers with its own query vectors until it is replaced", wanted.provider)

    async def release(self) -> None:
        previous, self._embedder, self._for, self.note = self._embedder, None, None, None
        if previous is not None:
            await previous.close()


def query_embedder(
    active: EmbedderIdentity | None, configured: Embedder | None, previous: PreviousEmbedder
) -> Embedder | None:
    """What embeds a query for the index whose embedder is ``active``: the ``configured`` embedder
    (None while it is not loaded) when it made that index; while an index of another routed choice
    is active (being rebuilt for this one), the embedder of that choice over the same loaded models
    (:meth:`RoutedEmbedder.view_for`); else the embedder that index was built with, when it is
    loaded (``previous``: the old index keeps its vector side until the new one replaces it); else
    None (the text side then answers alone)."""
    if active is None:
        return None
    if configured is not None:
        if active == configured.identity:
            return configured
        if isinstance(configured, RoutedEmbedder) and (view := configured.view_for(active)) is not None:
            return view
    return previous.of(active)


def needs_previous(active: EmbedderIdentity | None, configured: Embedder | None) -> bool:
    """Whether the active index was built by an embedder other than the ``configured`` one (None
    while not loaded: no) and the configured one's models cannot embed its queries."""
    if active is None or configured is None or active == configured.identity:
        return False
    return not (isinstance(configured, RoutedEmbedder) and configured.view_for(active) is not None)
