"""REALTALK through Neotask's real search path, against two plain BM25 baselines.

``python -m bench.memory_eval --realtalk DIR [--cache DIR] [--embedder minilm|use]`` (``DIR`` is
the ``data/`` folder of a clone of github.com/danny911kr/REALTALK; see
``bench/retrieval/realtalk.py``). One ``MemoryService`` holds the ten chats as ten agents in one
LanceDB table; every question goes through ``MemoryService.search`` (what ``GET
/v1/memory/search`` calls) with the shipped settings and the abstention thresholds at 0, and its
two candidate pools are kept so other fusions can be scored offline. Baselines: ``bm25s``
(Snowball stemmer, English stop words), per chat, one document per turn (``Speaker: text``) and
one per indexed chunk (its ``content``: heading, context and text, what the full-text side sees).
"""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.retrieval.conversations import Question
from bench.retrieval.realtalk import Chat, unanswerable, write_all
from config.settings import MemorySettings
from memory import MemoryService
from memory.candidates import Candidate
from memory.embedders import Embedder
from memory.store import POINTER

KS = (5, 10, 25)
Ranked = list[tuple[str, int, int]]  # (path, start line, end line), best first
KINDS = ("all", "multi-hop", "temporal", "inference")


@dataclass
class Asked:
    agent: str
    question: Question
    shipped: Ranked  # MemoryService.search, abstention off
    pool: list[Candidate]
    bm25_turns: Ranked
    bm25_indexed: Ranked
    quiet: int = -1  # results with the shipped thresholds (abstention on), top 10


@dataclass
class RealtalkRun:
    asked: list[Asked]
    chunks: int
    index_seconds: float
    embedded: int
    search_ms: list[float]
    refused: dict[str, tuple[int, int]] = field(default_factory=dict)  # agent -> (no result, asked)
    unanswerable_pools: list[tuple[str, list[Candidate]]] = field(default_factory=list)  # (agent, pool)
    unanswerable_questions: list[str] = field(default_factory=list)  # the text of each pool's question


def no_abstention(settings: MemorySettings) -> MemorySettings:
    search = settings.search.model_copy(update={"min_score": 0.0, "min_text_score": 0.0, "min_topic_cosine": 0.0})
    return settings.model_copy(update={"search": search})


def _bm25(docs: list[str], questions: Sequence[str], k: int) -> list[list[int]]:
    import bm25s
    import snowballstemmer

    stemmer = snowballstemmer.stemmer("english")
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    q = bm25s.tokenize(list(questions), stopwords="en", stemmer=stemmer, show_progress=False)
    found, _ = retriever.retrieve(q, k=min(k, len(docs)), show_progress=False, n_threads=1)
    return [[int(i) for i in row] for row in found]


def _chunk_rows(uri: Path) -> list[dict[str, Any]]:
    import lancedb

    pointer = json.loads((uri / POINTER).read_text("utf-8"))
    table = lancedb.connect(str(uri)).open_table(pointer["table"])
    cols = ["agent", "path", "start_line", "end_line", "content"]
    return table.search().select(cols).limit(table.count_rows()).to_list()  # type: ignore[no-any-return]


def baselines(chat: Chat, rows: list[dict[str, Any]]) -> tuple[list[Ranked], list[Ranked]]:
    """bm25s per turn and per indexed chunk, for every question of one chat."""
    texts = [q.text for q in chat.questions]
    per_turn = _bm25([t for _, _, t in chat.turns], texts, max(KS))
    mine = [r for r in rows if r["agent"] == chat.agent]
    per_chunk = _bm25([r["content"] for r in mine], texts, max(KS))
    return (
        [[(chat.turns[i][0], chat.turns[i][1], chat.turns[i][1]) for i in order] for order in per_turn],
        [[(mine[i]["path"], mine[i]["start_line"], mine[i]["end_line"]) for i in order] for order in per_chunk],
    )


async def collect(data: Path, cache: Path, embedder: Embedder, settings: MemorySettings) -> RealtalkRun:
    """Index the chats (incrementally: ``cache`` keeps the workspaces and the LanceDB between runs)
    and ask every question."""
    chats = write_all(data, cache / "workspaces")
    service = MemoryService(
        no_abstention(settings),
        {c.agent: ws for c, ws in chats},
        cache / "realtalk.lance",
        clock=lambda: datetime(2024, 3, 1, tzinfo=UTC),
        embedder=embedder,
    )
    quiet = MemoryService(
        settings,
        {c.agent: ws for c, ws in chats},
        cache / "realtalk.lance",
        clock=lambda: datetime(2024, 3, 1, tzinfo=UTC),
        embedder=embedder,
    )
    await service.start()
    asked: list[Asked] = []
    search_ms: list[float] = []
    try:
        started = time.perf_counter()
        report = await service.reindex()
        seconds = time.perf_counter() - started
        rows = await asyncio.to_thread(_chunk_rows, cache / "realtalk.lance")
        await quiet.start()
        for chat, _ in chats:
            per_turn, per_chunk = baselines(chat, rows)
            for q, b1, b2 in zip(chat.questions, per_turn, per_chunk, strict=True):
                t0 = time.perf_counter()
                hits = await service.search(chat.agent, q.text, k=max(KS))
                search_ms.append(1000 * (time.perf_counter() - t0))
                pool = await service.candidates(chat.agent, q.text)
                shown = await quiet.search(chat.agent, q.text, k=10)
                ranked = [(h.path, h.start_line, h.end_line) for h in hits]
                asked.append(Asked(chat.agent, q, ranked, pool, b1, b2, len(shown)))
        refused = {}
        unanswerable_pools = []
        unanswerable_questions = []
        for chat, _ in chats:
            qs = unanswerable(chat.turns, chat.people)
            empty = [not await quiet.search(chat.agent, q.text, k=10) for q in qs]
            refused[chat.agent] = (sum(empty), len(qs))
            unanswerable_pools += [(chat.agent, await service.candidates(chat.agent, q.text)) for q in qs]
            unanswerable_questions += [q.text for q in qs]
    finally:
        await quiet.close()
        await service.close()
    return RealtalkRun(
        asked, len(rows), seconds, report.chunks_embedded, search_ms, refused, unanswerable_pools,
        unanswerable_questions,
    )  # fmt: skip


def ranks_of(q: Question, ranked: Ranked) -> list[int | None]:
    return [
        next((i for i, (p, a, b) in enumerate(ranked, 1) if p == path and a <= line <= b), None)
        for path, line in q.evidence
    ]


def recall(rows: list[list[int | None]]) -> dict[str, float]:
    n = len(rows)
    out: dict[str, float] = {"n": n}
    for k in KS:
        out[f"r@{k}"] = 100 * sum(sum(1 for r in rs if r is not None and r <= k) / len(rs) for rs in rows) / n
    return out


def score(asked: Sequence[Asked], pick: Callable[[Asked], Ranked]) -> dict[str, dict[str, float]]:
    per: dict[str, list[list[int | None]]] = {}
    for a in asked:
        rs = ranks_of(a.question, pick(a))
        per.setdefault("all", []).append(rs)
        per.setdefault(a.question.kind, []).append(rs)
    return {k: recall(v) for k, v in per.items()}


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    kinds = [k for k in KINDS if k in next(iter(results.values()))]
    first = next(iter(results.values()))
    head = f"{'method':<34}" + "".join(f"{k + ' (n=' + str(int(first[k]['n'])) + ')':>22}" for k in kinds)
    lines = [head, f"{'':<34}" + "".join(f"{'@5    @10    @25':>22}" for _ in kinds)]
    for name, r in results.items():
        cells = "".join(f"{r[k]['r@5']:6.1f} {r[k]['r@10']:6.1f} {r[k]['r@25']:6.1f}".rjust(22) for k in kinds)
        lines.append(f"{name:<34}{cells}")
    return "\n".join(lines)


def load_or_collect(
    data: Path, cache: Path, embedder: Embedder, settings: MemorySettings, *, tag: str, reuse: bool
) -> RealtalkRun:
    saved = cache / f"asked.{tag}.pickle"
    if reuse and saved.exists():
        run: RealtalkRun = pickle.loads(saved.read_bytes())
        return run
    run = asyncio.run(collect(data, cache, embedder, settings))
    saved.write_bytes(pickle.dumps(run))
    return run


def report(run: RealtalkRun, extra: dict[str, Callable[[Asked], Ranked]] | None = None) -> dict[str, Any]:
    """Print the REALTALK table; the PASS/FAIL lines of the targets; the figures (JSON-ready)."""
    results = {
        "Neotask search (shipped)": score(run.asked, lambda a: a.shipped),
        **{name: score(run.asked, fn) for name, fn in (extra or {}).items()},
        "BM25 (bm25s), one doc per turn": score(run.asked, lambda a: a.bm25_turns),
        "BM25 (bm25s), indexed text": score(run.asked, lambda a: a.bm25_indexed),
    }
    n_chats = len({a.agent for a in run.asked})
    ms = sorted(run.search_ms)
    print(
        f"\n== REALTALK: {n_chats} chats, {run.chunks} chunks, {len(run.asked)} questions; indexed in "
        f"{run.index_seconds:.1f} s ({run.embedded} embedded); search p50 {ms[len(ms) // 2]:.1f} ms, "
        f"p95 {ms[int(0.95 * (len(ms) - 1))]:.1f} ms"
    )
    print(table(results))
    if run.refused:
        empty, total = (sum(v[i] for v in run.refused.values()) for i in (0, 1))
        kept = sum(1 for a in run.asked if a.quiet > 0) / len(run.asked)
        off = results["Neotask search (shipped)"]["all"]["r@10"]
        on = score(run.asked, lambda a: a.shipped[: a.quiet])["all"]["r@10"]
        print(
            f"abstention (shipped thresholds): {empty} of {total} unanswerable questions get no result; "
            f"answerable questions with a result {100 * kept:.1f} %; R@10 with abstention {on:.1f} (off {off:.1f})"
        )
    shipped = results["Neotask search (shipped)"]["all"]
    bm = [results[m]["all"] for m in results if m.startswith("BM25")]
    stronger = max(b["r@10"] for b in bm)
    gain = shipped["r@10"] - stronger
    above = all(shipped[f"r@{k}"] > b[f"r@{k}"] for b in bm for k in KS)
    print(f"{'PASS' if gain >= 10 else 'FAIL'}  REALTALK: shipped @10 - the stronger BM25 @10 = {gain:+.1f} (>= +10)")
    print(f"{'PASS' if above else 'FAIL'}  REALTALK: shipped above both BM25 baselines at @5/@10/@25")
    return {"results": results, "chunks": run.chunks, "questions": len(run.asked), "pass": gain >= 10 and above}


def with_params(fn: Callable[[list[Candidate]], Ranked]) -> Callable[[Asked], Ranked]:
    return lambda a: fn(a.pool)


__all__ = ["Asked", "RealtalkRun", "load_or_collect", "replace", "report", "score", "table"]
