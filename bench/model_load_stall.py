"""How long loading the default embedder stops the event loop (``memory/native_libraries.py``).

The daemon loads the embedding model on a thread of its own, but CPython loads a package's shared
libraries with the interpreter lock held, so the event loop cannot run while torch's 434 MB
library is opened. Each round starts a fresh interpreter (nothing imported, page cache as the
machine has it) that runs a 5 ms ticker task on its loop and awaits the default embedder's start;
it reports the longest gap between two ticks (the loop's longest stop) and the load's length.
Rounds alternate between the shipped code and the same code with the preload switched off
(the baseline), and the script prints the medians and their ratio.

``python -m bench.model_load_stall [--rounds R]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time


async def _measure(preload: bool) -> dict[str, float]:
    from config.settings import EmbeddingSettings
    from memory import native_libraries
    from memory.embedders.choice import build_embedder

    if not preload:
        native_libraries.HEAVY = {}
    embedder = build_embedder(EmbeddingSettings())
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.perf_counter()
    await embedder.start()
    loaded = time.perf_counter() - started
    stop.set()
    await ticker
    await embedder.close()
    return {"longest_stop_s": max(gaps), "load_s": loaded}


def _round(preload: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.model_load_stall", "--child", "on" if preload else "off"],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_measure(args.child == "on"))))
        return
    runs: dict[str, list[dict[str, float]]] = {"baseline (no preload)": [], "preload": []}
    for _ in range(args.rounds):
        runs["baseline (no preload)"].append(_round(False))
        runs["preload"].append(_round(True))
    medians = {}
    for name, rounds in runs.items():
        stop = statistics.median(r["longest_stop_s"] for r in rounds)
        load = statistics.median(r["load_s"] for r in rounds)
        medians[name] = stop
        worst = max(r["longest_stop_s"] for r in rounds)
        print(
            f"{name:22s} longest loop stop: median {stop * 1000:6.0f} ms, worst {worst * 1000:6.0f} ms;"
            f" load {load:.2f} s  ({args.rounds} rounds)"
        )
    ratio = medians["baseline (no preload)"] / medians["preload"]
    print(f"ratio: the baseline stops the loop {ratio:.1f}x as long as the preload")


if __name__ == "__main__":
    main()
