"""Creating a session: the cost of a new key's first message — a new run
(folder, metadata.json, tasks.db row, sessions.json entry) and its first append — in a home holding
10,000 active sessions vs one holding 10, as a ratio measured in the same run (target ≤ 1.3x).

sessions.json is rewritten for a new run within ``storage.sessions_flush_ms``, coalesced like
appends: the run folder and tasks.db are its durable truth, and recovery rebuilds the entry from
them after a crash. ``python -m bench.session_creation [--quick]``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Report, Summary, fmt_seconds, median, now, parser, print_table, ratio, section
from bench.session_homes import make_template, peer_key, start_chat_run, write_home
from bench.sessions_engine import TIMED, settings_for_bench
from config.clock import system_clock
from sessions.files.store import SessionStore

CREATE_LIMIT = 1.3
WARMUP = 20


@dataclass(frozen=True)
class Sizes:
    big: int  # active keys in the big home
    small: int  # active keys in the small home
    samples: int  # new sessions timed per home


FULL = Sizes(big=10_000, small=10, samples=300)
QUICK = Sizes(big=1_000, small=10, samples=40)


async def timed_creation(store: SessionStore, index: int) -> float:
    start = now()
    run = await start_chat_run(store, peer_key(1_000_000 + index))
    await store.append(run, TIMED)
    return now() - start


async def bench_creation(many: SessionStore, few: SessionStore, sizes: Sizes, report: Report) -> None:
    section(f"new session (run + first message) with {sizes.big:,} keys vs {sizes.small}")
    sides = ((many, sizes.big), (few, sizes.small))
    index = 0
    for store, _ in sides:
        for _ in range(WARMUP):
            index += 1
            await timed_creation(store, index)
    times: dict[int, list[float]] = {sizes.big: [], sizes.small: []}
    rewrites = {sizes.big: many.registry.rewrites, sizes.small: few.registry.rewrites}
    for i in range(sizes.samples):
        # Alternate which side goes first so neither gains from drift or from following the other.
        for store, keys in sides if i % 2 == 0 else sides[::-1]:
            index += 1
            times[keys].append(await timed_creation(store, index))
    rewrites = {sizes.big: many.registry.rewrites - rewrites[sizes.big],
                sizes.small: few.registry.rewrites - rewrites[sizes.small]}  # fmt: skip
    rows = []
    for keys in (sizes.big, sizes.small):
        s = Summary.of(times[keys])
        rows.append([f"{keys:,} keys", str(s.n), fmt_seconds(s.p50), fmt_seconds(s.p95), fmt_seconds(s.p99),
                     str(rewrites[keys])])  # fmt: skip
    print(f"  {sizes.samples} new keys per home, interleaved one by one (fsync {many.settings.storage.fsync})")
    print_table(["home", "sessions", "p50", "p95", "p99", "sessions.json rewrites"], rows)
    value = ratio(median(times[sizes.big]), median(times[sizes.small]))
    report.check(f"new-session median, {sizes.big:,} keys / {sizes.small} keys", value, CREATE_LIMIT)


async def run(sizes: Sizes, workdir: Path) -> int:
    report = Report("bench.session_creation")
    settings = settings_for_bench()
    started = now()
    template = await make_template(workdir / "template", settings, system_clock, 4)
    flush_ms = settings.storage.sessions_flush_ms
    many_root, few_root = workdir / "many", workdir / "few"
    for root, count in ((many_root, sizes.big), (few_root, sizes.small)):
        await asyncio.to_thread(write_home, root, template, [peer_key(i) for i in range(count)], flush_ms=flush_ms)
    many = await SessionStore.open(many_root, settings, clock=system_clock)
    few = await SessionStore.open(few_root, settings, clock=system_clock)
    size = many.home.sessions_json.stat().st_size
    print(f"  (homes of {sizes.big:,} and {sizes.small} sessions; sessions.json {size / 1e6:.1f} MB)")
    try:
        await bench_creation(many, few, sizes, report)
    finally:
        await many.close()
        await few.close()
    print(f"\n  total {now() - started:.1f} s")
    return report.finish()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser("python -m bench.session_creation", "Session creation cost.").parse_args(argv)
    sizes = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="neotask-bench-") as workdir:
        return asyncio.run(run(sizes, Path(workdir)))


if __name__ == "__main__":
    raise SystemExit(main())
