"""OpenAI-compatible front door benchmark: what Neotask adds to a chat completion.

The same official ``openai`` client sends the same conversations (each client resends its whole
history, up to ``TURNS`` turns, then starts a new conversation) either straight to the local
model server (``tests/support/openai_server.py``) or to ``POST /v1/chat/completions`` of a gateway
whose agent answers through that same server. The gateway stores what is new (the user message,
then the reply: two durable appends under ``storage.fsync: batch``) and runs the turn.

Reported per round and concurrency (1 and 16 clients): p50 and p99 of each side, the differences
in p50, p95 and p99 (the overhead Neotask adds) and the gateway's CPU per call (its process CPU
clock, in nanoseconds). Rounds alternate direct and gateway so drift on a noisy machine
hits both; the spread over rounds is printed. The client sends ``messages`` through
``extra_body`` on both sides: the SDK's typed transform of a message list costs ~15 ms of client
CPU per call here, which at 16 clients would measure the load generator rather than the servers
(the gateway's own provider does the same, see ``conversations/provider.py``). Target: p50 overhead < 5 ms plus the
fsyncs of the two appends (an fsync of a small append in the same home is timed in this run).

The model server and the gateway run in their own processes (``--serve model|gateway``), so the
load generator shares an event loop with neither. Memory recall is off in the gateway (its
embedding model is a memory cost, not the front door's; docs/memory-tuning.md measures it).

``python -m bench.openai_compat [--quick] [--rounds N] [--requests N] [--baseline DIR]``: with
``--baseline`` a second gateway runs from another checkout (``git worktree add /tmp/base main``) in
the same run, alternated round by round with this tree's, for a before/after under the same load:
the ratios of CPU per call and of added p50 and p95, round by round, are printed with their median
and range (a round measures both gateways under the same load; the CPU ratio is the steadier one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Report, ServerProcess, fmt_seconds, percentile, print_table, section

now = time.perf_counter
HOST = "127.0.0.1"
TURNS = 8
SERVER_MAX_S = 900.0
TARGET_OVERHEAD_S = 0.005
APPENDS_PER_CALL = 2
CPUCLOCK_SCHED = 2  # Linux: a process's CPU clock id is (~pid << 3) | CPUCLOCK_SCHED


# -- servers (child processes) ------------------------------------------------------------------


async def _serve_gateway(home: Path, model_url: str) -> None:
    from aiohttp import web

    from config.loader import LoadedConfig, build_settings, deep_merge, load_defaults
    from gateway.app import create_app

    overrides = {
        "gateway": {"openai_compat": {"enabled": True}},
        "agents": {"main": {"model": {"base_url": model_url, "name": "bench-model", "max_retries": 0}}},
        "memory": {"recall": {"enabled": False}},
    }
    settings = build_settings(deep_merge(load_defaults(), overrides))
    app = create_app(LoadedConfig(settings=settings, home=home, config_path=None), env={})
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await _listen(runner)


async def _serve_model() -> None:
    from tests.support.openai_server import OpenAIServer

    server = OpenAIServer()
    await server.start()
    print(f"PORT {server.port}", flush=True)
    await _wait_for_parent()
    await server.close()


async def _listen(runner: Any) -> None:
    from aiohttp import web

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    await web.SockSite(runner, sock, backlog=1024).start()
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await _wait_for_parent()
    await runner.cleanup()


async def _wait_for_parent() -> None:
    """Until SIGTERM, or the parent closes our stdin (it is done, or died)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(sys.stdin.fileno(), 1024) else None)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), SERVER_MAX_S)


class Server(ServerProcess):
    def __init__(self, *args: str, root: Path | None = None) -> None:
        super().__init__("bench.openai_compat", args, what=args[0], stop_timeout_s=15, root=root)


# -- the load -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, all its threads (those ended too): what it cost, whatever the
    machine's load did to the wall clock. Read from the process's CPU clock (Linux: the clock id
    ``clock_getcpuclockid(pid)`` would give), in nanoseconds: a round's few seconds of CPU are
    measured to well under 1%, where the 10 ms clock ticks of ``/proc/<pid>/stat`` (the fallback)
    blur a before/after of a few percent."""
    with contextlib.suppress(OSError):
        return time.clock_gettime((~pid << 3) | CPUCLOCK_SCHED)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    side: str
    clients: int
    latencies: list[float]
    errors: int
    cpu: float = 0.0  # this (the bench client's) process's CPU seconds over the phase

    @property
    def cpu_per_call(self) -> float:
        return self.cpu / max(len(self.latencies), 1)

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 95)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)


async def phase(base_url: str, side: str, clients: int, requests: int) -> Phase:
    """``requests`` chat completions from ``clients`` concurrent clients (one conversation each at
    a time, resent whole, a new conversation every TURNS turns)."""
    import openai

    latencies: list[float] = []
    errors = 0
    remaining = requests

    async def client(i: int, sdk: openai.AsyncOpenAI) -> None:
        nonlocal remaining, errors
        user, history = "", list[dict[str, str]]()
        while remaining > 0:
            remaining -= 1
            if len(history) >= 2 * TURNS or not user:
                user, history = f"bench-{uuid.uuid4().hex[:12]}", []
            history.append({"role": "user", "content": f"question {len(history) // 2} from client {i}: how are you?"})
            started = now()
            try:
                answer = await sdk.chat.completions.create(
                    model="neotask/main", messages=[], user=user, extra_body={"messages": history}
                )
            except openai.APIError:
                errors += 1
                history.pop()
                continue
            latencies.append(now() - started)
            history.append({"role": "assistant", "content": answer.choices[0].message.content or ""})

    async with openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=60) as sdk:
        cpu = time.process_time()
        await asyncio.gather(*(client(i, sdk) for i in range(clients)))
        cpu = time.process_time() - cpu
    return Phase(side, clients, latencies, errors, cpu)


async def sdk_phase(model_url: str, clients: int, requests: int) -> Phase:
    """The model call the gateway makes for each chat completion, made from this process: its
    ``ChatProvider.complete`` (the ``openai`` client's request path, the transport, the answer's
    parse), ``clients`` at a time, no tools offered. What this process spends per call is CPU the
    gateway cannot spend less of while it calls its model through the ``openai`` package."""
    from config.settings import ModelSettings
    from conversations.provider import ChatProvider

    provider = ChatProvider(ModelSettings(base_url=model_url, name="bench-model", max_retries=0), api_key=None)
    latencies: list[float] = []
    remaining = requests

    async def client(i: int) -> None:
        nonlocal remaining
        history = [{"role": "system", "content": "You are a helpful assistant."}]
        while remaining > 0:
            remaining -= 1
            if len(history) > 2 * TURNS:
                history = history[:1]
            history.append({"role": "user", "content": f"question {len(history) // 2} from client {i}: how are you?"})
            started = now()
            answer = await provider.complete(history)
            latencies.append(now() - started)
            history.append({"role": "assistant", "content": answer.content})

    try:
        cpu = time.process_time()
        await asyncio.gather(*(client(i) for i in range(clients)))
        cpu = time.process_time() - cpu
    finally:
        await provider.close()
    return Phase("sdk", clients, latencies, 0, cpu)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def added_floor(clients: int, sdk_cpu: float, n_cores: int) -> float:
    """The least p50 the gateway can add when each call costs it ``sdk_cpu`` of CPU (its model call
    through the ``openai`` package) on top of what the direct side pays: one client waits for it in
    series; ``clients`` calls in flight on ``n_cores`` busy cores wait for one another's, about
    ``clients / n_cores`` of them per call (the bench client, the gateway and the model server all
    run on these cores; the direct side's work is in both sides' p50 and cancels out)."""
    return sdk_cpu * max(1.0, clients / n_cores)


def fsync_seconds(folder: Path, times: int = 50) -> float:
    """Median time of a small append plus fsync in ``folder`` (the gateway's home's disk)."""
    samples = []
    path = folder / "fsync-probe"
    with path.open("ab") as handle:
        for _ in range(times):
            started = now()
            handle.write(b'{"seq": 1, "role": "user", "content": "probe"}\n')
            handle.flush()
            os.fsync(handle.fileno())
            samples.append(now() - started)
    path.unlink()
    return statistics.median(samples)


@dataclass
class Side:
    """A gateway under test: this tree's, or ``--baseline``'s (another checkout, same run)."""

    name: str
    server: Server
    url: str
    cpu: float = 0.0
    calls: int = 0
    added_p50: list[float] = field(default_factory=list)
    added_p95: list[float] = field(default_factory=list)
    added_p99: list[float] = field(default_factory=list)
    cpu_per_call: list[float] = field(default_factory=list)  # per round

    def measured(self, front: Phase, direct: Phase, cpu: float) -> None:
        self.cpu += cpu
        self.calls += len(front.latencies)
        self.added_p50.append(front.p50 - direct.p50)
        self.added_p95.append(front.p95 - direct.p95)
        self.added_p99.append(front.p99 - direct.p99)
        self.cpu_per_call.append(cpu / max(len(front.latencies), 1))

    def reset(self) -> None:
        self.cpu, self.calls = 0.0, 0
        self.added_p50, self.added_p95, self.added_p99, self.cpu_per_call = [], [], [], []

    def summary(self) -> str:
        spread = ", ".join(f"added {name}: median {fmt_seconds(statistics.median(values))}, min "
                           f"{fmt_seconds(min(values))}, max {fmt_seconds(max(values))}"
                           for name, values in (("p50", self.added_p50), ("p95", self.added_p95),
                                                ("p99", self.added_p99)))  # fmt: skip
        return f"  {self.name}: over rounds {spread}; gateway CPU per call {fmt_seconds(self.cpu / max(self.calls, 1))}"

    def against(self, before: Side) -> str:
        """This side over ``before``, round by round (each round measures both under the same
        load): the median and range of the ratios of CPU per call and of added p50 and p95."""

        def ratios(mine: list[float], theirs: list[float]) -> str:
            each = [a / b for a, b in zip(mine, theirs, strict=True) if b > 0]
            if not each:
                return "n/a"
            return f"{statistics.median(each):.3f} ({min(each):.3f}-{max(each):.3f})"

        cpu = ratios(self.cpu_per_call, before.cpu_per_call)
        p50, p95 = ratios(self.added_p50, before.added_p50), ratios(self.added_p95, before.added_p95)
        return (f"  {self.name} / {before.name}, median (range) of the per-round ratios: CPU per call {cpu},"
                f" added p50 {p50}, added p95 {p95}")  # fmt: skip


async def run(rounds: int, requests: dict[int, int], home: Path, baseline: Path | None = None) -> int:
    report = Report("bench.openai_compat")
    model = Server("model")
    sides: list[Side] = []
    try:
        model_url = f"http://{HOST}:{model.port}/v1"
        trees = [("neotask", None, home)] + ([("baseline", baseline, home / "baseline")] if baseline else [])
        for name, root, folder in trees:
            folder.mkdir(exist_ok=True)
            server = Server("gateway", "--home", str(folder), "--model-url", model_url, root=root)
            sides.append(Side(name, server, f"http://{HOST}:{server.port}/v1"))
        for side in sides:
            await phase(side.url, "warm-up", 2, 8)
        await phase(model_url, "warm-up", 2, 8)
        fsync = await asyncio.to_thread(fsync_seconds, home)
        target = TARGET_OVERHEAD_S + APPENDS_PER_CALL * fsync
        section(f"fsync of a small append in the home: p50 {fmt_seconds(fsync)}; target p50 overhead "
                f"< 5 ms + {APPENDS_PER_CALL} x fsync = {fmt_seconds(target)}")  # fmt: skip
        if baseline:
            print(f"  baseline: the gateway of {baseline}, alternated round by round with this tree's")
        n_cores = cores()
        print(f"  {n_cores} core(s); 1-min load average at the start: {os.getloadavg()[0]:.2f}")
        for clients, count in requests.items():
            section(f"{clients} concurrent client(s), {count} requests per side per round, {rounds} rounds")
            rows = []
            cpu_model, calls = 0.0, 0
            sdk_cpu, sdk_calls, client_cpu, client_calls = 0.0, 0, 0.0, 0
            for side in sides:
                side.reset()
            for r in range(rounds):
                direct = await phase(model_url, "direct", clients, count)
                client_cpu, client_calls = client_cpu + direct.cpu, client_calls + len(direct.latencies)
                sdk = await sdk_phase(model_url, clients, count)
                sdk_cpu, sdk_calls = sdk_cpu + sdk.cpu, sdk_calls + len(sdk.latencies)
                for side in sides if r % 2 == 0 else sides[::-1]:  # neither always goes first
                    before = cpu_seconds(side.server.proc.pid), cpu_seconds(model.proc.pid)
                    front = await phase(side.url, side.name, clients, count)
                    side.measured(front, direct, cpu_seconds(side.server.proc.pid) - before[0])
                    if side is sides[0]:
                        cpu_model += cpu_seconds(model.proc.pid) - before[1]
                        calls += len(front.latencies)
                    rows.append([f"round {r + 1}", side.name, fmt_seconds(direct.p50),
                                 fmt_seconds(front.p50), fmt_seconds(side.added_p50[-1]),
                                 fmt_seconds(side.added_p95[-1]), fmt_seconds(direct.p99),
                                 fmt_seconds(front.p99), fmt_seconds(side.added_p99[-1]),
                                 fmt_seconds(side.cpu_per_call[-1]), direct.errors + front.errors])  # fmt: skip
            print_table(["", "gateway", "direct p50", "gateway p50", "added p50", "added p95", "direct p99",
                         "gateway p99", "added p99", "CPU/call", "errors"], rows)  # fmt: skip
            for side in sides:
                print(side.summary())
            if len(sides) > 1:
                print(sides[0].against(sides[1]))
            print(f"  model server CPU per call through this tree's gateway: {fmt_seconds(cpu_model / max(calls, 1))}"
                  " (CPU figures: the processes' CPU clocks, ns)")  # fmt: skip
            per_sdk, per_client = sdk_cpu / max(sdk_calls, 1), client_cpu / max(client_calls, 1)
            per_server = cpu_model / max(calls, 1)
            floor = added_floor(clients, per_sdk, n_cores)
            served = added_floor(clients, per_sdk + per_server, n_cores)
            print(f"  the openai client's own CPU per call: {fmt_seconds(per_client)} (this process, direct side:"
                  f" the typed create and its parsed answer), {fmt_seconds(per_sdk)} as the gateway makes it (its"
                  f" ChatProvider.complete from this process: bytes in, raw JSON out, no tools)")  # fmt: skip
            print(f"  least added p50 that follows at {clients} client(s) on {n_cores} core(s): the gateway's model"
                  f" call alone {fmt_seconds(per_sdk)} x max(1, {clients}/{n_cores}) = {fmt_seconds(floor)}; with the"
                  f" typed create {fmt_seconds(added_floor(clients, per_client, n_cores))}; with an HTTP exchange"
                  f" served as cheaply as the model server serves its own ({fmt_seconds(per_server)}):"
                  f" {fmt_seconds(served)}")  # fmt: skip
            if floor > target:
                print(f"  => the target ({fmt_seconds(target)}) is NOT reachable on this machine at {clients} clients"
                      " while the gateway calls its model through the openai package: its model call alone costs"
                      " more than that")  # fmt: skip
            elif served > target:
                print(f"  => the target ({fmt_seconds(target)}) is NOT reachable on this machine at {clients} clients"
                      " while the gateway calls its model through the openai package and serves HTTP: the model call"
                      " plus a request served as cheaply as the model server's cost more than that")  # fmt: skip
            report.check(
                f"p50 overhead at {clients} client(s) (median of rounds)",
                statistics.median(sides[0].added_p50) * 1e3,
                target * 1e3,
                unit=" ms",
            )
        print(f"\n  1-min load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        for side in sides:
            side.server.stop()
        model.stop()
    return report.finish()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.openai_compat", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run for CI, not a measurement")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None, help="per side, per round, at 1 client (x4 at 16)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. main) whose gateway runs in the same run, alternated round by round",
    )
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model-url", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    if args.serve:
        if args.serve[0] == "model":
            asyncio.run(_serve_model())
        else:
            asyncio.run(_serve_gateway(args.home, args.model_url))
        return 0
    rounds = args.rounds or (1 if args.quick else 5)
    single = args.requests or (10 if args.quick else 200)
    with tempfile.TemporaryDirectory(prefix="neotask-bench-openai-") as tmp:
        return asyncio.run(run(rounds, {1: single, 16: single * 4}, Path(tmp), args.baseline))


if __name__ == "__main__":
    sys.exit(main())
