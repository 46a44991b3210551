"""Gateway ingest benchmark: store-only ``POST /v1/sessions/{key}/messages``
over HTTP with the default config (fsync batch), against a bare aiohttp JSON echo handler on the
same route shape, measured in the same run by the same load generator.

Load generator: ``wrk`` when installed (a C program, so the servers are the bottleneck, not the
client; ``bench/wrk_post.lua`` builds the POST bodies with one key per connection), else a Python
aiohttp client; the run prints which. Cases, each with its own keys:

- 64 connections on 64 keys: gateway messages/s ≥ 0.5x the echo's requests/s, p99 ≤ 3x the echo's;
- 64 connections on 1 key: ≥ 0.25x;
- 256 connections on 1,000 keys: printed, no target.

Two floors are alternated with them on 64x64 (information, ``--no-floors`` skips them): a *durable
echo* (the echo plus one line per message through the store's own ``AppendWriter``, answered once
synced: what durability costs by itself) and the *store alone* (``SessionStore.append`` called
straight from the handler: seq, counters, sessions.json, messages.jsonl and current.jsonl, none of
the gateway's HTTP and conversation layers). They show where the gateway's cost per message is.

Each server runs in its own process (``python -m bench.gateway_ingest --serve gateway|echo``) on
the event loop the gateway's config chooses (``gateway.event_loop``; the echo uses the same one),
bound to a free loopback port. Per case: a warm-up (the first message on a key starts its run),
then rounds that alternate echo and gateway so drift on a noisy machine hits both; per-round and
pooled ratios are printed. Every acknowledged message is then counted in the messages.jsonl files.

``python -m bench.gateway_ingest [--quick] [--seconds S] [--rounds N] [--client wrk|python]
[--cases 64x64,64x1,256x1000] [--profile] [--site guarded|plain] [--no-floors]``. ``--profile`` records the gateway
with py-spy during one extra 64x64 phase and prints where its time goes. ``--site plain`` serves the
gateway without the daemon's connection guard (to measure what the guard costs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from bench.common import ServerProcess, ratio
from bench.load import Phase, cpu_seconds, key_prefix, prime, python_load, wrk_command, wrk_load, wrk_path, wrk_version
from config.settings import Settings
from gateway import eventloop
from gateway.eventloop import LoopChoice, resolve

HOST = "127.0.0.1"
SERVER_MAX_S = 1800.0  # a server that loses its parent still exits


@dataclass(frozen=True)
class Case:
    connections: int
    keys: int
    min_throughput: float | None  # gateway msg/s / echo req/s
    max_p99: float | None  # gateway p99 / echo p99

    @property
    def name(self) -> str:
        return f"{self.connections}x{self.keys}"


# Two floors, alternated with the echo and the gateway on the 64x64 case: what making each message
# durable costs by itself (the echo plus one synced line through the store's own writer), and what
# the session store's append costs (seq, counters, both stores) with no HTTP layer of the gateway's.
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Lifecycle = Callable[[web.Application], AsyncIterator[None]]

FLOOR_NAMES = {"durable": "durable echo", "store": "store alone"}
FLOOR_CASE = "64x64"

CASES = {
    "64x64": Case(64, 64, 0.5, 3.0),
    "64x1": Case(64, 1, 0.25, None),
    "256x1000": Case(256, 1000, None, None),
}


# -- servers (run in the child processes) -------------------------------------------------------


async def _echo(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"session_key": request.match_info["key"], "echo": body})


def _route_app(handler: Handler, lifecycle: Lifecycle | None = None) -> web.Application:
    """An app serving ``handler`` on the message route (the same shape for every server)."""
    app = web.Application()
    app.router.add_post("/v1/sessions/{key}/messages", handler)
    if lifecycle is not None:
        app.cleanup_ctx.append(lifecycle)
    return app


def _echo_app() -> web.Application:
    return _route_app(_echo)


def _durable_echo_app(home: Path) -> web.Application:
    """The echo plus the least a durable answer needs: each body appended as one line to its key's
    file through the gateway's own ``AppendWriter`` (group commit, default fsync batch), the answer
    sent once the line is synced. What the gateway does beyond this is its own bookkeeping."""
    import orjson

    from sessions.files.writer import AppendWriter

    writer = AppendWriter("batch")
    files: dict[str, Path] = {}

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        key = request.match_info["key"]
        path = files.get(key)
        if path is None:
            path = files[key] = home / f"{len(files)}.jsonl"
        await writer.append(path, orjson.dumps(body) + b"\n", durable=True)
        return web.json_response({"session_key": key, "echo": body})

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        writer.start()
        yield
        await writer.close()

    return _route_app(handler, lifecycle)


def _store_echo_app(home: Path) -> web.Application:
    """The echo plus the session store alone: each body's ``content`` appended as a user message
    to its key's active run through ``SessionStore.append`` (seq, counters, sessions.json,
    messages.jsonl and current.jsonl through the writer's group commit); no validation, commands,
    hooks, history index, metrics or conversation layer."""
    from config.clock import system_clock
    from sessions.files.store import SessionStore
    from sessions.records import NewMessage, RunStart, TaskKey

    state: dict[str, SessionStore] = {}

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        key = request.match_info["key"]
        store = state["store"]
        run = store.active_run(key)
        if run is None:
            run = await store.start_run(RunStart(key, agent_id="main", chat_type="direct", channel=None,
                                                 task_key=TaskKey(task_type="agent", task_identifier=key)))  # fmt: skip
        record = await store.append(run, NewMessage(role="user", content=body["content"]))
        return web.json_response({"session_key": key, "run_id": run.run_id, "message_seq": record["seq"]})

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        state["store"] = await SessionStore.open(home, _gateway_settings(None), clock=system_clock)
        yield
        await state["store"].close()

    return _route_app(handler, lifecycle)


def _gateway_settings(fsync: str | None) -> Settings:
    from config.loader import build_settings, deep_merge, load_defaults

    overrides = {"storage": {"fsync": fsync}} if fsync else {}
    return build_settings(deep_merge(load_defaults(), overrides))


def _gateway_app(home: Path, fsync: str | None) -> web.Application:
    from config.loader import LoadedConfig
    from gateway.app import create_app

    config = LoadedConfig(settings=_gateway_settings(fsync), home=home, config_path=None)
    return create_app(config, env={})


async def _serve(kind: str, home: Path | None, fsync: str | None, site: str = "guarded") -> None:
    """Serve the echo, or the gateway as the daemon does (``site`` guarded: its runner and its
    ``GuardedSite``, a protocol wrapper per connection; plain: aiohttp's own runner and site, to
    measure what the guard costs)."""
    from gateway.connections import GUARD, GuardedSite
    from gateway.heap import settle_heap
    from gateway.runner import JsonErrorsAppRunner

    gateway = kind == "gateway" and home is not None
    if kind == "durable" and home is not None:
        app = _durable_echo_app(home)
    elif kind == "store" and home is not None:
        app = _store_echo_app(home)
    else:
        app = _gateway_app(home, fsync) if gateway and home is not None else _echo_app()
    if gateway and site == "guarded":
        keepalive = _gateway_settings(fsync).gateway.keepalive_timeout_s
        runner: web.AppRunner = JsonErrorsAppRunner(app, access_log=None, handle_signals=False,
                                                    keepalive_timeout=keepalive)  # fmt: skip
        await runner.setup()
        served: web.BaseSite = GuardedSite(runner, HOST, 0, app[GUARD], backlog=1024)
        await served.start()
        port = runner.addresses[0][1]
    else:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, 0))  # a free loopback port, told to the parent on stdout
        port = sock.getsockname()[1]
        await web.SockSite(runner, sock, backlog=1024).start()
    if gateway:
        settle_heap()  # as the daemon does once it listens
    print(f"PORT {port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The parent holds our stdin: when it closes (the parent is done or died) we stop.
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(sys.stdin.fileno(), 1024) else None)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), SERVER_MAX_S)
    await runner.cleanup()


def configured_loop(choice: LoopChoice | None) -> LoopChoice:
    """The loop the servers run on: ``choice``, else what the default config's
    ``gateway.event_loop`` resolves to here."""
    if choice:
        return resolve(choice)
    settings = _gateway_settings(None)
    return resolve(settings.gateway.event_loop)


class Server(ServerProcess):
    """A server subprocess; ``port`` once it listens."""

    def __init__(self, kind: str, home: Path | None, *, loop: str, fsync: str | None, site: str = "guarded") -> None:
        args = [kind, "--loop", loop, "--site", site]
        if home is not None:
            args += ["--home", str(home)]
        if fsync:
            args += ["--fsync", fsync]
        self.kind = kind
        super().__init__("bench.gateway_ingest", args, what=kind, stop_timeout_s=30)


# -- running the cases --------------------------------------------------------------------------


@dataclass
class Options:
    client: str  # wrk | python
    seconds: float
    warmup_s: float
    rounds: int
    profile: bool
    floors: bool = True  # also alternate the durable echo and the store alone (64x64 only)


async def phase(server: Server, name: str, case: Case, opts: Options, *, seconds: float, tag: str) -> Phase:
    load = wrk_load if opts.client == "wrk" else python_load
    cpu_before = cpu_seconds(server.proc.pid)
    result = await load(
        server.port, name, connections=case.connections, keys=case.keys, prefix=key_prefix(case.name),
        seconds=seconds, tag=tag,
    )  # fmt: skip
    result.cpu_s = cpu_seconds(server.proc.pid) - cpu_before
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class CaseResult:
    case: Case
    echoes: list[Phase]
    gateways: list[Phase]
    passed: bool

    @property
    def throughput(self) -> float:
        return rate(self.gateways) / rate(self.echoes) if rate(self.echoes) else 0.0

    @property
    def p99(self) -> float:
        return ratio(mean([g.p99 for g in self.gateways]), mean([e.p99 for e in self.echoes]))


def cpu_per_request(phase: Phase) -> float:
    """Server CPU per answered request: steadier than rates on a shared machine (information)."""
    return phase.cpu_s / phase.ok if phase.ok else math.nan


def rate(phases: Sequence[Phase]) -> float:
    elapsed = sum(p.elapsed for p in phases)
    return sum(p.ok for p in phases) / elapsed if elapsed else 0.0


def report(case: Case, echoes: list[Phase], gateways: list[Phase], floors: Sequence[list[Phase]] = ()) -> CaseResult:
    rows = [("round", "server", "req or msg/s", "p50", "p99", "mean", "ok", "failed", "CPU/request")]
    for i, (echo, gateway) in enumerate(zip(echoes, gateways, strict=True), 1):
        for p in (echo, *(f[i - 1] for f in floors), gateway):
            rows.append(
                (str(i), p.name, f"{p.rate:,.0f}", ms(p.p50), ms(p.p99), ms(p.mean), f"{p.ok:,}", str(p.failed),
                 f"{cpu_per_request(p) * 1e6:,.0f} µs")
            )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  "
            + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    for p in (*echoes, *gateways, *(p for f in floors for p in f)):
        for error, count in p.errors.most_common(3):
            print(f"  {p.name} error x{count}: {error}")
    per_round = [(ratio(g.rate, e.rate), ratio(g.p99, e.p99)) for e, g in zip(echoes, gateways, strict=True)]
    print("  per round: throughput " + ", ".join(f"{t:.2f}" for t, _ in per_round)
          + "; p99 " + ", ".join(f"{p:.1f}x" for _, p in per_round))  # fmt: skip
    result = CaseResult(case, echoes, gateways, True)
    # A stalled echo round on a loaded machine can answer a handful of requests inside one 10 ms CPU
    # tick (cpu_s 0.0): the ratio is then unknown (inf), never a crash.
    echo_cpu = mean([cpu_per_request(e) for e in echoes])
    cpu = ratio(mean([cpu_per_request(g) for g in gateways]), echo_cpu)
    print(f"  server CPU per request, gateway / echo: {cpu:.2f}x (information: less sensitive to other load)")
    for f in floors:
        f_cpu = ratio(mean([cpu_per_request(p) for p in f]), echo_cpu)
        print(f"  floor {f[0].name}: {rate(f) / rate(echoes):.2f} of the echo's req/s, p99"
              f" {ratio(mean([p.p99 for p in f]), mean([e.p99 for e in echoes])):.1f}x, CPU per request {f_cpu:.2f}x"
              " (information)")  # fmt: skip
    print(f"  pooled: echo {rate(echoes):,.0f} req/s p99 {ms(mean([e.p99 for e in echoes]))};"
          f" gateway {rate(gateways):,.0f} msg/s p99 {ms(mean([g.p99 for g in gateways]))}")  # fmt: skip
    ok_t = case.min_throughput is None or result.throughput >= case.min_throughput
    ok_p = case.max_p99 is None or result.p99 <= case.max_p99
    target_t = f"target ≥ {case.min_throughput:.2f}" if case.min_throughput is not None else "no target"
    target_p = f"target ≤ {case.max_p99:.1f}x" if case.max_p99 is not None else "no target"
    print(f"  {'PASS' if ok_t else 'FAIL'}  gateway msg/s / echo req/s = {result.throughput:.2f} ({target_t})")
    print(f"  {'PASS' if ok_p else 'FAIL'}  gateway p99 / echo p99 = {result.p99:.2f}x ({target_p})")
    clean = all(p.failed == 0 for p in (*echoes, *gateways))
    if not clean:
        print("  FAIL  some requests failed (see the errors above)")
    result.passed = ok_t and ok_p and clean
    return result


async def run_case(
    case: Case, echo: Server, gateway: Server, opts: Options, floors: Sequence[Server] = ()
) -> tuple[CaseResult, list[Phase]]:
    """The case's result and every gateway phase (for the stored-messages check). ``floors``
    (the durable echo, the store alone) are alternated with the two in every round."""
    print(f"\n== {case.connections} connections on {case.keys:,} key(s): {opts.rounds} round(s) of"
          f" {opts.seconds:g} s per server, alternating", flush=True)  # fmt: skip
    primed = await prime(gateway.port, connections=case.connections, keys=case.keys, prefix=key_prefix(case.name))
    await prime(echo.port, connections=case.connections, keys=case.keys, prefix=key_prefix(case.name))
    for floor in floors:
        await prime(floor.port, connections=case.connections, keys=case.keys, prefix=key_prefix(case.name))
        await phase(floor, FLOOR_NAMES[floor.kind], case, opts, seconds=opts.warmup_s, tag="warm-up")
    warm = [
        Phase("gateway (first message per key)", primed, 0, 0.0, math.nan, math.nan, math.nan),
        await phase(echo, "echo", case, opts, seconds=opts.warmup_s, tag="warm-up"),
        await phase(gateway, "gateway", case, opts, seconds=opts.warmup_s, tag="warm-up"),
    ]
    for p in warm[1:]:
        if p.failed:
            print(f"  warm-up on {p.name} failed: {dict(p.errors)}")
    echoes, gateways = [], []
    floored: list[list[Phase]] = [[] for _ in floors]
    for i in range(opts.rounds):
        echoes.append(await phase(echo, "echo", case, opts, seconds=opts.seconds, tag=f"round {i + 1}"))
        for floor, phases in zip(floors, floored, strict=True):
            phases.append(await phase(floor, FLOOR_NAMES[floor.kind], case, opts, seconds=opts.seconds,
                                      tag=f"round {i + 1}"))  # fmt: skip
        gateways.append(await phase(gateway, "gateway", case, opts, seconds=opts.seconds, tag=f"round {i + 1}"))
    return report(case, echoes, gateways, floored), [warm[0], warm[2], *gateways]


def check_stored(home: Path, phases: Sequence[Phase]) -> bool:
    """Every acknowledged message is in a messages.jsonl; wrk stops with requests in flight, which
    the gateway may have stored without wrk counting them, so at most that many more."""
    total = 0
    for path in home.rglob("messages.jsonl"):
        with path.open("rb") as f:
            total += sum(1 for _ in f)
    acknowledged = sum(p.ok for p in phases)
    slack = sum(p.in_flight_at_stop for p in phases)
    ok = acknowledged <= total <= acknowledged + slack
    extra = f", plus at most {slack:,} in flight when the generator stopped" if slack else ""
    print(f"\n  stored messages: {total:,} (acknowledged {acknowledged:,}{extra}): {'ok' if ok else 'MISMATCH'}")
    return ok


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("  (py-spy not installed: pip install py-spy to profile)")
        return None
    cmd = [spy, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds)), "--rate", "250",
           "--format", "raw", "--output", str(out), "--nonblocking", "--threads"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def summarize_profile(path: Path, top: int = 25) -> None:
    """Samples per thread, then self and inclusive shares per function of the event loop thread."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        raw = [f for f in stack.split(";") if f]
        thread = raw[0].split(" (")[0] + " " + raw[0].rsplit(": ", 1)[-1].rstrip('"') if raw else "?"
        threads[thread] += count
        if not raw or "MainThread" not in raw[0]:
            continue
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")") for f in raw[1:]]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    print("\n  py-spy samples per thread: " + ", ".join(f"{t.split()[-1]} {c}" for t, c in threads.most_common(6)))
    if not total:
        print("  (no samples of the event loop thread)")
        return
    print(f"  event loop thread: {total} samples; self time (top {top})")
    for frame, count in own.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")
    print(f"\n  inclusive time (top {top})")
    for frame, count in inclusive.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")


async def profiled(server: Server, opts: Options, tmp: Path) -> Phase | None:
    """One more 64x64 gateway phase under py-spy."""
    out = tmp / "gateway.pyspy.txt"
    spy = profile(server.proc.pid, opts.seconds + 1, out)
    if spy is None:
        return None
    await asyncio.sleep(0.5)
    print("\n== profile: one more 64x64 gateway phase under py-spy", flush=True)
    result = await phase(server, "gateway (profiled)", CASES["64x64"], opts, seconds=opts.seconds, tag="profile")
    print(f"  {result.rate:,.0f} msg/s, p99 {ms(result.p99)} while profiled")
    _, err = await asyncio.to_thread(spy.communicate, timeout=opts.seconds + 60)
    if out.exists():
        summarize_profile(out)
    else:
        print(f"  py-spy recorded nothing: {err.decode(errors='replace')[-400:]}")
    return result


async def run(cases: Sequence[Case], opts: Options, *, loop: str, fsync: str | None, site: str) -> bool:
    if opts.client == "wrk":
        sample = wrk_command(0, connections=64, keys=64, prefix=key_prefix("64x64"), seconds=opts.seconds, tag="r1")
        print(f"  load generator: {wrk_version()}; per phase, e.g.: {' '.join(sample)}")
    else:
        print("  load generator: the Python aiohttp client (wrk not found: apt-get install wrk measures better;"
              " this client holds the echo near 4,000 req/s)")  # fmt: skip
    print(f"  servers: event loop {loop}, storage.fsync {fsync or 'batch (default)'}, gateway site {site}"
          f" ({'the daemon runner and its connection guard' if site == 'guarded' else 'aiohttp runner, no guard'})",
          flush=True)  # fmt: skip
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="neotask-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        echo = Server("echo", None, loop=loop, fsync=None)
        gateway = Server("gateway", home, loop=loop, fsync=fsync, site=site)
        floors: list[Server] = []
        if opts.floors and any(case.name == FLOOR_CASE for case in cases):
            for kind in FLOOR_NAMES:
                (Path(tmp) / kind).mkdir()
                floors.append(Server(kind, Path(tmp) / kind, loop=loop, fsync=None))
        stored_phases: list[Phase] = []
        try:
            for case in cases:
                result, phases = await run_case(case, echo, gateway, opts, floors if case.name == FLOOR_CASE else ())
                results.append(result)
                stored_phases += phases
            if opts.profile:
                extra = await profiled(gateway, opts, Path(tmp))
                if extra is not None:
                    stored_phases.append(extra)
        finally:
            echo.stop()
            gateway.stop()
            for floor in floors:
                floor.stop()
        stored = check_stored(home, stored_phases)
    print("\n  summary: " + "; ".join(
        f"{r.case.name} {r.throughput:.2f} / p99 {r.p99:.1f}x {'ok' if r.passed else 'MISSED'}" for r in results
    ))  # fmt: skip
    return stored and all(r.passed for r in results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_ingest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run, not a measurement")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per measured phase (8)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating echo/gateway rounds per case (2)")
    parser.add_argument("--client", choices=("wrk", "python"), default=None, help="default: wrk when installed")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default=None,
                        help="the servers' event loop (default: the config's gateway.event_loop)")  # fmt: skip
    parser.add_argument("--fsync", choices=("batch", "always", "never"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="also profile the gateway with py-spy")
    parser.add_argument("--no-floors", action="store_true",
                        help="skip the two floors (durable echo, store alone) alternated on 64x64")  # fmt: skip
    parser.add_argument("--site", choices=("guarded", "plain"), default="guarded",
                        help="guarded (default): the gateway served as the daemon serves it (its runner, keep-alive"
                        " and connection guard); plain: aiohttp's runner and site, to measure the guard")  # fmt: skip
    parser.add_argument("--serve", choices=("echo", "gateway", "durable", "store"), help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    loop = configured_loop(args.loop)
    if args.serve:
        eventloop.run(_serve(args.serve, args.home, args.fsync, args.site), loop)
        return 0
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    client = args.client or ("wrk" if wrk_path() else "python")
    if client == "wrk" and not wrk_path():
        parser.error("wrk is not installed (apt-get install wrk)")
    seconds = args.seconds or (1.0 if args.quick else 8.0)
    opts = Options(
        client=client,
        seconds=seconds,
        warmup_s=min(1.0, seconds) if args.quick else 3.0,  # a quick run's warm-ups no longer than its phases
        rounds=args.rounds or (1 if args.quick else 2),
        profile=args.profile,
        floors=not args.no_floors,
    )
    cases = [CASES[c] for c in args.cases.split(",")]
    print("\n== gateway ingest: store-only messages over HTTP vs a bare aiohttp JSON echo", flush=True)
    passed = asyncio.run(run(cases, opts, loop=loop, fsync=args.fsync, site=args.site))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
