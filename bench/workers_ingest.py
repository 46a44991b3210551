"""Several gateway processes on PostgreSQL (``neotask gateway --workers N``): store-only
``POST /v1/sessions/{key}/messages``, 64 wrk connections on 64 keys, against real daemon processes
started as a user would (``python -m gateway.cli gateway``):

- ``files``: the files backend, one process (the baseline);
- ``pg x1``: the postgres backend, one process;
- ``pg xN``: the postgres backend, ``--workers N`` (keys leased across processes, events relayed);
- ``pg x1 <64/N>c``: the postgres backend, one process, under 64/N connections: the load each of
  the N processes has. With the same 64 connections split between N processes, each process's
  group commit gathers 1/N of the messages per round trip, and a statement's fixed cost is shared
  by fewer messages; this case has that too, without any sharing, so pg xN against it is what
  sharing costs at equal load per process (what N processes on N cores under N times the load
  would show);
- ``pg x1 paced``, ``pg x1 <64/N>c paced`` and ``pg xN paced``: the same daemons, each wrk connection waiting
  ``--pause-ms`` (30) before each request, so 32 connections bring about 950 msg/s and 64 about
  1,900: the same load in all (64 connections on one process or on N) and the same load per
  process (32 on one, 64 on two), both *below* what the machine takes. Under the unpaced load the
  N processes, their database backends and wrk outnumber the two cores and preempt each other
  (about 5 times the involuntary context switches per message of one process), which this comparison
  leaves out: it is the one that predicts N processes on N cores;
- ``pg Nx1 apart`` (and paced): N one-process gateways that share nothing, each on a database of
  its own (``pg x1 <64/N>c`` and N - 1 more like it), each loaded at the same time by a wrk of its
  own with 64/N connections: the same total load as pg xN, and as many processes, without the
  leases, the events or a database in common. Against pg x1 it is what N gateway processes with
  nothing in common cost on this machine; pg xN against it is what the sharing costs when the
  processes compete for the same cores;
- ``echo x1`` and ``echo xN``: the floor, no Neotask at all (``bench.echo_server``: a bare aiohttp
  handler that decodes the body and answers a small JSON ack, in one process, or in N behind a
  supervisor on one ``SO_REUSEPORT`` port as the gateway's workers): what this machine charges
  for a second process when there is nothing to share.

Every message of these cases carries a ``client_message_id`` of its own (the retry-safe way to
post, what every channel does); ``files x1 no id``, ``pg x1 no id`` and ``pg xN no id`` post the
same without one, on the same daemons, and the report compares each case with its ``no id`` twin:
messages/s, CPU per message and, on PostgreSQL, database commits per message (the
``pg_stat_database.xact_commit`` delta of the case's database over the messages acknowledged: every
statement outside a transaction is one). ``--cases`` measures only the named cases (and their
daemons), e.g. ``--cases "files x1,files x1 no id,pg x1,pg x1 no id"``.

The daemons and the two echo servers run side by side (idle when not measured), the daemons
on a durable PostgreSQL server this script starts (fsync on, ``tests.support.postgres``); rounds
alternate the cases so drift on a noisy machine hits each. Per case: messages/s, p99, and CPU time
per message of the server's processes (supervisor and workers) and, for the daemons, of the
database's (postmaster and backends), from /proc. The pg xN / pg x1 CPU ratio is printed beside
the echo's, and their quotient: how much of pg's ratio is beyond the machine's floor.

``python -m bench.workers_ingest [--seconds S] [--rounds R] [--workers N] [--pause-ms MS] [--cases A,B]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import yaml

from bench.load import Phase, cpu_seconds, key_prefix, prime, wrk_load, wrk_path
from tests.support.postgres import PgServer, start_server, stop_server

REPO = Path(__file__).resolve().parents[1]
CONNECTIONS = 64
# the paced cases: 32 connections each waiting 30 ms before each request give one process about
# 950 msg/s and two about 1,800: below what this 2-core machine takes (4,500-5,000)
PAUSE_MS = 30
_LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")


@dataclass
class Case:
    name: str
    argv: list[str]  # after the interpreter
    database: bool = True  # charged with the database's CPU (the echo is not: it has none)
    connections: int = CONNECTIONS  # wrk's connections, each on a key of its own
    pause_ms: int = 0  # each connection waits this long before each request: a load below saturation
    server: Case | None = None  # measured on another case's daemon (a paced case)
    apart: list[Case] = field(default_factory=list)  # measured on these daemons at once, a wrk each
    ids: bool = True  # each message with a client_message_id of its own
    repo: Path = REPO  # the checkout the daemon runs (``--baseline``: another one, measured beside this)
    datname: str | None = None  # the daemon's PostgreSQL database (its commits are counted)
    proc: asyncio.subprocess.Process | None = None
    port: int = 0
    # phase, gateway CPU s, db CPU s, database commits (NaN: not counted)
    phases: list[tuple[Phase, float, float, float]] = field(default_factory=list)


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


def gateway_case(name: str, folder: Path, data: Mapping[str, object], workers: int) -> Case:
    folder.mkdir()
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    argv = ["-m", "gateway.cli", "gateway", "--home", str(folder / "home"), "--config", str(config)]
    return Case(name, [*argv, "--port", "0", "--workers", str(workers)])


def share_name(workers: int) -> str:
    """The case of one process under the load each of ``workers`` processes has."""
    return f"pg x1 {CONNECTIONS // workers}c"


def apart_name(workers: int) -> str:
    """The case of ``workers`` one-process gateways that share nothing, loaded at once."""
    return f"pg {workers}x1 apart"


def echo_case(workers: int) -> Case:
    return Case(f"echo x{workers}", ["-m", "bench.echo_server", "--port", "0", "--workers", str(workers)], False)


async def start(case: Case) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
    env["NEOTASK_MEMORY__WATCH__POLL_SECONDS"] = "3600"
    env["PYTHONPATH"] = str(case.repo)
    case.proc = await asyncio.create_subprocess_exec(
        sys.executable, *case.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
        cwd=case.repo,
    )  # fmt: skip
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


async def start_all(daemons: Sequence[Case]) -> None:
    """Each daemon started and listening, one at a time: several imports at once take minutes on a
    small machine."""
    for case in daemons:
        await start(case)
        print(f"  {case.name}: listening on port {case.port}", flush=True)


async def stop_all(daemons: Sequence[Case], server: PgServer) -> None:
    """Each daemon stopped, then the PostgreSQL server."""
    for case in daemons:
        await stop(case)
    await asyncio.to_thread(stop_server, server)


def arguments(description: str | None) -> argparse.ArgumentParser:
    """The options of a benchmark that measures each case for ``--seconds``, ``--rounds`` times,
    with ``--workers`` gateway processes in the case of several."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    return parser


DRAIN_TIMEOUT_S = 60.0  # a history index still behind after this is reported as it is
STATS_SETTLE_S = 1.5  # a busy backend reports its counts to pg_stat_database at most once a second


async def commits(server: PgServer, datnames: list[str]) -> float:
    """Transactions committed so far in ``datnames`` (NaN for none), once the backends reported them."""
    if not datnames:
        return math.nan
    await asyncio.sleep(STATS_SETTLE_S)
    admin = await asyncpg.connect(server.dsn())
    try:
        value = await admin.fetchval(
            "SELECT sum(xact_commit) FROM pg_stat_database WHERE datname = ANY($1::text[])", datnames
        )
    finally:
        await admin.close()
    return float(value or 0)


async def history_behind(server: PgServer, datname: str) -> int:
    """Messages stored in ``datname`` that its history index does not hold yet."""
    conn = await asyncpg.connect(server.dsn(datname))
    try:
        return int(await conn.fetchval("SELECT (SELECT count(*) FROM messages) - (SELECT count(*) FROM history)"))
    finally:
        await conn.close()


async def caught_up(server: PgServer, datname: str, timeout_s: float = DRAIN_TIMEOUT_S) -> tuple[int, float]:
    """Wait until the history index of ``datname`` holds every stored message (``timeout_s`` at
    most): the messages behind when asked, and the seconds it took. A phase's messages are counted
    served once the work they caused is done: a process whose index fell behind the load did not
    serve them at the rate its acknowledgements suggest."""
    began = time.perf_counter()
    behind = left = await history_behind(server, datname)
    while left > 0 and time.perf_counter() - began < timeout_s:
        await asyncio.sleep(0.05)
        left = await history_behind(server, datname)
    return behind, time.perf_counter() - began


async def measure(case: Case, server: PgServer, seconds: float, tag: str) -> None:
    daemons = case.apart or [case.server or case]
    gateway = [pid for daemon in daemons if daemon.proc is not None for pid in tree(daemon.proc.pid)]
    database = server.pids() if case.database else []
    datnames = [daemon.datname for daemon in daemons if daemon.datname]
    committed = await commits(server, datnames)
    before = cpu_of(gateway), cpu_of(database)
    tag = f"{tag}-{case.name.replace(' ', '-')}"  # ids unique per case: no case repeats another's
    async with asyncio.TaskGroup() as group:  # one wrk failing stops the others
        runs = [
            group.create_task(wrk_load(
                daemon.port, case.name, connections=case.connections, keys=case.connections,
                prefix=key_prefix("w64x64"), seconds=seconds, tag=tag, pause_ms=case.pause_ms, ids=case.ids,
            ))
            for daemon in daemons
        ]  # fmt: skip
    phases = [run.result() for run in runs]
    after = cpu_of(gateway), cpu_of(server.pids() if case.database else [])
    # the CPU is read before the commits settle; wrk's late requests (in flight at its stop) count
    # in the commits, not in the messages: a slight over-count
    case.phases.append(
        (together(phases), after[0] - before[0], after[1] - before[1], await commits(server, datnames) - committed)
    )


def together(phases: list[Phase]) -> Phase:
    """Phases run at the same time (a wrk per daemon) as one: messages added, the slowest p99."""
    if len(phases) == 1:
        return phases[0]
    ok = sum(p.ok for p in phases)
    errors: collections.Counter[str] = collections.Counter()
    for p in phases:
        errors.update(p.errors)
    return Phase(
        phases[0].name, ok=ok, failed=sum(p.failed for p in phases),
        elapsed=statistics.fmean(p.elapsed for p in phases), p50=max(p.p50 for p in phases),
        p99=max(p.p99 for p in phases), mean=sum(p.mean * p.ok for p in phases) / ok if ok else math.nan,
        errors=errors, in_flight_at_stop=sum(p.in_flight_at_stop for p in phases),
    )  # fmt: skip


def summary(case: Case) -> tuple[float, float, float, float]:
    """Messages/s (pooled), worst p99, gateway and database CPU ms per message."""
    ok = sum(p.ok for p, _, _, _ in case.phases)
    elapsed = sum(p.elapsed for p, _, _, _ in case.phases)
    gw = sum(g for _, g, _, _ in case.phases) / ok * 1000 if ok else math.nan
    db = sum(d for _, _, d, _ in case.phases) / ok * 1000 if ok else math.nan
    return ok / elapsed, max(p.p99 for p, _, _, _ in case.phases), gw, db


def commits_per_message(case: Case) -> float:
    ok = sum(p.ok for p, _, _, _ in case.phases)
    return sum(c for _, _, _, c in case.phases) / ok if ok else math.nan


def id_report(cases: list[Case], results: Mapping[str, tuple[float, float, float, float]]) -> list[str]:
    """Each case that sends ids against its ``no id`` twin: messages/s, CPU and commits per message."""
    by_name = {case.name: case for case in cases}
    lines = []
    for name, (rate, _, gw, db) in results.items():
        twin = results.get(f"{name} no id")
        if twin is None or not twin[0]:
            continue
        cpu, twin_cpu = gw + db, twin[2] + twin[3]
        line = (
            f"  {name}: with ids {rate:.0f} msg/s, without {twin[0]:.0f}: {rate / twin[0]:.2f}x messages/s,"
            f" {cpu / twin_cpu:.2f}x CPU per message (target <= 1.2x)"
        )
        mine, theirs = commits_per_message(by_name[name]), commits_per_message(by_name[f"{name} no id"])
        if not math.isnan(mine) and theirs > 0:
            line += f"; {mine:.3f} vs {theirs:.3f} commits per message: {mine / theirs:.2f}x (target <= 1.2x)"
        lines.append(line)
    return lines


def report(results: dict[str, tuple[float, float, float, float]], workers: int) -> list[str]:
    """The table (a ``summary`` per case) and the ratios: pg xN / pg x1 CPU per message beside the
    echo's (the machine's floor), and their quotient (the part of pg's ratio beyond the floor)."""
    nan = (math.nan,) * 4
    base, one, many = results.get("files x1", nan), results.get("pg x1", nan), results.get(f"pg x{workers}", nan)
    lines = []
    for name, (rate, p99, gw, db) in results.items():
        cpu = (
            f"{gw:.3f} ms"
            if name.startswith("echo")
            else f"{gw:.3f} ms gateway + {db:.3f} ms database = {gw + db:.3f} ms"
        )
        lines.append(
            f"  {name:9} {rate:8.0f} msg/s ({rate / base[0]:.2f}x files)  p99 {p99 * 1000:6.1f} ms  CPU/msg {cpu}"
        )
    pg = (many[2] + many[3]) / (one[2] + one[3])
    lines.append(
        f"  pg x{workers} vs pg x1: {many[0] / one[0]:.2f}x messages/s, {pg:.2f}x CPU per message (target <= 1.2x)"
    )
    lines.append(f"  pg x1 vs files x1: {one[0] / base[0]:.2f}x messages/s (target >= 0.7x)")
    share = results.get(share_name(workers))
    if share is not None:
        equal = (many[2] + many[3]) / (share[2] + share[3])
        lines.append(
            f"  pg x{workers} vs pg x1 with {CONNECTIONS // workers} connections (the load each of the {workers}"
            f" processes has): {equal:.2f}x CPU per message (the cost of sharing at equal load per process)"
        )
    for suffix, how in (("", ""), (" paced", "paced, ")):
        apart, together_ = results.get(apart_name(workers) + suffix), results.get(f"pg x{workers}{suffix}")
        single = results.get(f"pg x1{suffix}")
        if apart is None or together_ is None or single is None:
            continue
        if not (apart[2] + apart[3] > 0 and single[2] + single[3] > 0):
            continue
        spent = apart[2] + apart[3]
        lines.append(
            f"  {how}{workers} one-process gateways that share nothing ({apart_name(workers)}, a database and a wrk"
            f" of {CONNECTIONS // workers} connections each, at once): {spent / (single[2] + single[3]):.2f}x"
            f" the CPU per message of pg x1 (what {workers} processes with nothing in common cost here); pg x{workers}"
            f" {(together_[2] + together_[3]) / spent:.2f}x theirs (what sharing costs on these cores)"
        )
    paced_many = results.get(f"pg x{workers} paced")
    for name, what in (
        ("pg x1 paced", "the same load in all"),
        (f"{share_name(workers)} paced", "the same load per process"),
    ):
        paced_one = results.get(name)
        if paced_one is not None and paced_many is not None and paced_one[0] > 0 and paced_one[2] + paced_one[3] > 0:
            paced = (paced_many[2] + paced_many[3]) / (paced_one[2] + paced_one[3])
            lines.append(
                f"  paced, {what} (below what the machine takes): pg x{workers} {paced_many[0] / paced_one[0]:.2f}x"
                f" the messages/s of {name}, {paced:.2f}x its CPU per message (target <= 1.2x)"
            )
    echo_one, echo_many = results.get("echo x1", nan), results.get(f"echo x{workers}", nan)
    floor = echo_many[2] / echo_one[2] if echo_one[2] > 0 else math.nan
    lines.append(
        f"  CPU per message, x{workers} / x1: pg {pg:.2f}x, echo {floor:.2f}x (the machine's floor);"
        f" pg / echo {pg / floor:.2f}x (beyond the floor)"
    )
    return lines


async def run(
    seconds: float,
    rounds: int,
    workers: int,
    pause_ms: int = PAUSE_MS,
    only: frozenset[str] = frozenset(),
    baseline: Path | None = None,
) -> None:
    if wrk_path() is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    server = await asyncio.to_thread(start_server, durable=True)
    tmp = Path(tempfile.mkdtemp(prefix="neotask-bench-workers-"))
    cases: list[Case] = []
    daemons: list[Case] = []
    try:
        # a database each: a gateway that does not lease keys must not share keys with others
        one = {"storage": {"backend": "postgres", "postgres": {"dsn": await server.database("bench_one")}}}
        many = {"storage": {"backend": "postgres", "postgres": {"dsn": await server.database("bench_many")}}}
        part = {"storage": {"backend": "postgres", "postgres": {"dsn": await server.database("bench_part")}}}
        for name, data, count, datname in (
            ("files x1", {}, 1, None), ("pg x1", one, 1, "bench_one"), (f"pg x{workers}", many, workers, "bench_many"),
        ):  # fmt: skip
            cases.append(gateway_case(name, tmp / name.replace(" ", "-"), data, count))
            cases[-1].datname = datname
        # one process under the load each of the N has: smaller group-commit batches, no sharing
        cases.append(gateway_case(share_name(workers), tmp / "pg-part", part, 1))
        cases[-1].datname = "bench_part"
        cases[-1].connections = CONNECTIONS // workers
        # N - 1 more such gateways, a database each: with the one above, N processes sharing nothing
        others = []
        for i in range(2, workers + 1):
            dsn = await server.database(f"bench_part{i}")
            others.append(gateway_case(f"{share_name(workers)} #{i}", tmp / f"pg-part{i}",
                                       {"storage": {"backend": "postgres", "postgres": {"dsn": dsn}}}, 1))  # fmt: skip
            others[-1].connections = CONNECTIONS // workers
            others[-1].datname = f"bench_part{i}"
        cases += [echo_case(1), echo_case(workers)]
        daemons = cases + others
        apart = [cases[3], *others]
        # the same messages without a client_message_id, on the same daemons (the twins of the ids)
        cases += [Case(f"{main.name} no id", [], ids=False, server=main) for main in cases[:3]]
        if baseline is not None:  # files x1 and pg x1 as another checkout runs them, with and without ids
            before = {"storage": {"backend": "postgres", "postgres": {"dsn": await server.database("bench_before")}}}
            for name, data, datname in (("files x1 before", {}, None), ("pg x1 before", before, "bench_before")):
                old = gateway_case(name, tmp / name.replace(" ", "-"), data, 1)
                old.repo, old.datname = baseline, datname
                daemons.append(old)
                cases += [old, Case(f"{name} no id", [], ids=False, server=old)]
        cases.append(Case(apart_name(workers), [], connections=CONNECTIONS // workers, apart=apart))
        if pause_ms:  # on the daemons of pg x1, pg xN and pg x1 under the load of one of the N
            one_case, many_case, part_case = cases[1], cases[2], cases[3]
            cases.append(Case(f"{one_case.name} paced", [], pause_ms=pause_ms, server=one_case))
            cases.append(Case(f"{part_case.name} paced", [], connections=part_case.connections, pause_ms=pause_ms,
                              server=part_case))  # fmt: skip
            cases.append(Case(f"{many_case.name} paced", [], pause_ms=pause_ms, server=many_case))
            cases.append(Case(f"{apart_name(workers)} paced", [], connections=part_case.connections,
                              pause_ms=pause_ms, apart=apart))  # fmt: skip
        if only:
            unknown = only - {case.name for case in cases}
            if unknown:
                raise SystemExit(f"--cases: no case {', '.join(sorted(unknown))}; the cases: {[c.name for c in cases]}")
            cases = [case for case in cases if case.name in only]
            needed = {id(d) for case in cases for d in (case.apart or [case.server or case])}
            daemons = [daemon for daemon in daemons if id(daemon) in needed]
        await start_all(daemons)
        prefix = key_prefix("w64x64")
        for case in daemons:
            await prime(case.port, connections=case.connections, keys=case.connections, prefix=prefix)
        load = os.getloadavg()[0]
        for r in range(1, rounds + 1):
            for case in cases if r % 2 else reversed(cases):
                await measure(case, server, seconds, f"r{r}")
                phase, gw, db, committed = case.phases[-1]
                print(
                    f"  round {r} {case.name:9} {phase.rate:8.0f} msg/s  p99 {phase.p99 * 1000:6.1f} ms"
                    f"  CPU gw {gw:5.2f} s db {db:5.2f} s  commits/msg {committed / max(phase.ok, 1):.3f}"
                    f"  failed {phase.failed}" + (f" {dict(phase.errors)}" if phase.errors else ""),
                    flush=True,
                )
        print(
            f"\n{CONNECTIONS} connections on {CONNECTIONS} keys ({CONNECTIONS // workers} for {share_name(workers)}),"
            f" store-only, {rounds}x{seconds:g} s per case, load {load:.1f}:"
        )
        results = {case.name: summary(case) for case in cases}
        print("\n".join(report(results, workers)))
        print("\nWith a client_message_id on every message vs the same without:")
        print("\n".join(id_report(cases, results)))
    finally:
        await stop_all(daemons, server)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pause-ms", type=int, default=PAUSE_MS, help="the paced cases' pause; 0: no paced cases")
    parser.add_argument("--cases", default="", help="measure only these cases (comma-separated names)")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout: its files x1 and pg x1 are measured too ('... before')"
    )
    args = parser.parse_args()
    if not 2 <= args.workers <= CONNECTIONS:
        parser.error(f"--workers must be between 2 and {CONNECTIONS} (the cases compare N processes with one)")
    only = frozenset(name.strip() for name in args.cases.split(",") if name.strip())
    asyncio.run(run(args.seconds, args.rounds, args.workers, args.pause_ms, only, args.baseline))


if __name__ == "__main__":
    main()
