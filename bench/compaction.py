"""Compaction benchmarks:

1. deciding and committing one extractive compaction of a 10,000-message run (the time is printed);
2. the per-message cost of the threshold check (``compaction_due`` on the live counters, as every
   append does) at 10 vs 10,000 messages: at most 1.3x.

``python -m bench.compaction [--quick]``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.common import Report, fmt_seconds, median, now, parser, print_table, ratio, section
from config.clock import system_clock
from config.loader import build_settings, deep_merge, load_defaults
from sessions.compaction import compaction_due, plan_compaction
from sessions.compactor import Compactor, extractive
from sessions.files.store import SessionStore
from sessions.records import NewMessage, RunStart, RunState, TaskKey
from sessions.thresholds import compaction_threshold

BIG, SMALL, CHECKS = 10_000, 10, 200_000


async def fill(store: SessionStore, key: str, count: int) -> RunState:
    run = await store.start_run(
        RunStart(key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key))
    )
    for start in range(0, count, 500):
        await asyncio.gather(
            *(
                store.append(
                    run,
                    NewMessage(
                        role="user" if i % 2 else "assistant",
                        content=f"message {i} about ticket NT-{i % 97} in path src/m{i % 13}.py",
                    ),
                )
                for i in range(start, min(count, start + 500))
            )
        )
    return run


def check_cost(run: RunState, overhead: int, threshold: int, checks: int) -> float:
    """Seconds per threshold check, as the append path does it (counters only, O(1))."""
    start = now()
    for _ in range(checks):
        compaction_due(run.context_tokens, overhead, threshold)
    return (now() - start) / checks


async def run_bench(root: Path, big: int, checks: int, report: Report) -> None:
    settings = build_settings(deep_merge(load_defaults(), {"storage": {"fsync": "never"}}))
    store = await SessionStore.open(root, settings, clock=system_clock)
    try:
        large = await fill(store, "agent:main:dm:large", big)
        small = await fill(store, "agent:main:dm:small", SMALL)
        threshold = compaction_threshold(settings.compaction, settings.agents["main"].model)

        section(f"1. decide and commit one extractive compaction of a {big:,}-message run")
        context = await store.read_context(large)
        start = now()
        plan = plan_compaction(context, keep_recent=10, min_to_compress=5)
        decided = now() - start
        compactor = Compactor(store, extractive, settings.compaction)
        start = now()
        result = await compactor.compact(large, trigger="manual", threshold=threshold)
        total = now() - start
        assert plan is not None and result is not None
        print_table(
            ["", "messages", "tokens before", "tokens after", "time"],
            [
                [
                    "decide (plan the cut)",
                    f"{len(plan.summarize):,}",
                    f"{plan.tokens_before:,}",
                    "-",
                    fmt_seconds(decided),
                ],
                [
                    "decide + summarize + commit",
                    f"{result.compressed:,}",
                    f"{result.tokens_before:,}",
                    f"{result.tokens_after:,}",
                    fmt_seconds(total),
                ],
            ],
        )

        section(f"2. threshold check per message: {big:,} vs {SMALL} messages in the run")
        large_costs, small_costs = [], []
        for _ in range(7):  # interleaved, to cancel drift
            large_costs.append(check_cost(large, 100, threshold, checks))
            small_costs.append(check_cost(small, 100, threshold, checks))
        print_table(
            ["run", "median per check"],
            [
                [f"{big:,} messages", fmt_seconds(median(large_costs))],
                [f"{SMALL} messages", fmt_seconds(median(small_costs))],
            ],
        )
        report.check(
            f"threshold check, {big:,}-message run / {SMALL}-message run",
            ratio(median(large_costs), median(small_costs)),
            1.3,
        )
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser("python -m bench.compaction", "Compaction benchmarks.").parse_args(argv)
    big, checks = (1_000, 20_000) if args.quick else (BIG, CHECKS)
    report = Report("bench.compaction")
    root = Path(tempfile.mkdtemp(prefix="neotask-bench-compaction-"))
    try:
        asyncio.run(run_bench(root, big, checks, report))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    raise SystemExit(main())
