"""Store-only ingest, files backend vs PostgreSQL backend, in one run (the PostgreSQL backend's first figure).

``C`` concurrent writers, one key each (as 64 connections on 64 keys), each appending its messages
one after the other through the store (``append``: acknowledged once durable: the files store's
group-committed fdatasync, the database's COMMIT with fsync on). The two backends are measured in
alternating rounds and the medians compared. For each: messages/s, p99 of one append, and CPU time
per message of the store's process and, for PostgreSQL, of the server's processes (postmaster and
backends, from /proc). The target: postgres ≥ 0.7x the files backend's messages/s.

No HTTP here: the daemon cannot serve the postgres backend yet (its wiring follows the store port).
``python -m bench.postgres_ingest [--quick] [--writers 64] [--messages 200] [--rounds 3]``
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Report, median, parser, percentile, print_table, section
from config.clock import system_clock
from config.settings import Settings
from sessions.files.store import SessionStore
from sessions.postgres.store import PgStore
from sessions.protocol import RunStore
from sessions.records import NewMessage, RunStart, TaskKey
from tests.support.postgres import PgServer, empty_database, find_binaries, start_server, stop_server

PG_TARGET = 0.7  # postgres messages/s at least this share of the files backend's
TICK = os.sysconf("SC_CLK_TCK")
TEXT = "a message of a plausible length for a chat line, with a few more words to make it so " * 2


@dataclass(frozen=True)
class Round:
    backend: str
    messages: int
    seconds: float
    p99_ms: float
    store_cpu_s: float
    db_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def cpu_ms(self, which: str) -> float:
        value = {"store": self.store_cpu_s, "db": self.db_cpu_s, "all": self.store_cpu_s + self.db_cpu_s}[which]
        return value * 1000 / self.messages


def _cpu_of(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


async def _drive(store: RunStore, writers: int, messages: int, backend: str, server: PgServer | None) -> Round:
    runs = []
    for i in range(writers):
        key = f"agent:main:bench-{i}"
        runs.append(
            await store.start_run(
                RunStart(
                    key, agent_id="main", chat_type="direct", channel=None, task_key=TaskKey("agent", key, user="b")
                )
            )
        )
    latencies: list[float] = []

    async def writer(run_index: int) -> None:
        run = runs[run_index]
        for n in range(messages):
            began = time.perf_counter()
            await store.append(run, NewMessage(role="user", content=f"{n} {TEXT}"))
            latencies.append(time.perf_counter() - began)

    pids = server.pids() if server is not None else []
    cpu0, db0, t0 = time.process_time(), _cpu_of(pids), time.perf_counter()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    seconds = time.perf_counter() - t0
    store_cpu, db_cpu = time.process_time() - cpu0, _cpu_of(pids) - db0
    return Round(backend, writers * messages, seconds, percentile(latencies, 99) * 1000, store_cpu, db_cpu)


async def _files_round(settings: Settings, writers: int, messages: int) -> Round:
    home = Path(tempfile.mkdtemp(prefix="neotask-bench-files-"))
    try:
        store = await SessionStore.open(home, settings, clock=system_clock)
        try:
            return await _drive(store, writers, messages, "files", None)
        finally:
            await store.close()
    finally:
        await asyncio.to_thread(shutil.rmtree, home, True)


async def _postgres_round(settings: Settings, server: PgServer, writers: int, messages: int) -> Round:
    dsn = await server.database("bench")
    await empty_database(dsn)
    store = await PgStore.open(settings, dsn=dsn, clock=system_clock, pool_size=settings.storage.postgres.pool_size)
    try:
        return await _drive(store, writers, messages, "postgres", server)
    finally:
        await store.close()


async def _bench(writers: int, messages: int, rounds: int, server: PgServer) -> list[Round]:
    settings = Settings()
    results = []
    for _ in range(rounds):  # alternated: the machine's noise falls on both
        results.append(await _files_round(settings, writers, messages))
        results.append(await _postgres_round(settings, server, writers, messages))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args_parser = parser("bench.postgres_ingest", __doc__ or "")
    args_parser.add_argument("--writers", type=int, default=64)
    args_parser.add_argument("--messages", type=int, default=200, help="per writer and round")
    args_parser.add_argument("--rounds", type=int, default=3)
    args = args_parser.parse_args(argv)
    writers, messages, rounds = (8, 20, 1) if args.quick else (args.writers, args.messages, args.rounds)
    report = Report("postgres_ingest")
    if find_binaries() is None:
        print("PostgreSQL binaries not found (apt-get install postgresql, or `make postgres`): skipped")
        return 0
    server = start_server(durable=True)
    try:
        print(f"PostgreSQL started in {server.started_s:.2f} s (fsync on); {writers} writers x {messages} messages,"
              f" {rounds} round(s) each, alternated")  # fmt: skip
        results = asyncio.run(_bench(writers, messages, rounds, server))
    finally:
        stop_server(server)
    section("store-only appends (medians of the rounds)")
    rows = []
    medians: dict[str, dict[str, float]] = {}
    for backend in ("files", "postgres"):
        mine = [r for r in results if r.backend == backend]
        medians[backend] = {
            "rate": median([r.rate for r in mine]),
            "p99": median([r.p99_ms for r in mine]),
            "store": median([r.cpu_ms("store") for r in mine]),
            "db": median([r.cpu_ms("db") for r in mine]),
            "all": median([r.cpu_ms("all") for r in mine]),
        }
        m = medians[backend]
        rows.append([backend, f"{m['rate']:.0f}", f"{m['p99']:.1f}", f"{m['store']:.3f}", f"{m['db']:.3f}",
                     f"{m['all']:.3f}"])  # fmt: skip
    print_table(["backend", "messages/s", "p99 ms", "CPU ms/msg store", "CPU ms/msg db", "CPU ms/msg total"], rows)
    files, pg = medians["files"], medians["postgres"]
    rate, cpu = pg["rate"] / files["rate"], pg["all"] / files["all"]
    print(f"\n  postgres/files: messages/s {rate:.2f}x, CPU per message {cpu:.2f}x")
    report.check("files messages/s ÷ postgres messages/s", files["rate"] / pg["rate"], 1 / PG_TARGET)
    return report.finish()


if __name__ == "__main__":
    raise SystemExit(main())
