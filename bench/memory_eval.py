"""Retrieval quality on realistic memory: conversations, notes and Japanese, per question kind.

``python -m bench.memory_eval [--quick] [--sizes 1000,5000,20000] [--big] [--embedder E] [--tune]``
(``--embedder auto``, the default: what ships, ``e5+use`` where E5 runs; ``minilm+e5+use``: the
default before, with ``--minilm-weight`` for its blend; ``minilm+use``: MiniLM for English
queries; ``e5``, ``minilm``, ``use``: one model alone)

Sets: ``conversation-N`` (``bench/retrieval/conversations.py``, N turns = N chunks, 1,000 to
20,000 by default, 50,000 with ``--big``), ``notes`` (the daily logs and notes of
``bench/retrieval/dataset.py``) and ``japanese`` (Japanese chat logs, about 900 turns). Each set is
indexed in a real LanceDB through ``MemoryService`` with the chosen embedder; every question's
two candidate pools (100 per side) are fetched once, then every method is scored offline with the
service's own fusion code (``memory.fusion.fuse``):

- ``vector``: cosine only; ``text``: LanceDB's BM25 only;
- ``rrf``: weighted reciprocal rank fusion; ``score`` (shipped): weighted mean of the cosine and
  the text strength (``memory.fusion.text_strength``: the cube of the share of the query's terms
  held, and BM25 through a Hill curve);
- ``bm25``: an independent baseline, ``bm25s`` (Snowball stemmer, English stop words), twice: over
  the chunks' own text (the turns alone, as a plain BM25 over a transcript sees them) and over the
  indexed text (heading, preceding turn and turn: what Neotask's full-text side searches). The
  hybrid must beat the stronger of the two by 5 points @10 on the conversation sets.

Recall@k of a question is the share of its evidence turns among the first k results (a result
holds a turn when it is the same file and its line range covers the turn); MRR uses the first.
Abstention thresholds are 0 for the ranking tables (only ranking is measured), and the shipped
thresholds are scored separately on the unanswerable questions of each language.
Results go to stdout and ``bench/out/memory_eval.json``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import pickle
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from bench.common import parser
from bench.retrieval import dataset
from bench.retrieval.conversations import Question, build_conversations, build_japanese
from config.settings import EmbeddingSettings, MemorySettings
from memory import MemoryService, SentenceTransformerEmbedder, UniversalSentenceEncoderEmbedder, build_embedder
from memory.candidates import Candidate
from memory.dates import spell_dates
from memory.embedders import E5_FLOOR, E5Embedder, Embedder, is_multilingual, query_vector
from memory.embedders.routed import RoutedEmbedder
from memory.fusion import FusionParams, fuse
from memory.store import POINTER
from memory.terms import is_cjk_query

TODAY = date(2026, 11, 30)
OUT = Path(__file__).resolve().parent / "out" / "memory_eval.json"
KS = (5, 10, 25)
Pools = list[tuple[Question, list[Candidate]]]


@dataclass
class EvalSet:
    name: str
    pools: Pools
    bm25: dict[str, list[tuple[str, int, int]]]  # question text -> ranked (path, start, end)
    chunks: int
    index_seconds: float
    bm25_indexed: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)  # over ``content``


def notes_questions(root: Path, days: int = 60) -> list[Question]:
    out = []
    for q in dataset.build(root, days=days):
        kind = {"same": "single", "japanese": "single"}.get(q.kind, q.kind)
        ev = () if q.path is None or q.line is None else ((q.path, q.line),)
        out.append(Question(kind, q.text, ev, "ja" if q.kind == "japanese" or not q.text.isascii() else "en"))
    return out


def make_embedder(name: str, minilm_weight: float | None = None) -> Embedder:
    """auto: what ships (``memory.embedding`` defaults: minilm+e5+use where E5 runs); minilm+e5+use:
    both English models blended (``minilm_weight``: MiniLM's share, None = the shipped one);
    minilm+use: the default before (MiniLM for English queries); e5+use: E5 for them; e5, use,
    minilm: one model alone."""
    if name == "minilm+e5+use" and minilm_weight is not None:
        english: list[SentenceTransformerEmbedder | E5Embedder] = [SentenceTransformerEmbedder(), E5Embedder()]
        return RoutedEmbedder(english=english, weights=[minilm_weight, 1 - minilm_weight], provider=name)
    if name in ("auto", "minilm+e5+use", "minilm+use", "e5+use"):
        return build_embedder(EmbeddingSettings(provider=name))
    if name == "e5":
        return E5Embedder()
    return UniversalSentenceEncoderEmbedder() if name == "use" else SentenceTransformerEmbedder()


Ranked = dict[str, list[tuple[str, int, int]]]


def _bm25_baseline(uri: Path, questions: Sequence[Question]) -> tuple[Ranked, Ranked, int]:
    """bm25s over the chunks' own text and over their indexed text; the number of chunks."""
    import bm25s
    import lancedb
    import snowballstemmer

    pointer = json.loads((uri / POINTER).read_text("utf-8"))
    table = lancedb.connect(str(uri)).open_table(pointer["table"])
    rows = (
        table.search().select(["path", "start_line", "end_line", "text", "content"]).limit(table.count_rows()).to_list()
    )
    stemmer = snowballstemmer.stemmer("english")
    q_tokens = bm25s.tokenize([q.text for q in questions], stopwords="en", stemmer=stemmer, show_progress=False)
    k = min(25, len(rows))
    ranked: list[Ranked] = []
    for column in ("text", "content"):
        retriever = bm25s.BM25()
        retriever.index(
            bm25s.tokenize([r[column] for r in rows], stopwords="en", stemmer=stemmer, show_progress=False),
            show_progress=False,
        )
        docs, _ = retriever.retrieve(q_tokens, k=k, show_progress=False, n_threads=1)
        ranked.append(
            {
                q.text: [(rows[i]["path"], rows[i]["start_line"], rows[i]["end_line"]) for i in order]
                for q, order in zip(questions, docs, strict=True)
            }
        )
    return ranked[0], ranked[1], len(rows)


async def collect(name: str, root: Path, build: Callable[[Path], list[Question]], embedder: Embedder) -> EvalSet:
    """One set indexed and asked with ``embedder`` (loaded once for every set, closed by the caller)."""
    workspace = root / name
    questions = build(workspace)
    service = MemoryService(
        MemorySettings(),
        {"main": workspace},
        root / f"{name}.lance",
        clock=lambda: datetime(2026, 11, 30, tzinfo=UTC),
        embedder=embedder,
    )
    await service.start()
    try:
        started = time.perf_counter()
        await service.reindex()
        seconds = time.perf_counter() - started
        pools = [(q, await service.candidates("main", q.text)) for q in questions]
    finally:
        await service.close()
    bm25, bm25_indexed, chunks = await asyncio.to_thread(_bm25_baseline, root / f"{name}.lance", questions)
    return EvalSet(name, pools, bm25, chunks, seconds, bm25_indexed)


async def collect_sets(root: Path, sizes: Sequence[int], embedder: Embedder, *, quick: bool) -> list[EvalSet]:
    """The seeded sets (conversations of ``sizes`` chunks, notes, Japanese) indexed with one
    loaded ``embedder``, closed at the end; ``quick``: smaller notes and Japanese sets."""
    builders: list[tuple[str, Callable[[Path], list[Question]]]] = [
        (f"conversation-{n}", functools.partial(build_conversations, chunks=n)) for n in sizes
    ]
    builders += [
        ("notes", functools.partial(notes_questions, days=8 if quick else 60)),
        ("japanese", functools.partial(build_japanese, filler_sessions=1 if quick else 6)),
    ]
    try:
        return [await collect(name, root, build, embedder) for name, build in builders]
    finally:
        await embedder.close()


def _ranks_of(q: Question, ranked: Sequence[tuple[str, int, int]]) -> list[int | None]:
    out: list[int | None] = []
    for path, line in q.evidence:
        rank = next((i for i, (p, a, b) in enumerate(ranked, 1) if p == path and a <= line <= b), None)
        out.append(rank)
    return out


def scores(rows: list[list[int | None]]) -> dict[str, float]:
    n = len(rows)
    out: dict[str, float] = {"n": n}
    for k in KS:
        out[f"r@{k}"] = sum(sum(1 for r in ranks if r is not None and r <= k) / len(ranks) for ranks in rows) / n
    out["mrr"] = sum(1 / min(r for r in ranks if r is not None) if any(ranks) else 0.0 for ranks in rows) / n
    return out


def ranked_by(
    params: FusionParams, multilingual: bool
) -> Callable[[Question, list[Candidate]], list[tuple[str, int, int]]]:
    def rank(q: Question, pool: list[Candidate]) -> list[tuple[str, int, int]]:
        p = params if multilingual or not is_cjk_query(q.text) else replace(params, use_vector=False)
        return [(h.path, h.start_line, h.end_line) for h in fuse(pool, p, today=TODAY, k=max(KS), query=q.text)]

    return rank


def evaluate_ranking(
    s: EvalSet, rank: Callable[[Question, list[Candidate]], list[tuple[str, int, int]]]
) -> dict[str, dict[str, float]]:
    per: dict[str, list[list[int | None]]] = {}
    for q, pool in s.pools:
        if not q.evidence:
            continue
        ranks = _ranks_of(q, rank(q, pool))
        per.setdefault(q.kind, []).append(ranks)
        per.setdefault("all", []).append(ranks)
    return {kind: scores(rows) for kind, rows in per.items()}


def evaluate_bm25(ranked: Ranked, s: EvalSet) -> dict[str, dict[str, float]]:
    return evaluate_ranking(s, lambda q, _: ranked[q.text])


def abstention(s: EvalSet, params: FusionParams, multilingual: bool) -> dict[str, dict[str, float]]:
    """Per language: share of unanswerable questions with no result, and share of answerable
    questions whose first evidence is still in the top 10 (what the thresholds cost)."""
    out: dict[str, dict[str, float]] = {}
    for lang in ("en", "ja"):
        un = [(q, p) for q, p in s.pools if q.lang == lang and not q.evidence]
        an = [(q, p) for q, p in s.pools if q.lang == lang and q.evidence]
        if not un and not an:
            continue
        rank = ranked_by(params, multilingual)
        empty = sum(1 for q, p in un if not rank(q, p))
        kept = sum(1 for q, p in an if any(r is not None and r <= 10 for r in _ranks_of(q, rank(q, p)[:10])))
        out[lang] = {
            "unanswerable": len(un),
            "abstained": empty / len(un) if un else 0.0,
            "answerable_r10_kept": kept / len(an) if an else 0.0,
        }
    return out


def methods(defaults: FusionParams) -> dict[str, FusionParams]:
    zero = replace(defaults, min_score=0.0, min_text_score=0.0, recency_half_life_days=None, min_topic_cosine=0.0)
    alone = replace(zero, neighbour_weight=0.0, speaker_weight=0.0)
    return {
        "before (0.8/0.2, no neighbours)": replace(alone, vector_weight=0.8, text_weight=0.2),
        "vector": replace(alone, method="score", vector_weight=1.0, text_weight=0.0),
        # the full-text side alone: LanceDB's BM25 order (a rank fusion with no vector weight)
        "text": replace(alone, method="rrf", vector_weight=0.0, text_weight=1.0),
        "rrf 0.7/0.3 (before)": replace(alone, method="rrf", vector_weight=0.7, text_weight=0.3),
        "rrf 0.5/0.5": replace(alone, method="rrf", vector_weight=0.5, text_weight=0.5),
        "rrf 0.3/0.7": replace(alone, method="rrf", vector_weight=0.3, text_weight=0.7),
        "shipped weights, no neighbours": alone,
        "shipped, no speaker lift": replace(zero, speaker_weight=0.0),
        "shipped": zero,
    }


def grid() -> list[FusionParams]:
    out = []
    for wt in (0.1, 0.2, 0.3, 0.4):
        for sat in (10.0, 20.0, 40.0, 80.0):
            out.append(FusionParams(round(1 - wt, 2), wt, 0.0, 0.0, method="score", text_saturation=sat))
    for wt in (0.5, 0.6, 0.7, 0.8, 0.9):
        out.append(FusionParams(round(1 - wt, 2), wt, 0.0, 0.0, method="rrf"))
    return out


def _fmt(r: dict[str, float]) -> str:
    return f"{100 * r['r@5']:5.1f} {100 * r['r@10']:5.1f} {100 * r['r@25']:5.1f} {r['mrr']:.3f}"


def report(sets: list[EvalSet], shipped: FusionParams, multilingual: bool, embedder: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"embedder": embedder, "sets": {}}
    table = methods(shipped)
    for s in sets:
        print(
            f"\n== {s.name}: {s.chunks} chunks, {len(s.pools)} questions, indexed in {s.index_seconds:.1f} s "
            f"({s.chunks / s.index_seconds:.0f} chunks/s), embedder {embedder}"
        )
        results = {m: evaluate_ranking(s, ranked_by(p, multilingual)) for m, p in table.items()}
        results["bm25 (bm25s)"] = evaluate_bm25(s.bm25, s)
        if s.bm25_indexed:  # pools saved by an older version have only the first
            results["bm25 (bm25s, indexed text)"] = evaluate_bm25(s.bm25_indexed, s)
        kinds = [
            k for k in ("all", "single", "multi-hop", "temporal", "paraphrase", "distractor") if k in results["text"]
        ]
        print(f"{'method':<28}" + "".join(f"{k + ' (n=' + str(int(results['text'][k]['n'])) + ')':>28}" for k in kinds))
        print(f"{'':<28}" + "".join(f"{'@5    @10   @25   MRR':>28}" for _ in kinds))
        for m, r in results.items():
            print(f"{m:<28}" + "".join(f"{_fmt(r[k]):>28}" for k in kinds))
        ab = abstention(s, shipped, multilingual)
        for lang, a in ab.items():
            print(
                f"abstention ({lang}, shipped thresholds): {a['abstained']:.2f} of {a['unanswerable']} unanswerable "
                f"return nothing; answerable r@10 kept {a['answerable_r10_kept']:.2f}"
            )
        payload["sets"][s.name] = {
            "chunks": s.chunks,
            "index_seconds": s.index_seconds,
            "results": results,
            "abstention": ab,
        }
    return payload


def tune(sets: list[EvalSet], multilingual: bool) -> list[tuple[float, FusionParams, dict[str, float]]]:
    """Every grid point, with its worst margin over the better single side (r@5/10/25, every set)."""
    rows = []
    singles = {}
    for s in sets:
        singles[s.name] = (
            evaluate_ranking(s, ranked_by(methods(FusionParams(0, 0, 0, 0))["vector"], multilingual))["all"],
            evaluate_ranking(s, ranked_by(methods(FusionParams(0, 0, 0, 0))["text"], multilingual))["all"],
        )
    for p in grid():
        margin = 1.0
        mean10 = {}
        for s in sets:
            r = evaluate_ranking(s, ranked_by(p, multilingual))["all"]
            v, t = singles[s.name]
            margin = min(margin, *(r[f"r@{k}"] - max(v[f"r@{k}"], t[f"r@{k}"]) for k in KS))
            mean10[s.name] = r["r@10"]
        rows.append((margin, p, mean10))
    rows.sort(key=lambda t: (-min(t[0], 0.0), -sum(t[2].values())))
    return rows


def embed_cost(n: int) -> None:
    """Indexing cost per chunk of each packaged embedder, on the same chunks, in turn, in one run
    (three rounds, the best of each: the machine is shared)."""
    with tempfile.TemporaryDirectory() as tmp:
        build_conversations(Path(tmp), chunks=n)
        texts = [p.read_text("utf-8") for p in sorted(Path(tmp).rglob("*.md"))]
        queries = [q.text for q in dataset.build(Path(tmp) / "notes", days=60)][:100]
    paragraphs = [p for t in texts for p in t.split("\n\n") if p.strip()][:n]
    embedders: dict[str, Embedder] = {
        "minilm": SentenceTransformerEmbedder(),
        "use": UniversalSentenceEncoderEmbedder(),
        "e5": E5Embedder(),
        "minilm+use (before)": make_embedder("minilm+use"),
        "e5+use": make_embedder("e5+use"),
        "minilm+e5+use (auto)": make_embedder("minilm+e5+use"),
    }
    best: dict[str, float] = {}
    per_query: dict[str, float] = {}

    async def run() -> None:
        for e in embedders.values():
            await e.start()
        for _ in range(3):
            for name, e in embedders.items():
                t0 = time.perf_counter()
                for i in range(0, len(paragraphs), 32):
                    await e.embed(paragraphs[i : i + 32])
                best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
                t0 = time.perf_counter()
                for q in queries:
                    await query_vector(e, q)  # as a search embeds it
                per_query[name] = min(per_query.get(name, 1e9), (time.perf_counter() - t0) / len(queries))
        for e in embedders.values():
            await e.close()

    asyncio.run(run())
    print(f"embedding {len(paragraphs)} chunks (batches of 32) and {len(queries)} questions one by one,")
    print("one thread per model, best of 3 interleaved rounds:")
    for name, sec in best.items():
        print(
            f"  {name:<22} {1000 * sec / len(paragraphs):6.2f} ms per chunk ({sec / best['minilm']:.2f}x minilm),"
            f" {1000 * per_query[name]:6.2f} ms per query ({per_query[name] / per_query['minilm']:.2f}x)"
        )


def _pool_ranking(p: FusionParams) -> Callable[[Any], list[tuple[str, int, int]]]:
    return lambda a: [
        (h.path, h.start_line, h.end_line)
        for h in fuse(a.pool, p, today=TODAY, k=max(KS), query=spell_dates(a.question.text))
    ]


def _realtalk(
    data: Path, cache: Path | None, emb: str, *, reuse: bool, payload: dict[str, Any], minilm_weight: float | None
) -> bool:
    from bench import realtalk_eval

    with tempfile.TemporaryDirectory(prefix="neotask-realtalk-") as tmp:
        where = cache if cache is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        embedder = make_embedder(emb, minilm_weight)
        try:
            # E5's answers depend on its floor (a pickle of the bench's earlier stand-in, raw
            # cosines, is not reused) and the blend's on MiniLM's weight
            tag = f"{emb}.floor{E5_FLOOR}" if "e5" in emb else emb
            if getattr(embedder, "weights", None) and len(embedder.weights) > 1:  # type: ignore[attr-defined]
                tag += f".minilm{embedder.weights[0]:g}"  # type: ignore[attr-defined]
            run = realtalk_eval.load_or_collect(data, where, embedder, MemorySettings(), tag=tag, reuse=reuse)
        finally:
            asyncio.run(embedder.close())
    defaults = MemorySettings().search
    shipped = FusionParams(
        defaults.vector_weight, defaults.text_weight, 0.0, 0.0, method=defaults.fusion,
        text_saturation=defaults.text_saturation, neighbour_weight=defaults.neighbour_weight,
        speaker_weight=defaults.speaker_weight,
    )  # fmt: skip
    extra = {
        name: _pool_ranking(p)
        for name, p in methods(shipped).items()
        if name in ("vector", "text", "before (0.8/0.2, no neighbours)", "shipped weights, no neighbours")
        or name == "shipped, no speaker lift"
    }
    extra |= {f"MMR (search.mmr {lam})": _pool_ranking(replace(shipped, mmr=lam)) for lam in (0.9, 0.7, 0.5)}
    out = realtalk_eval.report(run, extra)
    quiet = replace(
        shipped, min_score=defaults.min_score, min_text_score=defaults.min_text_score,
        min_topic_cosine=defaults.min_topic_cosine, min_topic_score=defaults.min_topic_score,
    )  # fmt: skip
    out["abstention"] = _realtalk_abstention(run, quiet)
    payload[f"realtalk-{emb}"] = out
    return bool(out["pass"])


def _realtalk_abstention(run: Any, shipped: FusionParams) -> list[dict[str, float]]:
    """The shipped thresholds, then min_score alone (the off-topic rule off), then the off-topic
    rule's two bars (min_topic_cosine x min_topic_score, at the shipped min_score), on the same
    pools (top 10): unanswerable questions refused (no result), answerable ones refused, and R@10
    with abstention."""
    from bench import realtalk_eval

    questions = getattr(run, "unanswerable_questions", [])
    if not run.unanswerable_pools or len(questions) != len(run.unanswerable_pools):
        print("abstention sweep: the cached run holds no unanswerable pools (collect again without --reuse)")
        return []
    rows = []
    print(f"\nabstention on REALTALK (top 10; {len(run.unanswerable_pools)} unanswerable questions)")
    print(f"{'min_score':>10} {'topic cos':>9} {'topic score':>11} {'unanswerable refused':>22} "
          f"{'answerable refused':>20} {'R@10 on':>8} {'R@10 off':>9}")  # fmt: skip
    off = realtalk_eval.score(run.asked, _pool_ranking(replace(shipped, min_score=0.0, min_topic_cosine=0.0)))
    off10 = off["all"]["r@10"]
    ms0, tc0, ts0 = shipped.min_score, shipped.min_topic_cosine, shipped.min_topic_score
    grid = [(ms0, tc0, ts0)]
    grid += [(ms, 0.0, ts0) for ms in (0.0, 0.055, 0.07, 0.08, 0.09, 0.1, 0.12, 0.15)]
    grid += [(ms0, tc, ts) for tc in (0.45, 0.5, 0.55, 0.6) for ts in (0.15, 0.2, 0.25, 1.0)]
    for ms, tc, ts in dict.fromkeys(grid):
        p = replace(shipped, min_score=ms, min_topic_cosine=tc, min_topic_score=ts)
        empty = sum(
            1
            for q, (_, pool) in zip(questions, run.unanswerable_pools, strict=True)
            if not fuse(pool, p, today=TODAY, k=10, query=spell_dates(q))
        )
        wrong = sum(1 for a in run.asked if not fuse(a.pool, p, today=TODAY, k=10, query=spell_dates(a.question.text)))
        on = realtalk_eval.score(run.asked, _pool_ranking(p))["all"]["r@10"]
        n_un, n_an = len(run.unanswerable_pools), len(run.asked)
        print(
            f"{ms:>10.3f} {tc:>9.2f} {ts:>11.2f} {f'{empty}/{n_un} ({100 * empty / n_un:.0f} %)':>22} "
            f"{f'{wrong}/{n_an} ({100 * wrong / n_an:.1f} %)':>20} {on:8.1f} {off10:9.1f}"
        )
        rows.append({"min_score": ms, "min_topic_cosine": tc, "min_topic_score": ts,
                     "unanswerable_refused": empty / n_un, "answerable_refused": wrong / n_an,
                     "r@10_on": on, "r@10_off": off10})  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser("python -m bench.memory_eval", __doc__ or "")
    ap.add_argument("--sizes", default="1000,5000,20000", help="conversation sizes in chunks")
    ap.add_argument("--big", action="store_true", help="add the 50,000-chunk conversation set")
    ap.add_argument(
        "--embedder",
        choices=("auto", "minilm+e5+use", "minilm+use", "e5+use", "e5", "minilm", "use", "both"),
        default="auto",
        help="auto: what ships (minilm+e5+use where E5 runs: both English models blended, USE for "
        "Japanese); minilm+use: the default before; e5+use: E5 for English; e5 / minilm / use: one model; "
        "both: use, minilm",
    )  # fmt: skip
    ap.add_argument("--tune", action="store_true", help="print the fusion grid (worst margin over the better side)")
    ap.add_argument("--pools", type=Path, help="keep the fetched pools in this pickle and reuse them (fusion work)")
    ap.add_argument("--realtalk", type=Path, help="the data/ folder of a REALTALK clone: the main conversation set")
    ap.add_argument("--cache", type=Path, help="REALTALK: keep workspaces, index and answers here between runs")
    ap.add_argument(
        "--minilm-weight", type=float, help="minilm+e5+use: MiniLM's share of an English query's cosine (0-1)"
    )
    ap.add_argument("--reuse", action="store_true", help="REALTALK: score the answers the cache holds, ask nothing")
    ap.add_argument("--no-seeded", action="store_true", help="only REALTALK (skip the seeded sets)")
    ap.add_argument("--embed-cost", type=int, default=0, help="time embedding N chunks with each embedder, then stop")
    args = ap.parse_args(argv)
    sizes = [100] if args.quick else [int(x) for x in args.sizes.split(",")]  # quick: a smoke run, small sets
    if args.big:
        sizes.append(50_000)
    settings = MemorySettings().search
    # what memory.search sets, but for recency decay and MMR: the sets' dates are generated, and MMR
    # is measured apart (its rows add search.mmr to this)
    shipped = replace(FusionParams.of(settings, use_vector=True), recency_half_life_days=None, mmr=None)
    payload: dict[str, Any] = {}
    ok = True
    if args.embed_cost:
        embed_cost(args.embed_cost)
        return 0
    if args.realtalk is not None:
        for emb in ("use", "minilm") if args.embedder == "both" else (args.embedder,):
            ok &= _realtalk(
                args.realtalk, args.cache, emb, reuse=args.reuse, payload=payload, minilm_weight=args.minilm_weight
            )
    if args.no_seeded:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(payload, indent=2))
        return 0 if ok else 1
    for emb in ("use", "minilm") if args.embedder == "both" else (args.embedder,):
        embedder = make_embedder(emb, args.minilm_weight)
        asyncio.run(embedder.start())  # loaded once: every set below, and whether it is multilingual
        multilingual = is_multilingual(embedder.identity)
        saved = args.pools.with_suffix(f".{emb}.pickle") if args.pools else None
        if saved is not None and saved.exists():
            asyncio.run(embedder.close())
            sets = pickle.loads(saved.read_bytes())
        else:
            with tempfile.TemporaryDirectory(prefix="neotask-eval-") as tmp:
                sets = asyncio.run(collect_sets(Path(tmp), sizes, embedder, quick=args.quick))
            if saved is not None:
                saved.write_bytes(pickle.dumps(sets))
        payload[emb] = report(sets, shipped, multilingual, emb)
        if args.tune:
            print("\nfusion grid: worst margin over the better single side at @5/10/25 on any set; r@10 per set")
            for margin, p, mean10 in tune(sets, multilingual)[:12]:
                print(
                    f"{p.method:<6} wv={p.vector_weight:<4} wt={p.text_weight:<4} sat={p.text_saturation:<5} "
                    f"margin={100 * margin:+5.1f} " + " ".join(f"{k}={100 * v:.1f}" for k, v in mean10.items())
                )
        for s in sets:
            r = payload[emb]["sets"][s.name]["results"]
            best = {k: max(r["vector"]["all"][f"r@{k}"], r["text"]["all"][f"r@{k}"]) for k in KS}
            never_loses = all(r["shipped"]["all"][f"r@{k}"] >= best[k] for k in KS)
            print(f"{'PASS' if never_loses else 'FAIL'}  {emb} {s.name}: shipped hybrid >= better side at @5/@10/@25")
            ok &= never_loses
            if s.name.startswith("conversation"):
                baseline = max(v["all"]["r@10"] for m, v in r.items() if m.startswith("bm25"))
                gain = r["shipped"]["all"]["r@10"] - baseline
                print(
                    f"{'PASS' if gain >= 0.05 else 'FAIL'}  {emb} {s.name}: hybrid @10 - the stronger BM25 @10 = "
                    f"{100 * gain:+.1f}"
                )
                ok &= gain >= 0.05
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(payload, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
