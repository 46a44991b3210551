"""Gateway ingest benchmark (issue 3): store-only ``POST /v1/sessions/{key}/messages`` over HTTP at
64 concurrent connections on 64 keys with the default fsync policy, against a bare aiohttp JSON
echo handler on the same route shape, measured in the same run by the same client.

Targets: gateway messages/s ≥ 40% of the echo's requests/s, and gateway p99 < 3x the echo's p99.

Each server runs in its own process (``python -m bench.gateway_ingest --serve gateway|echo``), bound
to 127.0.0.1 on a free port, so the load generator never shares an event loop with it. The rounds
alternate echo and gateway so drift on a noisy machine hits both. Everything is bounded: a fixed
number of requests per phase, a deadline per phase, and servers that exit when their stdin closes.

``python -m bench.gateway_ingest [--quick] [--requests N] [--profile]``. ``--profile`` (and any
full run that misses a target) records the gateway with py-spy during one extra phase and prints
where its time goes.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp
from aiohttp import web

now = time.perf_counter
HOST = "127.0.0.1"
CONCURRENCY = 64
KEYS = 64
SERVER_MAX_S = 900.0  # a server that loses its parent still exits
PHASE_MAX_S = 120.0
TARGET_THROUGHPUT = 0.40
TARGET_P99 = 3.0


# -- servers (run in the child processes) -------------------------------------------------------


async def _echo(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"session_key": request.match_info["key"], "echo": body})


def _echo_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/sessions/{key}/messages", _echo)
    return app


def _gateway_app(home: Path) -> web.Application:
    from config.loader import LoadedConfig, build_settings, load_defaults
    from gateway.app import create_app

    config = LoadedConfig(settings=build_settings(load_defaults()), home=home, config_path=None)
    return create_app(config, env={})


async def _serve(kind: str, home: Path | None) -> None:
    app = _gateway_app(home) if kind == "gateway" and home is not None else _echo_app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))  # a free loopback port, told to the parent on stdout
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock, backlog=1024).start()
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


# -- the load generator -------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    ok: int
    failed: int
    elapsed: float
    latencies: list[float]
    errors: collections.Counter[str]

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0


class Server:
    """A server subprocess; ``port`` once it listens."""

    def __init__(self, kind: str, home: Path | None) -> None:
        cmd = [sys.executable, "-m", "bench.gateway_ingest", "--serve", kind]
        if home is not None:
            cmd += ["--home", str(home)]
        root = Path(__file__).resolve().parents[1]
        self.kind = kind
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"the {kind} server did not start (said {line!r})")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def key_path(i: int) -> str:
    return "/v1/sessions/" + quote(f"agent:main:bench:dm:{i}", safe="") + "/messages"


async def load(port: int, name: str, requests: int, *, deadline_s: float = PHASE_MAX_S) -> Phase:
    """``requests`` POSTs from CONCURRENCY workers, worker i on key i % KEYS; each answer checked."""
    base = f"http://{HOST}:{port}"
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    remaining = requests
    stop_at = now() + deadline_s

    async def worker(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal remaining
        url = base + key_path(i % KEYS)
        n = 0
        while remaining > 0 and now() < stop_at:
            remaining -= 1
            n += 1
            payload = {"content": f"message {n} from worker {i}: the quick brown fox jumps over the lazy dog"}
            started = now()
            try:
                async with session.post(url, json=payload) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        errors[f"HTTP {resp.status} {body[:120]!r}"] += 1
                        continue
            except aiohttp.ClientError as exc:
                errors[type(exc).__name__] += 1
                continue
            latencies.append(now() - started)

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = now()
        await asyncio.gather(*(worker(i, session) for i in range(CONCURRENCY)))
        elapsed = now() - started
    return Phase(name, len(latencies), sum(errors.values()), elapsed, latencies, errors)


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * pct / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def pooled(phases: Sequence[Phase], name: str) -> Phase:
    errors: collections.Counter[str] = collections.Counter()
    for phase in phases:
        errors.update(phase.errors)
    latencies = [x for phase in phases for x in phase.latencies]
    return Phase(
        name,
        sum(p.ok for p in phases),
        sum(p.failed for p in phases),
        sum(p.elapsed for p in phases),
        latencies,
        errors,
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def report(echo: Phase, gateway: Phase) -> bool:
    rows = [("", "requests", "failed", "req/s", "msg/s", "p50", "p99", "mean")]
    for phase in (echo, gateway):
        msgs = f"{phase.rate:,.0f}" if phase is gateway else "-"
        mean = statistics.fmean(phase.latencies) if phase.latencies else math.nan
        rows.append((phase.name, f"{phase.ok:,}", str(phase.failed), f"{phase.rate:,.0f}", msgs,
                     ms(percentile(phase.latencies, 50)), ms(percentile(phase.latencies, 99)), ms(mean)))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  "
            + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    for phase in (echo, gateway):
        for error, count in phase.errors.most_common(5):
            print(f"  {phase.name} error x{count}: {error}")
    throughput = gateway.rate / echo.rate if echo.rate else 0.0
    p99 = percentile(gateway.latencies, 99) / percentile(echo.latencies, 99)
    ok_throughput = throughput >= TARGET_THROUGHPUT
    ok_p99 = p99 < TARGET_P99
    print(f"  {'PASS' if ok_throughput else 'FAIL'}  gateway msg/s / echo req/s = {throughput:.2f}"
          f" (target ≥ {TARGET_THROUGHPUT:.2f})")  # fmt: skip
    print(f"  {'PASS' if ok_p99 else 'FAIL'}  gateway p99 / echo p99 = {p99:.2f}x (target < {TARGET_P99:.1f}x)")
    clean = gateway.failed == 0 and echo.failed == 0
    if not clean:
        print("  FAIL  some requests failed (see the errors above)")
    return ok_throughput and ok_p99 and clean


def check_stored(home: Path, expected: int) -> bool:
    """Every acknowledged message is in a messages.jsonl, once."""
    total = 0
    for path in home.rglob("messages.jsonl"):
        with path.open("rb") as f:
            total += sum(1 for _ in f)
    status = "ok" if total == expected else "MISMATCH"
    print(f"  stored messages: {total:,} (acknowledged {expected:,}): {status}")
    return total == expected


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("  (py-spy not installed: pip install py-spy to profile)")
        return None
    cmd = [spy, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds)), "--rate", "250",
           "--format", "raw", "--output", str(out), "--nonblocking"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def summarize_profile(path: Path, top: int = 25) -> None:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")") for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        print("  (no samples)")
        return
    print(f"\n  py-spy: {total} samples; self time (top {top})")
    for frame, count in own.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")
    print(f"\n  inclusive time (top {top})")
    for frame, count in inclusive.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")


async def run(requests: int, rounds: int, warmup: int, *, with_profile: bool, profile_on_fail: bool) -> bool:
    with tempfile.TemporaryDirectory(prefix="neotask-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        echo_server = Server("echo", None)
        gateway_server = Server("gateway", home)
        acknowledged = 0
        try:
            for server in (echo_server, gateway_server):  # first messages start runs; not measured
                warm = await load(server.port, server.kind, warmup)
                if warm.failed:
                    print(f"  warm-up on {server.kind} failed: {dict(warm.errors)}")
                    return False
            acknowledged += warm.ok
            echoes, gateways = [], []
            per_round = requests // rounds
            for _ in range(rounds):
                echoes.append(await load(echo_server.port, "echo", per_round))
                gateways.append(await load(gateway_server.port, "gateway", per_round))
            echo, gateway = pooled(echoes, "echo"), pooled(gateways, "gateway")
            acknowledged += gateway.ok
            print(f"\n  {rounds} round(s) of {per_round:,} requests each, {CONCURRENCY} connections, {KEYS} keys")
            passed = report(echo, gateway)
            if with_profile or (profile_on_fail and not passed):
                acknowledged += await profiled(gateway_server, per_round, gateway.rate, Path(tmp))
        finally:
            echo_server.stop()
            gateway_server.stop()
        return check_stored(home, acknowledged) and passed


async def profiled(server: Server, requests: int, rate: float, tmp: Path) -> int:
    """One more gateway phase under py-spy; the messages it stored."""
    out = tmp / "gateway.pyspy.txt"
    seconds = max(5.0, requests / max(rate, 1.0))
    spy = profile(server.proc.pid, seconds, out)
    if spy is None:
        return 0
    await asyncio.sleep(1.0)
    phase = await load(server.port, "gateway (profiled)", requests)
    _, err = await asyncio.to_thread(spy.communicate, timeout=seconds + 60)
    if out.exists():
        summarize_profile(out)
    else:
        print(f"  py-spy recorded nothing: {err.decode(errors='replace')[-400:]}")
    return phase.ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_ingest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run, not a measurement")
    parser.add_argument("--requests", type=int, default=None, help="measured requests per server (20,000)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating echo/gateway rounds (2)")
    parser.add_argument("--profile", action="store_true", help="also profile the gateway with py-spy")
    parser.add_argument("--serve", choices=("echo", "gateway"), help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.home))
        return 0
    requests = args.requests or (1_000 if args.quick else 20_000)
    rounds = args.rounds or (1 if args.quick else 2)
    warmup = 4 * CONCURRENCY if args.quick else 16 * CONCURRENCY
    print("\n== gateway ingest: store-only messages over HTTP vs a bare aiohttp JSON echo", flush=True)
    passed = asyncio.run(run(requests, rounds, warmup, with_profile=args.profile, profile_on_fail=not args.quick))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
