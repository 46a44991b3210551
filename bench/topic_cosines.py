"""Can a model's best cosine over a memory tell an unanswerable question from an answerable one?

``python -m bench.topic_cosines --realtalk DIR [--quick]`` (``DIR``: the ``data/`` folder of a
REALTALK clone, see ``bench/retrieval/realtalk.py``)

The off-topic rule (``memory.topic.off_topic``) refuses a question that holds a word no candidate
holds, unless a candidate's cosine shows a close paraphrase. On the seeded sets' paraphrase
questions the fused cosine cannot show it (docs/memory-tuning.md, seventh round). multilingual-e5-small
was trained to match a question to the passage that answers it, so its cosine might: this bench
asks each English model of the default embedder (MiniLM, E5) alone. Every paragraph of a memory
(a REALTALK turn, a seeded turn or note) is embedded as a passage, every question as a query; a
question's **best cosine** is its highest over its own memory. For each threshold ``t`` it prints
the share of answerable and of unanswerable questions whose best cosine is below ``t`` (what a
rule "refuse below t" would refuse). Sets: REALTALK (697 answerable, its 95 unanswerable questions
of ``realtalk.unanswerable``), conversation-1000 and the English notes (their off-topic questions);
``--quick``: two chats and conversation-100, at most 64 paragraphs and questions each (a smoke run).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.common import parser
from bench.memory_eval import notes_questions
from bench.retrieval import realtalk
from bench.retrieval.conversations import build_conversations
from memory.embedders import E5Embedder, Embedder, SentenceTransformerEmbedder, query_vector

QUICK = 64  # --quick: at most this many paragraphs, and questions of each kind, per memory
Memory = tuple[list[str], list[str], list[str]]  # paragraphs, answerable questions, unanswerable ones


def _paragraphs(root: Path) -> list[str]:
    return [
        para.strip()
        for path in sorted(root.rglob("*.md"))
        for para in path.read_text("utf-8").split("\n\n")
        if para.strip()
    ]


def memories(data: Path | None, root: Path, *, quick: bool) -> dict[str, list[Memory]]:
    """The sets' memories, written under ``root``: set name -> one memory per agent."""
    out: dict[str, list[Memory]] = {}
    if data is not None:
        chats = realtalk.write_all(data, root / "realtalk")[: 2 if quick else None]
        out["REALTALK"] = [
            (_paragraphs(ws), [q.text for q in c.questions], [q.text for q in realtalk.unanswerable(c.turns, c.people)])
            for c, ws in chats
        ]
    qs = build_conversations(root / "conversation", chunks=100 if quick else 1000)
    out["conversation-100" if quick else "conversation-1000"] = [
        (_paragraphs(root / "conversation"), [q.text for q in qs if q.evidence], [q.text for q in qs if not q.evidence])
    ]
    if quick:  # a smoke run: the first paragraphs and questions are enough to go through every step
        return {name: [(p[:QUICK], a[:QUICK], u[:QUICK]) for p, a, u in sets] for name, sets in out.items()}
    qs = [q for q in notes_questions(root / "notes") if q.lang == "en"]
    out["notes"] = [
        (_paragraphs(root / "notes"), [q.text for q in qs if q.evidence], [q.text for q in qs if not q.evidence])
    ]
    return out


async def best_cosines(model: Embedder, memory: Memory) -> tuple[np.ndarray, np.ndarray]:
    """Each answerable and each unanswerable question's highest cosine over the memory."""
    paragraphs, answerable, unanswerable = memory
    chunks = np.concatenate([await model.embed(paragraphs[i : i + 32]) for i in range(0, len(paragraphs), 32)])

    async def best(questions: Sequence[str]) -> np.ndarray:
        if not questions:
            return np.zeros(0)
        queries = np.stack([await query_vector(model, q) for q in questions])
        return (queries @ chunks.T).max(axis=1)  # type: ignore[no-any-return]

    return await best(answerable), await best(unanswerable)


async def run(sets: dict[str, list[Memory]]) -> None:
    models: dict[str, Embedder] = {"MiniLM": SentenceTransformerEmbedder(), "E5": E5Embedder()}
    try:
        for model_name, model in models.items():
            await model.start()
            for set_name, mems in sets.items():
                pairs = [await best_cosines(model, m) for m in mems]
                a = np.concatenate([p[0] for p in pairs])
                u = np.concatenate([p[1] for p in pairs])
                print(f"\n{model_name} on {set_name}: {len(a)} answerable, {len(u)} unanswerable questions")
                print(
                    "  best cosine, answerable p5 / p25 / p50: "
                    + " / ".join(f"{v:.3f}" for v in np.percentile(a, [5, 25, 50]))
                    + "; unanswerable p50 / p75 / p95: "
                    + " / ".join(f"{v:.3f}" for v in np.percentile(u, [50, 75, 95]))
                )
                lo, hi = np.percentile(np.concatenate([a, u]), [2, 90])
                for t in np.round(np.linspace(lo, hi, 8), 3):
                    print(
                        f"  refuse below {t:.3f}: answerable refused {100 * (a < t).mean():5.1f} %, "
                        f"unanswerable refused {100 * (u < t).mean():5.1f} %"
                    )
    finally:
        for model in models.values():
            await model.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser("python -m bench.topic_cosines", __doc__ or "")
    ap.add_argument("--realtalk", type=Path, help="the data/ folder of a REALTALK clone (skipped without it)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="neotask-topic-") as tmp:
        sets = memories(args.realtalk, Path(tmp), quick=args.quick)
        asyncio.run(run(sets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
