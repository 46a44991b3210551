"""Opening a home made the way users make one.

``bench.sessions_engine`` opens a synthetic home (one run cloned on disk). This one builds the
home through the HTTP API of a real daemon (``neotask gateway``): every key gets a few messages,
one key in ten a longer chat and a ``/compact``, one in ten is completed and started again (a run
that inherits), and a cleanup with ``retention_days: 0`` archives the completed runs. The daemon is
stopped with SIGTERM, then the bench times, alternating:

- a plain Python loop reading the files the store reads (sessions.json, and metadata.json,
  messages.jsonl, current.jsonl, summaries.jsonl of every active run): the baseline;
- ``SessionStore.open`` (recovery included): target < 2 s and ≤ 3x the baseline;
- (information) a restart of the daemon until ``/healthz`` answers.

``python -m bench.real_home [--quick] [--sessions N] [--keep DIR]``: ``--keep`` builds the home in
DIR once and reuses it on later runs (building 10,000 sessions takes minutes).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import aiohttp

from bench.common import Report, fmt_seconds, median, parser, print_table, ratio, section
from config.clock import system_clock
from config.loader import build_settings, load_defaults
from home import layout
from sessions.files.store import SessionStore

OPEN_LIMIT = 3.0
OPEN_AIM_S = 2.0
CONCURRENCY = 32
REPO = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"listening on (http://\S+) ")
# retention 0: the one cleanup, before the other sessions exist, archives the completed runs
BUILD_CONFIG = "cleanup:\n  retention_days: 0\nmemory:\n  watch:\n    poll_seconds: 3600\n"


def key(i: int) -> str:
    return f"agent:main:telegram:dm:user{i}"


def path(i: int, tail: str) -> str:
    return f"/v1/sessions/{quote(key(i), safe='')}/{tail}"


class Daemon:
    """``neotask gateway`` on a free port, in its own process."""

    def __init__(self, home: Path, config: Path | None) -> None:
        self.home, self.config = home, config
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> float:
        """Seconds from exec until the daemon answers /healthz."""
        args = [sys.executable, "-m", "gateway.cli", "gateway", "--home", str(self.home), "--port", "0"]
        if self.config is not None:
            args += ["--config", str(self.config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
        started = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=REPO
        )
        assert self.proc.stdout is not None
        async with asyncio.timeout(300):
            while not self.url:
                line = (await self.proc.stdout.readline()).decode()
                if not line:
                    raise RuntimeError("the daemon exited before listening")
                if match := _LISTENING.search(line):
                    self.url = match.group(1)
            async with aiohttp.ClientSession() as session, session.get(self.url + "/healthz") as resp:
                resp.raise_for_status()
        return time.perf_counter() - started

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.communicate(), 120)


async def build(home: Path, sessions: int) -> dict[str, int]:
    """Make the home through the API; what was made."""
    config = home.parent / "build-config.yaml"
    config.write_text(BUILD_CONFIG)
    daemon = Daemon(home, config)
    await daemon.start()
    made = {"messages": 0, "compactions": 0, "completed": 0, "archived": 0}
    gate = asyncio.Semaphore(CONCURRENCY)
    try:
        async with aiohttp.ClientSession(daemon.url, timeout=aiohttp.ClientTimeout(total=600)) as http:

            async def call(route: str, body: dict[str, object] | None = None) -> dict[str, object]:
                async with http.post(route, json=body) as resp:
                    data: dict[str, object] = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"POST {route} answered {resp.status}: {data}")
                    return data

            async def message(i: int, n: int) -> None:
                role = "user" if n % 2 == 0 else "assistant"
                text = f"question {n}: what about the plan? " * 3 if role == "user" else f"answer {n}: next step. " * 8
                await call(path(i, "messages"), {"role": role, "content": text})
                made["messages"] += 1

            async def first_run(i: int) -> None:  # completed, then archived by the cleanup
                async with gate:
                    for n in range(3):
                        await message(i, n)
                    await call(path(i, "complete"))
                    made["completed"] += 1

            async def one(i: int) -> None:
                async with gate:
                    turns = 20 if i % 10 == 3 else 2 if i % 10 == 7 else 3
                    for n in range(turns):  # for i % 10 == 7, a run that inherits from the archived one
                        await message(i, n)
                    if i % 10 == 3:
                        answer = await call(path(i, "commands"), {"command": "/compact"})
                        events = answer["events"]
                        assert isinstance(events, list)
                        made["compactions"] += any(e.get("type") == "compaction" for e in events)
                    if i % 10 == 5:  # completed and kept in completed/, then a new run
                        await call(path(i, "complete"))
                        made["completed"] += 1
                        for n in range(2):
                            await message(i, n)

            started = time.perf_counter()
            await asyncio.gather(*(first_run(i) for i in range(7, sessions, 10)))
            cleanup = await call("/v1/admin/cleanup", {"dry_run": False})
            actions = cleanup.get("actions")
            made["archived"] = sum(1 for a in actions if "archive" in str(a)) if isinstance(actions, list) else 0
            print(f"  completed and archived {made['archived']:,} runs ({time.perf_counter() - started:.0f} s)")
            for chunk in range(0, sessions, 1000):
                await asyncio.gather(*(one(i) for i in range(chunk, min(chunk + 1000, sessions))))
                print(f"  built {min(chunk + 1000, sessions):,} sessions ({time.perf_counter() - started:.0f} s)",
                      flush=True)  # fmt: skip
    finally:
        await daemon.stop()
    return made


def plain_read(contexts: Path) -> int:
    """The baseline: read sessions.json and the files of every active run the store looks at."""
    total = 0
    with open(contexts / "sessions.json", "rb") as handle:
        total += len(handle.read())
    for status in ("running", "paused"):
        with os.scandir(contexts / status) as folders:
            for folder in folders:
                if not folder.is_dir():
                    continue
                for name in (layout.METADATA, layout.MESSAGES, layout.CURRENT, layout.SUMMARIES):
                    try:
                        with open(os.path.join(folder.path, name), "rb") as handle:
                            total += len(handle.read())
                    except FileNotFoundError:
                        pass
    return total


async def timed_open(root: Path) -> tuple[float, int]:
    settings = build_settings(load_defaults())
    start = time.perf_counter()
    store = await SessionStore.open(root, settings, clock=system_clock)
    elapsed = time.perf_counter() - start
    active = sum(1 for _ in store.active_runs())
    await store.close()
    return elapsed, active


def describe(root: Path) -> str:
    contexts = root / "contexts"
    counts = {s: sum(1 for _ in (contexts / s).iterdir()) for s in ("running", "paused", "completed")}
    archived = sum(1 for _ in (contexts / "archive").glob("*.tar.gz")) if (contexts / "archive").exists() else 0
    # summaries.jsonl exists from a run's start (seed layout): a compacted run has a line in it
    summaries = sum(1 for p in (contexts / "running").glob("*/summaries.jsonl") if p.stat().st_size)
    size = (contexts / "sessions.json").stat().st_size / 1e6
    return (f"{counts['running']:,} running runs ({summaries:,} compacted), {counts['completed']:,} completed,"
            f" {archived:,} archived; sessions.json {size:.1f} MB")  # fmt: skip


async def run(root: Path, sessions: int, repeats: int, report: Report, *, restart: bool = True) -> None:
    if not (root / "contexts" / "sessions.json").exists():
        section(f"building a home of {sessions:,} sessions through the API of a real daemon")
        started = time.perf_counter()
        made = await build(root, sessions)
        print(f"  made {made} in {time.perf_counter() - started:.0f} s")
    print(f"  home: {describe(root)}")

    section(f"open it: SessionStore.open vs a plain read ({repeats} of each after a warm-up, alternating)")
    contexts = root / "contexts"
    plain_read(contexts)
    _, active = await timed_open(root)
    times: dict[str, list[float]] = {"plain": [], "open": []}
    for i in range(repeats):
        for name in ("plain", "open") if i % 2 == 0 else ("open", "plain"):
            if name == "plain":
                start = time.perf_counter()
                await asyncio.to_thread(plain_read, contexts)
                times["plain"].append(time.perf_counter() - start)
            else:
                times["open"].append((await timed_open(root))[0])
    base = median(times["plain"])
    rows = [
        [label, fmt_seconds(median(v)), fmt_seconds(min(v)), fmt_seconds(max(v)), f"{ratio(median(v), base):.2f}x"]
        for label, v in (("plain Python loop (baseline)", times["plain"]), ("SessionStore.open", times["open"]))
    ]
    print_table(["", "median", "min", "max", "vs baseline"], rows)
    print(f"  each open: {', '.join(f'{t:.2f} s' for t in times['open'])}; {active:,} active runs")
    opened = median(times["open"])
    report.check(
        f"SessionStore.open / plain read, {active:,} sessions", ratio(opened, median(times["plain"])), OPEN_LIMIT
    )
    report.check(f"SessionStore.open of {active:,} sessions, median", opened, OPEN_AIM_S, unit=" s")

    if not restart:
        return
    section("restart the daemon until /healthz answers (information: includes Python start-up and imports)")
    daemon = Daemon(root, None)
    try:
        print(f"  {await daemon.start():.2f} s")
    finally:
        await daemon.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("python -m bench.real_home", "Open a home built through the API.")
    p.add_argument("--sessions", type=int, default=None, help="sessions to build (10,000; --quick 100)")
    p.add_argument("--keep", type=Path, default=None, help="build the home here once and reuse it")
    args = p.parse_args(argv)
    sessions = args.sessions or (100 if args.quick else 10_000)
    repeats = 2 if args.quick else 5
    report = Report("bench.real_home")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args.keep / "home", sessions, repeats, report, restart=not args.quick))
    else:
        with tempfile.TemporaryDirectory(prefix="neotask-bench-") as tmp:
            asyncio.run(run(Path(tmp) / "home", sessions, repeats, report, restart=not args.quick))
    return report.finish()


if __name__ == "__main__":
    raise SystemExit(main())
