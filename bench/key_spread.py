"""Keys that move between workers (``neotask gateway --workers N`` on PostgreSQL): store-only
``POST /v1/sessions/{key}/messages``, 64 wrk connections on 64 keys, two loads on each daemon:

- ``affine``: connection i posts to key i only; the kernel (``SO_REUSEPORT``) gives each connection
  to one worker, so each key's requests come to one worker (``bench.workers_ingest``'s load);
- ``spread``: every request goes to a key drawn at random, so each key's requests come over every
  connection, to every worker: what a load balancer in front, or many short client connections,
  bring.

Daemons: ``pg x1`` (one process), ``pg xN`` (N workers, as configured by default: a post for a
key another worker owns is handed to it, ``gateway.key_handoff``), with ``--first-case`` ``pg xN
first`` (``gateway.key_owner: first``: worker 1 owns every key) and ``pg xN leases`` (N workers,
``key_handoff: false``: the key's lease moves between the workers instead). A durable PostgreSQL
server this script starts (fsync on), a database per daemon; rounds alternate the cases. Per case:
messages/s, p99 (the median of the rounds' and the worst), CPU time per message of the daemon's
processes and of the database's, and the transactions committed in its database per message
(``pg_stat_database.xact_commit``: the group commit's width, with the events and leases). A case's
time runs until its history index holds every message it stored: its messages/s and CPU include
that catch-up (a process whose index fell behind did not serve the load at the rate of its
acknowledgements), and what the index lacked as wrk stopped is printed. The
targets: pg xN spread at least 0.9x the messages/s of pg x1, and its p99 within 2x of pg xN affine.

With ``--pause-ms`` (60; 0: none) the same daemons are measured again *paced*, each connection
waiting that long before each request (about 1,000 msg/s in all, below saturation): there the p99
and the CPU per message are the daemons' own, not the cores' contention's.

With ``--baseline DIR`` (another checkout, e.g. a worktree of the main branch) a fourth daemon,
``pg xN baseline``, runs that checkout's code with the same settings, loaded beside the others: the
report compares pg xN's spread case with it, in the same run.

First, the hop alone (``hop_cost``): both sides of ``gateway.handoff`` in this process, on real
sockets, a store that answers at once, 64 posts under way at a time: the CPU time per handed post,
reported against pg x1's gateway CPU per message.

``python -m bench.key_spread [--seconds S] [--rounds R] [--workers N] [--no-leases-case] [--first-case]
[--pause-ms MS] [--hop-only] [--baseline DIR]``
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.load import Phase, key_prefix, prime, wrk_load, wrk_path
from bench.workers_ingest import Case, arguments, caught_up, commits, cpu_of, gateway_case, start_all, stop_all, tree
from conversations.posts import DeltaFn, Post
from gateway.handoff import Handoff, owner_of
from sessions.keys import parse_key
from sessions.records import NewMessage
from tests.support.postgres import PgServer, start_server

CONNECTIONS = 64
KEYS = 64
# the paced cases: each connection waits this long before each request, about 1,000 msg/s in all,
# below what this loaded 2-core machine takes with one process or two
PAUSE_MS = 60


async def hop_cost(posts: int = 12800, rounds: int = 5, warm: int = 20) -> float:
    """CPU seconds per handed post, both sides in this process (the median of ``rounds``)."""

    async def handle(post: Post, on_delta: DeltaFn | None) -> Mapping[str, object]:
        return {"session_key": post.key.raw, "run_id": "r", "message_seq": 1, "reply": None, "events": [], "usage": {}}

    home = Path(tempfile.mkdtemp(prefix="neotask-bench-hop-"))
    one, two = Handoff(home, os.getpid(), 1, 2, handle), Handoff(home, os.getpid(), 2, 2, handle)
    await one.start()
    await two.start()
    try:
        raws = (f"agent:main:dm:hop{n}" for n in range(10_000))
        keys = [raw for raw in raws if owner_of(raw, 2) == 2][:CONNECTIONS]
        batch = [Post(parse_key(raw, agents={"main"}), NewMessage(role="user", content=f"message {n} of the hop bench",
                      client_message_id=f"hop-{n}"), reply=False) for n, raw in enumerate(keys)]  # fmt: skip
        for _ in range(warm):  # warm: the connection made, the code paths run once
            await asyncio.gather(*(one.post(post) for post in batch))
        costs = []
        for _ in range(rounds):
            before = time.process_time()
            for _ in range(posts // len(batch)):
                await asyncio.gather(*(one.post(post) for post in batch))
            costs.append((time.process_time() - before) / (posts // len(batch) * len(batch)))
        assert two.server.handled == (warm + rounds * (posts // len(batch))) * len(batch)
        return statistics.median(costs)
    finally:
        await one.close()
        await two.close()


@dataclass
class Load:
    name: str
    daemon: Case
    spread: bool
    pause_ms: int = 0
    # phase (its time includes the history index catching up), gateway CPU s, db CPU s,
    # transactions committed in the daemon's database
    phases: list[tuple[Phase, float, float, float]] = field(default_factory=list)
    behind: list[int] = field(default_factory=list)  # messages the history index lacked as wrk stopped


async def measure(load: Load, server: PgServer, seconds: float, tag: str) -> None:
    assert load.daemon.proc is not None
    gateway = tree(load.daemon.proc.pid)
    datnames = [load.daemon.datname] if load.daemon.datname else []
    committed = await commits(server, datnames)
    before = cpu_of(gateway), cpu_of(server.pids())
    phase = await wrk_load(
        load.daemon.port, load.name, connections=CONNECTIONS, keys=KEYS, prefix=key_prefix("spread"),
        seconds=seconds, tag=tag, spread=load.spread, pause_ms=load.pause_ms,
    )  # fmt: skip
    behind, drain_s = await caught_up(server, load.daemon.datname) if load.daemon.datname else (0, 0.0)
    after = cpu_of(gateway), cpu_of(server.pids())
    committed = await commits(server, datnames) - committed
    phase = dataclasses.replace(phase, elapsed=phase.elapsed + drain_s)
    load.phases.append((phase, after[0] - before[0], after[1] - before[1], committed))
    load.behind.append(behind)


Summary = tuple[float, float, float, float, int, float, float]


def _daemons(workers: int) -> tuple[str, ...]:
    """The multi-worker daemons a report compares with pg x1 (those it ran)."""
    return tuple(f"pg x{workers}{tail}" for tail in ("", " first", " leases", " baseline"))


def summary(load: Load) -> Summary:
    """Messages/s (pooled), the median of the rounds' p99s (s: a spike of the machine's other
    work in one round does not decide it), gateway and database CPU ms per message, failures, the
    worst round's p99 (s) and the database's commits per message."""
    ok = sum(p.ok for p, _, _, _ in load.phases)
    elapsed = sum(p.elapsed for p, _, _, _ in load.phases)
    gw = sum(g for _, g, _, _ in load.phases) / ok * 1000 if ok else math.nan
    db = sum(d for _, _, d, _ in load.phases) / ok * 1000 if ok else math.nan
    per_message = sum(c for _, _, _, c in load.phases) / ok if ok else math.nan
    failed = sum(p.failed for p, _, _, _ in load.phases)
    p99s = [p.p99 for p, _, _, _ in load.phases]
    return ok / elapsed, statistics.median(p99s), gw, db, failed, max(p99s), per_message


def report(results: dict[str, Summary], workers: int, hop_s: float | None = None) -> list[str]:
    lines = []
    for name, (rate, p99, gw, db, failed, worst, per_message) in results.items():
        lines.append(
            f"  {name:26} {rate:7.0f} msg/s  p99 {p99 * 1000:7.1f} ms (worst round {worst * 1000:7.1f})  CPU/msg"
            f" {gw:.3f} ms gateway + {db:.3f} ms database = {gw + db:.3f} ms, {per_message:.3f} commits/msg"
            + (f"  ({failed} failed)" if failed else "")
        )
    one_a, one_s = results["pg x1 affine"], results["pg x1 spread"]
    if hop_s is not None:
        lines.append(
            f"  the hop alone: {hop_s * 1e6:.1f} us of CPU per handed post (both sides), {hop_s * 1000 / one_s[2]:.3f}x"
            f" pg x1 spread's gateway CPU per message; with {workers} workers {(workers - 1) / workers:.2f} of the"
            f" spread posts are handed"
        )
    for daemon in _daemons(workers):
        affine, spread = results.get(f"{daemon} affine"), results.get(f"{daemon} spread")
        if affine is None or spread is None:
            continue
        lines.append(
            f"  {daemon}: spread {spread[0] / one_s[0]:.2f}x the msg/s of pg x1 spread"
            f" ({spread[0] / one_a[0]:.2f}x pg x1 affine; target >= 0.9x), p99 {spread[1] / affine[1]:.2f}x"
            f" its affine case's (target <= 2x), CPU/msg {(spread[2] + spread[3]) / (one_s[2] + one_s[3]):.2f}x"
            f" pg x1 spread; affine {affine[0] / one_a[0]:.2f}x the msg/s of pg x1 affine"
        )
    ours, theirs = results.get(f"pg x{workers} spread"), results.get(f"pg x{workers} baseline spread")
    if ours is not None and theirs is not None:
        lines.append(
            f"  pg x{workers} against the baseline's code, spread: msg/s {ours[0] / theirs[0]:.2f}x, CPU/msg"
            f" {(ours[2] + ours[3]) / (theirs[2] + theirs[3]):.2f}x (gateway {ours[2] / theirs[2]:.2f}x),"
            f" p99 {ours[1] / theirs[1]:.2f}x"
        )
    one_p = results.get("pg x1 spread paced")
    for daemon in _daemons(workers):
        affine, spread = results.get(f"{daemon} affine paced"), results.get(f"{daemon} spread paced")
        if one_p is None or affine is None or spread is None:
            continue
        cpu = spread[2] + spread[3]
        lines.append(
            f"  paced (below saturation), {daemon}: spread p99 {spread[1] / affine[1]:.2f}x its affine case's,"
            f" {spread[1] / one_p[1]:.2f}x pg x1 spread's; CPU/msg {cpu / (one_p[2] + one_p[3]):.2f}x"
            f" pg x1 spread, {cpu / (affine[2] + affine[3]):.2f}x its affine case's"
        )
    return lines


async def run(
    seconds: float, rounds: int, workers: int, leases_case: bool, pause_ms: int, baseline: Path | None = None,
    first_case: bool = False,
) -> None:  # fmt: skip
    if wrk_path() is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    hop_s = await hop_cost()
    print(f"  the hop alone: {hop_s * 1e6:.1f} us of CPU per handed post (both sides, in this process)", flush=True)
    server = await asyncio.to_thread(start_server, durable=True)
    tmp = Path(tempfile.mkdtemp(prefix="neotask-bench-spread-"))
    daemons: list[Case] = []
    try:
        plans: list[tuple[str, int, dict[str, object]]] = [("pg x1", 1, {}), (f"pg x{workers}", workers, {})]
        if first_case:
            plans.append((f"pg x{workers} first", workers, {"key_owner": "first"}))
        if leases_case:
            plans.append((f"pg x{workers} leases", workers, {"key_handoff": False}))
        if baseline is not None:
            plans.append((f"pg x{workers} baseline", workers, {}))
        for i, (name, count, gateway) in enumerate(plans):
            datname = f"bench_spread{i}"
            storage = {"backend": "postgres", "postgres": {"dsn": await server.database(datname)}}
            data: dict[str, object] = {"storage": storage}
            if gateway:
                data["gateway"] = gateway
            case = gateway_case(name, tmp / name.replace(" ", "-"), data, count)
            case.datname = datname
            if name.endswith("baseline") and baseline is not None:
                case.repo = baseline
            daemons.append(case)
        await start_all(daemons)
        for daemon in daemons:
            await prime(daemon.port, connections=CONNECTIONS, keys=KEYS, prefix=key_prefix("spread"))
        loads = [Load(f"{d.name} {how}", d, how == "spread") for d in daemons for how in ("affine", "spread")]
        if pause_ms:  # the same daemons below saturation: p99 and CPU without the cores' contention
            loads += [Load(f"{daemons[0].name} spread paced", daemons[0], True, pause_ms)]
            loads += [Load(f"{d.name} {how} paced", d, how == "spread", pause_ms) for d in daemons[1:]
                      for how in ("affine", "spread")]  # fmt: skip
        load_avg = os.getloadavg()[0]
        for r in range(1, rounds + 1):
            for load in loads if r % 2 else reversed(loads):
                await measure(load, server, seconds, f"r{r}")
                phase, gw, db, _ = load.phases[-1]
                print(
                    f"  round {r} {load.name:26} {phase.rate:7.0f} msg/s  p99 {phase.p99 * 1000:7.1f} ms"
                    f"  CPU gw {gw:5.2f} s db {db:5.2f} s  history behind {load.behind[-1]:6d}  failed {phase.failed}"
                    + (f" {dict(phase.errors)}" if phase.errors else ""),
                    flush=True,
                )
        print(
            f"\n{CONNECTIONS} connections on {KEYS} keys, store-only, {rounds}x{seconds:g} s per case,"
            f" load {load_avg:.1f} at the start:"
        )
        print("\n".join(report({load.name: summary(load) for load in loads}, workers, hop_s)))
        print("  history index behind as wrk stopped (most of the rounds): " + ", ".join(
            f"{load.name} {max(load.behind)}" for load in loads))  # fmt: skip
    finally:
        await stop_all(daemons, server)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--no-leases-case", action="store_true", help="leave out pg xN with key_handoff: false")
    parser.add_argument("--pause-ms", type=int, default=PAUSE_MS, help="the paced cases' pause; 0: none")
    parser.add_argument("--first-case", action="store_true", help="add pg xN with key_owner: first")
    parser.add_argument("--hop-only", action="store_true", help="only the hop's CPU per handed post (no database)")
    parser.add_argument("--baseline", type=Path, help="another checkout: pg xN on its code, beside this one's")
    args = parser.parse_args()
    if args.hop_only:
        print(f"the hop alone: {asyncio.run(hop_cost()) * 1e6:.1f} us of CPU per handed post (both sides)")
        return
    if not 2 <= args.workers <= 16:
        parser.error("--workers must be between 2 and 16")
    if args.baseline is not None and not (args.baseline / "gateway" / "cli.py").is_file():
        parser.error(f"--baseline {args.baseline} is not a Neotask checkout (no gateway/cli.py)")
    baseline = args.baseline.resolve() if args.baseline is not None else None
    leases = not args.no_leases_case
    asyncio.run(run(args.seconds, args.rounds, args.workers, leases, args.pause_ms, baseline, args.first_case))


if __name__ == "__main__":
    main()
