"""Several gateway processes on PostgreSQL (issue 28, ``neotask gateway --workers N``): store-only
``POST /v1/sessions/{key}/messages``, 64 wrk connections on 64 keys, against real daemon processes
started as a user would (``python -m gateway.cli gateway``):

- ``files``: the files backend, one process (the baseline);
- ``pg x1``: the postgres backend, one process;
- ``pg xN``: the postgres backend, ``--workers N`` (keys leased across processes, events relayed).

The three daemons run side by side (idle when not measured) on a durable PostgreSQL server this
script starts (fsync on, ``tests.support.postgres``); rounds alternate the cases so drift on a
noisy machine hits each. Per case: messages/s, p99, and CPU time per message of the gateway's
processes (supervisor and workers) and of the database's (postmaster and backends), from /proc.

``python -m bench.workers_ingest [--seconds S] [--rounds R] [--workers N]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.load import Phase, cpu_seconds, key_prefix, prime, wrk_load, wrk_path
from tests.support.postgres import PgServer, start_server, stop_server

REPO = Path(__file__).resolve().parents[1]
CONNECTIONS = KEYS = 64
_LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")


@dataclass
class Case:
    name: str
    home: Path
    config: Path
    workers: int
    proc: asyncio.subprocess.Process | None = None
    port: int = 0
    phases: list[tuple[Phase, float, float]] = field(default_factory=list)  # phase, gateway CPU s, db CPU s


def tree(pid: int) -> list[int]:
    """``pid`` and its children (a supervisor's workers)."""
    found = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def cpu_of(pids: list[int]) -> float:
    return sum(c for c in (cpu_seconds(p) for p in pids) if not math.isnan(c))


async def start(case: Case) -> None:
    argv = [sys.executable, "-m", "gateway.cli", "gateway", "--home", str(case.home), "--config", str(case.config)]
    argv += ["--port", "0", "--workers", str(case.workers)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
    env["NEOTASK_MEMORY__WATCH__POLL_SECONDS"] = "3600"
    case.proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=REPO
    )
    assert case.proc.stdout is not None
    async with asyncio.timeout(600):
        while True:
            line = (await case.proc.stdout.readline()).decode()
            if not line:
                raise RuntimeError(f"{case.name}: the gateway exited before listening")
            if match := _LISTENING.search(line):
                case.port = int(match.group(1))
                return


async def stop(case: Case) -> None:
    if case.proc is not None and case.proc.returncode is None:
        case.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(case.proc.communicate(), 60)
        if case.proc.returncode is None:
            case.proc.kill()


async def measure(case: Case, server: PgServer, seconds: float, tag: str) -> None:
    assert case.proc is not None
    gateway, database = tree(case.proc.pid), server.pids()
    before = cpu_of(gateway), cpu_of(database)
    phase = await wrk_load(
        case.port, case.name, connections=CONNECTIONS, keys=KEYS, prefix=key_prefix("w64x64"), seconds=seconds, tag=tag
    )
    after = cpu_of(gateway), cpu_of(server.pids())
    case.phases.append((phase, after[0] - before[0], after[1] - before[1]))


def summary(case: Case) -> tuple[float, float, float, float]:
    """Messages/s (pooled), worst p99, gateway and database CPU ms per message."""
    ok = sum(p.ok for p, _, _ in case.phases)
    elapsed = sum(p.elapsed for p, _, _ in case.phases)
    gw = sum(g for _, g, _ in case.phases) / ok * 1000 if ok else math.nan
    db = sum(d for _, _, d in case.phases) / ok * 1000 if ok else math.nan
    return ok / elapsed, max(p.p99 for p, _, _ in case.phases), gw, db


async def run(seconds: float, rounds: int, workers: int) -> None:
    if wrk_path() is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    server = await asyncio.to_thread(start_server, durable=True)
    tmp = Path(tempfile.mkdtemp(prefix="neotask-bench-workers-"))
    cases: list[Case] = []
    try:
        # a database each: a gateway that does not lease keys must not share keys with others
        one = {"storage": {"backend": "postgres", "postgres": {"dsn": await server.database("bench_one")}}}
        many = {"storage": {"backend": "postgres", "postgres": {"dsn": await server.database("bench_many")}}}
        for name, data, count in (("files x1", {}, 1), ("pg x1", one, 1), (f"pg x{workers}", many, workers)):
            folder = tmp / name.replace(" ", "-")
            folder.mkdir()
            config = folder / "config.yaml"
            config.write_text(yaml.safe_dump(data))
            cases.append(Case(name, folder / "home", config, count))
        for case in cases:  # one at a time: three imports at once take minutes on a small machine
            await start(case)
            print(f"  {case.name}: listening on port {case.port}", flush=True)
        prefix = key_prefix("w64x64")
        for case in cases:
            await prime(case.port, connections=CONNECTIONS, keys=KEYS, prefix=prefix)
        load = os.getloadavg()[0]
        for r in range(1, rounds + 1):
            for case in cases if r % 2 else reversed(cases):
                await measure(case, server, seconds, f"r{r}")
                phase, gw, db = case.phases[-1]
                print(
                    f"  round {r} {case.name:9} {phase.rate:8.0f} msg/s  p99 {phase.p99 * 1000:6.1f} ms"
                    f"  CPU gw {gw:5.2f} s db {db:5.2f} s  failed {phase.failed}"
                    + (f" {dict(phase.errors)}" if phase.errors else ""),
                    flush=True,
                )
        print(f"\n64 connections on 64 keys, store-only, {rounds}x{seconds:g} s per case, load {load:.1f}:")
        results = {case.name: summary(case) for case in cases}
        base = results["files x1"]
        one = results["pg x1"]
        for name, (rate, p99, gw, db) in results.items():
            print(
                f"  {name:9} {rate:8.0f} msg/s ({rate / base[0]:.2f}x files)  p99 {p99 * 1000:6.1f} ms"
                f"  CPU/msg {gw:.3f} ms gateway + {db:.3f} ms database = {gw + db:.3f} ms"
            )
        many = results[f"pg x{workers}"]
        print(
            f"  pg x{workers} vs pg x1: {many[0] / one[0]:.2f}x messages/s,"
            f" {(many[2] + many[3]) / (one[2] + one[3]):.2f}x CPU per message (target <= 1.2x)"
        )
        print(f"  pg x1 vs files x1: {one[0] / base[0]:.2f}x messages/s (target >= 0.7x)")
    finally:
        for case in cases:
            await stop(case)
        await asyncio.to_thread(stop_server, server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(run(args.seconds, args.rounds, args.workers))


if __name__ == "__main__":
    main()
