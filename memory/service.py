"""MemoryService: the one object the gateway, the CLI and the scheduler use (see ``memory``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

from config.clock import Clock, iso
from config.errors import BadRequest, NeotaskError
from config.settings import MemorySettings
from memory import scopes, sources
from memory.candidates import Candidate, PoolQuery, read_candidates
from memory.dates import spell_dates
from memory.embedders import Embedder
from memory.embedders.choice import build_embedder
from memory.files import MemoryFiles
from memory.fusion import FusionParams, fuse
from memory.indexer import Indexer, Progress
from memory.loading import ModelLoader
from memory.progress import PassProgress
from memory.query_embedding import PreviousEmbedder, QueryVectors, needs_previous, query_embedder
from memory.records import AppendResult, IndexReport, MemoryFile, SearchHit
from memory.store import ChunkStore
from memory.table import IndexIdentity
from memory.watcher import sweep, watch

log = logging.getLogger("neotask.memory")
T = TypeVar("T")


class MemoryService:
    """Long-term memory of every agent: Markdown files indexed in LanceDB, hybrid search.

    ``workspaces`` maps agent id → workspace folder (``MEMORY.md``, ``memory/**/*.md``).
    ``uri`` is the LanceDB folder (``memory.uri``). ``embedder`` defaults to the one
    ``settings.embedding`` describes, built with ``env`` (the caller's environment: the API key
    and the offline flag, see :func:`memory.embedders.choice.build_embedder`; None: an empty one); an
    embedder passed in is not closed by :meth:`close`.

    ``background`` false (a short-lived CLI command): no indexing, watching or sweeping; the index
    is used as it is, and the model loads only when a search needs a query vector.
    """

    def __init__(
        self,
        settings: MemorySettings,
        workspaces: Mapping[str, Path],
        uri: Path,
        *,
        clock: Clock,
        embedder: Embedder | None = None,
        env: Mapping[str, str] | None = None,
        background: bool = True,
    ) -> None:
        self.settings = settings
        self._background = background
        self._env = dict(env or {})
        self._workspaces = {agent: Path(p) for agent, p in workspaces.items()}
        self._files = MemoryFiles(settings, self._workspaces, self._notify)
        self._uri = Path(uri)
        self._clock = clock
        self._own_embedder = embedder is None
        self._embedder_arg = embedder
        self._embedder: Embedder | None = None
        self._embedder_ready = False
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-index")
        # LanceDB's import (2.4 s of CPU) runs on a daemon thread of its own, as a model load does:
        # a shutdown right after the start waits for the index thread, never for that import.
        self._lancedb = ModelLoader(_import_lancedb, name="memory-lancedb-import")
        # Searches read on their own threads: the full-text and the vector query of one search run
        # side by side, and neither waits behind an indexing write (LanceDB reads are snapshot reads).
        self._reads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="memory-read")
        self._query_vectors = QueryVectors()
        self._store: ChunkStore | None = None
        self._indexer: Indexer | None = None
        self._run_lock = asyncio.Lock()
        self._embedder_lock = asyncio.Lock()
        self._index_lock = asyncio.Lock()
        self._queued: set[str] = set()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._writer = asyncio.Event()  # this process writes the index (``set_writer``)
        self._writer.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = False
        self._last_run: dict[str, Any] | None = None
        self._progress: PassProgress | None = None  # the indexing pass in flight
        self._last_error: str | None = None
        # the embedder the active index was built with, while it is rebuilt for another (it answers meanwhile)
        self._previous = PreviousEmbedder(settings, self._env)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Watch in the background (not awaited); the index (LanceDB) is opened by the first thing
        that needs it, and the model loaded by the first thing that embeds: a home with no memory
        files and no index loads neither (each costs seconds of CPU)."""
        self._embedder = self._embedder_arg or build_embedder(self.settings.embedding, self._env)
        if not self._background:
            if await asyncio.to_thread(self._index_exists):
                await self._ensure_index()
            self._ready = True  # the index as it is: searched as it stands, brought level by the daemon
            return
        self._tasks = [asyncio.create_task(self._worker(), name="memory-indexer")]
        extra = {a: [self._extra_root(ws, p) for p in self.settings.extra_paths] for a, ws in self._workspaces.items()}
        watch_settings = self.settings.watch
        self._tasks.append(
            asyncio.create_task(
                watch(self._workspaces, extra, watch_settings, self._notify, self._stop), name="memory-watch"
            )
        )
        self._tasks.append(
            asyncio.create_task(
                sweep(self._workspaces, watch_settings.poll_seconds, self._notify, self._stop), name="memory-sweep"
            )
        )
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._last_error = f"{task.get_name()} stopped: {exc!r}"
            log.error("memory: %s stopped", task.get_name(), exc_info=exc)

    @staticmethod
    def _extra_root(workspace: Path, extra: str) -> Path:
        p = Path(extra).expanduser()
        return p if p.is_absolute() else workspace / p

    async def close(self) -> None:
        """Stop watching and indexing, wait for the index thread, release the model."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._db.shutdown(wait=True))
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._reads.shutdown(wait=True))
        if self._own_embedder and self._embedder is not None:
            await self._embedder.close()
        await self._previous.release()

    @property
    def ready(self) -> bool:
        """True once the initial index pass has finished."""
        return self._ready

    @property
    def partial(self) -> bool:
        """True while a search may miss what the files hold: before the first pass has finished,
        and while a pass has chunks left to embed (a rebuild, or new and changed files)."""
        progress = self._progress
        return not self._ready or (progress is not None and progress.done < progress.total)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (blocking) on the index's write thread: no LanceDB write happens meanwhile
        (a backup copies the tables there)."""
        return await self._call(fn)

    def set_writer(self, enabled: bool) -> None:
        """Whether this process indexes (LanceDB has one writer): with several gateway processes
        only the leader does; the others search the index as it is, and changes noticed meanwhile
        are indexed once this process writes again."""
        if enabled:
            self._writer.set()
        else:
            self._writer.clear()

    def _notify(self, agents: set[str]) -> None:
        self._queued |= agents & set(self._workspaces)
        self._wake.set()

    async def _ensure_index(self) -> ChunkStore:
        """The index, opened (LanceDB imported, the active table and its mirror loaded) on first use."""
        async with self._index_lock:
            if self._store is None:
                assert self._embedder is not None, "MemoryService.start() was not awaited"
                await self._lancedb.load()
                store = await self._call(ChunkStore, self._uri)
                indexer = Indexer(self.settings, self._workspaces, store, self._embedder, self._db)
                await indexer.load_known()
                self._store, self._indexer = store, indexer
            return self._store

    def _index_exists(self) -> bool:
        """Whether an index was ever written at ``memory.uri`` (nothing to open otherwise)."""
        try:
            return any(self._uri.iterdir())
        except OSError:
            return False

    async def _ensure_embedder(self) -> Embedder:
        assert self._embedder is not None, "MemoryService.start() was not awaited"
        async with self._embedder_lock:
            if not self._embedder_ready:
                await self._embedder.start()
                self._embedder_ready = True
        return self._embedder

    def _has_sources(self) -> bool:
        """Whether there is anything to index or to clear: no files and no index need neither
        LanceDB nor a model, so a gateway without memory files never loads them."""
        if self._indexer is not None and self._indexer.known:
            return True
        if self._indexer is None and self._index_exists():
            return True  # an index from before: opened to learn what it holds (and clear what went)
        return any(sources.discover(ws, self.settings.extra_paths) for ws in self._workspaces.values())

    async def _worker(self) -> None:
        if not self._writer.is_set():
            self._ready = True  # not the writer: the index as it is, searched as it stands
            await self._writer.wait()
        try:
            if await self._call(self._has_sources):
                await self._ensure_index()
                await self._ensure_embedder()
                await self.reindex()
            self._ready = True
        except (NeotaskError, OSError, ValueError, RuntimeError) as exc:
            self._last_error = str(exc)
            log.error("memory: initial index failed (the sweep retries): %s", exc)
        while not self._stop.is_set():
            await self._wake.wait()
            await self._writer.wait()
            self._wake.clear()
            agents, self._queued = sorted(self._queued), set()
            if not agents or not await self._call(self._has_sources):
                continue
            try:
                await self._ensure_embedder()
                await self._reindex(agents, force=False, progress=None)
                self._ready = True
            except (NeotaskError, OSError, ValueError, RuntimeError) as exc:
                self._last_error = str(exc)
                log.error("memory: indexing %s failed: %s", ", ".join(agents), exc)

    # --- indexing ----------------------------------------------------------------------------

    async def reindex(
        self, agent: str | None = None, *, force: bool = False, progress: Progress | None = None
    ) -> IndexReport:
        """Bring the index level with the files now (of one agent, or all); ``force`` re-embeds
        everything into a new table that replaces the old one. ``progress(done, total)`` is
        called with embedded-chunk counts."""
        agents = [self._agent(agent)] if agent is not None else sorted(self._workspaces)
        await self._ensure_index()
        await self._ensure_embedder()
        return await self._reindex(agents, force=force, progress=progress)

    async def _reindex(self, agents: list[str], *, force: bool, progress: Progress | None) -> IndexReport:
        await self._ensure_index()
        assert self._indexer is not None
        async with self._run_lock:
            self._progress = tracker = PassProgress()
            # a rebuild for another embedder: the old index keeps answering with its own model's
            # query vectors, loaded beside the rebuild (not before it: the rebuild does not wait)
            previous = asyncio.create_task(self._ensure_previous()) if self._needs_previous() else None

            def both(done: int, total: int) -> None:
                tracker.update(done, total)
                if progress:
                    progress(done, total)

            try:
                report = await self._indexer.run(agents, force=force, progress=both)
            finally:
                self._progress = None
                if previous is not None:
                    await previous
                if not self._needs_previous():  # the new index replaced the old: its model goes
                    await self._previous.release()
        self._last_run = {**report.as_dict(), "finished_at": iso(self._clock())}
        self._last_error = report.errors[-1] if report.errors else None
        return report

    def status(self) -> dict[str, Any]:
        """Index state: ready, files, chunks, pending, identity, last run, and the pass in flight's
        progress (chunks embedded of those it must embed, rate, seconds left; None between
        passes) (JSON-ready)."""
        indexer, store = self._indexer, self._store
        known = indexer.known if indexer else {}
        per_agent: dict[str, dict[str, int]] = {a: {"files": 0, "chunks": 0} for a in self._workspaces}
        for (agent, _), state in known.items():
            if agent in per_agent:
                per_agent[agent]["files"] += 1
                per_agent[agent]["chunks"] += state.chunks
        identity = store.active_identity.as_dict() if store and store.active_identity else None
        return {
            "ready": self._ready,
            "files": sum(a["files"] for a in per_agent.values()),
            "chunks": sum(a["chunks"] for a in per_agent.values()),
            "pending": indexer.pending if indexer else 0,
            "rebuilding": bool(indexer and indexer.rebuilding),
            "embedded_total": indexer.embedded_total if indexer else 0,
            "progress": self._progress.as_dict() if self._progress else None,
            "identity": identity,
            "table": store.active.name if store and store.active is not None else None,
            "serving": self.serving(),
            "agents": per_agent,
            "last_run": self._last_run,
            "last_error": self._last_error,
        }

    # --- search ------------------------------------------------------------------------------

    async def search(
        self,
        agent: str,
        query: str,
        *,
        k: int | None = None,
        include_memory_md: bool = True,
        scope: scopes.Scope = scopes.EVERY,
    ) -> list[SearchHit]:
        """Hybrid search of one agent's memory (of the files of ``scope``: ``memory.scopes``), best
        first; [] when nothing clears the thresholds."""
        agent, query, k = self.check_search(agent, query, k)
        scopes.check(scope)
        if self._store is None and self._index_exists():
            await self._ensure_index()
        if not self._background and self._store is not None and self._store.active_identity is not None:
            await self._ensure_embedder()  # no worker loads it: this search is what needs a vector
            if self._needs_previous():  # an index the daemon is rebuilding for this embedder
                await self._ensure_previous()
        pool, use_vector = await self._candidates(agent, query, include_memory_md, True, scope)
        params = FusionParams.of(self.settings.search, use_vector=use_vector)
        return fuse(pool, params, today=self._clock().date(), k=k, query=spell_dates(query))

    def check_search(self, agent: str, query: str, k: int | None = None) -> tuple[str, str, int]:
        """A search's agent, query (stripped) and ``k`` (the setting's when None), validated
        before anything is read or written; BadRequest (UnknownAgent) naming what to fix."""
        agent = self._agent(agent)
        s = self.settings.search
        k = s.top_k if k is None else k
        if not 1 <= k <= s.candidates:
            raise BadRequest(f"k must be between 1 and {s.candidates} (memory.search.candidates)")
        query = query.strip()
        if not query:
            raise BadRequest("q must be a non-empty search query")
        return agent, query, k

    def _configured(self) -> Embedder | None:
        """The configured embedder once loaded (None before)."""
        return self._embedder if self._embedder_ready else None

    def _query_embedder(self, active: IndexIdentity | None) -> Embedder | None:
        """What embeds a query for the index of identity ``active`` (``query_embedder``)."""
        return query_embedder(active.embedder if active else None, self._configured(), self._previous)

    def _needs_previous(self) -> bool:
        """Whether the active index needs the embedder it was built with (``needs_previous``)."""
        store = self._store
        active = store.active_identity if store is not None else None
        return needs_previous(active.embedder if active else None, self._configured())

    async def _ensure_previous(self) -> None:
        """Load the embedder the active index was built with (once per index: ``PreviousEmbedder``)."""
        store = self._store
        if store is not None and store.active_identity is not None:
            await self._previous.ensure(store.active_identity.embedder)

    def serving(self) -> dict[str, Any] | None:
        """What answers a search now (JSON-ready; None before an index exists): the active index's
        embedder, whether a query gets a vector for it (``vectors``; false: its text side answers
        alone, ``note`` says why), and, while a rebuild for another embedder runs, that embedder
        (``replacing``: the active index keeps answering until the new one is complete)."""
        store = self._store
        if store is None:
            return None
        _, active = store.serving()
        if active is None:
            return None
        indexer = self._indexer
        target = indexer.rebuild_identity if indexer is not None else None
        vectors = self._query_embedder(active) is not None
        note = None
        if not vectors:
            note = self._previous.note or "the embedding model is not loaded yet"
        return {
            "provider": active.provider,
            "model": active.model,
            "vectors": vectors,
            "replacing": (
                {"provider": target.provider, "model": target.model}
                if target is not None and target.embedder != active.embedder
                else None
            ),
            "note": note,
        }

    async def candidates(
        self,
        agent: str,
        query: str,
        *,
        include_memory_md: bool = True,
        with_share: bool = True,
        scope: scopes.Scope = scopes.EVERY,
    ) -> list[Candidate]:
        """Both candidate pools of a query, merged, before fusion and abstention (for evaluation:
        ``memory.fusion.fuse`` turns them into hits under any weights and thresholds).
        ``with_share=False`` leaves each candidate's term share at 0 (it costs stemming). A date in
        digits in the query is searched as memory spells it (``memory.dates``)."""
        pool, _ = await self._candidates(agent, query, include_memory_md, with_share, scope)
        return pool

    async def _candidates(
        self, agent: str, query: str, include_memory_md: bool, with_share: bool, scope: scopes.Scope
    ) -> tuple[list[Candidate], bool]:
        """``candidates``, and whether the query's cosines may rank and abstain: false without a
        query vector, or when the query is CJK and the embedder English-only (its cosines then
        say nothing: unrelated Japanese scores 0.5-0.7)."""
        agent = self._agent(agent)
        query = spell_dates(query)
        if self._store is None and self._index_exists():
            await self._ensure_index()
        store = self._store
        if store is None:
            return [], False  # no index was ever written: nothing to find
        table, active = store.serving()  # read together: a swap may run meanwhile
        if table is None:
            return [], False
        n = self.settings.search.candidates
        pools = PoolQuery(store, table, query, agent, n, include_memory_md, with_share, scope)
        return await read_candidates(
            self._reads,
            pools,
            embedder=self._query_embedder(active),
            configured=self._embedder,
            vectors=self._query_vectors,
        )

    # --- files (memory/files.py) ---------------------------------------------------------------

    def _agent(self, agent: str) -> str:
        return self._files.agent(agent)

    def list_files(self, agent: str) -> list[MemoryFile]:
        """The agent's memory files (path relative to the workspace, size, mtime), by path."""
        return self._files.list_files(agent)

    def read_file(self, agent: str, path: str, scope: scopes.Scope = scopes.EVERY) -> str:
        """A memory file's text (``MemoryFiles.read_file``)."""
        return self._files.read_file(agent, path, scope)

    async def get(
        self,
        agent: str,
        path: str,
        start_line: int | None = None,
        end_line: int | None = None,
        *,
        include_memory_md: bool = True,
        scope: scopes.Scope = scopes.EVERY,
    ) -> str:
        """The ``memory_get`` tool: lines ``start_line``..``end_line`` (1-based, inclusive) of a file.
        With ``include_memory_md=False`` (the caller may not show it) MEMORY.md is NotFound, and
        so is a file outside ``scope``."""
        return await self._files.lines(agent, path, start_line, end_line, include_memory_md, scope)

    async def append_daily(self, agent: str, text: str, *, today: date, scope: scopes.Scope = None) -> AppendResult:
        """The ``memory_append`` tool (``MemoryFiles.append_daily``); then the file is indexed."""
        return await self._files.append_daily(agent, text, today=today, scope=scope)


def _import_lancedb() -> None:
    import lancedb  # noqa: F401  (loaded for ChunkStore, which imports it where it connects)
