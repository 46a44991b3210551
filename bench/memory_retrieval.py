"""Retrieval quality of memory search: vector only, full text only and hybrid, per question kind.

``python -m bench.memory_retrieval [--quick]``. Builds the generated memory of
``bench/retrieval/dataset.py`` (daily logs of many sessions, notes, MEMORY.md, planted facts),
indexes it with the packaged all-MiniLM-L6-v2 in a real LanceDB, fetches each question's two
candidate pools once, then scores every configuration offline with the same pure fusion code the
service uses (``memory.fusion.fuse``). A hit is right when its line range holds the fact's line.

For each method the weights and thresholds are chosen by a grid search on
objective = 0.7 * MRR (answerable) + 0.3 * abstention rate (unanswerable); the hybrid winner is
what ``config/defaults.yaml`` ships (``memory.search``). Results go to stdout and
``bench/out/memory_retrieval.json``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from bench.common import parser
from bench.retrieval.dataset import Question, build
from config.settings import MemorySettings
from memory import MemoryService, SentenceTransformerEmbedder
from memory.fusion import Candidate, FusionParams, fuse

KINDS = ("same", "paraphrase", "japanese", "unanswerable")
TODAY = date(2026, 11, 30)
OUT = Path(__file__).resolve().parent / "out" / "memory_retrieval.json"

WEIGHTS = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
MIN_SCORES = [0.0, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]
MIN_TEXT = [0.0, 0.5, 0.6, 0.67, 0.75, 0.8, 1.0]


def evaluate(pools: list[tuple[Question, list[Candidate]]], params: FusionParams) -> dict[str, dict[str, float]]:
    """recall@1/5/10 and MRR per answerable kind, abstention rate for unanswerable, and 'all'."""
    per: dict[str, list[tuple[int | None, int]]] = {k: [] for k in KINDS}
    for q, pool in pools:
        hits = fuse(pool, params, today=TODAY, k=10)
        rank = None
        if q.path is not None:
            for i, h in enumerate(hits, 1):
                if h.path == q.path and q.line is not None and h.start_line <= q.line <= h.end_line:
                    rank = i
                    break
        per[q.kind].append((rank, len(hits)))
    out: dict[str, dict[str, float]] = {}
    answerable: list[tuple[int | None, int]] = []
    for kind, rows in per.items():
        if not rows:
            continue
        if kind == "unanswerable":
            out[kind] = {"n": len(rows), "abstention": sum(1 for _, n in rows if n == 0) / len(rows)}
            continue
        answerable += rows
        out[kind] = _ranks(rows)
    out["answerable"] = _ranks(answerable)
    return out


def _ranks(rows: list[tuple[int | None, int]]) -> dict[str, float]:
    n = len(rows)
    return {
        "n": n,
        "recall@1": sum(1 for r, _ in rows if r is not None and r <= 1) / n,
        "recall@5": sum(1 for r, _ in rows if r is not None and r <= 5) / n,
        "recall@10": sum(1 for r, _ in rows if r is not None and r <= 10) / n,
        "mrr": sum(1 / r for r, _ in rows if r is not None) / n,
    }


def objective(result: dict[str, dict[str, float]]) -> float:
    return 0.7 * result["answerable"]["mrr"] + 0.3 * result.get("unanswerable", {}).get("abstention", 0.0)


def grid(method: str) -> list[FusionParams]:
    if method == "vector":
        return [FusionParams(1.0, 0.0, s, 0.0) for s in MIN_SCORES]
    if method == "text":
        return [FusionParams(0.0, 1.0, 0.0, t) for t in MIN_TEXT]
    return [FusionParams(w, round(1 - w, 2), s, t) for w, s, t in itertools.product(WEIGHTS, MIN_SCORES, MIN_TEXT)]


async def collect(root: Path, quick: bool) -> list[tuple[Question, list[Candidate]]]:
    workspace = root / "ws"
    questions = build(workspace, days=20 if quick else 60)
    embedder = SentenceTransformerEmbedder()
    settings = MemorySettings()
    service = MemoryService(
        settings, {"main": workspace}, root / "db", clock=lambda: datetime(2026, 11, 30, tzinfo=UTC), embedder=embedder
    )
    await service.start()
    try:
        await service.reindex()
        status = service.status()
        print(f"corpus: {status['files']} files, {status['chunks']} chunks, {len(questions)} questions")
        return [(q, await service.candidates("main", q.text)) for q in questions]
    finally:
        await service.close()
        await embedder.close()


def _row(label: str, result: dict[str, dict[str, float]]) -> str:
    cells = []
    for kind in ("same", "paraphrase", "japanese", "answerable"):
        r = result.get(kind)
        cells.append(f"{r['recall@1']:.2f}/{r['recall@5']:.2f}/{r['recall@10']:.2f} {r['mrr']:.2f}" if r else "-")
    abst = result.get("unanswerable", {}).get("abstention", 0.0)
    return f"{label:<8}" + "".join(f"{c:>24}" for c in cells) + f"{abst:>12.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser("python -m bench.memory_retrieval", __doc__ or "").parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="neotask-retrieval-") as tmp:
        pools = asyncio.run(collect(Path(tmp), args.quick))
    best: dict[str, tuple[FusionParams, dict[str, dict[str, float]]]] = {}
    for method in ("vector", "text", "hybrid"):
        scored = [(objective(r), p, r) for p in grid(method) for r in [evaluate(pools, p)]]
        scored.sort(key=lambda t: (-t[0], -t[1].min_score, -t[1].min_text_score, -t[1].vector_weight))
        best[method] = (scored[0][1], scored[0][2])
        if method == "hybrid":
            top = scored[0]
            tied = sorted(
                p.vector_weight
                for o, p, _ in scored
                if o == top[0] and (p.min_score, p.min_text_score) == (top[1].min_score, top[1].min_text_score)
            )
            print(f"hybrid: best objective {top[0]:.3f}, reached with vector_weight {tied[0]}..{tied[-1]}")
    defaults = MemorySettings().search
    shipped = FusionParams(defaults.vector_weight, defaults.text_weight, defaults.min_score, defaults.min_text_score)
    best["shipped"] = (shipped, evaluate(pools, shipped))

    print("\nrecall@1/@5/@10 MRR per kind; abstention = share of unanswerable questions with no result")
    header = "".join(f"{k:>24}" for k in ("same", "paraphrase", "japanese", "all answerable"))
    print(f"{'method':<8}{header}{'abstention':>12}")
    for method, (_, result) in best.items():
        print(_row(method, result))
    print()
    for method, (params, _) in best.items():
        print(
            f"{method:<8} vector_weight={params.vector_weight} text_weight={params.text_weight} "
            f"min_score={params.min_score} min_text_score={params.min_text_score}"
        )
    print("\nthe abstention trade-off (shipped weights and min_text_score, min_score varied):")
    print(f"{'min_score':>10}{'MRR all':>10}{'MRR para':>10}{'abstention':>12}")
    for ms in MIN_SCORES[1:]:
        r = evaluate(pools, FusionParams(shipped.vector_weight, shipped.text_weight, ms, shipped.min_text_score))
        print(f"{ms:>10}{r['answerable']['mrr']:>10.2f}{r['paraphrase']['mrr']:>10.2f}{r['unanswerable']['abstention']:>12.2f}")
    h, v, t = (best[m][1] for m in ("hybrid", "vector", "text"))
    s = best["shipped"][1]
    checks = {
        "hybrid (tuned) objective >= best single": objective(h) >= max(objective(v), objective(t)),
        "shipped hybrid MRR >= best single (all answerable)": s["answerable"]["mrr"]
        >= max(v["answerable"]["mrr"], t["answerable"]["mrr"]),
        "shipped hybrid MRR > best single (paraphrase)": s["paraphrase"]["mrr"]
        > max(v["paraphrase"]["mrr"], t["paraphrase"]["mrr"]),
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {m: {"params": vars(p), "result": r} for m, (p, r) in best.items()}
    OUT.write_text(json.dumps(payload, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
