"""Memory at scale: index N chunks with the default embedders, then a daemon's RSS over that index.

``python -m bench.memory_scale [--chunks N]`` (20,000 by default):

1. a Markdown memory of N chunks (one heading and one paragraph of 50-110 words each, 50 per file)
   is indexed from scratch by ``MemoryService.reindex`` with the default settings in a child
   process (``--child``), which reports its wall and CPU time (user + system, every thread) for
   loading the models and for indexing, and its peak RSS (target: under 5 CPU-minutes to index);
2. the daemon (``neotask gateway``) on that home, once its memory is ready (models loaded, index
   opened and mirrored, nothing to embed), against the daemon on a home with no memory files
   (the session store only: no model, no LanceDB): RSS of each, read from ``/proc``.

Results go to stdout and ``bench/out/memory_scale.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import parser

OUT = Path(__file__).resolve().parent / "out" / "memory_scale.json"
REPO = Path(__file__).resolve().parents[1]
CPU_TARGET_S = 300.0
PER_FILE = 50


def write_memory(workspace: Path, chunks: int, seed: int = 4) -> int:
    """``chunks`` sections of one paragraph each (each one chunk), ``PER_FILE`` to a file; bytes written."""
    from bench.memory_speed import paragraph

    rng = random.Random(seed)
    memory = workspace / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    total = 0
    for f in range(0, chunks, PER_FILE):
        sections = [f"## Entry {i}\n\n{paragraph(rng)}" for i in range(f, min(f + PER_FILE, chunks))]
        text = f"# Notes {f // PER_FILE}\n\n" + "\n\n".join(sections) + "\n"
        (memory / f"notes-{f // PER_FILE:04d}.md").write_text(text, encoding="utf-8")
        total += len(text.encode())
    return total


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def child(home: Path) -> dict[str, Any]:
    """Index ``home``'s workspace ``main`` into ``home/memory.lance`` with the default settings."""
    from config.clock import system_clock
    from config.settings import MemorySettings
    from memory import MemoryService

    settings = MemorySettings.model_validate({"watch": {"poll_seconds": 3600}})
    service = MemoryService(
        settings, {"main": home / "workspaces" / "main"}, home / "memory.lance", clock=system_clock, background=False
    )
    c0, t0 = _cpu(), time.perf_counter()
    await service.start()
    assert service._embedder is not None
    await service._embedder.start()  # the models, timed apart from the indexing
    c1, t1 = _cpu(), time.perf_counter()
    report = await service.reindex()
    c2, t2 = _cpu(), time.perf_counter()
    status = service.status()
    await service.close()
    return {
        "load_wall_s": t1 - t0,
        "load_cpu_s": c1 - c0,
        "index_wall_s": t2 - t1,
        "index_cpu_s": c2 - c1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "chunks": status["chunks"],
        "embedded": report.chunks_embedded,
        "embedder": status["identity"]["provider"],
    }


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def daemon_rss(home: Path, *, memory: bool) -> dict[str, float]:
    """Start ``neotask gateway`` on ``home``; once its memory is ready (``memory``) or it has
    answered and settled (store only), its RSS; then stop it."""
    from bench.real_home import Daemon

    daemon = Daemon(home, None)
    await daemon.start()
    assert daemon.proc is not None
    try:
        async with aiohttp.ClientSession() as session:
            async with asyncio.timeout(900):
                while memory:
                    async with session.get(daemon.url + "/v1/memory/status") as resp:
                        status = await resp.json()
                    if status.get("ready") and status.get("chunks") and status.get("progress") is None:
                        break
                    await asyncio.sleep(1)
        await asyncio.sleep(3)  # settled: no load in flight
        rss, hwm = rss_mb(daemon.proc.pid)
        return {"rss_mb": rss, "peak_rss_mb": hwm}
    finally:
        await daemon.stop()


async def run(root: Path, chunks: int) -> dict[str, Any]:
    home = root / "home"
    corpus = write_memory(home / "workspaces" / "main", chunks)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.memory_scale", "--child", str(home),
        stdout=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the indexing child failed ({proc.returncode})")
    index = json.loads(out.decode().strip().splitlines()[-1])
    loaded = await daemon_rss(home, memory=True)
    bare = root / "bare"
    (bare / "workspaces" / "main").mkdir(parents=True)
    store_only = await daemon_rss(bare, memory=False)
    return {"corpus_bytes": corpus, "index": index, "daemon_memory": loaded, "daemon_store_only": store_only}


def report(result: dict[str, Any]) -> bool:
    i, m, s = result["index"], result["daemon_memory"], result["daemon_store_only"]
    print(f"memory of {i['chunks']:,} chunks ({result['corpus_bytes'] / 1e6:.1f} MB), embedder {i['embedder']}:")
    print(f"  models loaded in {i['load_wall_s']:.1f} s wall, {i['load_cpu_s']:.1f} s CPU")
    per_chunk = 1000 * i["index_cpu_s"] / max(i["chunks"], 1)
    print(f"  indexed ({i['embedded']:,} embedded) in {i['index_wall_s']:.0f} s wall, {i['index_cpu_s']:.0f} s CPU "
          f"({i['index_cpu_s'] / 60:.1f} CPU-minutes; {per_chunk:.1f} ms a chunk)")  # fmt: skip
    print(f"  peak RSS of the indexing process: {i['peak_rss_mb']:.0f} MB")
    print(f"daemon RSS, memory ready over that index: {m['rss_mb']:.0f} MB (peak {m['peak_rss_mb']:.0f} MB)")
    print(f"daemon RSS, store only (no memory files): {s['rss_mb']:.0f} MB (peak {s['peak_rss_mb']:.0f} MB)")
    ok = i["index_cpu_s"] < CPU_TARGET_S
    print(f"{'PASS' if ok else 'FAIL'}  indexing {i['chunks']:,} chunks under {CPU_TARGET_S / 60:.0f} CPU-minutes")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser("python -m bench.memory_scale", __doc__ or "")
    ap.add_argument("--chunks", type=int, default=20_000, help="chunks in the memory (default 20,000)")
    ap.add_argument("--child", type=Path, help=argparse_hidden())
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(asyncio.run(child(args.child))))
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="neotask-memscale-") as tmp:
        result = asyncio.run(run(Path(tmp), 2_000 if args.quick else args.chunks))
    ok = report(result)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
