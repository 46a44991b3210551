"""E5's query path in int8 on onnxruntime: a search query's vector at about a third of the CPU.

A search embeds one short text, and on torch (the traced bfloat16 encoder of
:mod:`memory.embedders.e5_engine`) that costs 12.7 ms of CPU p50 on this project's machine; the
same encoder exported to ONNX and its linear layers quantized to int8 by onnxruntime's dynamic
quantization costs 4.4 ms p50, 6.2 ms p95, its vectors within a cosine of 0.994 of torch's on 300
REALTALK questions (docs/memory-tuning.md, eleventh round). Passages stay on torch: batched, int8 on
onnxruntime costs about twice bfloat16 on torch per chunk, and every float engine measured
(onnxruntime, OpenVINO, torch.compile) within 0.8-1.4x of it.

The graph is exported once (``torch.onnx``'s TorchScript exporter, then
``onnxruntime.quantization.quantize_dynamic``; about 15 s of CPU) from the float32 dequantized
encoder and kept in the user's cache directory (``$XDG_CACHE_HOME/neotask``, else
``~/.cache/neotask``) under a name that holds a hash of the model file and the two libraries'
versions, written atomically. :func:`load` returns None, and the caller keeps the torch path, when
onnxruntime or onnx is missing, the export or the session fails, or the graph's vectors of the
probe texts are not within :data:`MIN_COSINE` of torch's.

Only :meth:`memory.embedders.E5Embedder._load` imports this module (it imports torch).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from memory.embedders.e5_engine import TorchE5, encoder_of_file, model_file

log = logging.getLogger(__name__)

# how far the int8 graph's query vectors may be from torch's (cosine) on the probe texts; on 300
# REALTALK questions the lowest was 0.9939, the median 0.9968
MIN_COSINE = 0.99
_PROBES = ("probe", "What did Caroline make in pottery class last Thursday?", "夫の誕生日はいつ？", "long " * 60)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neotask"


def graph_path(model: Path) -> Path:
    """Where the int8 graph of ``model`` is kept: named by the file's hash and the versions of torch
    and onnxruntime (another of either exports again)."""
    import onnxruntime

    digest = hashlib.sha256()
    with model.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"{torch.__version__} {onnxruntime.__version__} v1".encode())
    return cache_dir() / f"e5-query-int8-{digest.hexdigest()[:16]}.onnx"


class _Pooled(torch.nn.Module):
    """The encoder with the mean over its tokens: what the graph computes from input embeddings."""

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled: torch.Tensor = (hidden * weights).sum(1) / weights.sum(1)
        return pooled


def export(model: Path, out: Path) -> None:
    """The float32 encoder of ``model`` exported to ONNX, its linear layers quantized to int8
    (per output channel; activations one scale per query), written to ``out`` atomically."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out.parent.mkdir(parents=True, exist_ok=True)
    pooled = _Pooled(encoder_of_file(model)).eval()
    example = (torch.zeros(1, 8, 384), torch.ones(1, 8, dtype=torch.int64))
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        plain = Path(tmp) / "float32.onnx"
        with warnings.catch_warnings():  # (the exporter's notes on traced branches and indexing)
            warnings.simplefilter("ignore")
            torch.onnx.export(
                pooled,
                example,
                str(plain),
                input_names=["embeds", "mask"],
                output_names=["mean"],
                dynamo=False,
                dynamic_axes={"embeds": {0: "batch", 1: "tokens"}, "mask": {0: "batch", 1: "tokens"}},
                opset_version=17,
            )
        quantized = Path(tmp) / "int8.onnx"
        import onnx

        quantize_dynamic(
            plain,
            quantized,
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        os.replace(quantized, out)


class OnnxQuery:
    """One query's vector through the int8 graph; thread-compatible (the embedder's thread calls it)."""

    def __init__(self, torch_model: TorchE5, path: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy waits
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._model = torch_model

    def encode_one(self, text: str, prefix: str) -> npt.NDArray[np.float32]:
        """The unit vector of ``prefix + text``; a text longer than one window goes to torch."""
        model = self._model
        ids = model.tokenizer.content([prefix + text])[0]
        if len(ids) > model.window:
            return model.encode([text], prefix)
        embeds = model.input_embeddings(ids)
        mask = np.ones(embeds.shape[:2], np.int64)
        mean = self._session.run(None, {"embeds": embeds, "mask": mask})[0][0].astype(np.float64)
        out: npt.NDArray[np.float32] = (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)[None, :]
        return out


def load(torch_model: TorchE5, threads: int = 1) -> OnnxQuery | None:
    """The int8 query path of ``torch_model``'s file (exported on first use), or None (see the module
    docstring: the caller then keeps torch's query path)."""
    try:
        path = graph_path(model_file())
        if not path.exists():
            export(model_file(), path)
        query = OnnxQuery(torch_model, path, threads)
        for probe in _PROBES:
            cosine = float(query.encode_one(probe, "query: ")[0] @ torch_model.encode([probe], "query: ")[0])
            if cosine < MIN_COSINE:
                log.warning("E5's int8 query graph is off (cosine %.4f on a probe); torch answers queries", cosine)
                return None
    except Exception as exc:  # a missing package, a failed export or session: the torch path works
        log.info("E5's int8 query graph not used (%s: %s); torch answers queries", type(exc).__name__, exc)
        return None
    return query
