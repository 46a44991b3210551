"""Incremental indexing: find changed files, embed only chunks whose content hash is new, write.

``plan_changes`` is the pure decision (which files to re-chunk and which to drop); ``Indexer.run``
carries it out through the index thread (LanceDB, file reads) and the embedder's own thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from config.errors import BadRequest, NeotaskError
from config.settings import MemorySettings
from memory.chunking import Chunk, chunk_markdown
from memory.embedders import Embedder
from memory.records import IndexReport
from memory.sources import SourceFile, allowed_roots, discover, file_hash, read_text_inside
from memory.store import ChunkStore
from memory.table import IndexIdentity, rows_table

log = logging.getLogger("neotask.memory")

T = TypeVar("T")
Progress = Callable[[int, int], None]
FileKey = tuple[str, str]  # (agent, relative path)
Signature = tuple[int, int]  # (mtime_ns, size)

EMBED_BATCH = 32  # chunks per embedding call: small enough that a search waits little behind it
WRITE_GROUP = 1024  # chunks per LanceDB write while indexing
# Vectors of the rows a write deleted, kept by content hash for the next passes: a file read while
# an editor was rewriting it (empty or cut short), then read whole, or a file renamed, re-embeds
# nothing (bench.memory_speed's edit check once re-embedded a whole file after such a read).
DROPPED_VECTORS = 2048


@dataclass(frozen=True)
class FileState:
    """What the index holds of a file: the hash of the text it was chunked from, its chunks."""

    file_hash: str
    chunks: int


@dataclass(frozen=True)
class FileChange:
    """A file to index again: its text's hash, its stat signature, its chunks."""

    key: FileKey
    file_hash: str
    signature: Signature
    chunks: tuple[Chunk, ...]


@dataclass
class Scan:
    scanned: int = 0
    changes: list[FileChange] = field(default_factory=list)
    removed: list[FileKey] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def plan_changes(
    agent: str,
    current: Mapping[str, tuple[Signature, Callable[[], str]]],
    known: Mapping[FileKey, FileState],
    signatures: Mapping[FileKey, Signature],
    *,
    full: bool,
) -> tuple[list[tuple[str, str, Signature]], list[FileKey]]:
    """Which files of ``agent`` need re-chunking, and which indexed files are gone.

    ``current`` maps a relative path to its stat signature and a reader of its text. A file whose
    signature is unchanged since it was indexed is skipped without reading; one that reads the same
    (same hash) is skipped too. ``full`` re-reads every file (a rebuild). Returns
    ``([(path, text, signature)], removed keys)``.
    """
    todo: list[tuple[str, str, Signature]] = []
    for rel, (sig, reader) in current.items():
        key = (agent, rel)
        state = known.get(key)
        if not full and state is not None and signatures.get(key) == sig:
            continue
        text = reader()
        if not full and state is not None and state.file_hash == file_hash(text):
            continue
        todo.append((rel, text, sig))
    removed = [key for key in known if key[0] == agent and key[1] not in current]
    return todo, removed


@dataclass(eq=False, repr=False)
class Indexer:
    """Keeps the chunk table level with the agents' memory files (``workspaces``: agent id →
    workspace folder): the table's writes on the ``db`` thread, the chunks embedded by ``embedder``."""

    settings: MemorySettings
    workspaces: Mapping[str, Path]
    store: ChunkStore
    embedder: Embedder
    db: ThreadPoolExecutor
    known: dict[FileKey, FileState] = field(default_factory=dict, init=False)
    pending: int = field(default=0, init=False)
    rebuilding: bool = field(default=False, init=False)
    rebuild_identity: IndexIdentity | None = field(default=None, init=False)  # what the rebuild in flight builds
    embedded_total: int = field(default=0, init=False)  # chunks embedded since start, by any run
    _signatures: dict[FileKey, Signature] = field(default_factory=dict, init=False)
    _strays_checked: bool = field(default=False, init=False)
    _dropped: OrderedDict[str, np.ndarray[Any, Any]] = field(default_factory=OrderedDict, init=False)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.db, fn, *args)

    def identity(self) -> IndexIdentity:
        return IndexIdentity.of(
            self.embedder.identity,
            self.settings.chunk_tokens,
            self.settings.overlap_tokens,
            self.embedder.max_input_tokens,
        )

    async def load_known(self) -> None:
        """Learn what the active table holds (so a restart re-embeds nothing)."""
        table = self.store.active
        hashes = await self._call(ChunkStore.file_hashes, table)
        rows = await self._call(self._per_file_counts, table)
        self.known = {key: FileState(h, rows.get(key, 0)) for key, h in hashes.items()}

    @staticmethod
    def _per_file_counts(table: Any) -> dict[FileKey, int]:
        if table is None or table.count_rows() == 0:
            return {}
        data = table.search().select(["agent", "path"]).limit(table.count_rows()).to_arrow()
        out: dict[FileKey, int] = {}
        for a, p in zip(data["agent"].to_pylist(), data["path"].to_pylist(), strict=True):
            out[(a, p)] = out.get((a, p), 0) + 1
        return out

    def _chunk(self, rel: str, text: str) -> tuple[Chunk, ...]:
        return tuple(
            chunk_markdown(
                rel,
                text,
                chunk_tokens=self.settings.chunk_tokens,
                overlap_tokens=self.settings.overlap_tokens,
                max_input_tokens=self.embedder.max_input_tokens,
                count_model_tokens=self.embedder.count_tokens,
            )
        )

    def _scan(self, agent: str, known: Mapping[FileKey, FileState], full: bool) -> Scan:
        scan = Scan()
        current: dict[str, tuple[Signature, Callable[[], str]]] = {}
        files: list[SourceFile] = discover(self.workspaces[agent], self.settings.extra_paths)
        roots = allowed_roots(self.workspaces[agent], self.settings.extra_paths)
        for f in files:
            try:
                st = f.abs.stat()
            except OSError:
                continue
            current[f.rel] = ((st.st_mtime_ns, st.st_size), functools.partial(read_text_inside, f.abs, roots))
        scan.scanned = len(current)
        try:
            todo, scan.removed = plan_changes(agent, current, known, self._signatures, full=full)
        except (OSError, BadRequest) as exc:  # a file vanished or became a symlink out: the next sweep settles it
            scan.errors.append(f"{agent}: {exc}")
            return scan
        for rel, text, sig in todo:
            scan.changes.append(FileChange((agent, rel), file_hash(text), sig, self._chunk(rel, text)))
        changed = {c.key for c in scan.changes}
        for rel, (sig, _) in current.items():
            if (agent, rel) in known and (agent, rel) not in changed:
                self._signatures[(agent, rel)] = sig
        return scan

    async def run(self, agents: Sequence[str], *, force: bool = False, progress: Progress | None = None) -> IndexReport:
        """One indexing pass over ``agents``; a rebuild (``force`` or a new identity) covers all
        agents into a new table that replaces the old one only if the pass succeeds."""
        started = time.monotonic()
        identity = self.identity()
        store = self.store
        if store.active is None:
            await self._call(lambda: store.swap(store.create_table(identity), identity))
            self.known = {}
        rebuild = force or store.active_identity != identity
        if rebuild:
            agents = list(self.workspaces)
            self._dropped.clear()  # another model or chunking, or force: re-embed
            # what a rebuild for this identity killed midway had written: reused, not re-embedded
            strays = [] if force else await self._call(store.strays_of, identity)
            await self._call(store.drop_strays, strays)  # (tables of other identities: of no use)
            target = await self._call(store.create_table, identity)
            known: dict[FileKey, FileState] = {}
            reuse = [] if force or store.active_identity is None else [store.active]
            if store.active_identity is not None and store.active_identity.embedder != identity.embedder:
                reuse = []
            reuse += strays
            self.rebuilding = True
            self.rebuild_identity = identity
        else:
            target, known, reuse = store.active, self.known, []
            if not self._strays_checked:  # a forced rebuild killed midway: its table is of no use
                await self._call(store.drop_strays)
            self._strays_checked = True
        try:
            report = await self._pass(agents, target, known, reuse, rebuild, progress)
            if rebuild:
                await self._call(lambda: store.maintain(target, force=True))
                await self._call(store.swap, target, identity)
                self.known = known
        except (NeotaskError, OSError, ValueError, RuntimeError) as exc:
            if not rebuild:
                raise
            log.error("memory index rebuild failed; the old index keeps serving: %s", exc)
            await self._call(store.drop, target)
            return IndexReport(rebuilt=False, seconds=time.monotonic() - started, errors=(f"rebuild failed: {exc}",))
        finally:
            self.rebuilding = False
            self.rebuild_identity = None
            self.pending = 0
        return IndexReport(**{**report.as_dict(), "errors": report.errors, "seconds": time.monotonic() - started})

    async def _pass(
        self,
        agents: Sequence[str],
        target: Any,
        known: dict[FileKey, FileState],
        reuse: list[Any],
        rebuild: bool,
        progress: Progress | None,
    ) -> IndexReport:
        store = self.store
        changes: list[FileChange] = []
        removed: list[FileKey] = []
        errors: list[str] = []
        scanned = 0
        for agent in agents:
            scan = await self._call(self._scan, agent, known, rebuild)
            scanned += scan.scanned
            changes += scan.changes
            removed += scan.removed
            errors += scan.errors
        self.pending = len(changes) + len(removed)
        total = sum(len(c.chunks) for c in changes)
        done = embedded = reused = deleted = 0
        if progress:
            progress(0, total)
        deleted = sum(known[k].chunks for k in removed if k in known)
        if removed:
            await self._call(self._replace, target, removed, [])
            for key in removed:
                known.pop(key, None)
                self._signatures.pop(key, None)
        group: list[FileChange] = []
        for i, change in enumerate(changes):
            group.append(change)
            if sum(len(c.chunks) for c in group) < WRITE_GROUP and i + 1 < len(changes):
                continue
            base = done

            def embedded_so_far(count: int, base: int = base) -> None:
                if progress:  # between embedding calls too, not only per written group
                    progress(base + count, total)

            e, r = await self._write_group(target, [target, *reuse], group, known, embedded_so_far)
            embedded += e
            reused += r
            done += e + r
            self.pending -= len(group)
            if progress:
                progress(done, total)
            group = []
        if not rebuild:
            await self._call(lambda: store.maintain(target, force=False))
        return IndexReport(
            files_scanned=scanned,
            files_changed=len(changes),
            files_removed=len(removed),
            chunks_embedded=embedded,
            chunks_reused=reused,
            chunks_deleted=deleted,
            rebuilt=rebuild,
            errors=tuple(errors),
        )

    def _replace(self, target: Any, remove: Sequence[FileKey], add: Sequence[Any]) -> None:
        """``store.write`` (on the index thread), keeping the deleted rows' vectors first."""
        if remove:
            for h, v in self.store.vectors_of_files(target, remove).items():
                self._dropped[h] = v
                self._dropped.move_to_end(h)
            while len(self._dropped) > DROPPED_VECTORS:
                self._dropped.popitem(last=False)
        self.store.write(target, remove, add)

    async def _write_group(
        self,
        target: Any,
        cache_tables: list[Any],
        group: list[FileChange],
        known: dict[FileKey, FileState],
        on_embedded: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        store = self.store
        hashes = [c.content_hash for change in group for c in change.chunks]
        cached = await self._call(store.vectors_for, cache_tables, hashes)
        missing: dict[str, str] = {}
        for change in group:
            for c in change.chunks:
                if c.content_hash not in cached and (dropped := self._dropped.get(c.content_hash)) is not None:
                    cached[c.content_hash] = dropped
                elif c.content_hash not in cached:
                    missing.setdefault(c.content_hash, c.embed_text)
        # by length, as model.encode does over a whole corpus: batches of like lengths pad least
        order = sorted(missing, key=lambda h: len(missing[h]))
        for i in range(0, len(order), EMBED_BATCH):
            part = order[i : i + EMBED_BATCH]
            vectors = await self.embedder.embed([missing[h] for h in part])
            self.embedded_total += len(part)
            for h, v in zip(part, vectors, strict=True):
                cached[h] = v
            if on_embedded is not None and i + len(part) < len(order):
                on_embedded(i + len(part))
        dims = self.identity().dimensions
        tables = []
        for change in group:
            vecs = (
                np.stack([cached[c.content_hash] for c in change.chunks])
                if change.chunks
                else np.zeros((0, dims), np.float32)
            )
            tables.append(rows_table(change.key[0], change.file_hash, change.chunks, vecs, dims))
        await self._call(self._replace, target, [c.key for c in group if c.key in known], tables)
        for change in group:
            known[change.key] = FileState(change.file_hash, len(change.chunks))
            self._signatures[change.key] = change.signature
        chunks = sum(len(c.chunks) for c in group)
        return len(order), chunks - len(order)
