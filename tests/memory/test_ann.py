"""The ANN index (IVF-HNSW-SQ): built once the table passes ``ANN_MIN_ROWS`` (20,000 in
production, lowered here), and vector search without the in-memory mirror still finds the nearest
chunks through it, with exact distances (real LanceDB)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memory.store as store_module
from memory.chunking import Chunk
from memory.embedders import EmbedderIdentity
from memory.store import ChunkStore
from memory.table import IndexIdentity, rows_table

DIMS, ROWS = 32, 1200


def chunks(n: int) -> list[Chunk]:
    return [
        Chunk(path=f"memory/n{i}.md", start_line=1, end_line=1, heading="", text=f"note {i}", content_hash=f"h{i}")
        for i in range(n)
    ]


def has_ann(table: Any) -> bool:
    return any(i.index_type.upper().startswith("IVF") for i in table.list_indices())


@pytest.mark.slow
@pytest.mark.allow_blocking  # LanceDB work on the test's own thread: there is no loop to protect here
def test_the_ann_index_is_built_past_the_threshold_and_still_finds_neighbours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(ROWS, DIMS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = ChunkStore(tmp_path / "memory.lance", mirror=False)  # (with the mirror searches scan it instead)
    identity = IndexIdentity.of(EmbedderIdentity("test", "random", DIMS), 200, 40, None)
    table = store.create_table(identity)
    store.write(table, [], [rows_table("main", "f", chunks(ROWS), vectors, DIMS)])

    monkeypatch.setattr(store_module, "ANN_MIN_ROWS", ROWS + 1)
    store.maintain(table, force=True)
    assert not has_ann(table), "below the threshold: a flat scan"

    monkeypatch.setattr(store_module, "ANN_MIN_ROWS", ROWS)
    store.maintain(table, force=True)
    assert has_ann(table)
    assert [i.index_type for i in table.list_indices() if i.index_type != "FTS"] == ["IvfHnswSq"]

    found = 0
    for target in range(0, ROWS, 60):
        query = vectors[target] + rng.normal(scale=0.3, size=DIMS).astype(np.float32)
        query /= np.linalg.norm(query)
        rows = store.vector_pool(table, query, "main", 10, True)
        # the distances are exact (re-ranked on the full vectors), not product-quantized guesses:
        # the fusion ranks on them
        exact = {f"memory/n{i}.md": 1.0 - float(vectors[i] @ query) for i in range(ROWS)}
        for row in rows:
            assert row["_distance"] == pytest.approx(exact[row["path"]], abs=1e-4)
        assert [r["_distance"] for r in rows] == sorted(r["_distance"] for r in rows)
        nearest = sorted(exact, key=exact.__getitem__)[:10]
        found += len({r["path"] for r in rows} & set(nearest))
    assert found >= 160, f"only {found} of the 200 exact top-10 neighbours were found"
