"""Session engine benchmarks, each a ratio against a baseline measured in the same run:

1. appending to a run holding 10,000 messages vs one holding 10 (target ≤ 1.3x);
2. routing a message with 10,000 active keys vs 10 (route + entry/run lookup + append; ≤ 1.3x);
3. sessions.json rewrites during 1,000 appends (target: coalesced, no per-message rewrite);
4. SessionStore.open of a home with 10,000 active sessions, recovery included, vs a plain Python
   loop reading the same files (≤ 3x; the aim is under 2 s).

``python -m bench.sessions_engine [--quick]``; every figure goes to stdout.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Report, Summary, fmt_seconds, median, now, parser, print_table, ratio, repeat, section
from bench.session_homes import (
    CHANNEL,
    conversation,
    make_template,
    peer_id,
    peer_key,
    start_chat_run,
    write_home,
)
from config.clock import system_clock
from config.loader import build_settings, deep_merge, load_defaults
from config.settings import Settings
from home import layout
from sessions.files.recovery import recover_all
from sessions.files.store import SessionStore
from sessions.keys import Ingress, route
from sessions.records import NewMessage, RunState

APPEND_LIMIT = 1.3
ROUTE_LIMIT = 1.3
OPEN_LIMIT = 3.0
OPEN_AIM_S = 2.0
FILL_CHUNK = 500
WARMUP = 50


@dataclass(frozen=True)
class Sizes:
    big: int  # messages in the big run (1); active keys in the big home (2, 4)
    small: int  # messages in each small run (1); active keys in the small home (2)
    samples: int  # timed appends per side (1, 2)
    small_runs: int  # (1) rotates its small side over this many runs so each stays near `small`
    rewrite_appends: int  # (3)
    open_repeats: int  # (4) timed opens and plain reads, after one warm-up of each
    history: int  # messages per session in the generated homes (2, 4)


FULL = Sizes(big=10_000, small=10, samples=2_000, small_runs=100, rewrite_appends=1_000, open_repeats=7, history=4)
QUICK = Sizes(big=1_000, small=10, samples=200, small_runs=10, rewrite_appends=1_000, open_repeats=2, history=4)

TIMED = NewMessage(role="user", content="a timed message of ordinary length, " * 3, sender_id="u")


def settings_for_bench() -> Settings:
    """Defaults (fsync: batch), with direct messages keyed per channel and peer."""
    return build_settings(deep_merge(load_defaults(), {"session": {"dm_scope": "per-channel-peer"}}))


async def fill(store: SessionStore, run: RunState, count: int) -> None:
    """Append ``count`` messages, concurrently in chunks (group commit keeps this quick)."""
    messages = conversation(min(count, 20))
    done = 0
    while done < count:
        chunk = min(FILL_CHUNK, count - done)
        await asyncio.gather(*(store.append(run, messages[(done + i) % len(messages)]) for i in range(chunk)))
        done += chunk


async def timed_append(store: SessionStore, run: RunState) -> float:
    start = now()
    await store.append(run, TIMED)
    return now() - start


def summary_row(label: str, size: str, values: Sequence[float]) -> list[str]:
    s = Summary.of(values)
    return [label, size, str(s.n), fmt_seconds(s.p50), fmt_seconds(s.p95), fmt_seconds(s.p99)]


# -- 1 and 3: appends on one store --------------------------------------------------------------


async def bench_append(store: SessionStore, sizes: Sizes, report: Report) -> None:
    section(f"1. append to a run holding {sizes.big:,} messages vs one holding {sizes.small}")
    big = await start_chat_run(store, peer_key(0))
    await fill(store, big, sizes.big)
    smalls = [await start_chat_run(store, peer_key(i + 1)) for i in range(sizes.small_runs)]
    for run in smalls:
        await fill(store, run, sizes.small)
    await store.registry.flush()

    per_small = math.ceil(sizes.samples / sizes.small_runs)
    big_times: list[float] = []
    small_times: list[float] = []
    for i in range(sizes.samples):
        small = smalls[i // per_small]
        # Alternate which side goes first so neither gains from drift or from following the other.
        if i % 2 == 0:
            big_times.append(await timed_append(store, big))
            small_times.append(await timed_append(store, small))
        else:
            small_times.append(await timed_append(store, small))
            big_times.append(await timed_append(store, big))

    print(f"  sequential appends, fsync {store.settings.storage.fsync}, interleaved one by one")
    print_table(
        ["run", "messages while timed", "appends", "p50", "p95", "p99"],
        [
            summary_row("big", f"{sizes.big:,} → {big.message_count:,}", big_times),
            summary_row(
                f"small ({sizes.small_runs} runs in turn)",
                f"{sizes.small} → {sizes.small + per_small}",
                small_times,
            ),
        ],
    )
    value = ratio(median(big_times), median(small_times))
    report.check(f"append median, {sizes.big:,}-message run / {sizes.small}-message run", value, APPEND_LIMIT)


async def bench_rewrites(store: SessionStore, sizes: Sizes, report: Report) -> None:
    count = sizes.rewrite_appends
    section(f"3. sessions.json rewrites during {count:,} appends")
    flush_s = store.settings.storage.sessions_flush_ms / 1000
    await store.registry.flush()
    await asyncio.sleep(flush_s * 1.5)  # let any flush timer still pending from earlier work expire
    run = await start_chat_run(store, peer_key(sizes.small_runs + 1))
    entries = len(store.registry.entries)
    before = store.registry.rewrites
    start = now()
    for _ in range(count):
        await store.append(run, TIMED)
    elapsed = now() - start
    during = store.registry.rewrites - before
    await asyncio.sleep(flush_s * 1.5)  # the coalesced flush the last appends scheduled
    total = store.registry.rewrites - before
    # One rewrite per started flush interval at most: the file follows within sessions_flush_ms.
    bound = math.floor(elapsed / flush_s) + 1 if flush_s > 0 else count
    print_table(
        ["appends", "elapsed", "sessions_flush_ms", "entries", "rewrites while appending", "incl. trailing flush"],
        [[f"{count:,}", fmt_seconds(elapsed), str(store.settings.storage.sessions_flush_ms), str(entries),
          str(during), str(total)]],
    )  # fmt: skip
    print(f"  appends per rewrite: {count / total:,.0f}" if total else "  appends per rewrite: no rewrite at all")
    report.check(
        f"sessions.json rewrites for {count:,} appends (coalescing bound over {fmt_seconds(elapsed)})",
        total,
        bound,
        unit="",
        digits=0,
    )


# -- 2: routing with many active keys -----------------------------------------------------------


async def timed_delivery(store: SessionStore, settings: Settings, index: int) -> tuple[float, float]:
    """Route one direct message from peer ``index`` and append it: (route + lookup, total) seconds."""
    ingress = Ingress(channel=CHANNEL, chat_type="direct", chat_id=peer_id(index), sender_id=peer_id(index))
    start = now()
    key = route(ingress, dm_scope=settings.session.dm_scope, bindings=settings.bindings, agents=settings.agents)
    entry = store.entry(key.raw)
    run = store.active_run(key.raw)
    if entry is None or run is None:
        raise RuntimeError(f"the generated home has no active run for {key.raw}")
    routed = now()
    await store.append(run, NewMessage(role="user", content=TIMED.content, sender_id=ingress.sender_id))
    return routed - start, now() - start


async def bench_route(many: SessionStore, few: SessionStore, sizes: Sizes, report: Report) -> None:
    section(f"2. route a message with {sizes.big:,} active keys vs {sizes.small}")
    settings = many.settings
    rng = random.Random(2)
    sides = ((many, sizes.big), (few, sizes.small))
    for store, keys in sides:
        for _ in range(WARMUP):
            await timed_delivery(store, settings, rng.randrange(keys))
    times: dict[int, list[tuple[float, float]]] = {sizes.big: [], sizes.small: []}
    for i in range(sizes.samples):
        for store, keys in sides if i % 2 == 0 else sides[::-1]:
            times[keys].append(await timed_delivery(store, settings, rng.randrange(keys)))

    rows = []
    for keys in (sizes.big, sizes.small):
        routing = [r for r, _ in times[keys]]
        total = Summary.of([t for _, t in times[keys]])
        rows.append(
            [f"{keys:,} keys", fmt_seconds(median(routing)), fmt_seconds(total.p50), fmt_seconds(total.p95),
             fmt_seconds(total.p99)]
        )  # fmt: skip
    print(f"  {sizes.samples:,} messages per home to uniformly random keys, interleaved one by one")
    print_table(["active", "route+lookup p50", "total p50", "total p95", "total p99"], rows)
    route_only = ratio(median([r for r, _ in times[sizes.big]]), median([r for r, _ in times[sizes.small]]))
    print(f"  route + lookup alone: {route_only:.2f}x (information)")
    value = ratio(median([t for _, t in times[sizes.big]]), median([t for _, t in times[sizes.small]]))
    report.check(f"routing median, {sizes.big:,} keys / {sizes.small} keys", value, ROUTE_LIMIT)


# -- 4: opening a home --------------------------------------------------------------------------


def plain_read(contexts: Path) -> int:
    """The baseline: find every active run folder and read the files the store reads, nothing more."""
    total = 0
    with open(contexts / "sessions.json", "rb") as handle:
        total += len(handle.read())
    for status in ("running", "paused"):
        with os.scandir(contexts / status) as folders:
            for folder in folders:
                if not folder.is_dir():
                    continue
                for name in (layout.METADATA, layout.MESSAGES, layout.CURRENT):
                    with open(os.path.join(folder.path, name), "rb") as handle:
                        total += len(handle.read())
    return total


async def timed_open(root: Path, settings: Settings, expected: int) -> float:
    start = now()
    store = await SessionStore.open(root, settings, clock=system_clock)
    elapsed = now() - start
    active = sum(1 for _ in store.active_runs())
    await store.close()
    if active != expected:
        raise RuntimeError(f"opened {active} active runs, expected {expected}")
    return elapsed


async def bench_open(root: Path, settings: Settings, sizes: Sizes, report: Report) -> None:
    section(f"4. open a home with {sizes.big:,} active sessions (recovery included) vs a plain read")
    contexts = root / "contexts"
    plain_read(contexts)  # one warm-up of each, so all are timed on a warm cache
    recover_all(contexts)
    await timed_open(root, settings, sizes.big)
    times: dict[str, list[float]] = {"plain": [], "recovery": [], "open": []}

    async def one(name: str) -> None:
        if name == "plain":
            times[name] += repeat(lambda: plain_read(contexts), 1)
        elif name == "recovery":
            times[name] += repeat(lambda: recover_all(contexts), 1)
        else:
            times[name].append(await timed_open(root, settings, sizes.big))

    order = list(times)
    for i in range(sizes.open_repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            await one(name)

    print(f"  {sizes.open_repeats} of each after one warm-up, alternating; files per run: metadata.json,")
    print(f"  messages.jsonl, current.jsonl ({sizes.history} messages each) + sessions.json")
    labels = {
        "plain": "plain Python loop (baseline)",
        "recovery": "recover_all alone (information)",
        "open": "SessionStore.open",
    }
    rows = []
    for name, values in times.items():
        rows.append([labels[name], fmt_seconds(median(values)), fmt_seconds(min(values)), fmt_seconds(max(values)),
                     f"{ratio(median(values), median(times['plain'])):.2f}x"])  # fmt: skip
    print_table(["", "median", "min", "max", "vs baseline"], rows)
    opened = median(times["open"])
    report.check(
        f"SessionStore.open / plain read, {sizes.big:,} sessions", ratio(opened, median(times["plain"])), OPEN_LIMIT
    )
    if sizes.big >= FULL.big:
        verdict = "met" if opened < OPEN_AIM_S else "NOT met"
        print(f"  aim: open under {OPEN_AIM_S:g} s with {sizes.big:,} sessions: {verdict} ({opened:.3f} s)")


# -- entry point --------------------------------------------------------------------------------


async def run(sizes: Sizes, workdir: Path) -> int:
    report = Report("bench.sessions_engine")
    settings = settings_for_bench()
    started = now()

    store = await SessionStore.open(workdir / "appends", settings, clock=system_clock)
    try:
        await bench_append(store, sizes, report)

        build = now()
        template = await make_template(workdir / "template", settings, system_clock, sizes.history)
        flush_ms = settings.storage.sessions_flush_ms
        many_root, few_root = workdir / "many", workdir / "few"
        await asyncio.to_thread(
            write_home, many_root, template, [peer_key(i) for i in range(sizes.big)], flush_ms=flush_ms
        )
        await asyncio.to_thread(
            write_home, few_root, template, [peer_key(i) for i in range(sizes.small)], flush_ms=flush_ms
        )
        many = await SessionStore.open(many_root, settings, clock=system_clock)
        few = await SessionStore.open(few_root, settings, clock=system_clock)
        print(f"\n  (generated homes of {sizes.big:,} and {sizes.small} sessions, opened in {now() - build:.1f} s)")
        try:
            await bench_route(many, few, sizes, report)
        finally:
            await many.close()
            await few.close()

        await bench_rewrites(store, sizes, report)
    finally:
        await store.close()

    await bench_open(many_root, settings, sizes, report)
    print(f"\n  total {now() - started:.1f} s")
    return report.finish()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser("python -m bench.sessions_engine", "Session engine benchmarks.").parse_args(argv)
    sizes = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="neotask-bench-") as workdir:
        return asyncio.run(run(sizes, Path(workdir)))


if __name__ == "__main__":
    raise SystemExit(main())
