"""MemoryService: the one object the gateway, the CLI and the scheduler use (see ``memory``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from config.clock import Clock, iso
from config.errors import BadRequest, MemoryFileNotFound, NeotaskError, UnknownAgent
from config.settings import MemorySettings
from memory import scopes, sources
from memory.candidates import Candidate, merge_pools
from memory.dates import spell_dates
from memory.embedders import (
    Embedder,
    EmbedderIdentity,
    cosine_floor_of,
    is_multilingual,
    query_scale_of,
    query_vector,
)
from memory.embedders.choice import build_embedder, embedder_of
from memory.embedders.routed import RoutedEmbedder
from memory.fusion import FusionParams, fuse
from memory.indexer import Indexer, Progress
from memory.loading import ModelLoader
from memory.progress import PassProgress
from memory.records import AppendResult, IndexReport, MemoryFile, SearchHit
from memory.speakers import named_speakers, spoken_by
from memory.store import ChunkStore
from memory.table import IndexIdentity
from memory.terms import is_cjk_query, query_terms, text_share
from memory.watcher import sweep, watch

log = logging.getLogger("neotask.memory")
T = TypeVar("T")
# query vectors kept by (embedder identity, query): an agent asks its memory the same question again
# (each turn's recall, a retried tool call), and a query's embedding is most of a search's CPU
QUERY_VECTORS_KEPT = 256


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
        self._query_vectors: OrderedDict[tuple[EmbedderIdentity, str], np.ndarray[Any, Any]] = OrderedDict()
        self._store: ChunkStore | None = None
        self._indexer: Indexer | None = None
        self._run_lock = asyncio.Lock()
        self._embedder_lock = asyncio.Lock()
        self._index_lock = asyncio.Lock()
        self._append_locks: dict[str, asyncio.Lock] = {}
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
        # While the index is rebuilt for another embedder, the old index keeps answering, its query
        # vectors made by the embedder it was built with (``_previous``, loaded for the rebuild and
        # closed once the new index replaces the old); ``_previous_note`` says why the old index
        # answers by its text side alone when that embedder cannot be loaded.
        self._previous: Embedder | None = None
        self._previous_for: EmbedderIdentity | None = None
        self._previous_note: str | None = None
        self._previous_lock = asyncio.Lock()

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
        await self._release_previous()

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
                    await self._release_previous()
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
        s = self.settings.search
        if self._store is None and self._index_exists():
            await self._ensure_index()
        if not self._background and self._store is not None and self._store.active_identity is not None:
            await self._ensure_embedder()  # no worker loads it: this search is what needs a vector
            if self._needs_previous():  # an index the daemon is rebuilding for this embedder
                await self._ensure_previous()
        pool, use_vector = await self._candidates(agent, query, include_memory_md, True, scope)
        params = FusionParams(
            s.vector_weight,
            s.text_weight,
            s.min_score,
            s.min_text_score,
            s.recency_half_life_days,
            method=s.fusion,
            text_saturation=s.text_saturation,
            use_vector=use_vector,
            neighbour_weight=s.neighbour_weight,
            mmr=s.mmr,
            speaker_weight=s.speaker_weight,
            min_topic_cosine=s.min_topic_cosine,
            min_topic_score=s.min_topic_score,
        )
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

    def _query_embedder(self, active: IndexIdentity | None) -> Embedder | None:
        """What embeds a query for the index of identity ``active``: the configured embedder when
        it made that index; while an index of another routed choice is active (being rebuilt for
        this one), the embedder of that choice over the same loaded models
        (:meth:`RoutedEmbedder.view_for`); else the embedder that index was built with, when it
        is loaded (``_previous``: the old index keeps its vector side until the new one replaces
        it); else None (the text side then answers alone)."""
        if active is None:
            return None
        embedder = self._embedder if self._embedder_ready else None
        if embedder is not None:
            if active.embedder == embedder.identity:
                return embedder
            if isinstance(embedder, RoutedEmbedder) and (view := embedder.view_for(active.embedder)) is not None:
                return view
        previous = self._previous
        return previous if previous is not None and previous.identity == active.embedder else None

    def _needs_previous(self) -> bool:
        """Whether the active index was built by an embedder other than the configured one (and
        the configured one's models cannot embed its queries)."""
        store, embedder = self._store, self._embedder if self._embedder_ready else None
        if store is None or embedder is None or store.active_identity is None:
            return False
        active = store.active_identity
        if active.embedder == embedder.identity:
            return False
        return not (isinstance(embedder, RoutedEmbedder) and embedder.view_for(active.embedder) is not None)

    async def _ensure_previous(self) -> None:
        """Load the embedder the active index was built with (once per index; see ``_previous``)."""
        store = self._store
        if store is None or store.active_identity is None:
            return
        wanted = store.active_identity.embedder
        async with self._previous_lock:
            if self._previous_for == wanted:
                return  # loaded, or tried and failed
            await self._release_previous()
            self._previous_for = wanted
            embedder: Embedder | None = None
            try:
                embedder = embedder_of(wanted, self.settings.embedding, self._env)
                await embedder.start()
                if embedder.identity != wanted:
                    raise ValueError(
                        f"it now makes {embedder.identity.model} ({embedder.identity.dimensions} dimensions)"
                    )
            except Exception as exc:  # any failure leaves the text side answering, as before
                if embedder is not None:
                    with contextlib.suppress(Exception):
                        await embedder.close()
                self._previous_note = (
                    f"the index's embedder ({wanted.provider} {wanted.model}) cannot be loaded ({exc}): it is "
                    "searched by its text side until the rebuild for the configured embedder replaces it"
                )
                log.warning("memory: %s", self._previous_note)
                return
            self._previous = embedder
            log.info("memory: the index of %s answers with its own query vectors until it is replaced", wanted.provider)

    async def _release_previous(self) -> None:
        previous, self._previous, self._previous_for, self._previous_note = self._previous, None, None, None
        if previous is not None:
            await previous.close()

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
            note = self._previous_note or "the embedding model is not loaded yet"
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
        loop = asyncio.get_running_loop()
        # the full-text query (and the term shares of what it found) runs while the query is
        # embedded; then one job takes the vector pool and merges it with the text side (one
        # hand-over between threads fewer than a job each: under load each costs a wake-up)
        text_job = self._reads.submit(_text_side, store, table, query, agent, n, include_memory_md, with_share, scope)
        vector = None
        embedder = self._query_embedder(active)
        scale = query_scale_of(embedder, query) if embedder is not None else 1.0
        floor = cosine_floor_of(embedder, query) if embedder is not None else 0.0
        try:
            if embedder is not None:
                vector = await self._query_vector(embedder, query)
        except RuntimeError:
            if embedder is self._embedder:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(text_job)
                raise
            vector = None  # the previous embedder closed as the new index replaced the old: text side
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(text_job)
            raise
        knows = vector is not None and embedder is not None
        knows = knows and (not is_cjk_query(query) or is_multilingual(embedder.identity))  # type: ignore[union-attr]

        def vector_side_and_merge() -> list[Candidate]:
            # (the text job was queued first, so it runs or has run: waiting here cannot deadlock
            # the two read threads)
            vec_rows = []
            if vector is not None:
                vec_rows = store.vector_pool(table, vector, agent, n, include_memory_md, scope)
            return _merge(query, vector, vec_rows, text_job.result(), n, with_share, scale, floor)

        return await loop.run_in_executor(self._reads, vector_side_and_merge), knows

    async def _query_vector(self, embedder: Embedder, query: str) -> np.ndarray[Any, Any]:
        """``query``'s vector from ``embedder``, the last ``QUERY_VECTORS_KEPT`` kept (an
        identity names the model that makes the vector, so one identity's vector of a text is
        always the same; read-only: every search shares it)."""
        key = (embedder.identity, query)
        if (found := self._query_vectors.get(key)) is not None:
            self._query_vectors.move_to_end(key)
            return found
        vector = await query_vector(embedder, query)
        vector.setflags(write=False)
        self._query_vectors[key] = vector
        while len(self._query_vectors) > QUERY_VECTORS_KEPT:
            self._query_vectors.popitem(last=False)
        return vector

    # --- files -------------------------------------------------------------------------------

    def _agent(self, agent: str) -> str:
        if agent not in self._workspaces:
            raise UnknownAgent(f"agent {agent!r} is not configured")
        return agent

    def list_files(self, agent: str) -> list[MemoryFile]:
        """The agent's memory files (path relative to the workspace, size, mtime), by path."""
        return sources.list_files(self._workspaces[self._agent(agent)], self.settings.extra_paths)

    def read_file(self, agent: str, path: str, scope: scopes.Scope = scopes.EVERY) -> str:
        """A memory file's text; BadRequest outside the memory sources, NotFound if missing or
        not in ``scope``."""
        workspace = self._workspaces[self._agent(agent)]
        f = sources.resolve(workspace, path, self.settings.extra_paths)
        if not scopes.contains(scope, f.rel):
            raise MemoryFileNotFound(f"memory file {path!r} is not available here")
        try:
            return sources.read_text_inside(f.abs, sources.allowed_roots(workspace, self.settings.extra_paths))
        except FileNotFoundError as exc:
            raise MemoryFileNotFound(f"memory file {path!r} does not exist") from exc

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
        scopes.check(scope)
        if not include_memory_md and path == sources.MEMORY_MD:
            raise MemoryFileNotFound("MEMORY.md is not available here")
        text = await asyncio.to_thread(self.read_file, agent, path, scope)
        return sources.line_slice(text, start_line, end_line)

    async def append_daily(self, agent: str, text: str, *, today: date, scope: scopes.Scope = None) -> AppendResult:
        """The ``memory_append`` tool: add the lines of ``text`` to the daily log of ``today`` (in the
        agent's zone, chosen by the caller) in ``scope`` (``memory/<today>.md`` for the shared
        scope, ``memory/scopes/<scope>/<today>.md`` for a named one), skipping lines already
        there; then index it."""
        workspace = self._workspaces[self._agent(agent)]
        if scope == scopes.EVERY:
            raise BadRequest("a daily log is written in one scope: the shared one (None) or a named one")
        scopes.check(scope)
        if not text.strip():
            raise BadRequest("text must hold at least one non-blank line")
        lock = self._append_locks.setdefault(agent, asyncio.Lock())
        async with lock:
            result = await asyncio.to_thread(sources.append_daily, workspace, text, today, scope)
        if result.appended:
            self._notify({agent})
        return result


TextSide = tuple[list[dict[str, Any]], np.ndarray[Any, Any], list[float], frozenset[str]]


def _text_side(
    store: ChunkStore,
    table: Any,
    query: str,
    agent: str,
    n: int,
    include_memory_md: bool,
    with_share: bool,
    scope: scopes.Scope,
) -> TextSide:
    """The full-text pool: its rows, their vectors, the share of the query's terms each holds, and
    the query's words that name a speaker of the chat (``named_speakers``: a turn by every person
    the query names is in this pool, since the turn's own text holds the name)."""
    rows, vectors = store.text_pool(table, query, agent, n, include_memory_md, scope)
    terms = query_terms(query) if with_share else ((), ())
    names = named_speakers(terms, (r["text"] for r in rows)) if with_share else frozenset()
    shares = [text_share(terms, r["content"], r["text"], names) if with_share else 0.0 for r in rows]
    return rows, vectors, shares, names


def _merge(
    query: str,
    vector: np.ndarray[Any, Any] | None,
    vec_rows: list[dict[str, Any]],
    text_side: TextSide,
    n: int,
    with_share: bool,
    scale: float = 1.0,
    floor: float = 0.0,
) -> list[Candidate]:
    """The two pools' rows as candidates, each with its cosine, BM25 score and term share.
    ``scale``: the embedder's ``query_scale_of(query)`` (a routed chunk vector holds several models'
    parts, so a query's dot product is its models' cosine divided by it). ``floor``: the embedder's ``cosine_floor``
    (E5's cosines sit in [0.7, 1]: mapped from there to [0, 1], below it 0)."""
    text_rows, text_vectors, text_shares, names = text_side
    terms = query_terms(query) if with_share else ((), ())
    in_text = {r["chunk_id"] for r in text_rows}
    full_pool = len(text_rows) >= n  # the text pool may have cut off matching chunks

    def cand(row: dict[str, Any], cosine: float, share: float | None, bm25: float = 0.0) -> Candidate:
        """``share`` None: computed here when needed."""
        needed = share is None and with_share and not full_pool and row["chunk_id"] not in in_text
        return Candidate(
            chunk_id=row["chunk_id"],
            path=row["path"],
            start_line=int(row["start_line"]),
            end_line=int(row["end_line"]),
            heading=row["heading"],
            text=row["text"],  # the chunk's own lines: its context is indexed, not shown
            cosine=min(1.0, max(0.0, (cosine * scale - floor) / (1.0 - floor))),
            share=text_share(terms, row["content"], row["text"], names) if needed else share or 0.0,
            bm25=bm25,
            named_speaker=spoken_by(names, row["text"]),
        )

    text_cos = text_vectors @ vector if vector is not None and len(text_rows) else np.zeros(len(text_rows))
    return merge_pools(
        # a chunk the full-text index does not match holds none of the query's terms; one in the
        # text pool gets its share there
        [(cand(r, 1.0 - r["_distance"], None), -float(r["_distance"])) for r in vec_rows],
        [
            (cand(r, float(c), share, float(r["_score"])), float(r["_score"]))
            for r, c, share in zip(text_rows, text_cos, text_shares, strict=True)
        ],
    )


def _import_lancedb() -> None:
    import lancedb  # noqa: F401  (loaded for ChunkStore, which imports it where it connects)
