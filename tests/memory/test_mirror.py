"""The in-memory mirror of a chunk table (``memory.mirror``): the vector pool it gives is the exact
flat scan LanceDB gives, and the full-text pool matches the chunks LanceDB's index matches, scored
by BM25 over every row of the table, through deletes, adds and a reopen (real LanceDB on both
sides)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory.bm25 import tokens
from memory.chunking import Chunk
from memory.embedders import EmbedderIdentity
from memory.mirror import Mirror, _take
from memory.store import ChunkStore
from memory.table import IndexIdentity, rows_table

DIMS = 24
WORDS = ["garden", "budget", "pottery", "violin", "harbour", "lantern", "orchard", "meadow"]
pytestmark = pytest.mark.allow_blocking  # LanceDB on the test's own thread: no loop to protect


def chunks(path: str, n: int, rng: np.random.Generator) -> list[Chunk]:
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS, size=4))
        out.append(Chunk(path=path, start_line=i + 1, end_line=i + 1, heading="H", text=f"{path} {i} {words}",
                         content_hash=f"{path}-{i}-{words}"))  # fmt: skip
    return out


def unit(rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
    v = rng.normal(size=(n, DIMS)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def flat_pool(table: Any, query: np.ndarray[Any, Any], where: str | None, limit: int) -> list[dict[str, Any]]:
    q = table.search(query, vector_column_name="vector").distance_type("cosine").bypass_vector_index()
    if where:
        q = q.where(where, prefilter=True)
    cols = ["chunk_id", "path", "start_line", "end_line", "heading", "text", "content", "_distance"]
    return list(q.limit(limit).select(cols).to_arrow().to_pylist())


def same_pool(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [r["chunk_id"] for r in got] == [r["chunk_id"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert g["_distance"] == pytest.approx(w["_distance"], abs=1e-5)
        assert {k: v for k, v in g.items() if k != "_distance"} == {k: v for k, v in w.items() if k != "_distance"}


def bm25(table: Any, query: str) -> dict[str, float]:
    """Okapi BM25 (k1 1.2, b 0.75, idf ln(1 + (N - df + 0.5) / (df + 0.5))) of every row of
    ``table`` that holds a term of ``query``, written out term by term."""
    rows = table.search().select(["chunk_id", "content"]).limit(table.count_rows()).to_list()
    docs = {r["chunk_id"]: tokens(r["content"]) for r in rows}
    mean = sum(len(d) for d in docs.values()) / len(docs)
    out: dict[str, float] = {}
    for term in set(tokens(query)):
        df = sum(1 for d in docs.values() if term in d)
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for chunk_id, d in docs.items():
            if (tf := d.count(term)) > 0:
                out[chunk_id] = out.get(chunk_id, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(d) / mean))
    return out


def check(store: ChunkStore, plain: ChunkStore, rng: np.random.Generator) -> None:
    """The mirrored store's vector pool equals the plain store's flat scan; its full-text pool
    holds the chunks LanceDB's full-text index matches, with their vectors, scored by BM25."""
    table, other = store.active, plain.active
    for _ in range(8):
        query = unit(rng, 1)[0]
        for agent, include_md in (("main", True), ("main", False), ("ops", True)):
            where = f"agent = '{agent}'" + ("" if include_md else " AND path != 'MEMORY.md'")
            same_pool(store.vector_pool(table, query, agent, 15, include_md), flat_pool(other, query, where, 15))
        words = " ".join(rng.choice(WORDS, size=2))
        # (every match: rows of equal BM25 come back in no fixed order, so a cut could differ)
        rows, vectors = store.text_pool(table, words, "main", 200, True)
        want_rows, want_vectors = plain.text_pool(other, words, "main", 200, True)
        assert rows and len(rows) < 200
        order = [r["_score"] for r in rows]
        assert order == sorted(order, reverse=True)
        got = {r["chunk_id"]: (r, v.tolist()) for r, v in zip(rows, vectors, strict=True)}
        want = {r["chunk_id"]: (r, v.tolist()) for r, v in zip(want_rows, want_vectors, strict=True)}
        scores = {c: r.pop("_score") for c, (r, _) in got.items()}
        assert {c: r.pop("_score") > 0 for c, (r, _) in want.items()} == {c: True for c in got}
        assert got == want
        reference = bm25(table, words)
        assert scores == {c: pytest.approx(reference[c], rel=1e-5) for c in scores}


def test_the_mirror_gives_the_exact_pools_through_writes_and_a_reopen(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    uri = tmp_path / "memory.lance"
    store = ChunkStore(uri)
    identity = IndexIdentity.of(EmbedderIdentity("test", "random", DIMS), 200, 40, None)
    table = store.create_table(identity)
    store.swap(table, identity)
    files = [
        ("main", "MEMORY.md", 6),
        ("main", "memory/a.md", 30),
        ("main", "memory/b.md", 40),
        ("ops", "memory/a.md", 25),
    ]
    store.write(
        table, [], [rows_table(a, "f", chunks(p, n, rng), unit(rng, n), DIMS) for a, p, n in files]
    )  # fmt: skip
    plain = ChunkStore(uri, mirror=False)
    check(store, plain, rng)

    # an edit: the file's rows are deleted and its new rows added; another file removed
    store.write(
        table, [("main", "memory/a.md")], [rows_table("main", "g", chunks("memory/a.md", 12, rng), unit(rng, 12), DIMS)]
    )
    store.write(table, [("main", "memory/b.md")], [])
    mirror = store.mirror(table)
    assert mirror is not None and len(mirror.snapshot) == table.count_rows() == 6 + 12 + 25
    check(store, ChunkStore(uri, mirror=False), rng)

    reopened = ChunkStore(uri)  # loads its mirror from the table
    loaded = reopened.mirror(reopened.active)
    assert loaded is not None and loaded.snapshot.rows.column("text").num_chunks == 1  # (however LanceDB batched it)
    check(reopened, ChunkStore(uri, mirror=False), rng)


def test_a_chunk_is_matched_as_soon_as_it_is_written_and_not_after_its_delete(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    store = ChunkStore(tmp_path / "memory.lance")
    identity = IndexIdentity.of(EmbedderIdentity("test", "random", DIMS), 200, 40, None)
    table = store.create_table(identity)
    store.swap(table, identity)
    store.write(table, [], [rows_table("main", "f", chunks("memory/a.md", 10, rng), unit(rng, 10), DIMS)])
    assert store.text_pool(table, "zeppelin quarry", "main", 10, True)[0] == []
    written = Chunk("memory/new.md", 1, 1, "H", "a zeppelin over the quarry", "zeppelin")
    vector = unit(rng, 1)
    store.write(table, [], [rows_table("main", "z", [written], vector, DIMS)])
    rows, vectors = store.text_pool(table, "zeppelin quarry", "main", 10, True)
    assert [r["path"] for r in rows] == ["memory/new.md"]
    assert rows[0]["text"] == written.text and rows[0]["_score"] > 0
    assert np.allclose(vectors[0], vector[0])
    assert store.text_pool(table, "zeppelin quarry", "ops", 10, True)[0] == []
    store.write(table, [("main", "memory/new.md")], [])
    rows, vectors = store.text_pool(table, "zeppelin quarry", "main", 10, True)
    assert rows == [] and vectors.shape == (0, DIMS)


def test_an_empty_mirror_and_filters_that_match_nothing() -> None:
    mirror = Mirror(DIMS)
    query = np.ones(DIMS, np.float32)
    assert mirror.snapshot.nearest(query, "main", 10, True) == []
    rng = np.random.default_rng(1)
    mirror.add(rows_table("main", "f", chunks("MEMORY.md", 3, rng), unit(rng, 3), DIMS))
    assert mirror.snapshot.nearest(query, "ops", 10, True) == []
    assert mirror.snapshot.nearest(query, "main", 10, False) == []
    assert len(mirror.snapshot.nearest(query, "main", 10, True)) == 3
    mirror.delete("main", ["MEMORY.md"])
    assert len(mirror.snapshot) == 0 and mirror.snapshot.nearest(query, "main", 10, True) == []


def test_a_query_with_one_models_part_scores_what_the_whole_vectors_score() -> None:
    """A routed query fills one model's part of the vector (the rest is 0): the scan reads only
    those columns, and scores what the product with the whole vectors gives."""
    from memory.mirror import _scores

    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(300, 896)).astype(np.float32)
    for part in (slice(0, 384), slice(384, 896)):
        query = np.zeros(896, np.float32)
        query[part] = rng.normal(size=part.stop - part.start)
        assert np.allclose(_scores(vectors, query), vectors @ query, atol=1e-4)
    whole = rng.normal(size=896).astype(np.float32)
    assert np.allclose(_scores(vectors, whole), vectors @ whole, atol=1e-4)


def test_rows_read_from_a_snapshot_of_many_adds_are_the_rows_added() -> None:
    """Every add appends a chunk to the snapshot's columns; reads take rows chunk by chunk and give
    the rows as added, in the order asked."""
    rng = np.random.default_rng(3)
    mirror = Mirror(DIMS)
    added = []
    for f in range(6):
        table = rows_table("main", "f", chunks(f"memory/{f}.md", 4, rng), unit(rng, 4), DIMS)
        mirror.add(table)
        added += table.select(["chunk_id", "path", "start_line", "end_line", "heading", "text", "content"]).to_pylist()
    snap = mirror.snapshot
    assert snap.rows.column("chunk_id").num_chunks > 1
    ids = [r["chunk_id"] for r in added]
    assert _take(snap.rows, np.array([17, 2])) == [added[17], added[2]]
    nearest = snap.nearest(snap.vectors[9], "main", 3, True)
    assert nearest[0]["chunk_id"] == ids[9]
    assert {k: v for k, v in nearest[0].items() if k != "_distance"} == added[9]
    assert _take(snap.rows, np.arange(len(ids))[::-1]) == added[::-1]


def test_the_full_text_cut_keeps_the_best_and_of_those_tied_the_first_rows() -> None:
    rng = np.random.default_rng(9)
    mirror = Mirror(DIMS)
    texts = ["violin lantern", "violin", "violin", "violin", "garden", "violin", "violin lantern"]
    found = [Chunk("memory/a.md", i + 1, i + 1, "H", t, f"h{i}") for i, t in enumerate(texts)]
    mirror.add(rows_table("main", "f", found, unit(rng, len(found)), DIMS))
    rows, vectors = mirror.snapshot.matches("violin lantern", "main", 4, True)
    assert [r["start_line"] for r in rows] == [1, 7, 2, 3]  # two tied, then four tied: table order
    assert np.allclose(vectors, mirror.snapshot.vectors[[0, 6, 1, 2]])
    assert [r["start_line"] for r in mirror.snapshot.matches("violin", "main", 2, True)[0]] == [2, 3]
    assert mirror.snapshot.matches("violin", "main", 0, True)[0] == []
