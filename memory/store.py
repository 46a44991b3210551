"""The LanceDB side: one chunk table for all agents, an identity pointer, candidate queries.

Blocking; every method is called from the memory index thread only (the daemon is the only
writer). The active table's name and identity live in ``<uri>/neotask-index.json``, replaced
atomically (temp file, fsync, rename): a rebuild writes a new table and swaps the pointer only
when it succeeded, so a failed rebuild leaves the old table serving.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from memory import scopes
from memory.mirror import Mirror
from memory.table import IndexIdentity, schema

POINTER = "neotask-index.json"
# From this many rows the table gets an IVF-HNSW-SQ index (searches use it only without the in-memory
# mirror, ``ChunkStore(mirror=False)``; with it they scan the mirror): at 20,000 rows the flat scan reads the
# whole vector column (30 MB) per query, 30-45 ms, while the index answers in about 10 ms and, on
# the conversation-20000 set of bench.memory_eval, finds 99.7 % of the exact top 100 (99.9 % of the
# top 10) with the same recall at every k for every fusion (see docs/memory-tuning.md, Speed). Below it a
# flat scan is exact and fast enough.
ANN_MIN_ROWS = 20_000
# Through the index a query probes this many partitions and re-ranks refine x limit rows on their
# full vectors (reading them is most of the query's time: refine 5 found 99.9 % of the exact top
# 100, 3 finds 99.7 %, both with the same recall at every k). Without the refine step the
# distances are the quantized index's approximations: ranked on them, the vector side lost nearly
# all its recall on conversation-20000 (IVF-HNSW-SQ, recall @10 0.3 against 52.6 flat) and on
# conversation-50000 (IVF-PQ, 2.4).
ANN_NPROBES = 20
ANN_REFINE = 3
_OPTIMIZE_EVERY_ROWS = 2_000
_OPTIMIZE_EVERY_WRITES = 40


def _q(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _file_groups(files: Iterable[tuple[str, str]]) -> list[tuple[str, list[str], str]]:
    """(agent, paths, SQL filter) selecting the rows of the (agent, path) files, at most 200
    paths each."""
    by_agent: dict[str, list[str]] = {}
    for agent, path in files:
        by_agent.setdefault(agent, []).append(path)
    out = []
    for agent, paths in by_agent.items():
        for i in range(0, len(paths), 200):
            part = paths[i : i + 200]
            out.append((agent, part, f"agent = {_q(agent)} AND path IN ({', '.join(_q(p) for p in part)})"))
    return out


def _file_filters(files: Iterable[tuple[str, str]]) -> list[str]:
    """SQL filters selecting the rows of the (agent, path) files, at most 200 paths each."""
    return [where for _, _, where in _file_groups(files)]


TEXT_COLUMNS = ["chunk_id", "path", "start_line", "end_line", "heading", "text", "content"]


class ChunkStore:
    """LanceDB database at ``uri`` with the active table and, during a rebuild, a new one.

    With ``mirror`` (the default) each table's vectors and text columns are also kept in memory
    (:mod:`memory.mirror`, loaded when a table is opened, kept in step by :meth:`write`): the
    vector pool is an exact scan of them, and the full-text pool reads only chunk ids and scores
    from LanceDB. Without it both pools are LanceDB queries (through the ANN index past
    ``ANN_MIN_ROWS``)."""

    def __init__(self, uri: Path, *, mirror: bool = True) -> None:
        import lancedb

        uri.mkdir(parents=True, exist_ok=True)
        self.uri = uri
        self._db = lancedb.connect(str(uri))
        self.active: Any = None
        self.active_identity: IndexIdentity | None = None
        self._writes = 0
        self._rows_since_optimize = 0
        self._fts: set[str] = set()
        self._ann: set[str] = set()
        # table name -> the agents that may have rows in it (a superset: deletes leave it as it
        # is). A table that holds one agent's rows only needs no agent filter, which costs a
        # search a scan of the agent column (a third of a flat vector query at 20,000 rows).
        self._agents: dict[str, frozenset[str]] = {}
        self._mirror_on = mirror
        self._mirrors: dict[str, Mirror] = {}
        self._mirror_lock = threading.Lock()
        self._active_lock = threading.Lock()
        pointer = self._read_pointer()
        try:
            if pointer is not None and pointer["table"] in self._tables():
                identity = IndexIdentity.from_dict(pointer["identity"])
                self.active = self._db.open_table(pointer["table"])
                self.active_identity = identity
                self._agents[self.active.name] = self._stored_agents(self.active)
                self.mirror(self.active)
        except (KeyError, TypeError):  # an unreadable pointer: start a new index
            self.active = self.active_identity = None

    def serving(self) -> tuple[Any, IndexIdentity | None]:
        """The active table and its identity, read together (a swap may run on the index thread)."""
        with self._active_lock:
            return self.active, self.active_identity

    def _tables(self) -> set[str]:
        return set(self._db.list_tables().tables)

    def _read_pointer(self) -> dict[str, Any] | None:
        path = self.uri / POINTER
        try:
            data: dict[str, Any] = json.loads(path.read_text("utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data

    def create_table(self, identity: IndexIdentity) -> Any:
        name = f"chunks_{identity.tag}_{int(time.time() * 1000)}_{os.getpid()}"
        table = self._db.create_table(name, schema=schema(identity.dimensions))
        self._agents[name] = frozenset()
        if self._mirror_on:
            self._mirrors[name] = Mirror(identity.dimensions)
        return table

    def swap(self, table: Any, identity: IndexIdentity) -> None:
        """Make ``table`` the active one (atomic pointer rename), then drop the old table."""
        path = self.uri / POINTER
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump({"table": table.name, "identity": identity.as_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        old = self.active
        with self._active_lock:
            self.active, self.active_identity = table, identity
        self._writes = self._rows_since_optimize = 0
        if old is not None and old.name != table.name:
            self.drop(old)
        self.drop_strays()

    def drop(self, table: Any) -> None:
        self._agents.pop(table.name, None)
        self._mirrors.pop(table.name, None)
        with contextlib.suppress(ValueError, FileNotFoundError, OSError):
            self._db.drop_table(table.name)

    def drop_strays(self, keep: Iterable[Any] = ()) -> None:
        """Tables left by a rebuild that died with the process (but the active table and ``keep``)."""
        kept = {t.name for t in (self.active, *keep) if t is not None}
        for name in self._tables():
            if name.startswith("chunks_") and name not in kept:
                self._agents.pop(name, None)
                self._mirrors.pop(name, None)
                with contextlib.suppress(ValueError, FileNotFoundError, OSError):
                    self._db.drop_table(name)

    def strays_of(self, identity: IndexIdentity) -> list[Any]:
        """The tables a rebuild for ``identity`` left when its process died (not the active one):
        their vectors are the new identity's, so a restarted rebuild reuses them by content hash
        instead of embedding every chunk again."""
        active = self.active.name if self.active is not None else None
        names = sorted(n for n in self._tables() if n.startswith(f"chunks_{identity.tag}_") and n != active)
        return [self._db.open_table(n) for n in names]

    # --- reads -------------------------------------------------------------------------------

    def mirror(self, table: Any) -> Mirror | None:
        """The in-memory copy of ``table`` (loaded on first use), or None when mirroring is off."""
        if not self._mirror_on or table is None:
            return None
        found = self._mirrors.get(table.name)
        if found is None:
            with self._mirror_lock:
                found = self._mirrors.get(table.name)
                if found is None:
                    found = Mirror.load(table, table.schema.field("vector").type.list_size)
                    self._mirrors[table.name] = found
        return found

    @staticmethod
    def count(table: Any, agent: str | None = None) -> int:
        if table is None:
            return 0
        return int(table.count_rows(f"agent = {_q(agent)}" if agent else None))

    @staticmethod
    def file_hashes(table: Any) -> dict[tuple[str, str], str]:
        """(agent, path) → file hash of every file the table holds."""
        if table is None or table.count_rows() == 0:
            return {}
        data = table.search().select(["agent", "path", "file_hash"]).limit(table.count_rows()).to_arrow()
        return {
            (a, p): h
            for a, p, h in zip(
                data["agent"].to_pylist(), data["path"].to_pylist(), data["file_hash"].to_pylist(), strict=True
            )
        }

    @staticmethod
    def vectors_for(tables: Iterable[Any], hashes: Iterable[str]) -> dict[str, np.ndarray[Any, Any]]:
        """Cached vectors by content hash, from the given tables (first wins)."""
        wanted = sorted(set(hashes))
        found: dict[str, np.ndarray[Any, Any]] = {}
        for table in tables:
            if table is None:
                continue
            for i in range(0, len(wanted), 500):
                part = [h for h in wanted[i : i + 500] if h not in found]
                if not part:
                    continue
                where = f"content_hash IN ({', '.join(_q(h) for h in part)})"
                data = table.search().where(where).select(["content_hash", "vector"]).limit(len(part) * 4 + 16)
                arrow = data.to_arrow()
                vecs = arrow["vector"].to_pylist()
                for h, v in zip(arrow["content_hash"].to_pylist(), vecs, strict=True):
                    found.setdefault(h, np.asarray(v, dtype=np.float32))
        return found

    @staticmethod
    def vectors_of_files(table: Any, files: Sequence[tuple[str, str]]) -> dict[str, np.ndarray[Any, Any]]:
        """The vectors of the rows of the (agent, path) files, by content hash (read before a
        write deletes them, so their vectors can be reused)."""
        found: dict[str, np.ndarray[Any, Any]] = {}
        for where in _file_filters(files):
            arrow = table.search().where(where).select(["content_hash", "vector"]).limit(table.count_rows()).to_arrow()
            for h, v in zip(arrow["content_hash"].to_pylist(), arrow["vector"].to_pylist(), strict=True):
                found.setdefault(h, np.asarray(v, dtype=np.float32))
        return found

    # --- writes ------------------------------------------------------------------------------

    def write(self, table: Any, remove: Sequence[tuple[str, str]], add: Sequence[pa.Table]) -> None:
        """Delete the rows of the (agent, path) files in ``remove``, then add the new rows."""
        mirror = self.mirror(table)
        for agent, paths, where in _file_groups(remove):
            table.delete(where)
            self._writes += 1
            if mirror is not None:
                mirror.delete(agent, paths)
        rows = [t for t in add if t.num_rows]
        if rows:
            known = self._agents.get(table.name)
            added = frozenset(a for t in rows for a in t.column("agent").unique().to_pylist())
            self._agents[table.name] = (self._stored_agents(table) if known is None else known) | added
            batch = pa.concat_tables(rows)
            table.add(batch)
            self._writes += 1
            if mirror is not None:
                mirror.add(batch)
            self._rows_since_optimize += sum(t.num_rows for t in rows)
        self.ensure_fts(table)

    def has_fts(self, table: Any) -> bool:
        """Whether ``table`` has its full-text index (remembered: asked on every query)."""
        if table.name not in self._fts:
            if not any(i.index_type == "FTS" for i in table.list_indices()):
                return False
            self._fts.add(table.name)
        return True

    def has_ann(self, table: Any) -> bool:
        """Whether ``table`` has its IVF vector index (remembered: asked on every query)."""
        if table.name not in self._ann:
            if not any(i.index_type.upper().startswith("IVF") for i in table.list_indices()):
                return False
            self._ann.add(table.name)
        return True

    def ensure_fts(self, table: Any) -> None:
        if self.has_fts(table) or table.count_rows() == 0:
            return
        from lancedb.index import FTS

        table.create_index(
            "content",
            config=FTS(
                base_tokenizer="icu",  # dictionary word segmentation, so Japanese text matches
                language="English",
                stem=True,
                remove_stop_words=True,
                ascii_folding=True,
                with_position=False,
            ),
        )

    def maintain(self, table: Any, *, force: bool = False) -> None:
        """Fold new rows into the indices, compact and prune old versions; build the ANN index
        once the table passes ``ANN_MIN_ROWS``. Cheap to call; works only when due."""
        if table is None or table.count_rows() == 0:
            return
        due = self._rows_since_optimize >= _OPTIMIZE_EVERY_ROWS or self._writes >= _OPTIMIZE_EVERY_WRITES
        if force or due:
            table.optimize(cleanup_older_than=timedelta(seconds=1), delete_unverified=True)
            self._writes = self._rows_since_optimize = 0
        rows = table.count_rows()
        if rows >= ANN_MIN_ROWS and not any(i.index_type.upper().startswith("IVF") for i in table.list_indices()):
            from lancedb.index import IvfHnswSq

            # (an IVF-PQ index an older version built is kept: the refine step makes it exact too)
            table.create_index("vector", config=IvfHnswSq(distance_type="cosine"))

    # --- queries -----------------------------------------------------------------------------

    @staticmethod
    def _stored_agents(table: Any) -> frozenset[str]:
        if table.count_rows() == 0:
            return frozenset()
        column = table.search().select(["agent"]).limit(table.count_rows()).to_arrow()["agent"]
        return frozenset(column.unique().to_pylist())

    def _where(self, table: Any, agent: str, include_memory_md: bool, scope: scopes.Scope) -> str | None:
        """The filter of a query of ``agent``'s chunks in ``scope``; None when it needs none."""
        parts = []
        agents = self._agents.get(table.name)
        if agents is None or not agents <= {agent}:
            parts.append(f"agent = {_q(agent)}")
        if not include_memory_md:
            parts.append("path != 'MEMORY.md'")
        if (in_scope := scopes.where(scope)) is not None:
            parts.append(in_scope)
        return " AND ".join(parts) or None

    def vector_pool(
        self,
        table: Any,
        vector: np.ndarray[Any, Any],
        agent: str,
        limit: int,
        include_memory_md: bool,
        scope: scopes.Scope = scopes.EVERY,
    ) -> list[dict[str, Any]]:
        """The ``limit`` nearest chunks of ``agent`` in ``scope`` by cosine distance (``_distance``),
        nearest first. Through an ANN index the candidates are re-ranked on their full vectors, so
        ``_distance`` is exact either way. With the mirror: an exact scan of the in-memory vectors."""
        if (mirror := self.mirror(table)) is not None:
            return mirror.snapshot.nearest(vector, agent, limit, include_memory_md, scope)
        query = table.search(vector, vector_column_name="vector").distance_type("cosine")
        if self.has_ann(table):
            query = query.nprobes(ANN_NPROBES).refine_factor(ANN_REFINE)
        if (where := self._where(table, agent, include_memory_md, scope)) is not None:
            query = query.where(where, prefilter=True)
        return list(query.limit(limit).select([*TEXT_COLUMNS, "_distance"]).to_arrow().to_pylist())

    def text_pool(
        self,
        table: Any,
        query: str,
        agent: str,
        limit: int,
        include_memory_md: bool,
        scope: scopes.Scope = scopes.EVERY,
    ) -> tuple[list[dict[str, Any]], np.ndarray[Any, Any]]:
        """The ``limit`` best BM25 matches of ``agent`` in ``scope`` (``_score``), best first, and
        their vectors. With the mirror: its in-memory BM25 index (:mod:`memory.bm25`); without it
        LanceDB's full-text index."""
        from lancedb.query import MatchQuery

        if (mirror := self.mirror(table)) is not None:
            return mirror.snapshot.matches(query, agent, limit, include_memory_md, scope)
        if not self.has_fts(table):
            return [], np.zeros((0, 0), np.float32)
        search = table.search(MatchQuery(query, "content"), query_type="fts")  # type: ignore[call-arg]
        if (where := self._where(table, agent, include_memory_md, scope)) is not None:
            search = search.where(where, prefilter=True)
        arrow = search.limit(limit).select([*TEXT_COLUMNS, "vector", "_score"]).to_arrow()
        dims = arrow.schema.field("vector").type.list_size
        vectors = arrow["vector"].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, dims)
        return arrow.drop_columns(["vector"]).to_pylist(), vectors
